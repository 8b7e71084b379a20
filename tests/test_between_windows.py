"""bench/between_windows.py's arithmetic and its refusals, and bench/launch_cost.py's (which shares the
arithmetic); their GPU runs: docs/benchmarks.md, "Issue 26's last runs". The toggles themselves need
CUPTI and a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from between_windows import on_over_off  # noqa: E402


def test_each_on_phase_is_set_against_the_off_phases_beside_it() -> None:
    # The program drifts 1 % per phase; the piece adds 10 % while on. Against the mean of its two
    # neighbours, each on phase reads the piece's 10 % with the drift cancelled.
    phases = [(i % 2 == 1, [0.010 * (1 + 0.01 * i) * (1.1 if i % 2 else 1.0)] * 10) for i in range(7)]
    ratios = on_over_off(phases, "mean")
    assert len(ratios) == 3
    assert all(r == pytest.approx(0.10, abs=1e-9) for r in ratios)


def test_the_floor_is_the_fast_speed_not_the_mix() -> None:
    # On and off phases alike flip between 17 and 25 ms blocks, in different mixes; the piece moves
    # the fast speed by 5 %. The mean reads the mix; the p10 reads the piece.
    off = [(False, [0.017] * 8 + [0.025] * 2)]
    on = [(True, [0.017 * 1.05] * 3 + [0.025] * 7)]
    phases = off + on + off
    assert on_over_off(phases, "p10") == [pytest.approx(0.05)]
    assert on_over_off(phases, "mean")[0] > 0.2


@pytest.mark.parametrize(
    ("script", "flag"), [("between_windows.py", "--variants"), ("launch_cost.py", "--modes")]
)
def test_an_unknown_piece_is_one_line_and_exit_2(script: str, flag: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), flag, "none,bogus"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2
    assert f"{flag}: unknown ['bogus']" in done.stderr
    assert "Traceback" not in done.stderr
