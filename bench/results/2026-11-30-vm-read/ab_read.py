"""Full reads of one columns recording by several checkouts, interleaved: events per CPU second.

    python ab_read.py EVENTS ROUNDS CHECKOUT...

Builds (once, under /tmp/bench-ab) a recording of EVENTS events stored as the file sink stores
them (``bench/summary.py``'s ``build``, layout ``columns``); then, ROUNDS times, each checkout's
``cuptistream.recording.reader.read`` reads all of it in a fresh process on CPU 1 (the CPU time
from after the reader's import, as ``bench/summary.py`` measures a full read). Prints each
checkout's median, min and max, then the per-round values as JSON.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

from summary import READ, build  # noqa: E402 - bench/, put on the path above

events, rounds, checkouts = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
recording = Path(f"/tmp/bench-ab/recording-{events}")
marker = recording.with_suffix(".n")
if not marker.exists():
    marker.write_text(str(build(recording, events, layout="columns")))
count = int(marker.read_text())
results: dict[str, list[int]] = {checkout: [] for checkout in checkouts}
for _ in range(rounds):
    for checkout in checkouts:
        argv = ["taskset", "-c", "1", sys.executable, "-c", READ, str(recording)]
        out = subprocess.run(argv, cwd=checkout, capture_output=True, text=True, check=True).stdout.split()
        assert int(out[0]) == count, out
        results[checkout].append(round(count / float(out[1])))
for checkout, values in results.items():
    print(checkout, statistics.median(values), min(values), max(values))
print(json.dumps(results))
