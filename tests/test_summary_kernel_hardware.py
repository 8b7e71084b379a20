"""``cuptistream summary``'s table of kernels' hardware utilization on file-sink recordings in which
the collector's own attribution joined H100-shaped PM samples with a GEMM and an elementwise kernel
(``tests/helpers/pm_kernel_recording``). Expected figures are recomputed here with plain Python,
kernel by kernel and sample by sample, not taken from the attribution or the summary's code."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from cuptistream.cli import main
from cuptistream.cupti.pm_metrics import field_of
from tests.helpers.pm_kernel_recording import (
    ELEMENTWISE,
    GEMM,
    kernels_of,
    samples_with_kernels,
    write_pm_kernel_recording,
)
from tests.helpers.pm_recording import CLOCK, HOSTS, PERIOD, SECOND, STATS_INTERVAL

SHOWN = {GEMM: GEMM, ELEMENTWISE: "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add"
         "<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
         "std::array<char*, 3ul>)"}  # fmt: skip


def expected(host: str, low: int | None = None, high: int | None = None) -> dict[str, dict[str, Any]]:
    """Per kernel name, over the kernels ending in an interval that starts in [low, high) (CUPTI ns):
    kernel time, covered time, each metric's overlap-weighted mean over the samples they ran in,
    and the own share (each sample's overlap squared over its length, per covered ns)."""
    metrics, starts, values = samples_with_kernels(host, list(HOSTS).index(host))
    samples = list(zip(starts.tolist(), (starts + PERIOD).tolist(), values.T.tolist(), strict=True))
    kernel_ns: dict[str, int] = defaultdict(int)
    overlap: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for start, end, name in kernels_of():
        interval = end // STATS_INTERVAL * STATS_INTERVAL
        if low is not None and not low <= interval < high:  # type: ignore[operator]
            continue
        kernel_ns[name] += end - start
        for i, (a, b, _) in enumerate(samples):
            if a < end and start < b:
                overlap[name][i] += min(end, b) - max(start, a)
    out = {}
    for name, total in kernel_ns.items():
        w = overlap[name]
        covered = sum(w.values())
        means = {m: sum(n * samples[i][2][k] for i, n in w.items()) / covered for k, m in enumerate(metrics)}
        own = sum(n * n / (samples[i][1] - samples[i][0]) for i, n in w.items()) / covered
        out[name] = {"kernel_ns": total, "covered_ns": covered, "samples": len(w), "means": means, "own": own}
    return out


def summary(path: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "summary.json"
    assert main(["summary", str(path), "--format", "json", "-o", str(out), *args]) == 0
    return json.loads(out.read_text())


def by_key(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["host"], r["name"]): r for r in report["kernel_hw_utilization"]["rows"]}


def check(rows: dict[tuple[str, str], dict[str, Any]], host: str, want: dict[str, dict[str, Any]]) -> None:
    assert {n for h, n in rows if h == host} == {SHOWN[n] for n in want}
    for name, figures in want.items():
        row = rows[(host, SHOWN[name])]
        assert row["device"] == 0
        assert (row["kernel_ns"], row["covered_ns"]) == (figures["kernel_ns"], figures["covered_ns"])
        assert row["covered_share"] == pytest.approx(figures["covered_ns"] / figures["kernel_ns"], rel=1e-12)
        assert row["means"] == pytest.approx(figures["means"], rel=1e-9, abs=1e-9)
        assert row["own_share"] == pytest.approx(figures["own"], rel=1e-9)
        for f in ("sm_active", "tensor_active", "dram_active", "sm_occupancy"):
            metric = next(m for m in figures["means"] if field_of(m) == f)
            assert row[f + "_pct"] == pytest.approx(figures["means"][metric], rel=1e-9, abs=1e-9)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pm_kernel_recording(tmp_path_factory.mktemp("pm_kernels") / "out")


def test_each_kernel_gets_the_counters_of_the_samples_it_ran_in(recording: Path, tmp_path: Path) -> None:
    report = summary(recording, tmp_path)
    rows = by_key(report)
    for host in HOSTS:
        check(rows, host, expected(host))
    gemm, elementwise = rows[("h100-a", GEMM)], rows[("h100-a", SHOWN[ELEMENTWISE])]
    assert 45 < gemm["tensor_active_pct"] < 55 and gemm["sm_active_pct"] > 85 and gemm["covered_share"] == 1.0
    assert elementwise["tensor_active_pct"] < 2 and elementwise["dram_active_pct"] > 70
    assert 0.9 < elementwise["covered_share"] < 1  # the kernels before the sampler started
    assert [r["name"] for r in report["kernel_hw_utilization"]["rows"]][:2] == [GEMM, SHOWN[ELEMENTWISE]]
    assert report["meta"]["events"]["pm_kernel_stats"] == 12


def test_top_keeps_each_devices_top_names_and_a_window_its_intervals(recording: Path, tmp_path: Path) -> None:
    out = tmp_path / "top.txt"
    assert main(["summary", str(recording), "--top", "1", "-o", str(out)]) == 0
    section = out.read_text().split("== Kernels' hardware utilization")[1].split("\n==")[0]
    assert "(top 2 of 4)" in section.splitlines()[0]  # each device's top name
    lines = [line for line in section.splitlines()[2:] if line]
    assert [line.split()[0] for line in lines] == list(HOSTS) and all("xmma_gemm" in line for line in lines)
    low, high = 7_010 * SECOND, 7_030 * SECOND  # CUPTI ns: the two intervals of the work
    since, until = ((t + CLOCK.offset_ns) / 1e9 for t in (low, high))
    window = summary(recording, tmp_path, "--since", f"@{since:.9f}", "--until", f"@{until:.9f}")
    rows = by_key(window)
    check(rows, "h100-b", expected("h100-b", low, high))
    assert all(r["intervals"] == 2 and r["covered_share"] == 1.0 for r in rows.values())
    assert summary(recording, tmp_path, "--device", "1")["kernel_hw_utilization"]["rows"] == []


def test_the_text_table_shows_the_key_fields(recording: Path, tmp_path: Path) -> None:
    out = tmp_path / "summary.txt"
    assert main(["summary", str(recording), "-o", str(out)]) == 0
    section = out.read_text().split("== Kernels' hardware utilization")[1].split("\n==")[0]
    header = section.splitlines()[1]
    for column in (
        "kernel",
        "covered %",
        "sm active %",
        "tensor active %",
        "dram active %",
        "sm occupancy %",
    ):
        assert column in header
    assert "means" not in header and "own" not in header
    line = next(line for line in section.splitlines() if line.startswith("h100-a") and "xmma_gemm" in line)
    assert " 100.0 " in line and " s " in line
