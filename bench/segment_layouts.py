"""What three segment layouts would cost the file sink per record (issue 30): a measurement for a
format decision, not a format.

    taskset -c 1 python bench/segment_layouts.py [--rounds 5] [CAPTURE]   # default: W3's H100 buffers

Over one capture's buffers (default: W3's own 4 MiB buffers, ``bench/results/2026-11-27f-h100``):

- **maps**: what the file sink writes today. ``Decoder.decode_packed`` packs each record into a
  msgpack map (timed: the packing the raw layouts would not do), then zstd level 1 compresses the
  chunks, as the file sink's frames do.
- **raw**: the activity buffers' bytes as CUPTI wrote them, zstd level 1 (what "store activity
  buffers raw and decode when reading" would compress).
- **shipped**: what the file sink writes since the columnar layout (``events.Columns``):
  ``Decoder(columns=True).decode_packed``, the fields the events carry, zstd level 1.
- **columns**: the gathered records (``Decoder._records``: structured arrays, one per kind), each
  field laid out as one column, 8-byte integers as differences from the previous record, zstd level 1.
  Every field of the CUPTI record, in a plain numpy loop: its build time is an upper bound.

Prints, per layout, CPU nanoseconds per record to build it (beyond the walk and gather every layout
needs for the statistics), to compress it, and bytes per record before and after zstd: the best of
``--rounds`` passes in this thread's CPU time. Pin it to one core.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import zstandard

from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.cupti import capture
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import RecordLayouts

T = TypeVar("T")
W3 = Path(__file__).resolve().parent / "results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti"


def best(run: Callable[[], T], rounds: int) -> tuple[float, T]:
    """The shortest of ``rounds`` runs in this thread's CPU seconds, and the last run's result."""
    fastest = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        result = run()
        fastest = min(fastest, time.thread_time() - start)
    return fastest, result


def as_columns(records: np.ndarray) -> bytes:
    """One kind's records, field by field; 8-byte integers as differences from the previous one."""
    parts = []
    for name in records.dtype.names or ():
        column = records[name]
        if column.dtype.kind in "iu" and column.dtype.itemsize == 8:
            column = np.diff(column.astype(np.int64), prepend=np.int64(0))
        parts.append(np.ascontiguousarray(column).tobytes())
    return b"".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("capture", nargs="?", type=Path, default=W3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    cap = capture.read(args.capture)
    buffers = [memoryview(bytearray(b.data)) for b in cap.buffers]

    def decoder() -> Decoder:
        return Decoder(TableNames(dict(cap.strings)), RecordLayouts(dict(cap.struct_sizes)))

    gathered = [r for b in buffers for _, _, r in decoder()._records(b, len(b), None)]
    count = sum(len(r) for r in gathered)
    zstd = zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=True)

    def walk_gather() -> None:
        one = decoder()
        for b in buffers:
            one._records(b, len(b), None)

    def packed(columns: bool = False) -> list[bytes]:
        one = decoder()
        one._packed.columns = columns
        return [bytes(c.payload) for b in buffers for c in one.decode_packed(b, len(b))]

    gather_s, _ = best(walk_gather, args.rounds)
    pack_s, maps = best(packed, args.rounds)
    shipped_s, shipped = best(lambda: packed(columns=True), args.rounds)
    columns_s, columns = best(lambda: [as_columns(r) for r in gathered], args.rounds)
    layouts: dict[str, tuple[float, list[bytes]]] = {
        "maps": (pack_s - gather_s, maps),
        "shipped": (shipped_s - gather_s, shipped),
        "raw": (0.0, [bytes(b) for b in buffers]),
        "columns": (columns_s, columns),
    }
    per_record = gather_s / count * 1e9
    print(
        f"{args.capture.name}: {count} records, {len(buffers)} buffers; walk and gather {per_record:.0f} ns a record"
    )
    for name, (build_s, parts) in layouts.items():

        def compress(parts: list[bytes] = parts) -> int:
            return sum(len(zstd.compress(p)) for p in parts)

        compress_s, out = best(compress, args.rounds)
        size = sum(len(p) for p in parts)
        print(
            f"{name:8s} build {build_s / count * 1e9:5.0f} ns  zstd-1 {compress_s / count * 1e9:5.0f} ns  "
            f"{size / count:5.0f} B in  {out / count:6.2f} B out  (a record)"
        )


if __name__ == "__main__":
    main()
