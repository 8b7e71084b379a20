"""``cuptistream summary``'s hardware-utilization table on file-sink recordings of PM sampling shaped
like an H100 run (``tests/helpers/pm_recording``). Expected figures come from the generated samples
with plain numpy (grouped by the interval their end falls in), not from the summary's code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuptistream.cli import main
from tests.helpers.pm_recording import (
    CLOCK,
    HOSTS,
    PERIOD,
    SECOND,
    STATS_INTERVAL,
    samples_of,
    write_pm_recording,
)

SM = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
TENSOR = "sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed"


def summary(path: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "summary.json"
    assert main(["summary", str(path), "--format", "json", "-o", str(out), *args]) == 0
    return json.loads(out.read_text())


def rows_by_key(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["host"], r["metric"]): r for r in report["hw_utilization"]["rows"]}


def expected(
    host: str, low: int | None = None, high: int | None = None
) -> dict[str, tuple[int, float, float]]:
    """metric -> (samples, mean, highest interval p95), over the intervals starting in [low, high)
    (CUPTI ns)."""
    metrics, starts, values = samples_of(host, seed=list(HOSTS).index(host))
    interval = (starts + PERIOD) // STATS_INTERVAL * STATS_INTERVAL
    keep = np.ones(len(starts), bool) if low is None else (interval >= low) & (interval < high)
    out = {}
    for m, metric in enumerate(metrics):
        column = values[m][keep]
        p95 = max(np.percentile(values[m][keep & (interval == i)], 95) for i in np.unique(interval[keep]))
        out[metric] = (len(column), float(column.mean()), float(p95))
    return out


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pm_recording(tmp_path_factory.mktemp("pm") / "out")


def test_each_device_gets_mean_and_p95_per_metric(recording: Path, tmp_path: Path) -> None:
    report = summary(recording, tmp_path)
    rows = rows_by_key(report)
    for host in HOSTS:
        want = expected(host)
        assert {m for h, m in rows if h == host} == set(want)  # the metrics the chip gave, each once
        for metric, (samples, mean, p95) in want.items():
            row = rows[(host, metric)]
            assert (row["device"], row["chip"], row["samples"], row["intervals"]) == (0, "GH100", samples, 4)
            assert row["mean"] == pytest.approx(mean, rel=1e-9, abs=1e-9)
            assert row["p95"] == pytest.approx(p95, rel=1e-9, abs=1e-9)
    # The shape of the run: 20 s of work in 30 s; tensor lower on h100-b.
    a, b = rows[("h100-a", SM)], rows[("h100-a", TENSOR)]
    assert 55 < a["mean"] < 65 and a["p95"] > 90 and a["field"] == "sm_active" and a["unit"] == "%"
    assert 30 < b["mean"] < 37 and 50 < b["p95"] < 60
    assert rows[("h100-b", TENSOR)]["mean"] < b["mean"]
    assert rows[("h100-a", "pcie__read_bytes.sum.per_second")]["unit"] == "B/s"
    assert report["meta"]["events"]["pm_stats"] == 8 and report["meta"]["events"]["pm_samples"] == 60


def test_samples_alone_give_the_same_table(recording: Path, tmp_path: Path) -> None:
    """A recording without the collector's statistics: its samples are folded as the collector folds."""
    samples_only = write_pm_recording(tmp_path / "samples", with_stats=False)
    folded = summary(samples_only, tmp_path)
    assert "pm_stats" not in folded["meta"]["events"]
    stats = rows_by_key(summary(recording, tmp_path))
    for key, row in rows_by_key(folded).items():
        assert row["samples"] == stats[key]["samples"] and row["intervals"] == stats[key]["intervals"]
        assert row["mean"] == pytest.approx(stats[key]["mean"]) and row["p95"] == pytest.approx(
            stats[key]["p95"]
        )
    assert len(folded["hw_utilization"]["rows"]) == len(stats) == 2 * 14


def test_a_window_keeps_the_intervals_that_start_in_it(recording: Path, tmp_path: Path) -> None:
    low, high = 7_010 * SECOND, 7_030 * SECOND  # CUPTI ns: the two intervals of the work
    since, until = ((t + CLOCK.offset_ns) / 1e9 for t in (low, high))
    rows = rows_by_key(summary(recording, tmp_path, "--since", f"@{since:.9f}", "--until", f"@{until:.9f}"))
    for metric, (samples, mean, p95) in expected("h100-a", low, high).items():
        row = rows[("h100-a", metric)]
        assert row["intervals"] == 2 and row["samples"] == samples == 1000
        assert row["mean"] == pytest.approx(mean, rel=1e-9, abs=1e-9)
        assert row["p95"] == pytest.approx(p95, rel=1e-9, abs=1e-9)
    assert rows[("h100-a", SM)]["mean"] > 75  # mostly the work
    assert summary(recording, tmp_path, "--device", "1")["hw_utilization"]["rows"] == []


def test_the_text_table_names_the_fields(recording: Path, tmp_path: Path) -> None:
    out = tmp_path / "summary.txt"
    assert main(["summary", str(recording), "-o", str(out)]) == 0
    text = out.read_text()
    section = text.split("== Hardware utilization")[1].split("\n==")[0]
    line = next(line for line in section.splitlines() if "h100-a" in line and " sm_active " in line)
    assert "GH100" in line and "%" in line
    assert any("pcie_rx_bytes" in line and "B/s" in line and "," in line for line in section.splitlines())
