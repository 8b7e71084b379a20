"""Where an activity window's cost comes from: each control step's wall time on the window thread,
next to the observed program's block times (diagnostic for issue 26, GPU machine).

    python bench/window_steps_gpu.py --workload W1 --seconds 20 [--window 0.1] [--pause 1]

Runs ``bench/workloads.py``'s workload in blocks of about 1-3 ms on the main thread inside a
``cuptistream.session`` in budget mode with a fixed duty cycle (``overhead.budget: off``), and wraps
the CUPTI calls that open and close a window (``cuptiActivityEnable``/``Disable``, the API filters,
the forced flush) to time them. Prints, per step, its median and max wall time, and how much longer
the program's blocks were while each step ran than the median block. JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from workloads import WORKLOADS

import cuptistream
from cuptistream.config import load
from cuptistream.cupti import library

BLOCK = {"W1": 100, "W2": 1, "W3": 20, "W4": 1}
steps: list[tuple[str, float, float]] = []  # (step, start, end) on time.perf_counter
_lock = threading.Lock()


def _timed(name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with _lock:
                steps.append((name, t0, time.perf_counter()))

    return wrapper


def instrument() -> None:
    from cuptistream.sources.activity import source as activity

    cls = activity.ActivitySource
    cls._enable = _timed("enable kinds + filters", cls._enable)  # type: ignore[method-assign]
    cls._apply_api_filters = _timed("api filters", cls._apply_api_filters)  # type: ignore[method-assign]
    cls.end_window = _timed("end_window (disable + forced flush + span)", cls.end_window)  # type: ignore[method-assign]
    original_call = library.call

    def call(name: str, *args: Any) -> Any:
        return _timed(name, original_call)(name, *args)

    library.call = call  # type: ignore[assignment]
    lib = library.libcupti()
    for name in ("cuptiActivityFlushAll", "cuptiActivityDisable"):
        setattr(lib, name, _timed(name, getattr(lib, name)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--window", default="100ms")
    parser.add_argument("--pause", default="1s")
    parser.add_argument("--kinds", default="concurrent_kernel,memcpy,memset,runtime,driver")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    block = WORKLOADS[args.workload]()
    n = BLOCK[args.workload]
    for _ in range(200):
        block(n)
    torch.cuda.synchronize()
    instrument()
    config = load({
        "overhead": {"budget": False},
        "sources": [{"type": "activity", "mode": "budget", "window": args.window, "min_window": args.window,
                     "pause": args.pause, "max_pause": args.pause, "kinds": args.kinds.split(",")}],
        "sinks": [{"type": "null"}],
    })  # fmt: skip
    blocks: list[tuple[float, float]] = []
    with cuptistream.session(config, quiet=True):
        t_end = time.perf_counter() + args.seconds
        while (t0 := time.perf_counter()) < t_end:
            block(n)
            torch.cuda.synchronize()
            blocks.append((t0, time.perf_counter()))
    durations = [b - a for a, b in blocks]
    median = statistics.median(durations)
    by_step: dict[str, list[tuple[float, float]]] = {}
    for name, a, b in steps:
        by_step.setdefault(name, []).append((a, b))
    result: dict[str, Any] = {
        "workload": args.workload,
        "median_block_ms": median * 1e3,
        "blocks": len(blocks),
        "steps": {},
    }
    print(f"{args.workload}: {len(blocks)} blocks, median {median * 1e3:.3f} ms")
    for name, spans in by_step.items():
        walls = [b - a for a, b in spans]
        excess = []
        for a, b in spans:
            over = [d - median for (s, e), d in zip(blocks, durations, strict=True) if s < b and e > a]
            excess.append(sum(max(o, 0.0) for o in over))
        row = {"calls": len(spans), "wall_ms_median": statistics.median(walls) * 1e3, "wall_ms_max": max(walls) * 1e3,
               "program_excess_ms_median": statistics.median(excess) * 1e3, "program_excess_ms_max": max(excess) * 1e3}  # fmt: skip
        result["steps"][name] = row
        print(f"  {name:45s} x{row['calls']:4d}  wall {row['wall_ms_median']:8.3f} ms (max {row['wall_ms_max']:8.3f})"
              f"  program lost {row['program_excess_ms_median']:8.3f} ms (max {row['program_excess_ms_max']:8.3f})")  # fmt: skip
    total_excess = sum(max(d - median, 0.0) for d in durations)
    print(
        f"  program time above the median block, whole run: {total_excess * 1e3:.1f} ms of {args.seconds:.0f} s"
    )
    result["total_excess_ms"] = total_excess * 1e3
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
