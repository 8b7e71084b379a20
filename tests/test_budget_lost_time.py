"""bench/budget_lost_time.py's estimator on block timings with a known cost: blocks of 10 ms, and
around each window's span some blocks made slower by a known amount. The GPU run reads real blocks;
this checks that the arithmetic recovers what was put in and that both nulls read zero where
nothing was."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from budget_lost_time import AFTER_S, BEFORE_S, between, gap_windows, null_in_base, null_in_gaps  # noqa: E402
from lost_time import window_cost  # noqa: E402


def _blocks(seconds: float, windows: list[tuple[float, float]], extra: float) -> list[tuple[float, float]]:
    """10 ms blocks with 2 % jitter; a block that ends inside a window's open time takes ``extra`` longer."""
    rng = random.Random(7)
    out, t = [], 0.0
    while t < seconds:
        d = 0.010 * (1 + rng.uniform(-0.02, 0.02))
        if any(closed - length <= t + d <= closed for closed, length in windows):
            d += extra
        t += d
        out.append((t, d))
    return out


def test_recovers_the_injected_cost_and_the_gap_null_reads_nothing() -> None:
    windows = [(5.0 * k + 2.06, 0.06) for k in range(6)]  # 60 ms open every 5 s, closed at 2.06, 7.06, ...
    blocks = _blocks(31.0, windows, extra=0.005)
    injected = sum(d - 0.010 for _, d in blocks if d > 0.0105)
    total = sum(d for _, d in blocks)
    cost, lost = window_cost(blocks, windows, BEFORE_S, AFTER_S, baseline="mean")
    assert cost == pytest.approx(injected / total, rel=0.1)
    assert len(lost) == 6 and all(x > 0 for x in lost)
    null, count = null_in_gaps(blocks, windows)
    assert count >= 5 and abs(null) < 0.0005
    clean = _blocks(15.0, [], extra=0.0)
    assert abs(null_in_base(clean, windows, total)) < 0.0005
    # Blocks between spans are the clean ones only.
    assert max(between(blocks, windows)) < 0.0105


def test_gap_windows_sit_in_the_untouched_time() -> None:
    windows = [(1.0, 0.06), (6.0, 0.06)]
    pretend = gap_windows(windows, 0.0, 7.0)
    spans = [(c - w - BEFORE_S, c + AFTER_S) for c, w in windows]
    for closed, length in pretend:
        lo, hi = closed - length - BEFORE_S, closed + AFTER_S
        assert all(hi <= s_lo or lo >= s_hi for s_lo, s_hi in spans), (lo, hi)
    # The gap between the two spans (1.5 .. 5.74) holds one; before the first (0 .. 0.74) and after
    # the last (6.5 .. 7) there is no room for a 0.76 s span and 0.2 s either side.
    assert len(pretend) == 1 and 1.5 < pretend[0][0] < 5.74
