"""``cuptistream summary``'s table of per-kernel metrics from on-demand windows (``KernelMetrics``):
a file-sink recording with two windows of one process, their means folded per name and metric,
weighted by launches, and names ranked by profiled GPU time. Expected figures are computed here by
hand from the events written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cuptistream import events as ev
from cuptistream.cli import main
from tests.helpers.fixture_recording import Process, write_recording

SECOND = 1_000_000_000
CLOCK = ev.ClockSync(cupti_ns=0, unix_ns=1_796_000_000 * SECOND)
METRICS = ["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
GEMM, ADD = "_Z4gemmPfS_", "_Z3addPf"
SHOWN = {GEMM: "gemm(float*, float*)", ADD: "add(float*)"}  # the summary demangles


def _window(start_s: int, launches: list[int], values: list[list[float | None]]) -> ev.KernelMetrics:
    return ev.KernelMetrics(
        start=start_s * SECOND, end=(start_s + 10) * SECOND, device_id=0, chip="GH100", metrics=METRICS,
        passes=9, names=[GEMM, ADD], launches=launches, values=values,
    )  # fmt: skip


def _summary(tmp_path: Path, *args: str) -> Any:
    resource = ev.Resource(host="node-1", pid=4242, process_name="train", command_line=["python"], rank=0)
    events: list[ev.Event] = [
        _window(100, [10, 30], [[50_000.0, 1_000.0], [80.0, 20.0]]),
        _window(200, [30, 10], [[70_000.0, 3_000.0], [90.0, None]]),
    ]
    recording = write_recording(tmp_path / "rec", [Process(resource, CLOCK, events)])
    out = tmp_path / "summary.out"
    assert main(["summary", str(recording), "-o", str(out), *args]) == 0
    return json.loads(out.read_text()) if "json" in args else out.read_text()


def test_means_are_weighted_by_launches_and_names_ranked_by_profiled_time(tmp_path: Path) -> None:
    table = _summary(tmp_path, "--format", "json")["kernel_metrics"]
    rows = [(r["name"], r["metric"], r["launches"], r["passes"], r["mean"]) for r in table["rows"]]
    gemm_ns = (50_000 * 10 + 70_000 * 30) / 40
    add_ns = (1_000 * 30 + 3_000 * 10) / 40
    assert rows == [
        (SHOWN[GEMM], METRICS[0], 40, 9, pytest.approx(gemm_ns)),
        (SHOWN[GEMM], METRICS[1], 40, 9, pytest.approx((80 * 10 + 90 * 30) / 40)),
        (SHOWN[ADD], METRICS[0], 40, 9, pytest.approx(add_ns)),
        (SHOWN[ADD], METRICS[1], 40, 9, pytest.approx(20.0)),  # the window without a value is left out
    ]
    assert all(r["host"] == "node-1" and r["device"] == 0 for r in table["rows"])


def test_the_text_table_shows_the_top_names(tmp_path: Path) -> None:
    text = _summary(tmp_path, "--top", "1")
    section = text[text.index("Kernel metrics of on-demand windows") :]
    assert SHOWN[GEMM] in section and SHOWN[ADD] not in section, section
