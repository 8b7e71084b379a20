"""Events/s from a synthetic source through the pipeline into the file sink (msgpack + zstd).

Runs each round in a fresh subprocess pinned to one CPU core (sched_setaffinity), so the
figure is per core: source thread, pipeline thread and zstd all share that core. Prints
median/min/max over the rounds. Usage: python bench/pipeline.py [--events N] [--rounds R]
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--core", type=int, default=0)
    args = parser.parse_args()
    rates, sizes = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run([sys.executable, "-c", ROUND, str(args.events), out, str(args.core)],
                                    check=True, capture_output=True, text=True)  # fmt: skip
        row = json.loads(result.stdout.strip().splitlines()[-1])
        rates.append(args.events / row["elapsed"])
        sizes.append(row["bytes"] / args.events)
    print(f"synthetic -> file (msgpack+zstd), {args.events} events x {args.rounds} rounds, one core "
          f"({os.cpu_count()} on this machine), {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"events/s  median {statistics.median(rates):,.0f}  min {min(rates):,.0f}  max {max(rates):,.0f}")
    print(f"bytes/event on disk  median {statistics.median(sizes):.2f}")


if __name__ == "__main__":
    main()
