"""``bench/multigpu_session.sh`` (issue 32's runs on a multi-GPU host) parses, refuses an unknown
step before touching anything, and runs its plumbing (bench/device_lib.sh) as a dry run. What it runs is covered by the benches' and GPU tests' own checks."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.device_session import check_parses_and_names_its_steps, run_driver

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "multigpu_session.sh"


def test_the_driver_parses_and_names_its_steps() -> None:
    check_parses_and_names_its_steps(SCRIPT, "setup lost node compare compare2 coexist detach accuracy fanin")


def test_a_dry_run_through_the_shared_plumbing(tmp_path: Path) -> None:
    done = run_driver(tmp_path, "multigpu_session.sh", "A", dry=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "multigpu-lost-node.tar.gz",
        "summary-lost-node.txt",
    ]
    summary = (tmp_path / "out" / "summary-lost-node.txt").read_text()
    assert "-- lost: dry run (limit 420s)" in summary and "-- node: dry run (limit 120s)" in summary
    log = (tmp_path / "results" / "lost.log").read_text()
    assert "bench/budget_lost_time.py --ddp 2 --workloads D1 --sessions 5 --seconds 30 --base 12" in log


def test_setup_stops_below_two_gpus(tmp_path: Path) -> None:
    done = run_driver(tmp_path, "multigpu_session.sh", "B", dry=True, MIN_GPUS="2")
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "out" / "summary-compare.txt").read_text()
    assert "setup: fewer than 2 GPUs; issue 32's runs need 2 or more. Stopping." in summary
    assert "-- compare" not in summary
