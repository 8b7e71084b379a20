"""Events/s from a synthetic source through the pipeline into the file sink (msgpack + zstd).

Runs each round in a fresh subprocess pinned to one CPU core (sched_setaffinity), so the
figure is per core: source thread, pipeline thread and zstd all share that core. Each round's
rate goes to ``--out`` (default ``bench/out/pipeline.json``); the last line is the headline row,
events/s as median [min..max] over the rounds, and the bytes per event on disk.

    python bench/pipeline.py [--events N] [--rounds R] [--core C]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUND = r"""
import json, os, sys, time, tempfile
os.sched_setaffinity(0, {int(sys.argv[3])})
import cuptistream
from cuptistream.recording.reader import read
events, out = int(sys.argv[1]), sys.argv[2]
config = {
    "sources": [{"type": "synthetic", "events": events, "chunk_events": 4096}],
    "sinks": [{"type": "file", "directory": out, "format": "msgpack", "fsync": "never",
               "queue": {"full_policy": "block", "max_bytes": "256MiB"}}],
    "pipeline": {"full_policy": "block", "memory_budget": "256MiB"},
}
start = time.perf_counter()
with cuptistream.session(config, quiet=True) as s:
    s.sources[0].wait()
elapsed = time.perf_counter() - start
assert s.report.sinks["file"].events_dropped == 0
size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
print(json.dumps({"elapsed": elapsed, "bytes": size}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--core", type=int, default=0, help="the CPU core each round is pinned to")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "pipeline.json")
    args = parser.parse_args()
    rates, sizes = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run([sys.executable, "-c", ROUND, str(args.events), out, str(args.core)],
                                    check=True, capture_output=True, text=True)  # fmt: skip
        row = json.loads(result.stdout.strip().splitlines()[-1])
        rates.append(args.events / row["elapsed"])
        sizes.append(row["bytes"] / args.events)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"events": args.events, "cpus": os.cpu_count(), "events_per_s": rates,
                                    "bytes_per_event": sizes, "date": time.strftime("%Y-%m-%d")}))  # fmt: skip
    print(f"wrote {args.out}")
    print(f"synthetic -> file (msgpack+zstd) on one core ({os.cpu_count()} on this machine): "
          f"{statistics.median(rates):,.0f} [{min(rates):,.0f}..{max(rates):,.0f}] events/s over {args.rounds} "
          f"rounds of {args.events} events, {statistics.median(sizes):.2f} bytes/event on disk")  # fmt: skip


if __name__ == "__main__":
    main()
