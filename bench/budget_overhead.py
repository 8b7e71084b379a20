"""What always-on mode (``configs/production.yaml``) costs bench/workloads.py's W1-W4, measured in
interleaved windows of one process, with the method's null measured in the same run.

Run on the GPU machine (torch, cupti-python and cuptistream importable)::

    python bench/budget_overhead.py --workloads W1,W2,W3,W4 --sessions 5 --window 10 --out budget.json
    python bench/budget_overhead.py --config configs/production.yaml --variant kernels=bench/configs/kernels-only.yaml

One process per workload builds its model once and then runs blocks (``bench/workloads.py``'s block
sizes, each ending with a device sync) for the whole measurement. The time is cut into windows of
``--window`` seconds: ``base`` windows with no session alternate with condition windows, ``B P B N B
P B N ...``, where ``P`` runs the workload inside ``cuptistream.session(config)`` (the probe in this
process, the collector in its own, as ``cuptistream run`` has it) and ``N`` is the null: a window with
no session, valued exactly like ``P``. The session starts before its window and stops after it
(start and stop are not the steady state being measured; ``--settle`` seconds after the start are
skipped). Each condition window's iterations per second is divided by the mean of its two neighbour
base windows (the machine drifts by more than the effects measured here, and neighbours cancel slow
drift); its cost is ``1 - ratio``. Per workload and condition: median, min and max over the
sessions. The null's spread is what the method resolves; a cost below it is not resolved.

Measured on the H100 (2026-11-25, docs/benchmarks.md "Always-on mode"): the null came out at -8.7 %
(W1) and -8.6 % (W2) over 2 sessions: a stopped session leaves the base window after it slower (CUPTI
detached mid-run), so this method does not resolve a session's cost there; and repeated in-process
start/stop with the activity source once ended a W3 process in ``cudaErrorLaunchFailure``. Kept for
machines and configs where its null holds; check the null first.

``--variant NAME=CONFIG`` adds conditions (e.g. continuous-layer candidates). ``--out`` keeps every
window's numbers and the sessions' reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from workloads import DEFAULT_BLOCK, WORKLOADS

import cuptistream
from cuptistream.config import load

ROOT = Path(__file__).resolve().parent.parent


def steps_per_s(block: Any, n: int, seconds: float) -> tuple[float, int]:
    """Iterations per second over blocks of ``n`` run for ``seconds``."""
    done = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        block(n)
        torch.cuda.synchronize()
        done += n
    return done / (time.perf_counter() - t0), done


def measure(workload: str, conditions: dict[str, Path | None], args: argparse.Namespace) -> dict[str, Any]:
    block = WORKLOADS[workload]()
    n = DEFAULT_BLOCK[workload]
    steps_per_s(block, n, args.warmup)
    names = list(conditions)
    windows: list[dict[str, Any]] = []
    base = [steps_per_s(block, n, args.window)[0]]
    for _ in range(args.sessions):
        for name in names:
            config = conditions[name]
            report = None
            if config is None:
                steps_per_s(block, n, args.settle)  # the same length of time as a session's settle
                rate, _ = steps_per_s(block, n, args.window)
            else:
                session = cuptistream.session(load(config), quiet=True)
                session.start()
                steps_per_s(block, n, args.settle)
                rate, _ = steps_per_s(block, n, args.window)
                report = session.stop()
            windows.append({"condition": name, "rate": rate, "report": _report(report)})
            base.append(steps_per_s(block, n, args.window)[0])
    costs: dict[str, list[float]] = {name: [] for name in names}
    for i, window in enumerate(windows):
        neighbours = (base[i] + base[i + 1]) / 2
        window["ratio"] = window["rate"] / neighbours
        costs[window["condition"]].append(1 - window["ratio"])
    summary = {
        name: {"median": statistics.median(c), "min": min(c), "max": max(c), "sessions": len(c)}
        for name, c in costs.items()
    }
    return {"workload": workload, "base_rates": base, "windows": windows, "summary": summary}


def _report(report: Any) -> dict[str, Any] | None:
    if report is None:
        return None
    try:
        import dataclasses

        return json.loads(json.dumps(dataclasses.asdict(report), default=str))
    except Exception:
        return {"summary": str(report)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "production.yaml")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=CONFIG")
    parser.add_argument("--sessions", type=int, default=5, help="windows per condition (default 5)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per window (default 10)")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds skipped after a session starts")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("budget_overhead.json"))
    args = parser.parse_args(argv)
    conditions: dict[str, Path | None] = {"production": args.config.resolve(), "null": None}
    for variant in args.variant:
        name, _, path = variant.partition("=")
        if not name or not Path(path).is_file():
            parser.error(f"--variant {variant!r}: expected NAME=CONFIG with an existing CONFIG file")
        conditions[name] = Path(path).resolve()
    results = []
    for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        if workload not in WORKLOADS:
            parser.error(f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
        result = measure(workload, conditions, args)
        results.append(result)
        for name, s in result["summary"].items():
            print(
                f"{workload} {name:>12}: cost {100 * s['median']:+.2f}% "
                f"[{100 * s['min']:+.2f} .. {100 * s['max']:+.2f}] over {s['sessions']} sessions",
                flush=True,
            )
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out), "config": str(args.config)},
                                        "results": results}, indent=1, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
