"""What GPU time by code adds to a recording, per process: the stack table, the probe's stack
changes per second and per hour, and the collector's ``stack_stats`` per GPU-hour.

From a recording taken with stacks on (default: ``tests/fixtures/stacks``, a GPU capture of
``tests/gpu/workloads/stacks_workload.py``; its README entry says how it was taken):

* the table: the ``stack_table`` events' bytes (msgpack) and how many stacks and frames they intern;
* the changes: ``stack_changes`` rows per second of sampling (first to last change) and their
  msgpack bytes in one zstd frame at level 3 (as the file sink writes a batch), scaled to an hour;
* ``stack_stats``: one event per ``--interval`` with a row for every stack the recording interned
  (an upper bound: an interval holds only the stacks that launched in it), GPU ns and launch counts
  of realistic size, encoded, times the intervals in an hour.

    python bench/stacks_volume.py [RECORDING] [--interval 10]

The result goes to ``--out`` (default ``bench/out/stacks_volume.json``); the last line is the row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOUR_S = 3600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", nargs="?", default=str(ROOT / "tests" / "fixtures" / "stacks"))
    parser.add_argument("--interval", type=float, default=10.0, help="statistics interval, seconds")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "stacks_volume.json"))
    args = parser.parse_args()

    import msgspec
    import zstandard

    from cuptistream.events import StackChanges, StackStats, StackTable
    from cuptistream.recording.reader import read

    tables: list[StackTable] = []
    changes: list[StackChanges] = []
    for event in read(args.recording):
        if isinstance(event, StackTable):
            tables.append(event)
        elif isinstance(event, StackChanges):
            changes.append(event)
    if not changes:
        raise SystemExit(f"{args.recording}: no stack_changes events; record with stacks on")
    encode = msgspec.msgpack.encode
    times = [t for c in changes for t in c.times]
    span_s = (max(times) - min(times)) / 1e9
    changes_zstd = len(zstandard.ZstdCompressor(level=3).compress(b"".join(encode(c) for c in changes)))
    stacks = [s for t in tables for s in t.stack_ids]
    rows = len(stacks) + 2  # and the "no stack recorded" and "other" rows
    stats = StackStats(
        interval_start=10**18, interval_end=10**18 + round(args.interval * 1e9), device_id=0,
        process_id=tables[0].process_id if tables else 0, traced_ns=round(args.interval * 1e9),
        stack_ids=[*stacks, -1, -3], gpu_ns=[987_654_321] * rows, launches=[12_345] * rows,
    )  # fmt: skip
    result = {
        "recording": args.recording,
        "span_s": round(span_s, 3),
        "table_bytes": sum(len(encode(t)) for t in tables),
        "stacks": len(stacks),
        "frames": sum(len(t.frame_ids) for t in tables),
        "changes": len(times),
        "changes_per_s": round(len(times) / span_s, 1),
        "changes_zstd_bytes_per_hour": round(changes_zstd / span_s * HOUR_S),
        "stack_stats_event_bytes": len(encode(stats)),
        "stack_stats_bytes_per_hour": round(len(encode(stats)) * HOUR_S / args.interval),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(
        f"stack table {result['table_bytes']} B ({result['stacks']} stacks, {result['frames']} frames); "
        f"changes {result['changes_per_s']:g}/s, {result['changes_zstd_bytes_per_hour'] / 1e6:.2f} MB/h zstd; "
        f"stack_stats at most {result['stack_stats_event_bytes']} B per {args.interval:g} s interval, "
        f"{result['stack_stats_bytes_per_hour'] / 1e6:.2f} MB per process and GPU-hour"
    )


if __name__ == "__main__":
    main()
