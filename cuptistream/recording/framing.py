"""zstd framing: one checksummed zstd frame per batch, and a scanner that survives damaged files.

Every frame is written with its content size and zstd's content checksum (XXH64 of the payload), so
a reader knows a frame's size before decompressing it and notices any changed bit. Frames written
before checksums existed have none and still read.

``scan_frames`` walks a file frame by frame and yields each intact frame and each damaged range:

- A frame's extent is found from its block headers before anything is decompressed, so a frame that
  ends past the end of the data (a writer killed mid-write) is a torn tail without any work.
- A frame declaring more than ``max_frame_bytes`` is refused unread; a frame without a declared size
  is decompressed block by block and refused once its output passes the bound, so a small file never
  decompresses to gigabytes.
- After a damaged frame the scan resynchronizes at the next frame magic, so every intact frame
  behind the damage is still returned. Magic bytes inside damaged data can start false candidates;
  the work spent on failed candidates is bounded by a multiple of the data's size, so a crafted file
  cannot make the scan quadratic.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

MAGIC = b"\x28\xb5\x2f\xfd"
# The largest payload a reader accepts in one frame. A batch is cut at batch.max_bytes (4MiB by
# default), so legitimate frames are far smaller; this only stops decompression bombs.
MAX_FRAME_BYTES = 256 * 1024 * 1024
TORN = "torn tail (incomplete frame)"

_BLOCK_MAX = 128 * 1024  # zstd's Block_Maximum_Size: no block regenerates more
_HEADER_MAX = 18  # magic + the largest frame header
_WINDOW = 1 << 20  # read-ahead for block headers, and the step of the magic search
# Failed candidates may cost this many times the data's size (plus a constant) before the scan
# gives up on resynchronizing; real damage costs about one times the damaged frame.
_RESYNC_FACTOR = 4
_RESYNC_EXTRA = 64 * 1024 * 1024


@dataclass(frozen=True)
class Damage:
    """Bytes of a recording that hold no intact frame: a torn tail, a corrupt frame, garbage."""

    path: str
    offset: int  # where the damaged range starts
    length: int  # bytes skipped from there
    problem: str = TORN

    @property
    def torn(self) -> bool:
        """A torn tail: the file ends inside a frame, as a writer killed mid-write leaves it."""
        return self.problem == TORN

    def describe(self) -> str:
        if self.torn:
            return f"{self.path}: torn tail of {self.length} bytes at offset {self.offset} (incomplete frame)"
        return f"{self.path}: {self.length} bytes at offset {self.offset} skipped ({self.problem})"


TornTail = Damage  # its name from before checksums, when a torn tail was the only damage reported


@dataclass(frozen=True)
class Frame:
    """One intact frame: where it is in the data and its decompressed payload."""

    offset: int
    length: int
    payload: bytes
    checked: bool = True  # False for frames written before checksums (nothing verified them)


class FrameEncoder:
    """Compresses payloads into self-contained zstd frames with content size and checksum."""

    def __init__(self, level: int = 3, threads: int = 0) -> None:
        self._compressor = zstandard.ZstdCompressor(
            level=level, threads=threads, write_content_size=True, write_checksum=True
        )

    def frame(self, payload: bytes | Sequence[bytes | memoryview]) -> bytes:
        """One frame of ``payload``, or of the concatenation of its pieces (compressed as they
        lie, with the GIL released, into the same frame the joined bytes would make)."""
        if isinstance(payload, bytes):
            return self._compressor.compress(payload)
        if len(payload) == 1:
            return self._compressor.compress(payload[0])
        stream = self._compressor.compressobj(size=sum(len(piece) for piece in payload))
        return b"".join([*(stream.compress(piece) for piece in payload), stream.flush()])


def write_frame(out: BinaryIO, frame: bytes) -> None:
    out.write(frame)
    out.flush()


def iter_frames(
    data: bytes | BinaryIO, path: str = "<bytes>", *, max_frame_bytes: int = MAX_FRAME_BYTES
) -> Iterator[bytes | Damage]:
    """Each intact frame's payload and each damaged range, in order (see ``scan_frames``)."""
    for item in scan_frames(data, path, max_frame_bytes=max_frame_bytes):
        yield item.payload if isinstance(item, Frame) else item


def scan_frames(
    data: bytes | bytearray | memoryview | BinaryIO,
    path: str = "<bytes>",
    *,
    max_frame_bytes: int = MAX_FRAME_BYTES,
) -> Iterator[Frame | Damage]:
    """Yield every intact ``Frame`` and one ``Damage`` per damaged range, in file order.

    ``data`` is bytes or a binary file opened for reading (read with ``pread``, in bounded pieces,
    up to its size when the scan starts). Never raises for anything in the data; memory stays
    within about ``max_frame_bytes`` plus one compressed frame.
    """
    source = _Source(data)
    size = source.size
    budget = _RESYNC_FACTOR * size + _RESYNC_EXTRA
    decompressor = zstandard.ZstdDecompressor()
    offset = 0
    damaged_at, problem = -1, ""
    seen_checksum = False
    while offset < size:
        found = _frame_at(source, offset, max_frame_bytes, decompressor)
        if isinstance(found, Frame) and not found.checked:
            # Frames from before checksums are taken only as an old writer leaves them: none with
            # a checksum before them in the file, and the next frame (or the end) right after.
            # A flipped checksum flag leaves the 4 checksum bytes behind; without this, a second
            # flip in its data would come back as a "good" frame.
            after = source.read(found.offset + found.length, 4)
            if seen_checksum or not MAGIC.startswith(after):
                found = "corrupt frame (no checksum where one is due)", found.length
        if isinstance(found, Frame):
            seen_checksum = seen_checksum or found.checked
            if damaged_at >= 0:
                # Damage followed by an intact frame is corruption, whatever the first failure said.
                middle = "damaged frame (it runs past the next intact frame)" if problem == TORN else problem
                yield Damage(path, damaged_at, offset - damaged_at, middle)
                damaged_at = -1
            yield found
            offset = found.offset + found.length
            continue
        failure, spent = found
        if damaged_at < 0:
            damaged_at, problem = offset, failure
        budget -= spent
        if budget < 0:
            problem = f"{problem}; too much damage to look for more frames"
            break
        offset = source.find(MAGIC, offset + 1)
    if damaged_at >= 0:
        yield Damage(path, damaged_at, size - damaged_at, problem)


def _frame_at(
    source: _Source, offset: int, max_frame_bytes: int, decompressor: zstandard.ZstdDecompressor
) -> Frame | tuple[str, int]:
    """The intact frame at ``offset``, or why there is none and how many bytes it took to find out."""
    header = source.read(offset, _HEADER_MAX)
    if header[:4] != MAGIC:
        return "not a zstd frame", 0
    if len(header) > 4 and header[4] & 0x08:  # the reserved bit: cheap to refuse, common in garbage
        return "bad frame header", 0
    try:
        params = zstandard.get_frame_parameters(header)
        position = offset + zstandard.frame_header_size(header)
    except zstandard.ZstdError:
        incomplete = offset + len(header) >= source.size
        return (TORN if incomplete else "bad frame header"), len(header)
    if params.dict_id:
        return "bad frame header (needs a dictionary)", len(header)
    unknown = params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    if not unknown and params.content_size > max_frame_bytes:
        return f"frame declares {params.content_size} bytes, over the {max_frame_bytes}-byte limit", 0
    # Walk the block headers to the frame's end: bounds are known before any decompression.
    blocks = [position]  # where each block starts, then where the checksum (or the frame) ends
    while True:
        head = source.read(position, 3)
        if len(head) < 3:
            return TORN, position - offset
        value = int.from_bytes(head, "little")
        last, kind, block_size = value & 1, (value >> 1) & 3, value >> 3
        if kind == 3 or block_size > _BLOCK_MAX:
            return "corrupt block header", position - offset
        position += 3 + (1 if kind == 1 else block_size)
        blocks.append(position)
        if position > source.size:
            return TORN, source.size - offset
        if last:
            break
    end = position + (4 if params.has_checksum else 0)
    if end > source.size:
        return TORN, source.size - offset
    spent = end - offset
    if unknown or params.content_size == 0:  # one-shot decompression checks nothing for size 0
        payload = _bounded(source, offset, blocks, end, max_frame_bytes, decompressor)
        if isinstance(payload, str):
            return payload, spent
    else:
        try:
            # Output is allocated at the declared size; zstd refuses any other size and a bad checksum.
            payload = decompressor.decompress(source.read(offset, end - offset))
        except zstandard.ZstdError as error:
            return _zstd_problem(error), spent
    return Frame(offset, end - offset, payload, params.has_checksum)


def _bounded(
    source: _Source,
    offset: int,
    blocks: list[int],
    end: int,
    max_frame_bytes: int,
    decompressor: zstandard.ZstdDecompressor,
) -> bytes | str:
    """Decompress a frame that does not declare its size (or declares 0), one block at a time, so
    no call produces more than one block's output: a first pass only counts, so a bomb is refused
    having held one block; a second keeps the output. Such frames come from other writers only."""
    # Pieces: the header with block 0, each further block, the checksum.
    pieces = list(zip([offset, *blocks[1:]], [*blocks[1:], end], strict=True))
    for keep in (False, True):
        stream = decompressor.decompressobj()
        parts: list[bytes] = []
        total = 0
        try:
            for start, stop in pieces:
                if stop > start:
                    part = stream.decompress(source.read(start, stop - start))
                    total += len(part)
                    if total > max_frame_bytes:
                        return f"frame decompresses to more than the {max_frame_bytes}-byte limit"
                    if keep:
                        parts.append(part)
        except zstandard.ZstdError as error:
            return _zstd_problem(error)
        if not stream.eof:
            return "corrupt frame (it does not end where its blocks say)"
    return b"".join(parts)


def _zstd_problem(error: zstandard.ZstdError) -> str:
    text = str(error)
    if "checksum" in text:
        return "checksum mismatch"
    detail = text.split(": ")[-1].strip().rstrip(".")
    return f"corrupt frame ({detail[:1].lower()}{detail[1:]})"


class _Source:
    """Random access to bytes or to a file (``pread`` into a window that serves the small reads of
    block headers and the magic search)."""

    def __init__(self, data: bytes | bytearray | memoryview | BinaryIO) -> None:
        self._fd = -1
        if isinstance(data, bytes | bytearray | memoryview):
            self._window = bytes(data)  # all of it: the window never moves
            self.size = len(self._window)
        else:
            self._fd = data.fileno()
            self.size = os.fstat(self._fd).st_size
            self._window = b""
        self._window_at = 0

    def read(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self.size - offset))
        start = offset - self._window_at
        if start >= 0 and start + length <= len(self._window):
            return self._window[start : start + length]
        if length >= _WINDOW:
            return os.pread(self._fd, length, offset)
        self._load(offset)
        return self._window[:length]

    def find(self, needle: bytes, start: int) -> int:
        """The offset of the next ``needle`` at or after ``start``, or the size if there is none."""
        while start < self.size:
            if not 0 <= start - self._window_at < len(self._window):
                self._load(start)
            found = self._window.find(needle, start - self._window_at)
            if found >= 0:
                return self._window_at + found
            end = self._window_at + len(self._window)
            if end >= self.size:
                break
            start = end - (len(needle) - 1)  # a needle may straddle two windows
            self._load(start)
        return self.size

    def _load(self, offset: int) -> None:
        self._window = os.pread(self._fd, min(_WINDOW, self.size - offset), offset)
        self._window_at = offset
