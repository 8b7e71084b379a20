"""``bench/fanin.py`` end to end, as a check of the bench, not of speed: two replay probes under one
collector, a finite replay under ``block``, and the read-back must match the captures exactly."""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # scripts/test.sh --all and CI run it

ROOT = Path(__file__).resolve().parent.parent


def test_fanin_reads_back_exactly_n_x_loops_x_the_captures(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "bench" / "fanin.py"), "--probes", "2", "--loops", "3",
               "--full-policy", "block", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["probes"] == 2 and run["dropped_events"] == 0 and run["shed_records"] == 0
    assert run["cupti_dropped_records"] == 0  # a replay source has no CUPTI to drop records
    check = run["check"]
    assert check["expected_data_events"] == 2 * 3 * 3710  # one loop of the shipped captures: 3,710 events
    assert check["record_events_on_disk"] == check["expected_data_events"]
    assert check["in_equals_disk_plus_drops"] and check["disk_equals_captures_x_loops"]
    assert run["peak_rss_anon_mib"] > 0 and run["peak_rss_shmem_mib"] > 0
    assert run["collector_faults_per_k_records"] > 0  # a process faults some pages in, at least at its start


def _fanin() -> object:
    sys.path.insert(0, str(ROOT / "bench"))
    import fanin

    return fanin


def test_the_steady_rate_leaves_the_start_out_and_needs_two_seconds_of_samples() -> None:
    fanin: Any = _fanin()
    s = 1_000_000_000
    # The sink's SelfStats every second: slow for the first 2 s (the programs starting), 1,000/s on.
    samples = [(100 * s + i * s, n) for i, n in enumerate([0, 10, 500, 1500, 2500, 3500, 4500])]
    assert fanin.steady_rate(samples, 100 * s, 107 * s) == pytest.approx(1000.0)
    assert fanin.steady_rate(samples, 100 * s, 103 * s) is None  # samples at 102 and 103 s: 1 s apart
    assert fanin.steady_rate([], 100 * s, 107 * s) is None


def test_the_overload_ratio_pairs_each_run_of_n_probes_with_the_same_run_of_2n() -> None:
    """Overload from the runs themselves: 2N / N per run, window and steady."""
    fanin: Any = _fanin()

    def run(n: int, r: int, rate: float, steady: float | None) -> dict[str, Any]:
        return {"probes": n, "workers": "auto", "run": r, "delivered_events_per_s": rate,
                "steady_delivered_events_per_s": steady}  # fmt: skip

    runs = [run(4, 0, 2.0e6, 2.5e6), run(8, 0, 1.8e6, 2.0e6), run(4, 1, 2.0e6, None), run(8, 1, 2.1e6, 2.2e6)]
    runs.append(run(16, 0, 1.0e6, None))  # 16 = 2 x 8: a pair too, for run 0 only
    found = fanin.overload_ratios(runs)
    assert found["8/4/wauto"] == {"window": [0.9, 1.05], "steady": [0.8], "window_median": 0.975,
                                  "steady_median": 0.8}  # fmt: skip
    assert found["16/8/wauto"]["window"] == [round(1.0 / 1.8, 3)]
    assert fanin.overload_ratios([run(4, 0, 1.0, None), run(6, 0, 1.0, None)]) == {}
    printed = fanin.rows(runs)  # the rows the bench ends with
    assert (
        printed[0]
        == "4 probes, workers auto, 2 runs: delivered 2.00 [2.00..2.00] M events/s (steady 2.50 [2.50..2.50])"
    )
    assert (
        "overload 8/4/wauto probes: delivered 2N / N 0.975 [0.900..1.050] (steady 0.800 [0.800..0.800])"
        in printed
    )


def test_gpu_programs_go_round_robin_over_the_gpus(tmp_path: Path) -> None:
    fanin: Any = _fanin()
    args = argparse.Namespace(mode="gpu", seconds=10.0, program_cpus="", gpus=2, loops=0)
    line = fanin.programs(args, 16, tmp_path / "stamps")
    assert "FANIN_DEVICE=$(( (i - 1) % 2 ))" in line and "for i in $(seq 16)" in line
    assert 'torch.cuda.set_device(int(os.environ.get("FANIN_DEVICE", "0")))' in line.replace("'\"'\"'", "'")
    assert fanin.device_plan(16, 2) == {"0": 8, "1": 8}
    assert fanin.device_plan(5, 4) == {"0": 2, "1": 1, "2": 1, "3": 1}
    # The shell does the same arithmetic: program i (from 1) on device (i - 1) mod G.
    devices = subprocess.run(["sh", "-c", "for i in $(seq 5); do echo $(( (i - 1) % 4 )); done"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert collections.Counter(devices) == collections.Counter({"0": 2, "1": 1, "2": 1, "3": 1})


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    fanin: Any = _fanin()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    assert fanin.visible_gpus() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert fanin.visible_gpus() == 1


def test_ddp_check_wants_every_rank_on_its_own_device_with_nccl() -> None:
    fanin: Any = _fanin()
    good = {"nproc": 2, "probes": 2, "ranks": {"0": {"kernels": 9, "device0": 9, "nccl_kernels": 3},
                                               "1": {"kernels": 9, "device1": 9, "nccl_kernels": 3}}}  # fmt: skip
    assert all(fanin.ddp_check(good, {0: 0, 1: 1}).values())
    shared = {**good, "ranks": {**good["ranks"], "1": {"kernels": 9, "device0": 9, "nccl_kernels": 3}}}
    assert fanin.ddp_check(shared, {0: 0, 1: 1}) == {
        "every_rank_a_probe": True, "every_rank_recorded": True, "kernels_on_own_device": False,
        "nccl_on_every_rank": True,
    }  # fmt: skip
    missing = {**good, "probes": 1, "ranks": {"0": good["ranks"]["0"]}}
    check = fanin.ddp_check(missing, {0: 0, 1: 1})
    assert (
        not check["every_rank_a_probe"]
        and not check["every_rank_recorded"]
        and not check["nccl_on_every_rank"]
    )


RANK_PROGRAM = (
    "import json, os, sys; from pathlib import Path; p = Path(sys.argv[1]); p.mkdir(exist_ok=True); "
    "(p / f'rank{os.environ[\"RANK\"]}.json').write_text(json.dumps({'device': 0}))"
)


def test_a_node_collector_in_front_of_a_two_rank_job(tmp_path: Path) -> None:
    """``--mode ddp``'s plumbing with replay probes for ranks: the node collector is up before the
    job, both ranks' probes reach it (the environment ``run`` would give), it drains on SIGTERM, and
    the recording is read back per rank (the shipped captures hold no NCCL kernel)."""
    fanin: Any = _fanin()
    args = argparse.Namespace(
        mode="cpu", loops=1, nproc=2, steps=0, seconds=5.0, shutdown_deadline=10.0, keep=False,
        memory_budget="64MiB", full_policy="block", sink_queue="16MiB", workers="0", replay_buffer_size="",
        replay_path="", zstd_level=3, heap_trim=True, worker_replies="mapped",
    )  # fmt: skip

    def job(args: argparse.Namespace, where: Path) -> list[str]:
        one = shlex.join([sys.executable, "-c", RANK_PROGRAM, str(where / "ranks")])
        return ["sh", "-c", f"RANK=0 LOCAL_RANK=0 {one} & RANK=1 LOCAL_RANK=1 {one}; wait"]

    result = fanin.ddp_behind_node_collector(args, tmp_path, job)
    assert result["probes"] == 2 and sorted(result["ranks"]) == ["0", "1"]
    assert result["ranks"]["0"]["kernels"] == result["ranks"]["1"]["kernels"] > 0
    assert result["check"] == {"every_rank_a_probe": True, "every_rank_recorded": True,
                               "kernels_on_own_device": True, "nccl_on_every_rank": False}  # fmt: skip
    assert not list((tmp_path / "ddp-n2" / "out").glob("*"))  # the recording is not kept
    assert json.loads((tmp_path / "ddp-n2" / "result.json").read_text())["probes"] == 2


def test_an_out_folder_holding_an_earlier_run_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    command = [sys.executable, str(ROOT / "bench" / "fanin.py"), "--probes", "1", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"fanin: --out {tmp_path.resolve()} holds an earlier run; give an empty or new folder"
    ]
    assert (tmp_path / "summary.json").read_text() == "{}"  # nothing of it touched
