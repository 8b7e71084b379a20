"""zstd framing: one independent zstd frame per batch, and a reader that finds a torn tail.

python-zstandard decodes a truncated stream without complaint, so the reader walks frame by frame
with ``decompressobj()`` and checks ``eof`` on each: a frame that never reaches its end is a torn
tail (a writer killed mid-write). Every complete frame before it is still returned.
Used by the file sink and by spool directories (e.g. the Kafka sink's).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

# Frames are written with their content size, so a reader can size buffers up front.
_MAGIC = b"\x28\xb5\x2f\xfd"
_PIECE = 1 << 18


@dataclass(frozen=True)
class TornTail:
    """Bytes at the end of a file that do not form a complete frame."""

    path: str
    offset: int  # where the incomplete frame starts
    length: int  # bytes from there to the end of the file

    def describe(self) -> str:
        return f"{self.path}: torn tail of {self.length} bytes at offset {self.offset} (incomplete frame)"


class FrameEncoder:
    """Compresses payloads into self-contained zstd frames."""

    def __init__(self, level: int = 3, threads: int = 0) -> None:
        self._compressor = zstandard.ZstdCompressor(level=level, threads=threads, write_content_size=True)

    def frame(self, payload: bytes) -> bytes:
        return self._compressor.compress(payload)


def write_frame(out: BinaryIO, frame: bytes) -> None:
    out.write(frame)
    out.flush()


def iter_frames(data: bytes, path: str = "<bytes>") -> Iterator[bytes | TornTail]:
    """Yield each complete frame's decompressed payload; yield one TornTail last if the data ends
    inside a frame (or holds bytes that are not a zstd frame)."""
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        if bytes(view[offset : offset + 4]) != _MAGIC:
            yield TornTail(path, offset, len(view) - offset)
            return
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        parts: list[bytes] = []
        position = offset
        try:
            # Feed in pieces so ``unused_data`` stays small: slicing the whole rest per frame is quadratic.
            while not decompressor.eof and position < len(view):
                piece = view[position : position + _PIECE]
                position += len(piece)
                parts.append(decompressor.decompress(piece))
        except zstandard.ZstdError:
            yield TornTail(path, offset, len(view) - offset)
            return
        if not decompressor.eof:
            yield TornTail(path, offset, len(view) - offset)
            return
        offset = position - len(decompressor.unused_data)
        payload = b"".join(parts)
        yield payload
