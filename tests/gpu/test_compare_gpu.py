"""GPU acceptance of ``cuptistream compare``, on one H100 or H200.

Four ranks share the GPU in lockstep (``tests/gpu/workloads/slow_rank.py``, torchrun, gloo) under
``cuptistream run``; one rank gets extra fp16 matmuls that make the job's step 5, 10 or 20 % longer. For
each slowdown ``compare`` must flag that rank alone and name the injected kernel (a kernel only that
rank launches) first among the kernels that take longer on it; a run without injection must flag
nobody. The stated cause may be compute time (on the work basis: the four ranks share one GPU, which
time-slices them, so ``compare`` says so in ``shared_devices``) or a different kernel count: the
injected work shows as extra kernels either way. torchrun's launcher process (no rank, no GPU work)
is listed in ``ignored``, not compared. Each check runs in ``full`` mode (raw records) and in always-on
mode (``configs/production.yaml``: statistics from budget windows, every rank's numbers estimates).
About 8 minutes in all.

``check_clean`` and ``check_slow`` are the assertions; ``tests/test_compare.py`` runs them on the
recorded results of an H100 run (``tests/fixtures/compare/gloo_4_ranks_one_gpu``).

With ``CUPTISTREAM_GPU_RESULTS=DIR`` each run's ``compare`` JSON and the workload's calibration are
written to ``DIR/compare_slow_rank_<pct>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
# ``full`` records every kernel; ``always-on`` is configs/production.yaml: budget windows of about 1 %
# of the time, statistics only, so ``compare`` works from estimates and needs a longer run.
MODES = {
    "full": (ROOT / "configs" / "default.yaml", 20, "5s"),
    "always-on": (ROOT / "configs" / "production.yaml", 40, "10s"),
}
WORKLOAD = ROOT / "tests" / "gpu" / "workloads" / "slow_rank.py"
CLI = [sys.executable, "-m", "cuptistream.cli"]
SLOW_RANK = 2


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _torchrun() -> list[str]:
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def run_slow_rank(
    tmp_path: Path,
    slowdown: float,
    mode: str,
    *,
    world: int = 4,
    slow_rank: int = SLOW_RANK,
    backend: str = "gloo",
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``slow_rank.py`` on ``world`` ranks under ``cuptistream run`` in ``mode``, then ``compare``:
    its JSON and each rank's workload calibration (also kept under ``CUPTISTREAM_GPU_RESULTS``)."""
    pytest.importorskip("torch")
    config, seconds, interval = MODES[mode]
    out, info = tmp_path / "rec", tmp_path / "workload"
    run = subprocess.run(
        [*CLI, "run", "-c", str(config), "-o", str(out), "--quiet", "--", *_torchrun(), "--standalone",
         f"--nproc_per_node={world}", str(WORKLOAD), "--backend", backend, "--slow-rank", str(slow_rank),
         "--slowdown", str(slowdown), "--seconds", str(seconds), "--out", str(info)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result_path = tmp_path / "compare.json"
    compare = subprocess.run(
        [*CLI, "compare", str(out), "--interval", interval, "--format", "json", "-o", str(result_path)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert compare.returncode == 0, compare.stderr[-3000:]
    result = json.loads(result_path.read_text())
    ranks = [json.loads((info / f"rank{r}.json").read_text()) for r in range(world)]
    prefix = "compare" if backend == "gloo" else f"compare_{backend}"
    keep_result(
        f"{prefix}_{mode}_slow_rank_{round(100 * slowdown)}.json", {"workload": ranks, "compare": result}
    )
    return result, ranks


def keep_result(name: str, data: object) -> None:
    """Write ``data`` as JSON to ``$CUPTISTREAM_GPU_RESULTS/name`` when that variable is set."""
    if results := os.environ.get("CUPTISTREAM_GPU_RESULTS"):
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / name).write_text(json.dumps(data, indent=1))


def _job(result: dict[str, Any]) -> None:
    """The four ranks are compared, sharing one GPU; anything else (the launcher) is ignored."""
    assert [r["rank"] for r in result["total"]["ranks"]] == [f"rank {i}" for i in range(4)]
    assert all(i["rank"].startswith("pid ") for i in result["ignored"]), result["ignored"]
    (shared,) = result["shared_devices"]
    assert shared["ranks"] == [f"rank {i}" for i in range(4)] and shared["uuid"].startswith("GPU-"), shared


def check_clean(result: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    _job(result)
    assert len({w["steps"] for w in ranks}) == 1  # lockstep
    assert result["outliers"] == [], result["outliers"]
    assert result["total"]["flags"] == [], result["total"]["flags"]


def check_slow(result: dict[str, Any], ranks: list[dict[str, Any]], estimated: bool = False) -> None:
    _job(result)
    slow = ranks[SLOW_RANK]
    assert slow["n_extra"] >= 1 and slow["injected_matmuls"] == slow["n_extra"] * slow["steps"] + 21
    assert [o["rank"] for o in result["outliers"]] == [f"rank {SLOW_RANK}"], result["outliers"]
    outlier = result["outliers"][0]
    high = {m["metric"] for m in outlier["metrics"] if m["direction"] == "high"}
    # The cause: more compute time, or more kernels (different work): on a time-sliced GPU the
    # extra work shows as extra kernels, and its time on the work basis.
    assert high & {"compute_ns", "kernels"}, outlier["metrics"]
    assert outlier["cause"].startswith("straggler") or "different number of kernels" in outlier["cause"]
    top = outlier["kernels_longer"][0]
    # The injected kernel: only the slow rank launches it, once or more per injected matmul. From
    # statistics the count is an estimate scaled from about 1 % of the time: within 30 %.
    least = 0.7 * slow["injected_matmuls"] if estimated else slow["injected_matmuls"]
    assert top["median_count"] == 0 and top["rank_count"] >= least, top
    assert top["median_ns"] == 0 and top["diff_ns"] == top["rank_ns"] > 0, top


def _statistics_only(result: dict[str, Any]) -> None:
    """Always-on mode: every rank was compared from the collector's statistics, as estimates."""
    for row in result["total"]["ranks"]:
        assert row["basis"].startswith("statistics (estimated"), row


@pytest.mark.parametrize("mode", list(MODES))
def test_no_injection_flags_nobody(tmp_path: Path, mode: str) -> None:
    result, ranks = run_slow_rank(tmp_path, 0.0, mode)
    check_clean(result, ranks)
    if mode == "always-on":
        _statistics_only(result)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("slowdown", [0.05, 0.10, 0.20])
def test_names_the_slow_rank_and_the_injected_kernel(tmp_path: Path, slowdown: float, mode: str) -> None:
    result, ranks = run_slow_rank(tmp_path, slowdown, mode)
    check_slow(result, ranks, estimated=mode == "always-on")
    if mode == "always-on":
        _statistics_only(result)
