"""GPU acceptance of ``cuptistream attach PID --for 5s`` on a torch step loop started as plain
``python``, without cuptistream:

- the recording holds every kernel launched by the steps wholly inside the window, and none from
  before the attach or after the detach;
- the loop keeps running, and its step time after the detach is back within noise of before (CUPTI
  finalized: no per-launch cost left);
- a loop that replays a CUDA graph captured before the attach keeps replaying it after the detach.

Run on the GPU machine from a directory outside the checkout, with cuptistream installed
(``python -m pytest tests/gpu/test_attach_gpu.py``). Needs ptrace (root, or ptrace_scope 0/1 with
the loop as this user's process).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cuptistream
from cuptistream.events import Kernel

pytestmark = pytest.mark.gpu
CLI = [sys.executable, "-m", "cuptistream.cli"]

# Every step launches 50 kernels (one per ``add_``) and logs its end time, duration and launches.
WORKLOAD = r"""
import json, sys, time, torch
seconds, log, graph = float(sys.argv[1]), open(sys.argv[2], "w", buffering=1), sys.argv[3] == "graph"
y = torch.zeros(1 << 16, device="cuda")
if graph:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(50):
                y.add_(1)
end = time.time() + seconds
while time.time() < end:
    began = time.perf_counter()
    if graph:
        g.replay()
    else:
        for _ in range(50):
            y.add_(1)
    torch.cuda.synchronize()
    log.write(json.dumps([time.time(), time.perf_counter() - began, 50]) + "\n")
print("ok", flush=True)
"""


def _gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _runtime(tmp_path: Path) -> Path:
    """The node install's probe runtime for this interpreter, hooked into a throwaway venv only."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    root = tmp_path / "node-root"
    done = subprocess.run([*CLI, "node", "install", "--python", str(tmp_path / "venv" / "bin" / "python"),
                           "--root", str(root)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "attach.json"
    config.write_text(json.dumps({
        "sources": [{"type": "activity", "kinds": ["concurrent_kernel"]}], "probe": {"start": "process"},
        "sinks": [{"type": "file", "directory": str(tmp_path / "out")}],
    }))  # fmt: skip
    return config


def _attach(pid: int, root: Path, config: Path) -> tuple[float, float, str]:
    """Run the attach; the wall times of its ``attached`` and ``detached`` lines, and its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_")}
    attach = subprocess.Popen([*CLI, "attach", str(pid), "--for", "5s", "-c", str(config), "--root", str(root)],
                              stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert attach.stderr is not None
    attached = detached = 0.0
    lines = []
    for line in attach.stderr:
        lines.append(line)
        if "attached to pid" in line:
            attached = time.time()
        if "detached from pid" in line:
            detached = time.time()
    assert attach.wait(120) == 0, "".join(lines)
    assert attached and detached, "".join(lines)
    return attached, detached, "".join(lines)


def _steps(log: Path) -> list[tuple[float, float, int]]:
    return [(float(a), float(b), int(c)) for a, b, c in map(json.loads, log.read_text().splitlines())]


def test_attach_records_the_window_only_and_the_loop_runs_on_at_its_speed(tmp_path: Path) -> None:
    _gpu()
    root, config, log = _runtime(tmp_path), _config(tmp_path), tmp_path / "steps.jsonl"
    loop = subprocess.Popen([sys.executable, "-c", WORKLOAD, "25", str(log), "plain"], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    time.sleep(8)  # warm up and measure before
    began = time.time()
    attached, detached, stderr = _attach(loop.pid, root, config)
    out, _ = loop.communicate(timeout=120)
    assert loop.returncode == 0 and out == "ok\n"
    assert "CUPTI finalized" in stderr, stderr
    steps = _steps(log)
    kernels = [e for e in cuptistream.read(tmp_path / "out") if isinstance(e, Kernel)]
    # The probe started before the ``attached`` line; the window closes 5 s after it started.
    inside = sum(n for end, took, n in steps if end - took >= attached and end <= attached + 4.9)
    overlapping = sum(n for end, took, n in steps if end >= began and end - took <= detached)
    assert inside > 0 and inside <= len(kernels) <= overlapping, (inside, len(kernels), overlapping)
    before = [took for end, took, _ in steps if end < began - 1]
    after = [took for end, took, _ in steps if end - took > detached + 1]
    ratio = statistics.median(after) / statistics.median(before)
    print(f"step time after/before detach: {ratio:.3f} ({len(before)} / {len(after)} steps)")
    assert ratio < 1.10, ratio


def test_a_cuda_graph_captured_before_the_attach_replays_after_the_detach(tmp_path: Path) -> None:
    _gpu()
    root, config, log = _runtime(tmp_path), _config(tmp_path), tmp_path / "steps.jsonl"
    loop = subprocess.Popen([sys.executable, "-c", WORKLOAD, "15", str(log), "graph"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(3)
    _, detached, stderr = _attach(loop.pid, root, config)
    out, err = loop.communicate(timeout=120)
    assert loop.returncode == 0 and out == "ok\n", err
    assert any(end - took > detached for end, took, _ in _steps(log)), "no replay after the detach"
    assert "CUDA graph" in stderr, f"the detach must say why CUPTI stayed attached:\n{stderr}"
    print(stderr)
