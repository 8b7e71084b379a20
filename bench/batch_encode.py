"""Time ``codec.encode_batch`` (the lane's per-batch assembly of encoded chunks) on one 8192-event
batch of 16 chunks, in this checkout and, with ``--against DIR``, in another one, interleaved in
fresh interpreters. Prints the median, min and max of each round's median, in microseconds.

    python bench/batch_encode.py --against /tmp/old-checkout --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_ONE_ROUND = """
import sys, time
sys.path[:0] = [{root!r}, {root!r} + "/tests"]
from cuptistream.recording import codec
from cuptistream.events import NvtxMarker
from helpers.batchgen import header
events = [NvtxMarker(name=f"kernel_{{i % 50}}_" + "x" * 40, timestamp=i, thread_id=1) for i in range(8192)]
chunks = [codec.encode_chunk(events[i : i + 512]) for i in range(0, 8192, 512)]
times = []
for seq in range({repeats}):
    h = header(seq)
    start = time.perf_counter()
    codec.encode_batch(h, chunks)
    times.append(time.perf_counter() - start)
print(sorted(times)[len(times) // 2] * 1e6)
"""


def one_round(root: Path, repeats: int) -> float:
    code = _ONE_ROUND.format(root=str(root), repeats=repeats)
    return float(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=200, help="batches per round")
    args = parser.parse_args()
    roots = {"this": Path(__file__).resolve().parents[1]}
    if args.against:
        roots["against"] = args.against.resolve()
    results: dict[str, list[float]] = {name: [] for name in roots}
    for _ in range(args.rounds):
        for name, root in roots.items():
            results[name].append(one_round(root, args.repeats))
    summary = {
        name: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
        for name, v in results.items()
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
