"""The capture file: raw activity buffers plus what decoding them needs, for fixtures and replay.

One file is one zstd frame holding a msgpack ``Capture``: the buffers exactly as CUPTI completed
them (trimmed to their valid bytes), the record size CUPTI used per kind, every string the
records point to (pointer → text), read in the live process before CUPTI went away, and a reading
of CUPTI's clock next to the Unix clock, so replayed times land on the capture's wall-clock date.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import zstandard

from cuptistream.events import ClockSync

FORMAT = 1


class CapturedBuffer(msgspec.Struct, kw_only=True):
    data: bytes  # the valid bytes of one completed buffer
    dropped: int = 0  # CUPTI's dropped-record count reported with it


class Capture(msgspec.Struct, kw_only=True):
    format: int = FORMAT
    name: str
    cupti_version: int
    device: str
    struct_sizes: dict[int, int]  # CUpti_ActivityKind -> record size in bytes
    strings: dict[int, str]  # pointer -> string
    buffers: list[CapturedBuffer]
    notes: str = ""
    # None in captures made before it was recorded: their CUPTI clock was the Unix epoch clock
    # (CUPTI 13 on Linux; the committed fixtures' timestamps fall on their capture date).
    clock: ClockSync | None = None

    @property
    def offset_ns(self) -> int:
        """Add to a captured timestamp to get Unix-epoch ns."""
        return self.clock.offset_ns if self.clock is not None else 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Capture)


def write(path: str | Path, capture: Capture) -> int:
    """Write ``capture`` to ``path``; returns the file size in bytes."""
    data = zstandard.ZstdCompressor(level=19).compress(_encoder.encode(capture))
    Path(path).write_bytes(data)
    return len(data)


def read(path: str | Path) -> Capture:
    """Read a capture file. Raises ``ValueError`` with a one-line reason on a bad file."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(Path(path).read_bytes())
        capture = _decoder.decode(raw)
    except (zstandard.ZstdError, msgspec.DecodeError) as error:
        raise ValueError(f"{path}: not a cuptistream capture file ({error})") from None
    if capture.format != FORMAT:
        raise ValueError(f"{path}: capture format {capture.format} is not supported (expected {FORMAT})")
    return capture
