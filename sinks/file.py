"""The file sink: batches into rotating segment files, read back with ``cuptistream.recording.reader.read``.

``format: msgpack`` (the default) writes each batch's msgpack, exactly as the pipeline encoded it,
as one zstd frame. ``format: jsonl`` writes the JSON Lines layout of ``cuptistream.recording.jsonl``, one zstd
frame per batch or, with ``compression: none``, plain text. Each batch is written and flushed before
``write`` returns; fsync follows ``fsync`` (see ``cuptistream.recording.segments``). Files are written as
``<name>.tmp`` and renamed when they rotate (by ``rotate_bytes`` or ``rotate_age``, checked on each
write), when the sink closes, or when their process has sent nothing for a minute.

Every observed process gets its own file set (``{prefix}-[rank{N}-]{host}-{pid}-...``): one writer
per file, and a process's batches stay in order in its files. The collector's own accounting
(losses, self-stats) goes to a file set named after the collector's process.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
from typing import Literal

import trio

from cuptistream.config import Duration, SinkConfig, Size
from cuptistream.delivery.retry import RetriesExhausted, RetryableError, call_with_retry
from cuptistream.errors import SinkUnavailableError
from cuptistream.events import Resource
from cuptistream.plugin import DeliveryError, OutgoingBatch, Sink
from cuptistream.recording import jsonl
from cuptistream.recording.framing import FrameEncoder
from cuptistream.recording.segments import (
    DIRECTORY_MODE,
    FsyncPolicy,
    SegmentWriter,
    parse_directory_mode,
    prepare_directory,
    safe_host,
    seal_orphans,
)

# A write that fails with one of these may succeed later (space freed, quota raised): it is retried
# with the shared ``retry`` settings. Any other error loses the batch at once.
_TRANSIENT = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EAGAIN, errno.EINTR})

# A process's file set is finished (renamed to its final name) after this long without a batch, so
# a node collector that serves many short-lived processes keeps few files open.
_IDLE_FINISH_S = 60.0

_SUFFIXES = {
    ("msgpack", "zstd"): ".msgpack.zst",
    ("jsonl", "zstd"): ".jsonl.zst",
    ("jsonl", "none"): ".jsonl",
}


class FileSinkConfig(SinkConfig, kw_only=True):
    directory: str = "cuptistream-out"
    prefix: str = "cuptistream"
    format: Literal["msgpack", "jsonl"] = "msgpack"
    compression: Literal["zstd", "none"] = "zstd"
    # 1, not zstd's usual 3: on batches of events it compresses about as well as level 3 in
    # noticeably less time, and the file sink's CPU is the collector's.
    zstd_level: int = 1
    fsync: FsyncPolicy = "rotate"
    rotate_bytes: Size = Size(256 * 1024 * 1024)  # 0: never rotate by size
    rotate_age: Duration = Duration(3600.0)  # 0: never rotate by age
    file_mode: int | str = 0o600  # an int, or an octal string such as "0640"
    # Directories the sink creates get directory_mode; an existing one keeps its own. A symlinked or
    # another user's directory is refused unless allowed (segments.prepare_directory says why).
    directory_mode: int | str = DIRECTORY_MODE
    allow_symlink: bool = False
    allow_foreign_owner: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        # Errors raised here reach the user as "sinks[N]: <message>".
        if self.format == "msgpack" and self.compression == "none":
            raise ValueError("compression: none is only allowed with format: jsonl; use compression: zstd")
        if not (1 <= self.zstd_level <= 22 or -7 <= self.zstd_level <= -1):
            raise ValueError(
                f"zstd_level: expected 1..22, or -1..-7 for zstd's fast levels, got {self.zstd_level}"
            )
        if not self.prefix or "/" in self.prefix:
            raise ValueError(f"prefix: expected a non-empty name without '/', got {self.prefix!r}")
        self.file_mode = _parse_mode(self.file_mode)
        self.directory_mode = parse_directory_mode(self.directory_mode)

    @property
    def mode(self) -> int:
        return int(self.file_mode)

    @property
    def suffix(self) -> str:
        return _SUFFIXES[(self.format, self.compression)]


def _parse_mode(value: int | str) -> int:
    try:
        mode = int(value, 8) if isinstance(value, str) else value
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ValueError(f'file_mode: expected permission bits such as 0o600 or "0640", got {value!r}')
    return mode


class FileSink(Sink):
    config_type = FileSinkConfig
    retries_itself = True  # a full disk is retried inside write, after cutting off the partial frame

    def __init__(self, config: FileSinkConfig) -> None:
        super().__init__(config)
        self.config: FileSinkConfig = config
        self._directory: str | None = None
        self._writers: dict[str, _ProcessWriter] = {}  # origin -> its process's file set
        # One zstd context for every process's writer (writes come one at a time, on the lane's
        # worker thread): a context each would grow the collector by a few MiB per probe.
        self._encoder = FrameEncoder(config.zstd_level) if config.compression == "zstd" else None
        self._closed = False
        self.batches_written = 0
        self.bytes_written = 0
        self.files_written = 0
        self.attempts = 0
        self.retries = 0

    @property
    def accepts_columns(self) -> bool:
        return self.config.format == "msgpack"  # written as it comes; JSON Lines maps each event

    async def open(self) -> None:
        await trio.to_thread.run_sync(self._open)

    def _open(self) -> None:
        config = self.config
        directory = str(
            prepare_directory(
                config.directory, key=self.where("directory"), mode=int(config.directory_mode),
                allow_symlink=config.allow_symlink, allow_foreign_owner=config.allow_foreign_owner,
            )
        )  # fmt: skip
        try:
            # A real file is the only reliable writability check (ACLs, read-only mounts, quotas).
            with tempfile.TemporaryFile(dir=directory):
                pass
            # A killed run's .tmp files become final files; live writers' (locked) ones are left.
            seal_orphans(directory, config.prefix, config.suffix)
        except OSError as error:
            reason = error.strerror or str(error)
            raise SinkUnavailableError(
                f"{self.where()}: cannot write to {directory}: {reason}; choose another directory"
            ) from None
        self._directory = directory

    def _writer_for(self, resource: Resource | None) -> _ProcessWriter:
        origin = _origin(resource)
        if (found := self._writers.get(origin)) is not None:
            return found
        config = self.config
        assert self._directory is not None
        writer = SegmentWriter(
            self._directory,
            prefix=config.prefix,
            suffix=config.suffix,
            rotate_bytes=int(config.rotate_bytes),
            rotate_age=float(config.rotate_age),
            fsync=config.fsync,
            file_mode=config.mode,
            zstd_level=config.zstd_level if config.compression == "zstd" else None,
            origin=origin,
            encoder=self._encoder,
        )
        self._writers[origin] = made = _ProcessWriter(writer)
        return made

    def _finish_idle(self, now: float) -> None:
        """Finish the file sets of processes that went quiet (exited, most likely)."""
        for origin, entry in list(self._writers.items()):
            if now - entry.last_write >= _IDLE_FINISH_S:
                del self._writers[origin]
                self._finish(entry.writer)

    def _finish(self, writer: SegmentWriter) -> None:
        writer.close()
        self.bytes_written += writer.bytes_written
        self.files_written += writer.files_finished

    async def write(self, batch: OutgoingBatch) -> None:
        """Write the batch as one frame. A full disk or quota is retried (``retry``; the segment
        writer cuts off a partial frame first); the deadline passing raises ``DeliveryError``."""

        async def once(_timeout: float) -> None:  # a blocking write cannot be cut short
            await trio.to_thread.run_sync(self._write, batch)

        deadline = trio.current_time() + self.config.retry.max_elapsed
        try:
            await call_with_retry(once, self.config.retry, self.config.request_timeout, deadline, self)
        except RetriesExhausted as error:
            raise DeliveryError(f"{self.where()}: cannot write batch {batch.seq}: {error}") from None

    def _write(self, batch: OutgoingBatch) -> None:
        if self._directory is None or self._closed:
            raise DeliveryError(f"{self.where()}: write while the sink is not open")
        payload = batch.parts if self.config.format == "msgpack" else jsonl.encode_batch(batch.batch)
        now = time.monotonic()
        try:
            self._finish_idle(now)
            entry = self._writer_for(batch.resource if batch.resource is not None else batch.batch.resource)
            entry.writer.append(payload)
        except OSError as error:
            if error.errno in _TRANSIENT:
                raise RetryableError(error.strerror or type(error).__name__) from error
            raise DeliveryError(f"{self.where()}: cannot write batch {batch.seq}: {error}") from error
        entry.last_write = now
        self.batches_written += 1

    async def close(self) -> None:
        if self._directory is None or self._closed:
            return
        self._closed = True
        try:
            await trio.to_thread.run_sync(self._finish_all)
        except OSError as error:
            raise DeliveryError(f"{self.where()}: cannot finish the last file: {error}") from error

    def _finish_all(self) -> None:
        failed: OSError | None = None
        for entry in self._writers.values():
            try:
                self._finish(entry.writer)
            except OSError as error:  # finish the others first
                failed = failed or error
        self._writers.clear()
        if failed is not None:
            raise failed

    def stats(self) -> dict[str, int]:
        live = [entry.writer for entry in self._writers.values()]
        return {
            "bytes_written": self.bytes_written + sum(w.bytes_written for w in live),
            "files_written": self.files_written + sum(w.files_finished for w in live),
            "batches_written": self.batches_written,
            "write_retries": self.retries,
        }


class _ProcessWriter:
    __slots__ = ("last_write", "writer")

    def __init__(self, writer: SegmentWriter) -> None:
        self.writer = writer
        self.last_write = 0.0


def _origin(resource: Resource | None) -> str:
    """The file-name part that says whose data a file holds: ``[rank{N}-]{host}-{pid}``."""
    if resource is None:
        return f"{safe_host()}-{os.getpid()}"
    rank = f"rank{resource.rank}-" if resource.rank is not None else ""
    return f"{rank}{safe_host(resource.host)}-{resource.pid}"
