"""``bench/fanin.py`` end to end, as a check of the bench, not of speed: two replay probes under one
collector, a finite replay under ``block``, and the read-back must match the captures exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_fanin_reads_back_exactly_n_x_loops_x_the_captures(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "bench" / "fanin.py"), "--probes", "2", "--loops", "3",
               "--full-policy", "block", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["probes"] == 2 and run["dropped_events"] == 0 and run["shed_records"] == 0
    check = run["check"]
    assert check["expected_data_events"] == 2 * 3 * 3710  # one loop of the shipped captures: 3,710 events
    assert check["record_events_on_disk"] == check["expected_data_events"]
    assert check["in_equals_disk_plus_drops"] and check["disk_equals_captures_x_loops"]
    assert run["peak_rss_anon_mib"] > 0 and run["peak_rss_shmem_mib"] > 0
