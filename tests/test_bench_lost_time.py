"""The estimator behind bench/sampling_overhead.py's ``--steady`` numbers, on synthetic step times
(the GPU figures are in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lost_time import long_run, long_run_total, window_cost


def blocks_with_stall(
    start: float, length: float, extra: float, drift: float = 0.0
) -> list[tuple[float, float]]:
    """100 s of 0.1 s blocks (end time, duration), each ``extra`` s longer inside [start, start + length),
    and ``drift`` s longer per 100 s of run time (a machine that slows down)."""
    blocks, t = [], 0.0
    while t < 100:
        d = 0.1 + drift * t / 100 + (extra if start <= t < start + length else 0.0)
        t += d
        blocks.append((t, d))
    return blocks


@pytest.mark.parametrize("length", [0.5, 15.0])
def test_a_stall_inside_a_window_is_read_whole_short_or_long(length: float) -> None:
    blocks = blocks_with_stall(50.0, length, extra=0.4)
    lost = sum(d - 0.1 for _, d in blocks)
    closed = 50.0 + length + 0.5  # the last stalled block (0.5 s) ends up to 0.5 s after the stall
    share, per_window = window_cost(blocks, [(closed, closed - 50.0)])
    assert per_window[0] == pytest.approx(lost, rel=0.02)
    assert share == pytest.approx(lost / sum(d for _, d in blocks), rel=0.02)


def test_slow_drift_is_not_read_as_lost_time() -> None:
    blocks = blocks_with_stall(50.0, 0.0, extra=0.0, drift=0.02)
    share, _ = window_cost(blocks, [(60.0, 5.0)])
    assert abs(share) < 0.001


def test_long_run_cost_is_lost_time_per_window_over_the_planned_cycle() -> None:
    session = {
        "windows_by_source": {"pc_sampling": 2, "sass": 0},
        "plans": {
            "pc_sampling": {"window_s": 0.5, "pause_s": 99.5},
            "sass": {"window_s": 0.25, "pause_s": 3000},
        },
        "lost_s_by_source": {"pc_sampling": 0.8},
        "charged_s_by_source": {"pc_sampling": 1.0},
    }
    out = long_run(session)
    assert list(out) == ["pc_sampling"]  # no SASS window fell in the session: nothing to say of it
    assert out["pc_sampling"]["long_run_cost"] == pytest.approx(0.004)
    assert out["pc_sampling"]["charged_s_per_window"] == pytest.approx(0.5)
    assert out["pc_sampling"]["windows_per_hour"] == pytest.approx(36.0)
    assert long_run_total(session) is None  # SASS had no window: its cost is unknown, not zero


def test_the_long_run_total_adds_every_source_that_had_a_window() -> None:
    session = {
        "windows_by_source": {"pc_sampling": 4, "sass": 1},
        "plans": {
            "pc_sampling": {"window_s": 0.5, "pause_s": 99.5},
            "sass": {"window_s": 0.25, "pause_s": 1999.75},
        },
        "lost_s_by_source": {"pc_sampling": 1.6, "sass": 9.0},
        "seconds": 120.0, "pc_samples_per_min": 100_000, "sass_records_per_min": 40_000,
    }  # fmt: skip
    assert long_run_total(session) == pytest.approx(0.004 + 0.0045)
    out = long_run(session)
    assert out["pc_sampling"]["collected_per_min"] == 30_000  # 50k per window, one per 100 s
    assert out["sass"]["collected_per_min"] == 2_400  # 80k per window, one per 2000 s


def test_the_command_line_skips_older_results_in_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"steady": [{"condition": "both", "window_cost": 0.01}]}))
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "bench" / "lost_time.py"), str(old)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and result.stdout == ""
    assert (
        result.stderr.strip()
        == f"{old}: a --steady result without windows per source (an older run); skipped"
    )
