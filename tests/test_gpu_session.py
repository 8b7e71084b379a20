"""``bench/gpu_session.sh`` (issues 26 and 30's one-GPU runs) on a machine with no GPU: it refuses an
unknown step, and its plumbing (bench/device_lib.sh: setup, steps under limits, the background
recording started in one call and collected in the next, the summary, the tarball into $OUT) runs
with a fake interpreter in place of the benches. What the benches measure is their own tests'."""

from __future__ import annotations

import tarfile
from pathlib import Path

from tests.helpers.device_session import ROOT, check_parses_and_names_its_steps, run_driver

SCRIPT = ROOT / "bench" / "gpu_session.sh"
GROUPS = {
    "A": ["volume-start", "fanin-cpu", "fanin-profile"],
    "B": ["fanin-block", "fanin-onecore", "volume-wait"],
    "C": ["lost1", "lost2"],
    "D": ["lost4", "full13"],
    "E": ["full24", "fanin-gpu"],
}


def test_the_driver_parses_and_names_its_steps() -> None:
    check_parses_and_names_its_steps(
        SCRIPT,
        "setup lost1 lost2 lost3 lost4 full13 full24 full3 steady4 steady1 drift1 between1 launch1 budget-tests gpu-tests attached1 "
        "launch-session "
        "volume-start",
    )


def test_the_w3_and_w4_follow_ups_run_their_benches(tmp_path: Path) -> None:
    """``full3`` runs W3 alone (with the decode-worker variant only if FULL3_VARIANT names it),
    ``steady4`` W4 with and without a session (the steps added after the first runs, 2026-11-27)."""
    done = run_driver(tmp_path, "gpu_session.sh", "full3", "steady4", dry=True)
    assert done.returncode == 0, done.stderr
    results = tmp_path / "results"
    full3 = (results / "full3.log").read_text()
    assert "--workloads W3 --modes none,bare,cuptistream --seconds 2" in full3 and "--variant" not in full3
    variant = "worker=bench/configs/default-decode-worker.yaml"
    done = run_driver(tmp_path / "variant", "gpu_session.sh", "full3", dry=True, FULL3_VARIANT=variant)
    assert done.returncode == 0, done.stderr
    full3 = (tmp_path / "variant" / "results" / "full3.log").read_text()
    assert f"--workloads W3 --modes none,bare,cuptistream --variant {variant} --seconds 2" in full3
    assert (ROOT / "bench" / "configs" / "default-decode-worker.yaml").is_file()
    assert (
        "steady_cost_gpu.py --workload W4 --configs none,configs/production.yaml"
        in (results / "steady4.log").read_text()
    )


def test_the_pinned_w1_and_the_paced_accuracy_runs_run_their_benches(tmp_path: Path) -> None:
    """``steady1`` pins W1's thread and runs the four configs; ``accuracy-start`` chains one paced
    ``budget_accuracy.py`` run per WORKLOAD:RATE (added 2026-11-27, second session)."""
    done = run_driver(
        tmp_path, "gpu_session.sh", "steady1", "accuracy-start", "drift1", "between1", "launch1", dry=True
    )
    assert done.returncode == 0, done.stderr
    results = tmp_path / "results"
    steady = (results / "steady1.log").read_text()
    assert "steady_cost_gpu.py --workload W1 --pin 3" in steady
    assert "bench/configs/windows-idle.yaml,configs/production.yaml" in steady
    assert (
        "budget_lost_time.py --workloads W1 --sessions 5 --seconds 25 --drift"
        in (results / "drift1.log").read_text()
    )
    assert (
        "between_windows.py --seconds 60 --phase 2" in (results / "between1.log").read_text()
    )  # each piece toggled inside one process (added 2026-11-27, third session)
    assert "bench/launch_cost.py --out" in (results / "launch1.log").read_text()
    chain = (results / "accuracy-start.log").read_text()
    for workload, rate in (("W4", 50), ("W2", 250), ("W5", 250)):
        assert f"budget_accuracy.py --workloads {workload} --rate {rate} --seconds 300" in chain


def test_the_detach_tests_and_the_reply_buffer_ab_run_their_commands(tmp_path: Path) -> None:
    """``budget-tests`` runs the budget GPU tests, ``attached1`` the DDP attached stress as one rank,
    ``launch-session`` the C loop alone against under
    production.yaml, and ``fanin-replies`` (replay) and ``fanin-gpu-replies`` (16 GPU programs)
    alternate ``--worker-replies mapped`` and ``shared`` twice."""
    done = run_driver(
        tmp_path, "gpu_session.sh", "budget-tests", "gpu-tests", "attached1", "launch-session", "fanin-replies",
        "fanin-gpu-replies", dry=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = tmp_path / "results"
    assert (
        "pytest -v -p no:cacheprovider tests/gpu/test_budget_gpu.py"
        in (results / "budget-tests.log").read_text()
    )
    assert "launch_cost.py --modes none --session-rounds 3" in (results / "launch-session.log").read_text()
    assert "tests/gpu/test_detach_multigpu.py -k attached" in (results / "attached1.log").read_text()
    assert (
        "pytest -v -p no:cacheprovider tests/gpu/test_activity_gpu.py -k per_thread"
        in (results / "gpu-tests.log").read_text()
    )
    for step, mode in (("fanin-replies", "--mode cpu"), ("fanin-gpu-replies", "--mode gpu")):
        lines = [
            line for line in (results / f"{step}.log").read_text().splitlines() if "--worker-replies" in line
        ]
        order = [line.split("--worker-replies ")[1].split()[0] for line in lines]
        assert order == ["mapped", "shared", "mapped", "shared"], step
        assert all(mode in line for line in lines), step


def test_a_dry_run_logs_every_command_and_returns_the_tarball(tmp_path: Path) -> None:
    done = run_driver(tmp_path, "gpu_session.sh", "all", dry=True)
    assert done.returncode == 0, done.stderr
    label = "volume-start-fanin-cpu-fanin-profile-fanin-block-fanin-onecore-volume-wait-lost1-lost2-lost4-full13-full24-fanin-gpu"
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == [f"gpu-{label}.tar.gz", f"summary-{label}.txt"]
    summary = (tmp_path / "out" / f"summary-{label}.txt").read_text()
    for group in GROUPS.values():
        for name in group:
            assert f"-- {name}: dry run" in summary
    results = tmp_path / "results"
    assert (
        "bench/budget_lost_time.py --workloads W2 --sessions 5 --seconds 25"
        in (results / "lost2.log").read_text()
    )
    assert (
        "--workloads W2,W4 --modes none,bare,cuptistream --seconds 2 --budget 370"
        in (results / "full24.log").read_text()
    )
    assert "taskset -c 12-15" in (results / "volume-start.log").read_text()
    assert "--modes budget --workloads W4 --seconds 660" in (results / "volume-start.log").read_text()
    with tarfile.open(tmp_path / "out" / f"gpu-{label}.tar.gz") as tar:
        assert "results/env.txt" in tar.getnames()


def test_a_file_over_8_mb_stays_out_of_the_tarball_and_is_named(tmp_path: Path) -> None:
    done = run_driver(tmp_path, "gpu_session.sh", "fanin-gpu", dry=False, FAKE_BENCH_BIG=str(9 * 2**20))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "results" / "fanin_gpu" / "n16" / "big").stat().st_size == 9 * 2**20
    summary = (tmp_path / "out" / "summary-fanin-gpu.txt").read_text()
    assert "left out of the tarball: fanin_gpu/n16/big (9.0M)" in summary
    with tarfile.open(tmp_path / "out" / "gpu-fanin-gpu.tar.gz") as tar:
        names = tar.getnames()
    assert "results/env.txt" in names and "results/fanin_gpu/n16/big" not in names


def test_the_recording_started_in_one_call_is_collected_in_the_next(tmp_path: Path) -> None:
    """A, then B on the same machine (STATE is shared): the background recording outlives A's
    call, B's volume-wait waits for it and puts its line in the summary; the steps' lines too."""
    first = run_driver(tmp_path / "a", "gpu_session.sh", "A", dry=False, FAKE_BENCH_SLEEP="3",
                       STATE=str(tmp_path / "state"), VOLUME_CPUS="")  # fmt: skip
    assert first.returncode == 0, first.stderr
    summary_a = (tmp_path / "a" / "out" / "summary-volume-start-fanin-cpu-fanin-profile.txt").read_text()
    assert "-- volume-start: pid " in summary_a
    assert "-- fanin-cpu: exit 0" in summary_a
    assert (
        '{"probes": 16, "delivered_events_per_s": 5, "check": {"in_equals_disk_plus_drops": true}}'
        in summary_a
    )
    second = run_driver(tmp_path / "b", "gpu_session.sh", "B", "C", "D", "E", dry=False, FAKE_BENCH_SLEEP="1",
                        STATE=str(tmp_path / "state"))  # fmt: skip
    assert second.returncode == 0, second.stderr
    [summary_path] = (tmp_path / "b" / "out").glob("summary-*.txt")
    summary = summary_path.read_text()
    assert "-- volume-wait: exited 0" in summary
    assert "W4 budget recording over 660 s: 100 bytes, 1.00 MB per GPU-hour (bound 2: within)" in summary
    for workload in ("W1", "W2", "W4"):
        assert f"{workload} session 0: cost +0.100%" in summary
    assert "wrote " in summary and "| W1 | table |" in summary
    assert "-- full24: merged with full13's JSON" in summary


def test_a_step_is_cut_to_what_is_left_of_the_call(tmp_path: Path) -> None:
    """CALL_LIMIT: lost1 runs under what is left of the call less 10 s for the tarball (its own
    limit is 265 s) and is cut there; lost2, with under STEP_MIN seconds left, does not start."""
    done = run_driver(tmp_path, "gpu_session.sh", "C", dry=False, FAKE_BENCH_SLEEP="60", CALL_LIMIT="16",
                      STEP_MIN="3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "out" / "summary-lost1-lost2.txt").read_text()
    assert "-- lost1: CUT at its " in summary
    assert "-- lost2: SKIPPED, " in summary
