"""bench/budget_lost_time.py's estimator on block timings with a known cost: blocks of 10 ms, and
around each window's span some blocks made slower by a known amount. The GPU run reads real blocks;
this checks that the arithmetic recovers what was put in and that both nulls read zero where
nothing was."""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from budget_lost_time import (  # noqa: E402
    AFTER_S,
    BEFORE_S,
    between,
    child_command,
    gap_windows,
    hold_windows,
    job_view,
    null_in_base,
    null_in_gaps,
    read_ranks,
    recorded_windows,
    summarize_ranks,
    verdict,
)
from lost_time import window_cost  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded_phases() -> None:
    """The estimator lays its null's pretend windows at a random phase (``random``): seeded, so a
    test reads the same null on every run (over 300 phases one in 300 read above the 0.0005 bound)."""
    random.seed(2026)


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


def _rank(
    rank: int, blocks: list[tuple[float, float]], windows: list[tuple[float, float]]
) -> dict[str, object]:
    """One rank's result as the DDP child writes it: the figures the parent summarizes, and the raw series."""
    total = sum(d for _, d in blocks)
    cost, _ = window_cost(blocks, windows, BEFORE_S, AFTER_S, baseline="mean")
    base = _blocks(15.0, [], extra=0.0)
    return {
        "rank": rank, "windows": len(windows), "window_cost": cost, "null_base": null_in_base(base, windows, total),
        "null_gaps": null_in_gaps(blocks, windows)[0], "expected_cost": 0.009, "between_over_base": 0.0,
        "raw": {"base": base, "session": blocks, "windows": windows},
    }  # fmt: skip


def test_ddp_job_view_counts_the_peers_windows_that_a_rank_waited_for() -> None:
    """Two ranks in lockstep: each rank's blocks slow down in both ranks' windows (a peer waits for
    the slowed rank in the all-reduce). Valued against its own windows a rank reads about half of
    what it lost; against every rank's windows, all of it, and the gap null stays near zero."""
    own = {0: [(5.0 * k + 2.06, 0.06) for k in range(6)], 1: [(5.0 * k + 4.56, 0.06) for k in range(6)]}
    both = sorted(own[0] + own[1])
    blocks = _blocks(31.0, both, extra=0.005)  # the same blocks on both ranks: lockstep
    injected = sum(d - 0.010 for _, d in blocks if d > 0.0105) / sum(d for _, d in blocks)
    ranks = [_rank(r, blocks, own[r]) for r in (0, 1)]
    job = job_view(ranks)
    for r in ("0", "1"):
        assert job[r]["windows"] == 12
        assert job[r]["window_cost"] == pytest.approx(injected, rel=0.1)
        assert abs(job[r]["null_gaps"]) < 0.0005 and abs(job[r]["null_base"]) < 0.0005
    assert all(rank["window_cost"] < 0.7 * injected for rank in ranks)  # its own windows: about half


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_ddp_summary_is_per_rank_over_sessions(tmp_path: Path) -> None:
    windows = [(5.0 * k + 2.06, 0.06) for k in range(6)]
    sessions = []
    for extra in (0.002, 0.004, 0.006):
        ranks = [_rank(r, _blocks(31.0, windows, extra=extra), windows) for r in (0, 1)]
        sessions.append({"ranks": ranks, "job": job_view(ranks)})
    summary = summarize_ranks(sessions)
    assert sorted(summary) == ["0", "1"]
    for rank in ("0", "1"):
        row = summary[rank]
        assert row["sessions"] == 3
        costs = sorted(s["ranks"][int(rank)]["window_cost"] for s in sessions)
        assert row["window_cost"] == {"median": costs[1], "min": costs[0], "max": costs[2]}
        assert set(row["job"]) == {"sessions", "window_cost", "null_base", "null_gaps", "windows"}
        assert row["job"]["window_cost"]["min"] > 0
    # What the child writes is what the parent reads; a rank missing is a failed session.
    for r in sessions[0]["ranks"]:
        (tmp_path / f"rank{r['rank']}.json").write_text(json.dumps(r))
    read = read_ranks(tmp_path, 2)
    assert read is not None and [r["rank"] for r in read] == [0, 1]
    assert job_view(read)["1"]["window_cost"] == pytest.approx(sessions[0]["job"]["1"]["window_cost"])
    assert read_ranks(tmp_path, 3) is None


def test_a_ddp_session_is_torchrun_of_the_child_per_rank() -> None:
    args = argparse.Namespace(
        seconds=30.0,
        base=12.0,
        settle=1.0,
        warmup=2.0,
        config=ROOT / "configs" / "production.yaml",
        ddp=2,
        late_session=False,
    )
    command = child_command("D1", args, Path("/tmp/x/ranks"))
    assert "--nproc_per_node=2" in command and "--standalone" in command
    assert (
        command[command.index("--ddp") + 1] == "2" and command[command.index("--out") + 1] == "/tmp/x/ranks"
    )
    assert command[command.index("--child") - 1].endswith("budget_lost_time.py")
    single = child_command("W1", argparse.Namespace(**{**vars(args), "ddp": 0}), Path("r.json"))
    assert single[0] == sys.executable and "--ddp" not in single and "--late-session" not in single
    late = child_command("W1", argparse.Namespace(**{**vars(args), "late_session": True}), Path("r.json"))
    assert "--late-session" in late


def test_the_base_part_holds_the_sessions_windows_shut() -> None:
    """``hold_windows`` takes the governor's window slot as another source's window would: the
    activity source's claim fails until the base part ends; a window already open is waited for."""
    from cuptistream.overhead import Governor

    governor = Governor(0.01, lambda decision: None)
    assert governor.claim("activity")  # a window opened before the bench's hold
    released = threading.Timer(0.2, governor.release, ("activity",))
    released.start()
    began = time.monotonic()
    let_go = hold_windows(governor)
    assert time.monotonic() - began >= 0.15  # waited for that window to close
    assert not governor.claim("activity")  # the next window may not open during the base part
    let_go()
    assert governor.claim("activity")


def test_the_verdict_is_issue_32s_goal_per_rank() -> None:
    def mmm(median: float) -> dict[str, float]:
        return {"median": median, "min": median - 0.001, "max": median + 0.001}

    row = {"window_cost": mmm(0.004), "null_base": mmm(-0.001), "null_gaps": mmm(0.002), "windows": mmm(6),
           "job": {"window_cost": mmm(0.009), "null_base": mmm(0.0), "null_gaps": mmm(-0.0025)}}  # fmt: skip
    assert verdict(row) == {"cost_within_goal": True, "job_cost_within_goal": True, "nulls_resolved": True}
    row["job"]["window_cost"] = mmm(0.014)  # two ranks' windows stall the job: over 1 %
    row["null_gaps"] = mmm(-0.004)  # a null past 0.3 %: not resolved
    assert verdict(row) == {"cost_within_goal": True, "job_cost_within_goal": False, "nulls_resolved": False}
    row["job"]["null_base"] = {}
    assert verdict(row)["nulls_resolved"] is None
    row["windows"] = {"median": 6, "min": 0, "max": 7}  # a session without a window measured nothing
    assert set(verdict(row).values()) == {None}


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_main_under_ddp_summarizes_what_the_ranks_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parent's side of ``--ddp``: each session's command (here a stand-in for torchrun that
    writes two ranks' results) is run, read per rank, valued against every rank's windows, kept as
    it ends, and summarized per rank; a session whose ranks wrote nothing is reported and skipped."""
    import budget_lost_time

    windows = [(5.0 * k + 2.06, 0.06) for k in range(6)]
    ranks = [_rank(r, _blocks(31.0, windows, extra=0.004), windows) for r in (0, 1)]
    (tmp_path / "ranks.json").write_text(json.dumps(ranks))
    calls = []

    def stand_in(workload: str, args: argparse.Namespace, out: Path, no_session: bool = False) -> list[str]:
        calls.append(out)
        if len(calls) == 2:
            failing = "import os, sys; print('fault handler', os.environ['PYTHONFAULTHANDLER']); sys.exit('rank 1 failed')"
            return [sys.executable, "-c", failing]
        program = (
            "import json, sys; from pathlib import Path; out = Path(sys.argv[2]); out.mkdir()\n"
            "for r in json.loads(Path(sys.argv[1]).read_text()): (out / f'rank{r[\"rank\"]}.json').write_text(json.dumps(r))"
        )
        return [sys.executable, "-c", program, str(tmp_path / "ranks.json"), str(out)]

    monkeypatch.setattr(budget_lost_time, "child_command", stand_in)
    out = tmp_path / "lost.json"
    assert (
        budget_lost_time.main(["--ddp", "2", "--workloads", "D1", "--sessions", "3", "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    kept = tmp_path / "lost.D1_session_1.output.txt"
    assert f"D1 session 1: exit 1 (all its output: {kept}): rank 1 failed" in printed
    assert kept.read_text() == "exit 1\n== stdout\nfault handler 1\n\n== stderr\nrank 1 failed\n"
    assert "D1 rank 0 (2 sessions): cost " in printed and "D1 rank 1 (2 sessions): cost " in printed
    result = json.loads(out.read_text())["results"]["D1"]
    assert len(result["sessions"]) == 2 and sorted(result["per_rank"]) == ["0", "1"]
    row = result["per_rank"]["1"]
    assert row["window_cost"]["median"] == pytest.approx(ranks[1]["window_cost"])
    assert row["job"]["window_cost"]["median"] == pytest.approx(job_view(ranks)["1"]["window_cost"])
    assert set(row["verdict"]) == {"cost_within_goal", "job_cost_within_goal", "nulls_resolved"}
    partial = json.loads((tmp_path / "lost.D1.partial.json").read_text())
    assert len(partial["sessions"]) == 2


def test_gap_windows_stay_clear_of_overlapping_ranks_windows() -> None:
    """Two ranks' windows together (``job_view``): nearly aligned, one rank's span inside the
    other's. No pretend window may touch either."""
    rank0 = [(5.0 * k + 2.10, 0.09) for k in range(6)]
    rank1 = [(5.0 * k + 2.08, 0.05) for k in range(6)]  # opens later, closes sooner: nested
    union = sorted(rank0 + rank1)
    pretend = gap_windows(union, 0.0, 31.0)
    touched = [(c - w - BEFORE_S, c + AFTER_S) for c, w in union]
    assert len(pretend) == 7  # the five gaps between pairs, before the first (0 .. 1.81), after the last
    for closed, length in pretend:
        lo, hi = closed - length - BEFORE_S, closed + AFTER_S
        assert all(hi <= t_lo or lo >= t_hi for t_lo, t_hi in touched), (lo, hi)
        assert length == 0.09  # as long as the longest window of the pair before it


def test_drift_runs_the_same_blocks_with_no_session_after_each_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--drift``: after each session the child runs with ``--no-session``; the summary sets the
    sessions' between-windows/base against the no-session runs' later/base, per rank."""
    import budget_lost_time

    commands: list[list[str]] = []
    real = budget_lost_time.child_command

    def stand_in(workload: str, args: argparse.Namespace, out: Path, no_session: bool = False) -> list[str]:
        commands.append(real(workload, args, out, no_session))
        later = 0.02 if no_session else 0.05  # the process drifts 2 %; a session adds 3 % between windows
        # The fast floor (p10 of the raw blocks): 2 % slower later with no session, 10 % with one.
        floor = 0.0102 if no_session else 0.011
        raw = {"base": [[i * 0.01, 0.010] for i in range(20)], "windows": [],
               "session": [[1 + i * 0.02, floor + (0.01 if i % 2 else 0.0)] for i in range(20)]}  # fmt: skip
        result = {"rank": None, "windows": 0 if no_session else 5, "window_cost": 0.001, "null_base": 0.0,
                  "null_gaps": 0.0, "expected_cost": 0.009, "between_over_base": later + 0.001 * len(commands),
                  "raw": raw}  # fmt: skip
        program = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"
        return [sys.executable, "-c", program, str(out), json.dumps(result)]

    monkeypatch.setattr(budget_lost_time, "child_command", stand_in)
    out = tmp_path / "lost.json"
    argv = ["--workloads", "W1", "--sessions", "2", "--drift", "--out", str(out)]
    assert budget_lost_time.main(argv) == 0
    assert ["--no-session" in c for c in commands] == [False, True, False, True]
    drift = json.loads(out.read_text())["results"]["W1"]["drift"]
    assert len(drift["runs"]) == 2
    row = drift["per_rank"]["0"]
    assert row["session"]["median"] == pytest.approx(0.052)  # 0.051 and 0.053
    assert row["no_session"]["median"] == pytest.approx(0.023)  # 0.022 and 0.024
    assert row["difference_of_medians"] == pytest.approx(0.029)
    printed = capsys.readouterr().out
    assert "W1 no session 1: later/base +2.40%" in printed
    assert (
        "W1 rank 0 between windows over base (median): session" in printed and "difference +2.90%" in printed
    )
    assert row["floor_session"]["median"] == pytest.approx(0.10)
    assert row["floor_no_session"]["median"] == pytest.approx(0.02)
    assert "W1 rank 0 between windows over base (p10): session" in printed and "difference +8.00%" in printed


def test_a_sessions_recorded_windows_say_how_many_attached_afresh(tmp_path: Path) -> None:
    """``recorded_windows`` reads the session's own recording (a real session and file sink): the
    windows with kinds, how many were fresh, and each message worse than ``debug`` with its count."""
    import yaml

    import cuptistream
    from cuptistream.events import Error, TraceWindow

    out = tmp_path / "rec"
    config = {"sources": [], "sinks": [{"type": "file", "directory": str(out)}]}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))

    def window(n: int, fresh: bool, kinds: list[str]) -> TraceWindow:
        return TraceWindow(
            source="activity", window=n, start=n, end=n + 1, kinds=kinds, records=0, fresh=fresh
        )

    stayed = "CUPTI stayed attached after a window: no CUDA call returned within 1 s"
    events = [window(1, True, ["kernel"]), window(2, False, ["kernel"]), window(3, True, ["kernel"]),
              window(4, True, []),  # no kinds: not a trace window of the budget's
              Error(severity="info", origin="source:activity", message=stayed, timestamp=1),
              Error(severity="debug", origin="pipeline", message="noise", timestamp=2)]  # fmt: skip
    with cuptistream.session(config, quiet=True) as session:
        session.emitter.emit(events)
    assert recorded_windows(path, None) == {"windows": 3, "fresh": 2, "messages": {f"info: {stayed}": 1}}
    assert recorded_windows(path, 1)["windows"] == 0  # another rank's batches do not count
    path.write_text(yaml.safe_dump({"sinks": [{"type": "file", "directory": str(tmp_path / "none")}]}))
    assert recorded_windows(path, None) == {"windows": None, "fresh": None, "messages": {}}
