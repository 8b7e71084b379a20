"""Step time of a plain-``python`` GPU loop after ``cuptistream attach PID --for`` against before,
beside the same loop left alone, interleaved processes.

    python bench/attach_steps.py [--workload W2] [--rounds 4] [--window 5]

A loop's step time moves between spans of one process (clocks, the allocator, the host's other
work), so an after/before ratio of one attached process says little alone. Each round starts two
processes of the same loop, one after the other in an order that alternates by round. Once a
process has warmed up for ``--warmup`` seconds and run ``--span`` more, the script either attaches
(``cuptistream attach PID --for WINDOW`` with the node install's probe runtime, recording the
window's kernels to a file) or, for the process left alone, waits as long as the round's attach
took. ``before`` is the median step over the ``--span`` seconds before that moment and ``after``
over the ``--span`` seconds that start a second after the detach (or the wait). Printed: each
process's after/before, and per round the attached process's ratio over the one left alone
(median [min..max]); the last line is the row. Raw numbers go to ``--out`` (default
``bench/out/attach_steps.json``).

Needs a GPU, torch, and ptrace rights over the loops (root, or ``kernel.yama.ptrace_scope`` 0 or
1 with the loops as children of this user's process); Python 3.14 attaches with
``sys.remote_exec`` instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from spread import spread_text

BENCH = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "cuptistream.cli"]

# One iteration of the workload a step, synchronized; SIGTERM ends the loop and the step times
# (wall-clock begin and end) go to the file named by the second argument.
LOOP = r"""
import json, signal, sys, time
sys.path.insert(0, sys.argv[3])
import torch
from workloads import WORKLOADS
block = WORKLOADS[sys.argv[1]]()
stop = False
def finish(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, finish)
steps, warm_until = [], time.time() + float(sys.argv[4])
while not stop:
    began = time.time()
    block(1)
    torch.cuda.synchronize()
    steps.append((began, time.time()))
    if warm_until and began > warm_until:
        print("warm", flush=True)
        warm_until = 0
json.dump(steps, open(sys.argv[2], "w"))
"""


def node_runtime(work: Path) -> Path:
    """The node install's probe runtime for this interpreter, hooked into a throwaway venv."""
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    root = work / "node-root"
    done = subprocess.run([*CLI, "node", "install", "--python", str(venv / "bin" / "python"), "--root", str(root)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"attach_steps.py: node install failed: {done.stderr.strip()}")
    return root


def attach(pid: int, window: float, root: Path, config: Path) -> tuple[float, float, str]:
    """Attach for ``window`` seconds; the wall times of the ``attached`` and ``detached`` lines, and
    what the attach said. SystemExit names a failed attach."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_")}
    proc = subprocess.Popen([*CLI, "attach", str(pid), "--for", f"{window}s", "-c", str(config), "--root", str(root)],
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert proc.stderr is not None
    attached = detached = 0.0
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "attached to pid" in line:
            attached = time.time()
        elif "detached from pid" in line:
            detached = time.time()
    if proc.wait(120) != 0 or not (attached and detached):
        raise SystemExit(f"attach_steps.py: the attach failed:\n{''.join(lines)}")
    return attached, detached, "".join(lines)


def one_process(
    args: argparse.Namespace, work: Path, name: str, act: Callable[[int], tuple[float, float]]
) -> dict[str, float]:
    """Run the loop, call ``act(pid)`` once it is warm and has run a span (it returns the moments
    the attach began and ended), then time a span after; the medians either side."""
    log = work / f"{name}.json"
    loop = subprocess.Popen([sys.executable, "-c", LOOP, args.workload, str(log), str(BENCH), str(args.warmup)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert loop.stdout is not None
    if loop.stdout.readline() != "warm\n":
        raise SystemExit(f"attach_steps.py: the {args.workload} loop ended before warming up")
    time.sleep(args.span + 0.5)
    began, ended = act(loop.pid)
    time.sleep(1 + args.span + 0.5)
    loop.send_signal(signal.SIGTERM)
    if loop.wait(60) != 0:
        raise SystemExit(f"attach_steps.py: the {args.workload} loop failed")
    steps = json.loads(log.read_text())
    before = [end - start for start, end in steps if began - args.span <= start and end <= began]
    after = [end - start for start, end in steps if ended + 1 <= start and end <= ended + 1 + args.span]
    if len(before) < 10 or len(after) < 10:
        raise SystemExit(
            f"attach_steps.py: too few steps in a span ({len(before)} before, {len(after)} after)"
        )
    return {
        "before_s": statistics.median(before), "after_s": statistics.median(after),
        "ratio": statistics.median(after) / statistics.median(before), "steps": len(before) + len(after),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W2", help="a workload of bench/workloads.py (default W2)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window", type=float, default=5.0, help="seconds attached (default 5)")
    parser.add_argument("--span", type=float, default=5.0, help="seconds timed either side (default 5)")
    parser.add_argument("--warmup", type=float, default=4.0, help="untimed seconds first (default 4)")
    parser.add_argument("--out", type=Path, default=BENCH / "out" / "attach_steps.json")
    args = parser.parse_args()
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = node_runtime(work)
        took = args.window + 1.0  # how long the last attach took; the process left alone waits as long
        for index in range(args.rounds):
            config = work / f"config{index}.json"
            config.write_text(json.dumps({
                "sources": [{"type": "activity", "kinds": ["concurrent_kernel"]}], "probe": {"start": "process"},
                "sinks": [{"type": "file", "directory": str(work / f"window{index}")}],
            }))  # fmt: skip

            def attached(pid: int) -> tuple[float, float]:
                nonlocal took
                began = time.time()
                _, detached, _ = attach(pid, args.window, root, config)  # noqa: B023 (called in this round)
                took = detached - began
                return began, detached

            def alone(pid: int) -> tuple[float, float]:
                began = time.time()
                time.sleep(took)
                return began, time.time()

            order = [("attached", attached), ("alone", alone)]
            result = {name: one_process(args, work, f"{name}{index}", act)
                      for name, act in (order if index % 2 == 0 else reversed(order))}  # fmt: skip
            rounds.append(result)
            print(f"round {index}: after/before attached {result['attached']['ratio']:.3f}, "
                  f"left alone {result['alone']['ratio']:.3f}", flush=True)  # fmt: skip
    relative = [r["attached"]["ratio"] / r["alone"]["ratio"] for r in rounds]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rounds": rounds}))
    print(f"wrote {args.out}")
    print(f"{args.workload}, {args.window:g} s attached, {args.span:g} s spans, {args.rounds} rounds: step after/before "
          f"attached {spread_text([r['attached']['ratio'] for r in rounds], '.3f')}, "
          f"left alone {spread_text([r['alone']['ratio'] for r in rounds], '.3f')}; "
          f"attached/alone {spread_text(relative, '.3f')}")  # fmt: skip


if __name__ == "__main__":
    main()
