"""GPU acceptance: budget windows that detach CUPTI (``between_windows: detach``) under a two-rank DDP
job, where NCCL's threads call CUDA while the window thread runs ``cuptiFinalize`` (issue 26).

CUPTI's guide warns that other threads inside CUDA calls during ``cuptiFinalize`` can crash; the
single-GPU tests (tests/gpu/test_budget_gpu.py) cover CUDA graphs and Python threads. Here:
``cuptistream run -c <production.yaml, detach, a window every second> -- torchrun --nproc_per_node=2
examples/train_ddp.py``. Every rank must finish all its steps, every window of both ranks after its
first must have attached CUPTI afresh, and no error may be reported. Needs two GPUs; skips on fewer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import cuptistream
from cuptistream.events import Error, TraceWindow
from tests.gpu.test_budget_gpu import CLI, ROOT, _record, detach_config
from tests.gpu.test_compare_gpu import _torchrun

pytestmark = pytest.mark.gpu
WORLD = 2
STEPS = 10000  # train_ddp.py's MLP steps: long enough for several windows (not yet timed on a GPU)


def test_ddp_ranks_finish_while_windows_detach_cupti(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, this machine has {torch.cuda.device_count()}")
    config, out, steps = detach_config(tmp_path), tmp_path / "rec", tmp_path / "steps"
    job = [*_torchrun(), "--standalone", f"--nproc_per_node={WORLD}", str(ROOT / "examples" / "train_ddp.py"),
           "--steps", str(STEPS), "--out", str(steps)]  # fmt: skip
    done = subprocess.run(
        [*CLI, "run", "-c", str(config), "-o", str(out), "--quiet", "--", *job],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(WORLD):
        assert json.loads((steps / f"rank{rank}.json").read_text())["steps"] == STEPS
    fresh: dict[int, list[bool]] = {}
    problems = []
    for batch in cuptistream.read(out).batches():
        for event in batch.events:
            if isinstance(event, TraceWindow) and event.kinds and batch.resource.rank is not None:
                fresh.setdefault(batch.resource.rank, []).append(event.fresh)
            elif isinstance(event, Error) and event.severity != "info":
                problems.append(event.message)
    assert not problems, problems
    assert sorted(fresh) == list(range(WORLD)), fresh
    for rank, windows in fresh.items():
        assert len(windows) >= 5 and all(windows[1:]), (rank, windows)  # each detached after its first
    _record("ddp_detach.json", {"windows": {r: len(w) for r, w in fresh.items()}, "steps": STEPS})
