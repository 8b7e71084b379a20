"""bench/lost_pooled.py: the lost-time figures of bench/budget_lost_time.py pooled over a workload's
sessions, and the method's resolution from pretend windows on the base parts. Synthetic block series
with a known cost and known noise check the arithmetic; a real H100 run (W2 under production.yaml,
``tests/fixtures/lost_time_w2.json``) checks it reads what that run's file holds."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from budget_lost_time import job_view, null_in_base, null_in_gaps  # noqa: E402
from lost_pooled import main, pool, pool_results, seconds, verdict, window_noise  # noqa: E402
from lost_time import ACTIVITY_AFTER_S, ACTIVITY_BEFORE_S, window_cost  # noqa: E402

W2_RUN = ROOT / "tests/fixtures/lost_time_w2.json"


def _blocks(
    seconds_: float, windows: list[tuple[float, float]], extra: float, jitter: float, seed: int
) -> list[tuple[float, float]]:
    """10 ms blocks, each off by up to ``jitter`` (uniform, independent); a block ending inside a
    window's open time takes ``extra`` longer."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while t < seconds_:
        d = 0.010 * (1 + rng.uniform(-jitter, jitter))
        if any(closed - length <= t + d <= closed for closed, length in windows):
            d += extra
        t += d
        out.append((t, d))
    return out


def _session(extra: float, jitter: float, seed: int, length: float = 31.0) -> dict[str, object]:
    """One session as budget_lost_time's child writes it: a 60 ms window every 5 s (6 in 31 s), and
    15 s of base."""
    windows = [(5.0 * k + 2.06, 0.06) for k in range(int((length - 1) / 5))]
    blocks = _blocks(length, windows, extra, jitter, seed)
    base = _blocks(15.0, [], 0.0, jitter, seed + 1000)
    total = sum(d for _, d in blocks)
    cost, _ = window_cost(blocks, windows, ACTIVITY_BEFORE_S, ACTIVITY_AFTER_S, baseline="mean")
    return {
        "rank": 0, "windows": len(windows), "window_cost": cost, "null_base": null_in_base(base, windows, total),
        "null_gaps": null_in_gaps(blocks, windows)[0], "raw": {"base": base, "session": blocks, "windows": windows},
    }  # fmt: skip


def test_the_pooled_cost_is_all_lost_time_over_all_time() -> None:
    # Sessions of different lengths and costs: the pooled cost weighs each by its time.
    sessions = [_session(extra, 0.02, seed, length) for seed, (extra, length) in
                enumerate(((0.002, 31.0), (0.005, 21.0), (0.008, 41.0)))]  # fmt: skip
    p = pool(sessions, [s["raw"] for s in sessions])  # type: ignore[misc]
    times = [seconds(s["raw"]) for s in sessions]  # type: ignore[arg-type]
    lost = sum(float(s["window_cost"]) * t for s, t in zip(sessions, times, strict=True))  # type: ignore[arg-type]
    assert p["cost"] == pytest.approx(lost / sum(times))
    unweighted = sum(float(s["window_cost"]) for s in sessions) / 3  # type: ignore[arg-type]
    assert p["cost"] != pytest.approx(unweighted, rel=0.02)
    assert p["sessions"] == 3 and p["windows"] == 18 and p["seconds"] == pytest.approx(sum(times), abs=0.1)
    # What was put in: every slowed block's extra time, over the sessions' time.
    injected = sum(d - 0.0102 for s in sessions for _, d in s["raw"]["session"] if d > 0.0105)  # type: ignore[index]
    assert p["cost"] == pytest.approx(injected / sum(times), rel=0.15)
    assert abs(p["null_base"]) < 0.0005 and abs(p["null_gaps"]) < 0.0005


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_the_resolution_is_one_windows_noise_times_root_windows_over_the_time() -> None:
    quiet = [_session(0.0, 0.02, seed) for seed in range(3)]
    noisy = [_session(0.0, 0.40, seed) for seed in range(3)]
    p_quiet = pool(quiet, [s["raw"] for s in quiet])  # type: ignore[misc]
    p_noisy = pool(noisy, [s["raw"] for s in noisy])  # type: ignore[misc]
    noise, pretend = window_noise([s["raw"] for s in noisy])  # type: ignore[misc]
    # 15 s of base: pretend windows closing every second from 2.26 s to 12.26 s (their span and 2 s
    # either side inside it): 11 per session.
    assert pretend == 3 * 11 and p_noisy["noise_windows"] == pretend
    assert p_noisy["resolution"] == pytest.approx(noise * math.sqrt(18) / p_noisy["seconds"], rel=1e-3)
    # 20 times the jitter: about 20 times the noise (independent blocks, ~76 of them per window's span).
    assert 10 < p_noisy["noise_s_per_window"] / p_quiet["noise_s_per_window"] < 30
    expected = 0.010 * 0.40 / math.sqrt(3) * math.sqrt(0.76 / 0.010)  # uniform's sd, summed over the span
    assert p_noisy["noise_s_per_window"] == pytest.approx(expected, rel=0.35)
    # Twice the sessions of the same noise: the resolution shrinks by about root 2.
    twice = noisy + [_session(0.0, 0.40, seed) for seed in range(3, 6)]
    p_twice = pool(twice, [s["raw"] for s in twice])  # type: ignore[misc]
    assert p_twice["resolution"] == pytest.approx(p_noisy["resolution"] / math.sqrt(2), rel=0.3)


def test_the_verdict_wants_the_cost_within_1_and_nulls_and_resolution_within_0_3_percent() -> None:
    p = {"windows": 40, "cost": 0.004, "null_base": -0.001, "null_gaps": 0.002, "resolution": 0.0025}
    assert verdict(p) == {"cost_within_goal": True, "resolved": True}
    assert verdict({**p, "resolution": 0.0035})["resolved"] is False  # too few windows to say
    assert (
        verdict({**p, "null_gaps": -0.004})["resolved"] is False
    )  # the estimator reads a cost where none is
    assert verdict({**p, "cost": 0.012})["cost_within_goal"] is False
    assert verdict({**p, "windows": 0}) == {"cost_within_goal": None, "resolved": None}


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_ddp_results_pool_per_rank_against_its_own_and_every_ranks_windows() -> None:
    sessions = []
    for seed in range(3):
        ranks = [{**_session(0.004, 0.02, 10 * seed + r), "rank": r} for r in (0, 1)]
        sessions.append({"ranks": ranks, "job": job_view(ranks)})
    pooled = pool_results({"D1": {"sessions": sessions}})
    assert sorted(pooled) == ["D1 rank 0", "D1 rank 1"]
    for rank in (0, 1):
        row = pooled[f"D1 rank {rank}"]
        assert row["windows"] == 18 and row["job"]["windows"] == 36  # both ranks' windows
        own = [s["ranks"][rank] for s in sessions]
        assert row["cost"] == pytest.approx(pool(own, [r["raw"] for r in own])["cost"])
        assert row["verdict"] == verdict(row)


def test_a_real_h100_run_pools_to_what_its_sessions_hold() -> None:
    """W2 under production.yaml on the H100 (2026-11-28, five sessions of 20 s, 19 windows)."""
    results = json.loads(W2_RUN.read_text())["results"]
    sessions = results["W2"]["sessions"]
    p = pool_results(results)["W2"]
    times = [seconds(s["raw"]) for s in sessions]
    assert p["windows"] == sum(s["windows"] for s in sessions) == 19
    assert p["cost"] == pytest.approx(
        sum(s["window_cost"] * t for s, t in zip(sessions, times, strict=True)) / sum(times)
    )
    # One window reads +-40-120 ms where nothing happened on the H100's W2 (block times wander by
    # 10-40 % over seconds): 19 windows in 100 s do not resolve 0.3 %.
    assert 0.04 < p["noise_s_per_window"] < 0.12
    assert p["resolution"] > 0.003 and p["verdict"]["resolved"] is False


def test_the_command_reads_a_results_file_and_refuses_none(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench/lost_pooled.py"), str(W2_RUN)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "W2: pooled over 5 sessions, 19 windows" in run.stdout and "resolution" in run.stdout
    # A run cut short writes its sessions so far as WORKLOAD.partial.json: the same sessions, read alike.
    cut = tmp_path / "lost_W2.W2.partial.json"
    sessions = json.loads(W2_RUN.read_text())["results"]["W2"]["sessions"]
    cut.write_text(json.dumps({"workload": "W2", "sessions": sessions}))
    partial = subprocess.run([sys.executable, str(ROOT / "bench/lost_pooled.py"), str(cut)],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert partial.stdout.split(": ", 1)[1] == run.stdout.split(": ", 1)[1]  # the same sessions
    none = subprocess.run(
        [sys.executable, str(ROOT / "bench/lost_pooled.py")], capture_output=True, text=True
    )
    assert none.returncode == 2 and none.stderr.startswith("usage: ")


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_together_pools_one_workloads_sessions_over_several_runs(tmp_path: Path) -> None:
    """A run cut short (its ``.partial.json``) and a second run of the same workload: --together
    pools their sessions as one run holding both would be pooled."""
    first = [_session(0.010, 0.2, seed) for seed in (1, 2, 3)]
    second = [_session(0.0, 0.2, seed) for seed in (4, 5)]
    cut = tmp_path / "lost_W9.W9.partial.json"
    cut.write_text(json.dumps({"workload": "W9", "sessions": first}))
    done = tmp_path / "lost_W9.json"
    done.write_text(json.dumps({"results": {"W9": {"sessions": second}}}))
    run = subprocess.run([sys.executable, str(ROOT / "bench/lost_pooled.py"), "--together", str(cut), str(done)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    expected = pool_results({"W9": {"sessions": first + second}})["W9"]
    assert f"W9: pooled over 5 sessions, {expected['windows']} windows" in run.stdout
    assert f"cost {100 * expected['cost']:+.3f}%" in run.stdout
    apart = subprocess.run([sys.executable, str(ROOT / "bench/lost_pooled.py"), str(cut), str(done)],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert "pooled over 3 sessions" in apart.stdout and "pooled over 2 sessions" in apart.stdout


def test_bad_arguments_get_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read a results file" in err[0]
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
