"""The Kafka sink's durable spool: messages that could not be sent wait here, in order, on disk.

It is a FIFO of segment files written by ``cuptistream.recording.segments.SegmentWriter`` (one zstd frame per
message, temp name then rename). Segments are replayed oldest first and deleted only once every
message read from them is acked or permanently dropped, so a crash during replay replays the segment
again (at-least-once). The directory belongs to one process at a time (an ``flock`` on ``.lock``);
segments left by an earlier process are replayed first.

The byte cap counts compressed bytes on disk. A message that would cross it is not written and is
returned to the caller, which counts it as dropped.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec

from cuptistream.errors import SinkUnavailableError
from cuptistream.plugin import sink_where
from cuptistream.recording.framing import TornTail, iter_frames
from cuptistream.recording.segments import (
    SegmentWriter,
    delete_segment,
    list_segments,
    prepare_directory,
    seal_orphans,
)

from .route import Message

log = logging.getLogger("cuptistream.sinks.kafka")

PREFIX = "spool"
SUFFIX = ".kafka.zst"
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Message).decode


class SpoolReader:
    """Reads one finished segment message by message (only one frame decompressed at a time)."""

    def __init__(self, path: Path, earlier_run: bool = False) -> None:
        self.path = path
        # Written by an earlier process: its messages are not among this run's events, so acking
        # them delivers nothing this run counted (``Delivery.acked_this_run``).
        self.earlier_run = earlier_run
        self.outstanding = 0  # messages handed out and not yet acked or dropped
        self.exhausted = False
        self.torn: TornTail | None = None
        self._frames: Iterator[bytes | TornTail] = iter_frames(path.read_bytes(), str(path))

    def next(self) -> Message | None:
        for frame in self._frames:
            if isinstance(frame, TornTail):
                self.torn = frame
                log.warning("kafka spool: %s; the complete messages before it are replayed", frame.describe())
                break
            self.outstanding += 1
            return _decode(frame)
        self.exhausted = True
        return None


class Spool:
    """Thread-safe: the pipeline's side appends, the delivery thread takes segments to replay."""

    def __init__(self, directory: str, max_bytes: int, segment_bytes: int, fsync: str, sink: str) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._segment_bytes = segment_bytes
        self._fsync = fsync
        self._sink = sink
        self._lock = threading.Lock()
        self._writer: SegmentWriter | None = None
        self._lock_fd: int | None = None
        self._unsealed_bytes = 0  # written to the live segment, not yet renamed
        self._waiting = 0  # finished segments not taken yet
        self._taken: set[Path] = set()
        self._earlier: set[Path] = set()  # segments found at ``open``: an earlier run's
        self.bytes = 0  # on disk, all segments

    def open(self) -> None:
        """Create the directory, take its lock, and seal segments a crashed writer left behind."""
        where = sink_where(self._sink, "spool_directory")
        try:
            prepare_directory(self.directory, key=where)  # 0700; no symlinked or foreign directory
            fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise SinkUnavailableError(f"{where}: cannot use {self.directory}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise SinkUnavailableError(
                f"{where}: {self.directory} is in use by another process; give each process its own spool"
            ) from None
        self._lock_fd = fd
        seal_orphans(self.directory, PREFIX, SUFFIX)
        leftover = list_segments(self.directory, PREFIX, SUFFIX)
        self.bytes = sum(p.stat().st_size for p in leftover)
        self._waiting = len(leftover)
        self._earlier = set(leftover)
        if leftover:
            log.info(
                "kafka spool: %d segments (%d bytes) left by an earlier run; replaying them first",
                len(leftover),
                self.bytes,
            )
        self._writer = SegmentWriter(
            self.directory,
            prefix=PREFIX,
            suffix=SUFFIX,
            rotate_bytes=self._segment_bytes,
            rotate_age=0,
            fsync=self._fsync,  # type: ignore[arg-type]
        )

    def has_data(self) -> bool:
        """Whether any message waits on disk that the delivery thread has not taken yet."""
        with self._lock:
            return self._unsealed_bytes > 0 or self._waiting > 0

    def append(self, messages: list[Message]) -> list[Message]:
        """Write messages in order; returns those that did not fit under the byte cap (not written).

        Raises ``OSError`` (e.g. disk full); the messages from the failing one on are not written.
        """
        assert self._writer is not None, "open() first"
        with self._lock:
            for index, message in enumerate(messages):
                payload = _encode(message)
                # Compressed size is known only after writing; budget the raw size to stay under the cap.
                if self.bytes + len(payload) > self.max_bytes:
                    return messages[index:]
                finished = self._writer.files_finished
                written = self._writer.append(payload)
                self.bytes += written
                if self._writer.files_finished != finished:  # the writer rotated after this frame
                    self._waiting += 1
                    self._unsealed_bytes = 0
                else:
                    self._unsealed_bytes += written
            return []

    def take(self) -> SpoolReader | None:
        """The oldest segment not yet taken, sealing the live one if nothing else is left."""
        with self._lock:
            for found in list_segments(self.directory, PREFIX, SUFFIX):
                if found not in self._taken:
                    self._taken.add(found)
                    self._waiting = max(0, self._waiting - 1)
                    return SpoolReader(found, earlier_run=found in self._earlier)
            if self._unsealed_bytes and self._writer is not None:
                path = self._writer.rotate()
                self._unsealed_bytes = 0
                if path is not None:
                    self._taken.add(path)
                    return SpoolReader(path)
            return None

    def release(self, reader: SpoolReader) -> None:
        """Delete a fully replayed segment."""
        with self._lock:
            try:
                size = reader.path.stat().st_size
            except FileNotFoundError:
                size = 0
            delete_segment(reader.path)
            self._taken.discard(reader.path)
            self.bytes = max(0, self.bytes - size)

    def close(self) -> None:
        """Seal the live segment; whatever is unsent stays on disk for the next process."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._unsealed_bytes = 0
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
