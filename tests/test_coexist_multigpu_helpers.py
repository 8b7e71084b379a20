"""The pure parts of ``tests/gpu/test_coexist_multigpu.py`` (the GPU run's reading of a recording),
on a replay recording whose program says it is rank 1: its kernels are grouped under that rank,
the collector's accounting under none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.gpu.test_coexist_multigpu import by_rank, largest_gap_ms

ROOT = Path(__file__).resolve().parent.parent


def test_a_recording_read_per_rank(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(ROOT / "configs" / "replay.yaml"), "-o", str(out),
         "--quiet", "--", sys.executable, "-c", "import time; time.sleep(1)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ranks = by_rank(out)
    assert list(ranks) == [1]
    row = ranks[1]
    assert sum(row["kernels"].values()) == len(row["starts"]) > 0 and row["yields"] == []
    assert largest_gap_ms(row["starts"]) >= 0


def test_largest_gap() -> None:
    assert largest_gap_ms([5_000_000, 1_000_000, 2_000_000]) == 3.0
    assert largest_gap_ms([7]) == 0.0
