"""What the probe costs a launch-bound program between activity windows, piece by piece (issue 26).

``budget_lost_time.py --drift`` found W1's blocks between windows 10-27 % slower than before its
session started, while the same process with no session got faster over the same minute. Between
windows the probe holds CUPTI's subscriber (the state source's STATE domain), keeps the activity API
initialized with its buffer callbacks registered, and runs its own threads. This runs W1 (one tiny
kernel per iteration: what pays most per launch) in one process per variant, the variants shuffled
in each round, and reports each variant's blocks against ``none`` of the same round::

    python bench/between_windows.py --rounds 3 --seconds 5 [--workload W1] [--out between.json]

Variants (each set up after the warm-up, then ``--settle`` seconds, then the timed blocks):

- ``none``: nothing.
- ``subscribe``: ``cuptiSubscribe`` with no domain enabled.
- ``state``: the subscriber with the STATE domain enabled (what the state source does).
- ``activity_once``: buffer callbacks registered, CONCURRENT_KERNEL enabled for 0.2 s, disabled,
  flushed: CUPTI's state after one budget window, with no subscriber.
- ``production``: ``cuptistream.session(configs/production.yaml)``; its windows fall inside the timed
  part (about 1 % of it by design).
- ``production_nostate``: the same without the state source.

Per process: block-time p10 (the fast mode's floor: W1 flips between two speeds, 17 and 25 ms on the
H100, whatever runs), median and mean, and the CPU seconds of each thread of the process over the
timed part (Python threads by name), so that a probe thread that spins shows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("none", "subscribe", "state", "activity_once", "production", "production_nostate")
PRODUCTION = ROOT / "configs" / "production.yaml"


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by its kernel thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def thread_names() -> dict[int, str]:
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) not in names:
            try:
                names[int(tid)] = "native:" + Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            except OSError:
                pass
    return names


def set_up(variant: str) -> Any:
    """Apply ``variant``; what must stay referenced (or stopped) until the timed part ends."""
    if variant == "none":
        return None
    if variant in ("production", "production_nostate"):
        import cuptistream
        from cuptistream.config import load

        config = load(PRODUCTION)
        if variant == "production_nostate":
            config.sources = [s for s in config.sources if s.type != "state"]
        return cuptistream.session(config, quiet=True).start()
    from cupti import cupti

    if variant in ("subscribe", "state"):

        def on_callback(userdata: Any, domain: int, cbid: int, data: Any) -> None:
            pass

        handle = cupti.subscribe(on_callback, None)
        if variant == "state":
            cupti.enable_domain(1, handle, cupti.CallbackDomain.STATE)
        return on_callback, handle
    if variant == "activity_once":
        import torch

        def requested() -> tuple[int, int]:
            return 8 << 20, 0

        def completed(activities: list[Any]) -> None:
            pass

        cupti.activity_register_callbacks(requested, completed)
        cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
        time.sleep(0.2)
        cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
        torch.cuda.synchronize()
        cupti.activity_flush_all(1)
        return requested, completed
    raise ValueError(variant)


def child(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from workloads import DEFAULT_BLOCK, WORKLOADS

    block, n = WORKLOADS[args.workload](), DEFAULT_BLOCK[args.workload]

    def run(seconds: float) -> list[float]:
        times: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            block(n)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    run(args.warmup)
    held = set_up(args.child)
    run(args.settle)
    cpu_before = thread_cpu()
    times = run(args.seconds)
    cpu_after = thread_cpu()
    names = thread_names()
    main_tid = threading.main_thread().native_id
    threads = {
        ("main" if tid == main_tid else names.get(tid, f"tid {tid}")): round(
            cpu - cpu_before.get(tid, 0.0), 3
        )
        for tid, cpu in cpu_after.items()
    }
    if args.child.startswith("production"):
        held.stop()
    ordered = sorted(times)
    return {
        "variant": args.child,
        "blocks": len(times),
        "p10_s": ordered[len(ordered) // 10],
        "median_s": statistics.median(times),
        "mean_s": statistics.fmean(times),
        "threads_cpu_s": {k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0},
    }


def parent(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        order = list(args.variants)
        random.shuffle(order)
        results: dict[str, dict[str, Any]] = {}
        for variant in order:
            command = [sys.executable, __file__, "--child", variant, "--workload", args.workload,
                       "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                       "--settle", str(args.settle)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 120)
            if done.returncode != 0:
                print(
                    f"round {r} {variant}: exit {done.returncode}: {done.stderr.strip()[-400:]}", flush=True
                )
                continue
            results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
            res = results[variant]
            print(f"round {r} {variant}: p10 {res['p10_s'] * 1e3:.2f} ms, median {res['median_s'] * 1e3:.2f} ms, "
                  f"mean {res['mean_s'] * 1e3:.2f} ms; thread CPU-s {res['threads_cpu_s']}", flush=True)  # fmt: skip
        rounds.append(results)
    summary: dict[str, dict[str, list[float]]] = {}
    for variant in args.variants:
        for stat in ("p10_s", "median_s", "mean_s"):
            ratios = [r[variant][stat] / r["none"][stat] - 1 for r in rounds if variant in r and "none" in r]
            summary.setdefault(variant, {})[stat] = ratios
        if variant == "none":
            continue
        s = summary[variant]
        print(f"{args.workload} {variant} over none: " + ", ".join(
            f"{stat[:-2]} {statistics.median(v) * 100:+.1f}% [{min(v) * 100:+.1f} .. {max(v) * 100:+.1f}]"
            for stat, v in s.items() if v), flush=True)  # fmt: skip
    return {"args": vars(args), "rounds": rounds, "over_none": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per process")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or "none" not in args.variants:
        parser.error(
            f"--variants: {unknown or 'none missing'} (known: {', '.join(VARIANTS)}; 'none' is the reference)"
        )
    if args.child:
        print(json.dumps(child(args)))
        return 0
    result = parent(args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
