"""Do CUPTI correlation ids go on counting a process's CUDA calls between budget windows? (issue 26)

    python bench/correlation_gaps_gpu.py --workload W2 --seconds 20

Runs bench/workloads.py's workload under ``configs/production.yaml`` with the windows' records kept
(``records: all``), then prints per window its kernels, their correlation id range, and the id gap
from the previous window over the time between them. Ids that advance between windows at the rate
the program launches (measured: yes, on the H100) let the statistics scale counts by calls made
(``cuptistream/statistics/launch_rate.py``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--seconds", default="20")
    args = parser.parse_args()
    from cuptistream.recording.reader import read

    config = yaml.safe_load((ROOT / "configs" / "production.yaml").read_text())
    for source in config["sources"]:
        if source["type"] == "activity":
            source["records"] = "all"
    tmp = Path(tempfile.mkdtemp())
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp / "config.yaml"), "-o", str(tmp / "out"),
         "--quiet", "--", sys.executable, str(ROOT / "bench" / "workloads.py"), "--workload", args.workload,
         "--seconds", args.seconds, "--warmup-seconds", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    info = json.loads(done.stdout.strip().splitlines()[-1])
    windows, kernels = [], []
    for event in read(tmp / "out"):
        kind = type(event).__name__
        if kind == "TraceWindow" and event.kinds:
            windows.append((event.start, event.end))
        elif kind == "Kernel":
            kernels.append((event.start, event.correlation_id))
    kernels.sort()
    print(f"{args.workload} iterations {info['iterations'] + info['warmup_iterations']}, "
          f"kernels recorded {len(kernels)}, windows {len(windows)}")  # fmt: skip
    previous: tuple[int, int] | None = None
    for start, end in sorted(windows):
        ids = [c for t, c in kernels if start <= t <= end + 200_000_000]
        if not ids:
            print(f"window {(end - start) / 1e6:.1f} ms: no kernels")
            continue
        low, high = min(ids), max(ids)
        line = f"window {(end - start) / 1e6:.1f} ms: {len(ids)} kernels, ids {low}..{high}"
        line += f", ids/kernel {(high - low) / max(1, len(ids) - 1):.2f}"
        if previous is not None:
            line += f", gap from previous {low - previous[1]} over {(start - previous[0]) / 1e9:.3f} s"
        print(line)
        previous = (end, high)
    return 0


if __name__ == "__main__":
    sys.exit(main())
