"""GPU acceptance of ``cuptistream compare`` and ``export`` across GPUs with NCCL.

Needs a host with two GPUs or more; on fewer it skips, and the one-GPU version is
``tests/gpu/test_compare_gpu.py``. One rank per GPU (up to 4) under ``torchrun`` in
``tests/gpu/workloads/slow_rank.py --backend nccl``: each step's gradient is all-reduced with NCCL on
the GPU, so the peers of a slowed rank wait for it inside the NCCL kernel. Per mode (``full``, and the
always-on ``configs/production.yaml``, as in the one-GPU test):

- without injection ``compare`` flags nobody;
- at 5, 10 and 20 % it flags the slowed rank alone, names the injected kernel first, and every peer
  shows more NCCL time than the slowed rank (they waited for it);
- ``full`` mode, no injection: ``cuptistream export`` of the job puts the ends of the kernels of one
  NCCL all-reduce (the n-th on every rank) within 1 ms of each other across the ranks' tracks. The
  ends, because a collective completes together on every rank, while a rank that arrived first
  started its kernel earlier and waited.

With ``CUPTISTREAM_GPU_RESULTS=DIR`` each run's ``compare`` JSON, the workload's calibration and the
export's alignment are written to ``DIR``. With two ranks the median rule (which needs 3) cannot
flag either, so a pair is compared as a pair (``outliers.flag_pair``).
"""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.test_compare_gpu import CLI, MODES, _env, keep_result, run_slow_rank

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SLOW_RANK = 1
ALIGNED_NS = 1_000_000  # one collective's kernel ends across ranks, 95th percentile


@pytest.fixture(scope="module")
def world() -> int:
    torch = pytest.importorskip("torch")
    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip(f"needs 2 or more GPUs, this machine has {gpus}")
    return min(gpus, 4)


def _job(result: dict[str, Any], world: int) -> None:
    """Every rank compared, each on a GPU of its own (nothing time-sliced)."""
    assert [r["rank"] for r in result["total"]["ranks"]] == [f"rank {i}" for i in range(world)]
    assert result["shared_devices"] == [], result["shared_devices"]


def check_clean(result: dict[str, Any], ranks: list[dict[str, Any]], world: int) -> None:
    _job(result, world)
    assert len({w["steps"] for w in ranks}) == 1  # lockstep
    assert result["outliers"] == [] and result["total"]["flags"] == [], result["outliers"]
    assert all(row["nccl_ns"] > 0 for row in result["total"]["ranks"]), result["total"]["ranks"]


def check_slow(result: dict[str, Any], ranks: list[dict[str, Any]], world: int, estimated: bool) -> None:
    _job(result, world)
    slow = ranks[SLOW_RANK]
    assert slow["n_extra"] >= 1
    assert [o["rank"] for o in result["outliers"]] == [f"rank {SLOW_RANK}"], result["outliers"]
    outlier = result["outliers"][0]
    assert outlier["cause"].startswith("straggler"), outlier["cause"]
    top = outlier["kernels_longer"][0]
    least = 0.7 * slow["injected_matmuls"] if estimated else slow["injected_matmuls"]
    assert top["median_count"] == 0 and top["rank_count"] >= least, top
    rows = {row["rank_id"]: row for row in result["total"]["ranks"]}
    waited = [rows[r]["nccl_ns"] for r in rows if r != SLOW_RANK]
    assert min(waited) > rows[SLOW_RANK]["nccl_ns"], rows  # the peers waited for it in NCCL


@pytest.mark.parametrize("mode", list(MODES))
def test_no_injection_flags_nobody_across_gpus(tmp_path: Path, world: int, mode: str) -> None:
    result, ranks = run_slow_rank(tmp_path, 0.0, mode, world=world, slow_rank=SLOW_RANK, backend="nccl")
    check_clean(result, ranks, world)
    if mode == "full":
        spread = collective_end_spread(tmp_path / "rec", tmp_path / "trace.json.gz", world)
        keep_result("export_nccl_alignment.json", spread)
        assert spread["p95_ns"] <= ALIGNED_NS, spread


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("slowdown", [0.05, 0.10, 0.20])
def test_names_the_slow_rank_and_its_peers_wait_in_nccl(
    tmp_path: Path, world: int, slowdown: float, mode: str
) -> None:
    result, ranks = run_slow_rank(tmp_path, slowdown, mode, world=world, slow_rank=SLOW_RANK, backend="nccl")
    check_slow(result, ranks, world, estimated=mode == "always-on")


def collective_end_spread(recording: Path, trace: Path, world: int) -> dict[str, Any]:
    """Export the job, pair the n-th NCCL kernel of every rank's track, and measure how far apart
    their ends are (ns): the same collective, so one clock puts them together."""
    export = subprocess.run(
        [*CLI, "export", str(recording), "-o", str(trace)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]
    with gzip.open(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    ends: dict[int, list[float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "nccl" in e["name"].lower():
            ends.setdefault(e["pid"], []).append(e["ts"] + e["dur"])  # microseconds
    assert len(ends) == world, sorted(ends)
    counts = {pid: len(v) for pid, v in ends.items()}
    assert len(set(counts.values())) == 1, counts  # every rank ran the same collectives
    columns = [sorted(v) for v in ends.values()]
    spreads = sorted(round(1000 * (max(c) - min(c))) for c in zip(*columns, strict=True))
    return {
        "collectives": len(spreads),
        "median_ns": statistics.median(spreads),
        "p95_ns": spreads[int(0.95 * (len(spreads) - 1))],
        "max_ns": spreads[-1],
    }
