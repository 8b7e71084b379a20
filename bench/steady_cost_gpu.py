"""What a session costs a program away from its windows: the median block time under the session
over the median before it, in one process per config, with the CPU each thread used (issue 26).

    python bench/steady_cost_gpu.py --workload W1 --configs none,bench/configs/empty-probe.yaml,configs/production.yaml

Each config runs in its own process: the workload (bench/workloads.py) is built and warmed up, runs
``--base`` seconds of blocks with no session, then starts ``cuptistream.session(config)`` and runs
``--seconds`` more (``none``: no session, which shows the drift of one process). Blocks that
overlap an activity window (from its throttle history, 0.2 s before to 0.5 s after) are left out,
so the ratio is the cost of holding a session, not of tracing. The CPU seconds of every thread of
the process (``/proc/self/task``) over the timed part tell where a steady cost is spent.
``--py-spy FILE`` also samples the session part with py-spy (non-blocking) into FILE.

``--pin CPU`` keeps the program's own thread on one core once the workload is built (threads made
before it keep the process's cores; the session is started with them, so the collector and the
probe's threads never share the program's core). A launch-bound loop's block time flips between
about 18 and 25 ms as the thread moves (W1 with no session read 0.98 and 1.38 in two processes);
pinned, that noise goes, and what is left is the session's.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds per thread name of this process (threads of one name summed)."""
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def child(args: argparse.Namespace) -> dict[str, Any]:
    from budget_lost_time import timed_blocks
    from workloads import DEFAULT_BLOCK, WORKLOADS

    import cuptistream
    from cuptistream.config import load

    block, n = WORKLOADS[args.workload](), DEFAULT_BLOCK[args.workload]
    cores = os.sched_getaffinity(0)
    if args.pin >= 0:
        os.sched_setaffinity(0, {args.pin})  # this thread only (Linux: 0 is the calling thread)
    timed_blocks(block, n, args.warmup)
    base = timed_blocks(block, n, args.base)
    os.sched_setaffinity(0, cores)  # what the session starts (threads, the collector) inherits this
    session = None if args.config == "none" else cuptistream.session(load(args.config), quiet=True).start()
    if args.pin >= 0:
        os.sched_setaffinity(0, {args.pin})
    timed_blocks(block, n, args.settle)
    spy = None
    if args.py_spy and session is not None:
        spy = subprocess.Popen(
            ["py-spy", "record", "--pid", str(os.getpid()), "--duration", str(int(args.seconds) - 1), "--rate", "200",
             "--nonblocking", "--threads", "--idle", "--format", "raw", "-o", args.py_spy],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    cpu0, t0 = thread_cpu(), time.monotonic()
    blocks = timed_blocks(block, n, args.seconds)
    wall = time.monotonic() - t0
    cpu = {k: round(v - cpu0.get(k, 0.0), 3) for k, v in thread_cpu().items()}
    if spy is not None:
        spy.wait(timeout=30)
    windows: list[tuple[float, float]] = []
    if session is not None and session.governor is not None:
        for t in session.governor.throttles:
            windows += [(closed, max(c.open_s, c.elapsed_s)) for closed, c in t.history]
    if session is not None:
        session.stop()
    clear = [d for end, d in blocks if not any(end - d < c + 0.5 and end > c - w - 0.2 for c, w in windows)]
    before = statistics.median(d for _, d in base)
    during = statistics.median(clear)
    return {
        "config": args.config,
        "workload": args.workload,
        "block_median_s": {"before": before, "during": during},
        "ratio": during / before,
        "blocks": {"before": len(base), "during": len(blocks), "clear": len(clear)},
        "windows": len(windows),
        "thread_cpu_s": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
        "wall_s": wall,
        "pinned_core": args.pin if args.pin >= 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--configs", default="none,bench/configs/empty-probe.yaml,configs/production.yaml")
    parser.add_argument("--rounds", type=int, default=1, help="each config this many times, interleaved")
    parser.add_argument("--base", type=float, default=6.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--pin", type=int, default=-1, help="core for the program's thread (default: none)")
    parser.add_argument("--py-spy", default="", help="py-spy raw output for the last config's session")
    parser.add_argument("--out", type=Path, default=Path("steady_cost.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path.insert(0, str(ROOT / "bench"))
        args.out.write_text(json.dumps(child(args)))
        return 0
    configs = [c if c == "none" else str(Path(c).resolve()) for c in args.configs.split(",")]
    results = []
    for r in range(args.rounds):
        for i, config in enumerate(configs):
            last = r == args.rounds - 1 and i == len(configs) - 1
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "r.json"
                cmd = [sys.executable, __file__, "--child", "--config", config, "--workload", args.workload,
                       "--base", str(args.base), "--seconds", str(args.seconds), "--settle", str(args.settle),
                       "--warmup", str(args.warmup), "--out", str(path), "--pin", str(args.pin),
                       "--py-spy", args.py_spy if last else ""]  # fmt: skip
                done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
                if done.returncode != 0 or not path.exists():
                    print(f"{config}: exit {done.returncode}: {done.stderr[-1500:]}", flush=True)
                    continue
                result = json.loads(path.read_text())
            results.append(result)
            top = list(result["thread_cpu_s"].items())[:6]
            print(f"{args.workload} {Path(config).name}: during/before {result['ratio']:.3f} "
                  f"({1e3 * result['block_median_s']['before']:.2f} -> {1e3 * result['block_median_s']['during']:.2f} ms), "
                  f"{result['windows']} windows, thread CPU s {top}", flush=True)  # fmt: skip
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
