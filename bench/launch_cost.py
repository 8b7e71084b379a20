"""What holding CUPTI between budget windows costs one kernel launch, piece by piece, in C (issue 26).

W1 (a Python loop of ~118k tiny launches a second) ran several percent slower between windows under
``configs/production.yaml`` than before its session (``budget_lost_time.py --drift``), but W1's own
speed flips between two levels, so its blocks resolve the pieces poorly (``between_windows.py``).
``bench/launch_cost.cu`` measures the launching thread's cost per launch of an empty kernel, which
does not flip, and toggles one piece of CUPTI on and off every 0.25 s inside one process:

    python bench/launch_cost.py [--phases 80] [--phase 0.25] [--session-rounds 3] [--out launch.json]

- ``none`` (the null), ``subscribe`` (a bare subscriber), ``state`` (its STATE domain: the state
  source), ``attach`` (the activity API attached with nothing traced, against ``cuptiFinalize``):
  each on phase's ns per launch over the mean of the off phases beside it (median, min, max).
- ``--session-rounds R``: the same binary with nothing toggled, alone and under ``cuptistream run -c
  configs/production.yaml``, alternating, R of each: the whole probe between (and in) its windows, per
  launch. A native program: the probe comes in through CUDA's injection hook, as for any program.

Built with the nvcc on PATH against the toolkit's CUPTI if it has one, else the wheel's
(``overhead_gpu.find_cupti``). Needs a GPU; fails with one line without one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from between_windows import on_over_off
from overhead_gpu import find_cupti

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "bench" / "launch_cost.cu"
MODES = ("none", "subscribe", "state", "attach")


def build(out: Path) -> Path:
    """Compile launch_cost.cu; the binary. Raises SystemExit with one line when it cannot."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("launch_cost.py: no nvcc on PATH to build bench/launch_cost.cu")
    # The toolkit's own CUPTI first: the wheel's headers can be newer than the toolkit's cuda.h.
    homes = [
        Path(nvcc).resolve().parent.parent,
        *(Path(p) for p in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if p),
    ]
    candidates: list[tuple[list[Path], Path]] = []
    for home in dict.fromkeys(homes):
        libs = sorted(p for d in ("lib", "lib64") for p in (home / d).glob("libcupti.so*"))
        if (home / "include" / "cupti.h").is_file() and libs:
            candidates.append(([home / "include"], libs[0]))
    includes, libcupti = find_cupti()
    candidates.append((includes, libcupti))
    errors = []
    for includes, libcupti in candidates:
        binary = out / "launch_cost"
        cmd = [nvcc, "-O2", *(f"-I{i}" for i in includes), "-o", str(binary), str(SOURCE),
               f"-L{libcupti.parent}", f"-l:{libcupti.name}", "-Xlinker", f"-rpath={libcupti.parent}"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode == 0:
            print(f"built {binary} against {libcupti}", flush=True)
            return binary
        errors.append(
            f"{libcupti}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        )
    raise SystemExit("launch_cost.py: building bench/launch_cost.cu failed: " + "; ".join(errors))


def run(command: list[str]) -> dict[str, Any]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(
            f"launch_cost.py: {' '.join(command)}: exit {done.returncode}: {done.stderr.strip()[-300:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _mmm(values: list[float]) -> str:
    return f"{statistics.median(values) * 100:+.2f}% [{min(values) * 100:+.2f} .. {max(values) * 100:+.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=80, help="phases per mode, alternately off and on")
    parser.add_argument("--phase", type=float, default=0.25, help="seconds per phase")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--session-rounds", type=int, default=3, help="alone / under production.yaml pairs")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "production.yaml")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if unknown := [m for m in args.modes if m not in MODES]:
        parser.error(f"--modes: unknown {unknown} (known: {', '.join(MODES)})")
    with tempfile.TemporaryDirectory(prefix="launch-cost-") as tmp:
        binary = build(Path(tmp))
        results: dict[str, Any] = {"toggled": {}, "session": []}
        for mode in args.modes:
            got = run([str(binary), mode, str(args.phases), str(args.phase)])
            phases = [(bool(on), [ns]) for on, ns in got["phases"]]
            ratios = on_over_off(phases, "mean")
            off = statistics.median(ns for on, (ns,) in phases if not on)
            results["toggled"][mode] = {"phases": got["phases"], "on_over_off": ratios, "off_ns": off}
            print(f"launch {mode}: {off:.0f} ns per launch off; on/off {_mmm(ratios)} over {len(ratios)} on phases",
                  flush=True)  # fmt: skip
        alone_cmd = [str(binary), "none", str(args.phases), str(args.phase)]
        session_cmd = [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(args.config), "--quiet", "--",
                       *alone_cmd]  # fmt: skip
        for r in range(args.session_rounds):
            pair = {}
            for label, command in (("alone", alone_cmd), ("session", session_cmd)):
                values = [ns for _, ns in run(command)["phases"]]
                pair[label] = statistics.median(values)
            results["session"].append(pair)
            print(f"launch round {r}: alone {pair['alone']:.0f} ns, under {args.config.name} "
                  f"{pair['session']:.0f} ns per launch ({pair['session'] / pair['alone'] - 1:+.2%})", flush=True)  # fmt: skip
        if results["session"]:
            ratios = [p["session"] / p["alone"] - 1 for p in results["session"]]
            print(f"launch session over alone: {_mmm(ratios)}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
