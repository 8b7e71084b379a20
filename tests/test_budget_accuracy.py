"""bench/budget_accuracy.py's comparison (the GPU run's verdict) on real statistics: the collector's
statistics of the shipped captures, replayed through ``cuptistream run``, against themselves and
against a copy with one kernel's time and the counts changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import budget_accuracy  # noqa: E402
from budget_accuracy import compare, statistics_of, workload_lines  # noqa: E402

import cuptistream  # noqa: E402
from cuptistream.events import ActivityStats, GpuStats  # noqa: E402


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> list[object]:
    out = tmp_path_factory.mktemp("rec") / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(ROOT / "configs" / "replay.yaml"), "-o", str(out),
         "--quiet", "--", sys.executable, "-c", "import time; time.sleep(1)"],
        cwd=out.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(cuptistream.read(out))


def test_a_recording_agrees_with_itself(replayed: list[object]) -> None:
    stats = statistics_of(replayed)
    assert stats["kernels"] > 0 and len(stats["shares"]) >= 10
    assert abs(sum(stats["shares"].values()) - 100.0) < 1e-6
    verdict = compare(stats, stats, {"full": 100, "budget": 100})
    assert verdict["pass"] and verdict["top10_worst_points"] == 0 and verdict["kernel_count_error"] == 0


def test_a_moved_share_and_a_lower_count_are_misses(replayed: list[object]) -> None:
    full = statistics_of(replayed)
    top = max(full["shares"], key=full["shares"].get)
    changed = [
        msgspec.structs.replace(e, estimated_total_ns=3 * e.total_ns, estimated_count=e.count, estimated=True)
        if isinstance(e, ActivityStats) and e.name == top else e
        for e in replayed
    ]  # fmt: skip
    budget = statistics_of(changed)
    verdict = compare(full, budget, {"full": 100, "budget": 100})
    assert verdict["top10_worst_points"] > 2 and not verdict["pass"]
    fewer = compare(full, full, {"full": 100, "budget": 110})  # 10 % more iterations, same kernels
    assert fewer["kernel_count_error"] == pytest.approx(-1 / 11) and not fewer["pass"]


def test_busy_is_the_mean_over_the_run_not_over_the_traced_time() -> None:
    """Two 10 s intervals, one traced 1 s at 80 % busy, one traced 0.1 s at 20 %: the run was about
    50 % busy. Weighting by traced time (74.5 %) reads the phase with the longer windows as the run."""
    second = 1_000_000_000

    def interval(index: int, traced_s: float, busy: float) -> GpuStats:
        traced = round(traced_s * second)
        return GpuStats(
            interval_start=index * 10 * second, interval_end=(index + 1) * 10 * second, device_id=0,
            traced_ns=traced, traced_fraction=traced / (10 * second), busy_ns=round(busy * traced),
            busy_fraction=busy, kernel_ns=0, nccl_ns=0, copy_ns=0, memset_ns=0, kernels=0, copies=0,
            memsets=0, estimated=True,
        )  # fmt: skip

    stats = statistics_of([interval(0, 1.0, 0.8), interval(1, 0.1, 0.2)])
    assert stats["busy"] == pytest.approx(50.0)
    assert stats["traced_fraction"] == pytest.approx(0.055)


def test_busy_at_equal_rate_discounts_the_full_traces_slowdown(replayed: list[object]) -> None:
    """The same GPU work per iteration, the full run 1.25x slower: its busy reads 80 % of the
    budget run's, and at equal rate they agree."""
    stats = statistics_of(replayed)
    slower = {**stats, "busy": 0.8 * stats["busy"]}
    verdict = compare(slower, stats, {"full": 800, "budget": 1000})
    assert verdict["busy_points"]["full_at_budget_rate"] == pytest.approx(stats["busy"])
    assert verdict["busy_points"]["diff_at_equal_rate"] == pytest.approx(0.0, abs=1e-9)
    assert verdict["iterations_per_s_budget_over_full"] == pytest.approx(1.25)


def test_nccl_kernels_are_compared_per_device(replayed: list[object]) -> None:
    """The top kernel renamed as a NCCL kernel (``nccl`` set, as the collector marks them): the
    figures per device follow it; the budget run estimating twice its count and time reads +100 %."""
    stats = [e for e in replayed if isinstance(e, ActivityStats) and e.category == "kernel"]
    top = max({e.name for e in stats}, key=lambda n: sum(e.total_ns for e in stats if e.name == n))

    def as_nccl(factor: int) -> list[object]:
        return [
            msgspec.structs.replace(e, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", nccl=True,
                                    estimated_count=factor * e.count, estimated_total_ns=factor * e.total_ns)
            if isinstance(e, ActivityStats) and e.name == top else e
            for e in replayed
        ]  # fmt: skip

    full, budget = statistics_of(as_nccl(1)), statistics_of(as_nccl(2))
    assert statistics_of(replayed)["nccl"] == {}
    devices = sorted(full["nccl"])
    assert devices and devices == sorted(budget["nccl"])
    verdict = compare(full, budget, {"full": 100, "budget": 100})
    for device in devices:
        row = verdict["nccl"][device]
        assert row["kernels_per_iteration_error"] == pytest.approx(1.0)
        assert row["ms_per_iteration_error"] == pytest.approx(1.0)
        assert 0 < row["full"]["share_of_kernel_time"] < row["budget"]["share_of_kernel_time"] <= 100
        assert row["share_diff_points"] > 0
    same = compare(full, full, {"full": 100, "budget": 100})["nccl"]
    assert all(r["kernels_per_iteration_error"] == 0 and r["share_diff_points"] == 0 for r in same.values())


def test_one_result_line_per_rank_under_torchrun() -> None:
    stdout = (
        'W0 some log\n{"workload": "D1", "iterations": 10, "rank": 0}\n'
        '[rank1]:{"workload": "D1", "iterations": 12, "rank": 1}\nnot json {\n'
    )
    assert [r["rank"] for r in workload_lines(stdout)] == [0, 1]
    joined = '{"workload": "D1", "rank": 0}{"workload": "D1", "rank": 1}\n\n'
    assert [r["rank"] for r in workload_lines(joined)] == [0, 1]


def test_budget_mode_runs_the_budget_recording_alone_and_reports_its_bytes(
    replayed: list[object],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--modes budget`` (the statistics' volume over one long recording): no full run, the bytes
    per GPU-hour of the one recording and its windows, from ``run``'s figures."""
    ran: list[str] = []

    def fake_run(
        workload: str, mode: str, seconds: float, work: Path, ddp: int = 0, rate: float = 0.0
    ) -> tuple[dict, int]:
        ran.append(mode)
        stats = statistics_of(replayed)
        stats["recording_bytes"] = 1_200_000
        stats["recording_mb_per_hour"] = 1_200_000 / seconds * 3600 / 1e6
        stats["recording_mb_per_gpu_hour"] = stats["recording_mb_per_hour"]
        return stats, 1000

    monkeypatch.setattr(budget_accuracy, "run", fake_run)
    out = tmp_path / "volume.json"
    assert (
        budget_accuracy.main(
            ["--modes", "budget", "--workloads", "W4", "--seconds", "3600", "--out", str(out)]
        )
        == 0
    )
    assert ran == ["budget"]
    [row] = msgspec.json.decode(out.read_bytes())
    assert row["workload"] == "W4" and row["recording_mb_per_gpu_hour"] == pytest.approx(1.2)
    assert row["within_bound"] is True and "busy_series" in row
    assert "W4 budget recording over 3600 s: 1,200,000 bytes, 1.20 MB per GPU-hour (bound 2: within)" in (
        capsys.readouterr().out
    )


def test_pacing_waits_only_when_ahead_and_tells_a_run_that_fell_behind() -> None:
    from pacing import kept_pace, pace_delay

    assert pace_delay(started=100.0, iterations_done=50, rate=100.0, now=100.2) == pytest.approx(0.3)
    assert pace_delay(started=100.0, iterations_done=50, rate=100.0, now=100.9) == 0.0  # behind: no wait
    assert pace_delay(started=100.0, iterations_done=50, rate=0.0, now=100.0) == 0.0  # unpaced
    assert kept_pace(iterations=2990, seconds=30.0, rate=100.0)
    assert not kept_pace(iterations=2500, seconds=30.0, rate=100.0)
