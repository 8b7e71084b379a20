"""zstd levels on the events the file sink compresses (issue 30): CPU time per event and ratio.

    taskset -c 1 python bench/zstd_levels.py [--arrays] [CAPTURE ...]   # default: W3's H100 buffers, the shipped captures

Each capture is decoded as the collector does (``Decoder.decode_packed``: the sink's payload bytes),
then compressed whole at levels -5, -1, 1 and 3; the best of 5 passes in this thread's CPU time.
``--arrays``: also the same events encoded as arrays (``[tag, field, ...]``, no field names), what a
format without the names would compress. A measurement for a format decision; nothing in the
product encodes arrays.
"""

import argparse
import time
from pathlib import Path

import msgspec
import zstandard

from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.cupti import capture, records
from cuptistream.cupti.names import TableNames

ROOT = Path(__file__).resolve().parent.parent
W3 = ROOT / "bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti"
LEVELS = (-5, -1, 1, 3)


def _decoder(path: Path) -> tuple[capture.Capture, Decoder]:
    """A capture and a decoder for its buffers, as a session's stream has one."""
    cap = capture.read(path)
    return cap, Decoder(TableNames(cap.strings), records.RecordLayouts(dict(cap.struct_sizes)))


def payload(path: Path) -> tuple[bytes, int]:
    """The encoded events of every buffer of a capture, and how many."""
    cap, decoder = _decoder(path)
    data, count = bytearray(), 0
    for buf in cap.buffers:
        for chunk in decoder.decode_packed(memoryview(bytes(buf.data)), len(buf.data)):
            data += bytes(chunk.payload)
            count += chunk.count
    return bytes(data), count


def as_arrays(path: Path) -> bytes:
    """The same events as msgpack arrays: the tag, then each field's value in order."""
    cap, decoder = _decoder(path)
    encode = msgspec.msgpack.Encoder().encode
    return b"".join(
        encode((type(event).__struct_config__.tag, *msgspec.structs.astuple(event)))
        for buf in cap.buffers
        for event in decoder.decode(memoryview(bytes(buf.data)), len(buf.data))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captures", nargs="*", type=Path)
    parser.add_argument("--arrays", action="store_true", help="also the events encoded as arrays")
    args = parser.parse_args()
    paths = args.captures or [W3, *sorted((ROOT / "sources" / "captures").glob("*.cupti"))]
    for path in paths:
        maps, count = payload(path)
        for encoding, data in [("maps", maps)] + ([("arrays", as_arrays(path))] if args.arrays else []):
            print(
                f"{path.name}, {encoding}: {count} events, {len(data) / count:.0f} bytes/event | "
                + " | ".join(_levels(data, count))
            )


def _levels(data: bytes, count: int) -> list[str]:
    """Each level's CPU time per event (best of 5) and ratio over ``data``."""
    cells = []
    for level in LEVELS:
        compressor = zstandard.ZstdCompressor(level=level)
        best = float("inf")
        for _ in range(5):
            start = time.thread_time()
            out = compressor.compress(data)
            best = min(best, time.thread_time() - start)
        cells.append(f"level {level}: {best / count * 1e9:.0f} ns/event, ratio {len(data) / len(out):.0f}")
    return cells


if __name__ == "__main__":
    main()
