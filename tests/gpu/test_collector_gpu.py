"""GPU acceptance for the probe/collector split. Runs on a GPU machine.

Every test runs a real program under ``cuptistream run`` (the program is the probe, the CLI process
the collector) and counts what arrived against what the program did, with exact launch counts from
NVRTC kernels (``tests/gpu/workloads/exact_counts.py``).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import cuptistream
from cuptistream.events import ApiCall, Kernel, Loss

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _default_activity() -> dict[str, Any]:
    default = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    return next(s for s in default["sources"] if s["type"] == "activity")


def _run(
    tmp_path: Path, source: dict[str, Any], program: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    cfg = {"sources": [source], "sinks": [{"type": "file", "directory": str(tmp_path / "out")}]}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp_path / "cfg.yaml"), "--report-json",
         str(report), "--", sys.executable, "-c", program, *args],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc, (json.loads(report.read_text()) if report.exists() else {})


LAUNCHES = r"""
import json, sys
from tests.gpu.workloads import exact_counts as w
n, replays, graph_kernels = (int(a) for a in sys.argv[1:4])
print(json.dumps(w.run(n, 0, 0, replays, graph_kernels)), flush=True)
"""


def test_default_filters_keep_about_one_api_call_per_kernel(tmp_path: Path) -> None:
    proc, report = _run(tmp_path, _default_activity(), LAUNCHES, "10000", "200", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = list(cuptistream.read(tmp_path / "out"))
    kernels = [e for e in events if isinstance(e, Kernel)]
    calls = [e for e in events if isinstance(e, ApiCall)]
    names = collections.Counter(c.name for c in calls)
    print(f"kernels={len(kernels)} api_calls={len(calls)} per kernel={len(calls) / len(kernels):.2f} "
          f"top={names.most_common(6)} report={report}")  # fmt: skip
    assert len(kernels) == 10_000 + 200 * 3
    # One launch record per NVRTC launch and one per graph launch; the unfiltered API gave ~7.
    assert len(calls) / len(kernels) < 1.5, names.most_common(10)
    launch_ids = collections.Counter(c.correlation_id for c in calls if "Launch" in c.name)
    assert all(launch_ids[k.correlation_id] == 1 for k in kernels if k.graph_id == 0)


@pytest.mark.parametrize("pool", ["default", "tiny"])
def test_every_kernel_is_an_event_or_a_counted_loss_at_graph_rates(tmp_path: Path, pool: str) -> None:
    source: dict[str, Any] = {"type": "activity", "kinds": ["concurrent_kernel"]}
    if pool == "tiny":  # two 64 KiB buffers: CUPTI must drop, and every drop must be counted
        source |= {"buffer_size": "64KiB", "buffer_pool_limit": 2}
    replays, per_graph = 20_000, 50
    proc, report = _run(tmp_path, source, LAUNCHES, "0", str(replays), str(per_graph))
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = list(cuptistream.read(tmp_path / "out"))
    kernels = sum(1 for e in events if isinstance(e, Kernel))
    dropped = sum(
        e.count for e in events if isinstance(e, Loss) and e.stage == "cupti" and e.unit == "records"
    )
    other = [e for e in events if isinstance(e, Loss) and e.stage != "cupti"]
    print(f"pool={pool} kernels={kernels} cupti_dropped={dropped} other_losses={other} report={report}")
    assert kernels + dropped == replays * per_graph
    assert not other
    if pool == "tiny":
        assert dropped > 0, "the tiny pool caused no drops; the test proves nothing"


KILLED = r"""
import json, os, signal, sys, time
from tests.gpu.workloads import exact_counts as w
did = w.run(int(sys.argv[1]), 0, 0, 0, 0)
print(json.dumps(did), flush=True)
time.sleep(1.5)  # flush_interval 0.2 s: CUPTI completes the buffers, the probe hands them over
if sys.argv[2] == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
elif sys.argv[2] == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
os._exit(3)
"""


@pytest.mark.parametrize(("how", "code"), [("sigkill", 128 + 9), ("segv", 128 + 11), ("os_exit", 3)])
def test_a_dying_program_loses_no_completed_buffer(tmp_path: Path, how: str, code: int) -> None:
    source = {"type": "activity", "kinds": ["concurrent_kernel"], "flush_interval": "200ms"}
    proc, report = _run(tmp_path, source, KILLED, "20000", how)
    assert proc.returncode == code, proc.stderr[-3000:]
    kernels = [e for e in cuptistream.read(tmp_path / "out") if isinstance(e, Kernel)]
    named = [k for k in kernels if k.name == "cs_exact_kernel"]
    print(f"{how}: exit {proc.returncode}, kernels {len(named)}, report {report}")
    assert len(named) == 20_000
