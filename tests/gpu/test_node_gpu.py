"""GPU acceptance of the node install: W2 (``bench/workloads.py``, an MLP training loop) started as
plain ``python`` from a venv whose only trace of cuptistream is the hook's line, with a node
collector running ``configs/production.yaml``, is recorded as it is under ``cuptistream run`` with
the same config: budget windows, kernel statistics with the same kernels at the same estimated
kernels per step, and its pid. The venv sees torch (the system's site-packages, or the folder
torch was imported from as its only ``PYTHONPATH``) and nothing of ours. About 70 s on an H100.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import cuptistream
from cuptistream.events import ActivityStats, TraceWindow
from tests.helpers.node_collector import CLI, Collector, write_node_config

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SECONDS = 20


def _config(path: Path, out: Path) -> Path:
    """configs/production.yaml with its file sink writing to ``out``."""
    cfg = yaml.safe_load((ROOT / "configs" / "production.yaml").read_text())
    cfg["sinks"][0]["directory"] = str(out)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _workload(python: str) -> list[str]:
    return [python, str(ROOT / "bench" / "workloads.py"), "--workload", "W2", "--seconds", str(SECONDS)]


def _profile(out: Path, iterations: int) -> dict[str, Any]:
    """What the recording says of the run: windows, kernels per step by name (estimated), pids."""
    batches = list(cuptistream.read(out).batches())
    events = [e for b in batches for e in b.events]
    stats = [e for e in events if isinstance(e, ActivityStats) and e.category == "kernel"]
    per_step: dict[str, float] = {}
    for s in stats:
        per_step[s.name] = per_step.get(s.name, 0.0) + s.estimated_count / iterations
    return {
        "windows": sum(1 for e in events if isinstance(e, TraceWindow) and e.kinds and not e.on_demand),
        "per_step": per_step,
        "pids": {b.resource.pid for b in batches if any(isinstance(e, ActivityStats) for e in b.events)},
        "estimated": all(s.estimated for s in stats),
    }


def _top(per_step: dict[str, float]) -> dict[str, float]:
    return dict(sorted(per_step.items(), key=lambda item: -item[1])[:5])


def test_a_plain_python_under_the_node_hook_is_recorded_like_a_wrapped_one(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True
    )
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_") and k != "PYTHONPATH"}
    # torch where the system has it, even if only on PYTHONPATH; nothing of ours beside it.
    torch_site = str(Path(torch.__file__).parents[1])
    if not (Path(torch_site) / "cuptistream").exists():
        env["PYTHONPATH"] = torch_site
    installed = subprocess.run(
        [*CLI, "node", "install", "--python", python, "--root", str(tmp_path / "node-root")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    ours = subprocess.run([python, "-c", "import cuptistream"], env=env, capture_output=True, text=True)
    assert ours.returncode != 0, "the venv must not see cuptistream but through the hook"

    # Hooked: a node collector, the node config, and the program started as plain python.
    hooked_out, socket_path = tmp_path / "hooked", tmp_path / "c.sock"
    config = _config(tmp_path / "node-probes.yaml", hooked_out)
    node = write_node_config(tmp_path / "node.yaml", socket_path, config, "cuda")
    collector = Collector(config, socket_path, tmp_path / "r.json")
    try:
        hooked = subprocess.run(
            _workload(python), env={**env, "CUPTISTREAM_NODE_CONFIG": str(node)},
            capture_output=True, text=True, timeout=SECONDS + 90,
        )  # fmt: skip
    finally:
        report = collector.stop()
    assert hooked.returncode == 0 and hooked.stderr == "", hooked.stderr[-3000:]
    assert report["probes"] == 1, report

    # Wrapped: the same program under `cuptistream run` with the same config.
    wrapped_out = tmp_path / "wrapped"
    wrapped = subprocess.run(
        [*CLI, "run", "-c", str(_config(tmp_path / "run.yaml", wrapped_out)), "--quiet", "--",
         *_workload(sys.executable)],
        capture_output=True, text=True, timeout=SECONDS + 90,
    )  # fmt: skip
    assert wrapped.returncode == 0, wrapped.stderr[-3000:]

    runs: dict[str, dict[str, Any]] = {}
    for name, done, out in (("hooked", hooked, hooked_out), ("wrapped", wrapped, wrapped_out)):
        timing = json.loads(done.stdout.strip().splitlines()[-1])
        runs[name] = _profile(out, timing["iterations"])
    print({name: {**run, "per_step": _top(run["per_step"])} for name, run in runs.items()})
    hooked_run, wrapped_run = runs["hooked"], runs["wrapped"]
    assert hooked_run["windows"] >= 3 and wrapped_run["windows"] >= 3
    assert hooked_run["estimated"] and wrapped_run["estimated"]
    assert len(hooked_run["pids"]) == 1
    # The same kernels, at the same estimated count per step (estimates from ~1 % of 20 s: ±35 %).
    top = list(_top(wrapped_run["per_step"]))
    assert set(top) <= set(hooked_run["per_step"]), (top, list(hooked_run["per_step"]))
    total_hooked, total_wrapped = sum(hooked_run["per_step"].values()), sum(wrapped_run["per_step"].values())
    assert 0.65 < total_hooked / total_wrapped < 1.35, (total_hooked, total_wrapped)
