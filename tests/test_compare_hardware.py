"""``cuptistream compare`` with PM sampling attributed to kernels: on 8 ranks replayed from the real
capture (``tests/helpers/ranks.py``), each with ``PmKernelStats`` made by the collector's own
attribution from synthetic samples (``tests/helpers/rank_hardware.py``), a slowed rank's longer
kernel is told apart as run less efficiently (its GPU reads lower SM and tensor activity) or as
more work (more launches at the same utilization)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from cuptistream.analysis.compare_hardware import verdicts
from cuptistream.analysis.summary_kernel_hardware import NameTotals
from cuptistream.cli import main
from cuptistream.cupti.names import demangle
from cuptistream.events import PmKernelStats
from tests.helpers.rank_hardware import more_launches, with_hardware
from tests.helpers.ranks import Scale, biggest_kernel, rank_processes, replayed, write_ranks

SLOW_RANK = 5
THROTTLE = 0.6  # the slow rank's SM and tensor activity: 31 % tensor active against 52 %


@pytest.fixture(scope="module")
def gemm() -> str:
    name = biggest_kernel(replayed()[0])
    assert "gemm" in name
    return name


@pytest.fixture(scope="module")
def throttled(tmp_path_factory: pytest.TempPathFactory, gemm: str) -> Path:
    """The slow rank's GEMM takes 1.3 times as long, and its GPU reads 0.6 times the activity."""
    root = tmp_path_factory.mktemp("throttled")
    ranks = rank_processes(8, scale=Scale(SLOW_RANK, gemm, 1.3))
    write_ranks(root, [with_hardware(p, r, THROTTLE if r == SLOW_RANK else 1.0) for r, p in enumerate(ranks)])
    return root


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory, gemm: str) -> Path:
    """The slow rank launches its GEMM twice as often, at the same utilization."""
    root = tmp_path_factory.mktemp("launches")
    ranks = rank_processes(8)
    ranks[SLOW_RANK] = more_launches(ranks[SLOW_RANK], gemm)
    write_ranks(root, [with_hardware(p, r) for r, p in enumerate(ranks)])
    return root


def _json(root: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "compare.json"
    assert main(["compare", str(root / "node*" / "out"), "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def test_throttled_rank_ran_its_gemm_less_efficiently(
    throttled: Path, gemm: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _json(throttled, tmp_path)
    assert [o["rank"] for o in result["outliers"]] == [f"rank {SLOW_RANK}"]
    outlier = result["outliers"][0]
    assert [k["name"] for k in outlier["kernels_longer"]] == [demangle(gemm)]
    (hw,) = outlier["kernels_hardware"]
    assert hw["name"] == demangle(gemm) and hw["verdict"] == "less efficient"
    assert set(hw["lower"]) == {"sm_active", "tensor_active"}  # DRAM activity was not throttled
    assert hw["rank_pct"]["tensor_active"] == pytest.approx(THROTTLE * 52, abs=1)
    assert hw["others_pct"]["tensor_active"] == pytest.approx(52, abs=1) and hw["others"] == 7
    assert hw["rank_pct"]["dram_active"] == pytest.approx(hw["others_pct"]["dram_active"], abs=1)
    assert hw["covered_share"] == 1.0 and hw["rank_count"] == hw["median_count"]
    assert "hardware_rule" in result["meta"]

    assert main(["compare", str(throttled / "node*" / "out")]) == 0
    text = capsys.readouterr().out
    assert f"rank {SLOW_RANK}: straggler" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("less efficient"))
    assert "tensor 31 % vs 52 %" in line and "ran less efficiently" in line and demangle(gemm)[:40] in line

    assert main(["compare", str(throttled / "node*" / "out"), "--format", "csv"]) == 0
    rows = [r for r in csv.reader(io.StringIO(capsys.readouterr().out)) if r[0] == "kernel_hardware"]
    assert [(r[1], r[3]) for r in rows] == [(f"rank {SLOW_RANK}", "less efficient")]


def test_more_launches_at_the_same_utilization(launches: Path, gemm: str, tmp_path: Path) -> None:
    result = _json(launches, tmp_path)
    assert [o["rank"] for o in result["outliers"]] == [f"rank {SLOW_RANK}"]
    (hw,) = result["outliers"][0]["kernels_hardware"]
    assert hw["name"] == demangle(gemm) and hw["verdict"] == "more launches" and hw["lower"] == []
    assert hw["rank_count"] == 2 * hw["median_count"]
    for field in ("sm_active", "tensor_active", "dram_active"):
        assert hw["rank_pct"][field] == pytest.approx(hw["others_pct"][field], abs=1)


def _totals(tensor: float | None, covered: int = 100) -> dict[str, NameTotals]:
    totals = NameTotals()
    totals.add(PmKernelStats(
        interval_start=0, interval_end=10, device_id=0, name="k", kernel_ns=100, covered_ns=covered,
        covered_share=covered / 100, samples=3, metrics=["sm__pipe_tensor_cycles_active_realtime"
        ".avg.pct_of_peak_sustained_elapsed"], mean=[tensor], own_share=1.0, all_share=1.0, traced_ns=10,
    ))  # fmt: skip
    return {"k": totals}


@pytest.mark.parametrize(
    ("tensor", "count", "covered", "verdict"),
    [
        (45.0, 6, 100, "less efficient"),  # 7 points and 13 % below the others' 52
        (50.0, 6, 100, "longer launches"),  # 2 points: within the noise
        (50.0, 7, 100, "more launches"),
        (30.0, 6, 20, "no reading"),  # a fifth of its time covered by samples
    ],
)
def test_verdict_thresholds(tensor: float, count: int, covered: int, verdict: str) -> None:
    longer = [{"name": "k", "rank_count": count, "median_count": 6.0}]
    others = [_totals(52.0), _totals(51.0), _totals(53.0)]
    (got,) = verdicts(longer, _totals(tensor, covered), others, 0.02)
    assert got["verdict"] == verdict and got["others_pct"] == {"tensor_active": 52.0} and got["others"] == 3
