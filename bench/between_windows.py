"""What holding CUPTI costs a launch-bound program between activity windows, piece by piece,
toggled inside one process (issue 26).

``budget_lost_time.py --drift`` found W1's blocks between windows 10-27 % slower than before its
session started (p10 +7-16 %), while the same process with no session got faster over the same
minute. Between windows the probe holds CUPTI's subscriber (the state source's STATE domain) and
keeps the activity API initialized; its own threads used no measurable CPU (``steady_cost_gpu.py``).

W1's speed differs between processes (its p10 read 14.4-25.4 ms in 18 processes on the H100,
2026-11-27, at 7c68e4a), so one process per variant cannot resolve 10 %. Here each variant toggles
its piece on and off every ``--phase`` seconds in one process (the first phase's state at random),
and each on phase is set against the mean of the off phases either side; the first block after a
toggle is left out. ``none`` toggles nothing and is labelled the same way: the method's null::

    python bench/between_windows.py --variants none,subscribe,state,attach --seconds 60 --phase 2

- ``subscribe``: ``cuptiSubscribe`` (no domain) on, ``cuptiUnsubscribe`` off.
- ``state``: a subscriber throughout; its STATE domain (what the state source enables) on and off.
- ``attach``: the activity API attached with nothing traced (buffer callbacks registered, one kind
  enabled and disabled at once: CUPTI between two budget windows) on; ``cuptiFinalize`` off. The
  probe never detaches mid-run (a W3 process once failed a graph launch after repeated detaches,
  docs/gpu-validation.md); W1 launches no graph. A process that fails says so and the rest go on.

Per variant: the on/off ratio of the block means (median, min, max over on phases) and of the
blocks' p10 (the fast mode's floor: W1 flips between about 17 and 25 ms a block).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from lost_time import p10

VARIANTS = ("none", "subscribe", "state", "attach")


class Toggle:
    """One variant's piece of CUPTI, switched on and off on the program's own thread."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.handle: int | None = None
        self.attached = False
        if variant == "none":
            return
        from cupti import cupti

        self.cupti = cupti
        if variant == "state":
            self.handle = cupti.subscribe(self._callback, None)

    @staticmethod
    def _callback(userdata: Any, domain: int, cbid: int, data: Any) -> None:
        pass

    @staticmethod
    def _requested() -> tuple[int, int]:
        return 1 << 20, 0

    @staticmethod
    def _completed(activities: list[Any]) -> None:
        pass

    def set(self, on: bool) -> None:
        if self.variant == "attach":
            if on:
                self.cupti.activity_register_callbacks(self._requested, self._completed)
                self.cupti.activity_enable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
                self.cupti.activity_disable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
                self.attached = True
            elif self.attached:
                self.cupti.activity_flush_all(1)
                self.cupti.finalize()
                self.attached = False
        elif self.variant == "subscribe":
            if on:
                self.handle = self.cupti.subscribe(self._callback, None)
            elif self.handle is not None:
                self.cupti.unsubscribe(self.handle)
                self.handle = None
        elif self.variant == "state":
            self.cupti.enable_domain(int(on), self.handle, self.cupti.CallbackDomain.STATE)


def child(args: argparse.Namespace) -> dict[str, Any]:
    from workloads import DEFAULT_BLOCK, WORKLOADS, run_blocks

    block, n = WORKLOADS[args.workload](), DEFAULT_BLOCK[args.workload]

    run_blocks(block, n, args.warmup)
    toggle = Toggle(args.child)
    on = random.random() < 0.5
    phases: list[tuple[bool, list[float]]] = []
    for _ in range(max(3, round(args.seconds / args.phase))):
        toggle.set(on)
        phases.append((on, run_blocks(block, n, args.phase)[1:]))  # the block the toggle fell in is left out
        on = not on
    toggle.set(False)
    return {"variant": args.child, "phases": phases}


def on_over_off(phases: list[tuple[bool, list[float]]], stat: str) -> list[float]:
    """Each on phase's statistic over the mean of the off phases either side."""

    def value(times: list[float]) -> float:
        return statistics.fmean(times) if stat == "mean" else p10(times)

    out = []
    for i, (on, times) in enumerate(phases):
        beside = [phases[j][1] for j in (i - 1, i + 1) if 0 <= j < len(phases)]
        if on and times and all(beside):
            out.append(value(times) / statistics.fmean(value(b) for b in beside) - 1)
    return out


def parent(args: argparse.Namespace) -> dict[str, Any]:
    order = list(args.variants)
    random.shuffle(order)
    results: dict[str, Any] = {}
    for variant in order:
        command = [sys.executable, __file__, "--child", variant, "--workload", args.workload,
                   "--seconds", str(args.seconds), "--phase", str(args.phase), "--warmup", str(args.warmup)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 120)
        if done.returncode != 0:
            print(
                f"{args.workload} {variant}: exit {done.returncode}: {done.stderr.strip()[-400:]}", flush=True
            )
            continue
        phases = json.loads(done.stdout.strip().splitlines()[-1])["phases"]
        ratios = {stat: on_over_off(phases, stat) for stat in ("mean", "p10")}
        results[variant] = {"phases": phases, "on_over_off": ratios}
        print(f"{args.workload} {variant} on/off over {len(ratios['mean'])} on phases: " + ", ".join(
            f"{stat} {statistics.median(v) * 100:+.2f}% [{min(v) * 100:+.2f} .. {max(v) * 100:+.2f}]"
            for stat, v in ratios.items() if v), flush=True)  # fmt: skip
    return {"args": {k: str(v) for k, v in vars(args).items()}, "variants": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--seconds", type=float, default=60.0, help="toggled seconds per variant")
    parser.add_argument("--phase", type=float, default=2.0, help="seconds on, then as many off")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown} (known: {', '.join(VARIANTS)}; 'none' is the null)")
    if args.child:
        print(json.dumps(child(args)))
        return 0
    result = parent(args)
    if args.out:
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
