"""Where budget windows open (sources/activity/schedule.py): phases of the process's own, or the same
moments in every rank of a job.

The window thread runs with the real governor and throttle; CUPTI cannot exist on this machine, so
the tracer is the recording stand-in of tests/test_activity_windows.py."""

from __future__ import annotations

import time

import pytest

from cuptistream.config import load
from cuptistream.errors import ConfigError
from cuptistream.overhead import Governor, Plan, Throttle
from sources.activity.schedule import _MAX_SEARCH, FreeSchedule, JobSchedule, job_key, schedule_for
from sources.activity.windows import Windows
from tests.test_activity_windows import RecordingTracer

TORCHRUN = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "29500",
}


def test_job_key_names_the_job_every_rank_shares() -> None:
    # torchrun without --rdzv-id sets TORCHELASTIC_RUN_ID=none: the rendezvous address is the key.
    rank1 = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}
    rank3 = {**rank1, "RANK": "3", "LOCAL_RANK": "3"}
    assert job_key(rank1) == job_key(rank3) == "MASTER_ADDR=10.0.0.7/MASTER_PORT=29500"
    assert job_key({**TORCHRUN, "TORCHELASTIC_RUN_ID": "train-42"}) == "TORCHELASTIC_RUN_ID=train-42"
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "991", "SLURM_STEP_ID": "0"}
    assert job_key(slurm) == "SLURM_JOB_ID=991/SLURM_STEP_ID=0"
    assert job_key({**TORCHRUN, "MASTER_PORT": "29501"}) != job_key(TORCHRUN)  # another job
    # Nothing to align with: one process, or no launcher at all.
    assert job_key({**TORCHRUN, "WORLD_SIZE": "1"}) is None
    assert job_key({}) is None


def _throttle_for(budget: float | None) -> Throttle:
    governor = Governor(budget, lambda decision: None)
    return Throttle(
        governor, "activity", window_s=0.2, pause_s=10.0, prior_unit_cost=0.6, timestamp=time.monotonic_ns
    )


def test_schedule_for_aligns_only_ranks_of_a_job_and_only_when_asked() -> None:
    governed = _throttle_for(0.01)
    assert isinstance(schedule_for(governed, 0.2, "job", environ=TORCHRUN), JobSchedule)
    assert isinstance(schedule_for(governed, 0.2, "none", environ=TORCHRUN), FreeSchedule)
    free = schedule_for(governed, 0.2, "job", environ={})
    assert isinstance(free, FreeSchedule)
    # Under a budget the first window waits a random part of the first pause; with none it opens at once.
    plan = governed.plan
    assert len({free.first(plan) for _ in range(5)}) == 5 and all(
        0 <= free.first(plan) <= plan.pause_s for _ in range(50)
    )
    ungoverned = _throttle_for(None)
    assert schedule_for(ungoverned, 0.2, "job", environ={}).first(ungoverned.plan) == 0.0


def test_ranks_with_one_plan_open_the_same_slots_at_the_planned_duty() -> None:
    key = job_key(TORCHRUN)
    assert key is not None
    a, b = JobSchedule(key, 0.2), JobSchedule(key, 0.2)
    plan = Plan(window_s=0.2, pause_s=3.8)  # 5 % of the time: 1 slot in 20
    opened = [s for s in range(100_000) if a.opens(s, plan)]
    assert opened == [s for s in range(100_000) if b.opens(s, plan)]
    assert len(opened) / 100_000 == pytest.approx(0.05, rel=0.05)
    # Another job's slots are drawn apart: they meet about as often as chance has it (5 % of 5 %).
    other = JobSchedule(job_key({**TORCHRUN, "MASTER_PORT": "29999"}) or "", 0.2)
    shared = sum(other.opens(s, plan) for s in opened)
    assert shared / len(opened) == pytest.approx(0.05, abs=0.02)


def test_a_costlier_rank_opens_a_subset_of_its_peers_slots() -> None:
    schedule = JobSchedule("job", 0.2)
    cheap, costly = Plan(0.2, 1.8), Plan(0.2, 7.8)  # 10 % and 2.5 % of the time
    cheap_slots = {s for s in range(50_000) if schedule.opens(s, cheap)}
    costly_slots = {s for s in range(50_000) if schedule.opens(s, costly)}
    assert costly_slots and costly_slots <= cheap_slots
    assert len(costly_slots) / len(cheap_slots) == pytest.approx(0.25, rel=0.1)
    # A window shorter than the slot is planned at a higher rate, up to every slot.
    assert all(schedule.opens(s, Plan(0.05, 0.05)) for s in range(1000))


def test_the_next_window_waits_for_the_next_open_slot_on_the_wall_clock() -> None:
    now = [1000.05]
    schedule = JobSchedule("job", 0.2, clock=lambda: now[0])
    plan = Plan(0.2, 1.8)
    slot = schedule.next_slot(plan, now[0])
    assert slot > 1000.05 / 0.2 and schedule.opens(slot, plan)
    assert not any(schedule.opens(s, plan) for s in range(5001, slot))
    assert schedule.next(plan) == pytest.approx(slot * 0.2 - now[0])
    now[0] = slot * 0.2 + 0.01  # that slot has begun: a missed start is never taken late
    assert schedule.missed(plan) > 0.19
    # A plan that would open almost never searches a bounded number of slots (~0.5 s of hashing).
    assert schedule.next_slot(Plan(0.2, 1e12), 0.0) == 1 + _MAX_SEARCH


def _rank(budget: float) -> tuple[Windows, RecordingTracer, list[float]]:
    """One rank's window thread, on a schedule aligned by the key 'job' and slots of 50 ms; its
    tracer notes the wall-clock time of each window's opening."""
    governor = Governor(budget, lambda decision: None)
    throttle = Throttle(
        governor, "activity", window_s=0.05, pause_s=0.05, prior_unit_cost=0.6, min_window_s=0.01,
        max_pause_s=0.5, timestamp=time.monotonic_ns,
    )  # fmt: skip
    opened: list[float] = []
    tracer = RecordingTracer({"kernel": 100})
    begin = tracer.begin_window

    def begin_noting_time(on_demand: bool, request: int) -> int | None:
        opened.append(time.time())
        return begin(on_demand, request)

    tracer.begin_window = begin_noting_time  # type: ignore[method-assign]
    windows = Windows(tracer, throttle, JobSchedule("job", 0.05))
    tracer.windows = windows
    return windows, tracer, opened


def test_two_ranks_window_threads_open_their_windows_in_the_same_slots() -> None:
    ranks = [_rank(0.3), _rank(0.3)]
    for windows, _, _ in ranks:
        windows.start()
    deadline = time.monotonic() + 10.0
    while min(len(opened) for _, _, opened in ranks) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    for windows, _, _ in ranks:
        windows.stop()
    slots = []
    for _, tracer, opened in ranks:
        assert len(opened) >= 6, tracer.log
        # Each window opened at the start of a 50 ms slot of the wall clock.
        on_time = [t for t in opened if t % 0.05 < 0.02]  # a loaded machine may wake a thread late
        assert len(on_time) >= 0.8 * len(opened), [round(t % 0.05, 4) for t in opened]
        slots.append({int(t // 0.05) for t in opened})
    common = slots[0] & slots[1]
    assert len(common) >= 5 and len(common) >= 0.8 * min(len(s) for s in slots), slots


def test_align_is_checked_in_the_config() -> None:
    source = {"type": "activity", "mode": "budget"}
    with pytest.raises(ConfigError, match="align"):
        load({"sinks": [{"type": "null"}], "sources": [{**source, "align": "ranks"}]})
    config = load({"sinks": [{"type": "null"}], "sources": [{**source, "align": "none"}]})
    assert config.sources[0].align == "none"  # type: ignore[attr-defined]
    assert load({"sinks": [{"type": "null"}], "sources": [source]}).sources[0].align == "job"  # type: ignore[attr-defined]
