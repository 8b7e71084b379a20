"""GPU acceptance of ``cuptistream attach PID --for 10s`` on W2 (``bench/workloads.py``'s MLP SGD
step) looping in a process started as plain ``python``, without cuptistream:

- the recording holds every kernel launched by the steps wholly inside the window (as many as a
  step of the same loop launches under ``cuptistream run``), and none from before the attach or
  after the detach;
- the loop keeps running, and its step time after the detach is back within noise of before (CUPTI
  finalized: no per-launch cost left);
- a loop that replays a CUDA graph captured before the attach keeps replaying it after the detach.

Run on the GPU machine with cuptistream installed (``python -m pytest tests/gpu/test_attach_gpu.py``).
Needs ptrace (root, or ptrace_scope 0/1 with the loop as this user's process).
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import cuptistream
from cuptistream.events import Kernel

pytestmark = pytest.mark.gpu
CLI = [sys.executable, "-m", "cuptistream.cli"]
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from attach_steps import attach, node_runtime  # noqa: E402  (the benchmark's attach, timed the same way)

WINDOW_S = 10

# Each step logs its wall-clock begin and end (it ends synchronized: its kernels ran in between).
WORKLOAD = r"""
import json, sys, time, torch
seconds, log, mode = float(sys.argv[1]), open(sys.argv[2], "w", buffering=1), sys.argv[3]
if mode == "w2":
    sys.path.insert(0, sys.argv[4])
    from workloads import w2_mlp_sgd
    block = w2_mlp_sgd()
    step = lambda: block(1)
else:  # a CUDA graph of 50 kernels, captured now
    y = torch.zeros(1 << 16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(50):
                y.add_(1)
    step = g.replay
end = time.time() + seconds
while time.time() < end:
    began = time.time()
    step()
    torch.cuda.synchronize()
    log.write(json.dumps([began, time.time()]) + "\n")
print("ok", flush=True)
"""


def _gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _config(tmp_path: Path, out: str) -> Path:
    config = tmp_path / f"{out}.json"
    config.write_text(json.dumps({
        "sources": [{"type": "activity", "kinds": ["concurrent_kernel"]}], "probe": {"start": "process"},
        "sinks": [{"type": "file", "directory": str(tmp_path / out)}],
    }))  # fmt: skip
    return config


def _steps(log: Path) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in map(json.loads, log.read_text().splitlines())]


def _kernels_per_step(out: Path, steps: list[tuple[float, float]]) -> tuple[list[int], int]:
    """Kernels per step (a kernel goes to the step begun last before its midpoint, on the wall
    clock), and those before the first step begun."""
    begins = [began for began, _ in steps]
    counts, before = [0] * len(steps), 0
    for batch in cuptistream.read(out).batches():
        offset = batch.clock.offset_ns
        for event in batch.events:
            if isinstance(event, Kernel):
                at = bisect.bisect_right(begins, (event.start + event.end) / 2e9 + offset / 1e9) - 1
                if at < 0:
                    before += 1
                else:
                    counts[at] += 1
    return counts, before


def _kernels_of_a_w2_step(tmp_path: Path) -> int:
    """What one step of the loop launches, from the same loop recorded whole under ``run``."""
    log, config = tmp_path / "reference.jsonl", _config(tmp_path, "reference")
    done = subprocess.run([*CLI, "run", "--quiet", "-c", str(config), "--", sys.executable, "-c", WORKLOAD, "4",
                           str(log), "w2", str(BENCH)], capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    counts, _ = _kernels_per_step(tmp_path / "reference", _steps(log))
    usual, times = Counter(counts[10:]).most_common(1)[0]  # the first steps build state
    assert usual > 0 and times >= 0.95 * len(counts[10:]), Counter(counts)
    return usual


def _wait_for_steps(log: Path, seconds: float) -> None:
    """Until the loop has logged steps for ``seconds`` (its start-up, torch's import included, varies)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        steps = _steps(log) if log.exists() else []
        if steps and steps[-1][1] - steps[0][0] >= seconds:
            return
        time.sleep(0.5)
    raise AssertionError("the loop logged no steps in 120 s")


def test_attach_records_the_window_only_and_the_loop_runs_on_at_its_speed(tmp_path: Path) -> None:
    _gpu()
    per_step = _kernels_of_a_w2_step(tmp_path)
    root, config, log = node_runtime(tmp_path), _config(tmp_path, "out"), tmp_path / "steps.jsonl"
    loop = subprocess.Popen([sys.executable, "-c", WORKLOAD, "60", str(log), "w2", str(BENCH)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    _wait_for_steps(log, seconds=12)  # warm up and measure before
    threads_before = len(os.listdir(f"/proc/{loop.pid}/task"))
    began = time.time()
    attached, detached, stderr = attach(loop.pid, WINDOW_S, root, config)
    time.sleep(2)
    threads_after = len(os.listdir(f"/proc/{loop.pid}/task"))  # printed: a thread the probe left shows here
    out, _ = loop.communicate(timeout=120)
    assert loop.returncode == 0 and out == "ok\n"
    assert "CUPTI finalized" in stderr, stderr
    steps = _steps(log)
    counts, before = _kernels_per_step(tmp_path / "out", steps)
    # The probe started before the ``attached`` line; the window closes WINDOW_S after it started.
    inside = [n for (start, end), n in zip(steps, counts, strict=True)
              if start >= attached and end <= attached + WINDOW_S - 0.1]  # fmt: skip
    outside = sum(n for (start, end), n in zip(steps, counts, strict=True) if end < began or start > detached)
    print(f"W2: {per_step} kernels a step; {len(inside)} steps inside the window, {sum(inside)} kernels")
    assert len(inside) > 100 and sum(inside) == per_step * len(inside), Counter(inside)
    assert before == 0 and outside == 0, (before, outside)
    # Equal spans either side of the window, away from the loop's warm-up and from the attach.
    took_before = [end - start for start, end in steps if began - 7 < start and end < began - 1]
    took_after = [end - start for start, end in steps if detached + 1 < start and end < detached + 7]
    ratio = statistics.median(took_after) / statistics.median(took_before)
    print(f"step time after/before detach: {ratio:.3f} ({len(took_before)} / {len(took_after)} steps); "
          f"threads {threads_before} before, {threads_after} after")  # fmt: skip
    assert ratio < 1.10, ratio


def test_a_cuda_graph_captured_before_the_attach_replays_after_the_detach(tmp_path: Path) -> None:
    _gpu()
    root, config, log = node_runtime(tmp_path), _config(tmp_path, "out"), tmp_path / "steps.jsonl"
    loop = subprocess.Popen([sys.executable, "-c", WORKLOAD, "20", str(log), "graph"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(3)
    _, detached, stderr = attach(loop.pid, WINDOW_S, root, config)
    out, err = loop.communicate(timeout=120)
    assert loop.returncode == 0 and out == "ok\n", err
    assert any(start > detached for start, _ in _steps(log)), "no replay after the detach"
    assert "CUDA graph" in stderr, f"the detach must say why CUPTI stayed attached:\n{stderr}"
    print(stderr)
