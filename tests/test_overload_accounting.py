"""Overload against a slow receiver, for every ``pipeline.full_policy`` x lane ``queue.full_policy``:
the accounting adds up exactly, stage by stage, and the recording says what the report says.

Each cell is a real ``cuptistream run``: a synthetic source at full speed for 2 s (the observed
program's probe queue, then the collector's intake, both 2 MiB under the cell's ``full_policy``)
into an OTLP sink whose receiver (``tests/otlp_receiver.py``) takes 0.1 s per request and a file sink
``ref`` with room to spare. The lanes use the cell's queue policy (the OTLP lane's 1 MiB queue fills;
``ref``'s does not). Per cell:

- every sink's lane took in what the intake passed (its ``events_in`` minus the intake's drops) plus
  the control events (loss, self-stats, errors), which ``ref``'s recording holds, exactly;
- the ``Loss`` events in ``ref``'s recording add up to the report's losses, key by key, the last
  interval's (what the shutdown deadline left in the intake and in the lanes) included;
- each lane's in = out + dropped, and its drops all have a reason.

With ``drop_newest`` or ``drop_oldest`` lanes the receiver gets stuck (5 s per request) for the end,
so the 2 s ``shutdown_deadline`` passes while the OTLP lane writes: its rest is counted
(``sink:otlp/shutdown_deadline``) before the final accounting. With ``block`` lanes the receiver
stays quick and the deadline is 30 s, long enough to drain: had it passed, the chunks the distributor
held (waiting for the OTLP lane's room) would be lost for ``ref`` too, so ``ref`` could no longer
count the control events on its own. That case (``drop_newest`` intake, ``block``
lanes, the receiver stuck), is ``test_the_last_intervals_losses_reach_the_recording``: the intake
still holds data at the deadline, and the recording's losses must still equal the report's.

The cells run three at a time (the checks are counts, not timings).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import Answer, OtlpReceiver

import cuptistream
from cuptistream.events import Kernel, Loss

pytestmark = pytest.mark.slow  # a fault matrix of real pipelines: about 30 s

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("block", "drop_newest", "drop_oldest")
PROGRAM = "from cuptistream.probe import bootstrap; bootstrap._probe.sources[0]._thread.join()"


def run_cell(
    tmp: Path, intake: str, lane: str, stuck_at_end: bool, deadline: str
) -> tuple[dict[str, Any], dict[str, int], int, int]:
    """Returns the report, ``ref``'s recorded losses by key, its Kernels and its other events.
    ``stuck_at_end``: from the program's last second on, the receiver takes 5 s per request, so the
    shutdown deadline passes with the OTLP lane writing (and, with ``block`` lanes, the distributor
    waiting for it with chunks in hand, and the intake full)."""
    with OtlpReceiver() as receiver:
        receiver.fallback = Answer(delay=0.1)
        if stuck_at_end:
            threading.Timer(1.5, lambda: setattr(receiver, "fallback", Answer(delay=5.0))).start()
        config = {
            "sources": [{"type": "synthetic", "events": 0, "rate": 0, "duration": "2s", "chunk_events": 500}],
            # A small probe queue and few slots: less held in flight, so block x block drains in time.
            "probe": {"memory_budget": "2MiB", "event_buffer_size": "256KiB", "event_buffers": 2},
            "pipeline": {"memory_budget": "2MiB", "full_policy": intake, "stats_interval": "500ms",
                         "shutdown_deadline": deadline},
            "sinks": [
                {"type": "otlp", "name": "otlp", "endpoint": receiver.endpoint, "timeout": "2s",
                 "queue": {"max_bytes": "1MiB", "full_policy": lane}},
                {"type": "file", "name": "ref", "directory": str(tmp / "ref"),
                 "queue": {"max_bytes": "512MiB", "full_policy": lane}},
            ],
        }  # fmt: skip
        (tmp / "cfg.json").write_text(json.dumps(config))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(
            [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp / "cfg.json"),
             "--report-json", str(tmp / "report.json"), "--", sys.executable, "-c", PROGRAM],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads((tmp / "report.json").read_text())
    recorded: collections.Counter[str] = collections.Counter()
    kernels = others = 0
    for event in cuptistream.read(tmp / "ref"):
        if isinstance(event, Kernel):
            kernels += 1
        else:
            others += 1
            if isinstance(event, Loss) and event.unit == "events":
                recorded[f"{event.stage}/{event.reason}"] += event.count
    return report, dict(recorded), kernels, others


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    base = tmp_path_factory.mktemp("overload")
    combos = list(itertools.product(POLICIES, POLICIES))
    for intake, lane in combos:
        (base / f"{intake}-{lane}").mkdir()
    outcomes: dict[tuple[str, str], Any] = {}
    (base / "deadline").mkdir()
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            (intake, lane): pool.submit(
                run_cell,
                base / f"{intake}-{lane}",
                intake,
                lane,
                lane != "block",
                "30s" if lane == "block" else "2s",
            )
            for intake, lane in combos
        }
        futures["deadline", ""] = pool.submit(run_cell, base / "deadline", "drop_newest", "block", True, "2s")
        for combo, future in futures.items():
            try:
                outcomes[combo] = future.result()
            except Exception as error:  # reported by that cell's test
                outcomes[combo] = error
    return outcomes


@pytest.mark.parametrize(("intake", "lane"), list(itertools.product(POLICIES, POLICIES)))
def test_overload_accounting_is_exact(cells: dict[tuple[str, str], Any], intake: str, lane: str) -> None:
    outcome = cells[intake, lane]
    if isinstance(outcome, BaseException):
        raise outcome
    report, recorded, kernels, control = outcome
    passed = report["events_in"] - report["intake_dropped"]
    losses = {k: int(v) for k, v in report["losses"].items()}
    print(f"intake {intake}, lanes {lane}: {report['events_in']} in, {report['intake_dropped']} dropped at "
          f"the intake, {passed} passed, {control} control events; ref holds {kernels} kernels; "
          f"losses {losses}")  # fmt: skip
    assert report["intake_dropped"] > 0 or losses.get("probe/queue_full", 0) > 0 or intake == "block", (
        "the overload never filled a queue"
    )
    for name, stats in report["sinks"].items():
        assert stats["events_in"] == passed + control, (name, stats, passed, control)
        assert stats["events_in"] == stats["events_out"] + stats["events_dropped"], (name, stats)
        lane_losses = sum(n for k, n in losses.items() if k.startswith(f"sink:{name}/"))
        assert lane_losses == stats["events_dropped"], (name, stats, losses)
    ref = report["sinks"]["ref"]
    assert ref["events_dropped"] == 0, ref  # room to spare: it holds every control event
    assert kernels == passed  # ... and every event the intake passed
    # What was counted after the final accounting chunk was built (the stuck OTLP lane dropping that
    # chunk, docs/reliability.md) is in no recording, and the report says so, key by key: the rest
    # adds up exactly. The ref lane, which delivers everything, has nothing unrecorded.
    unrecorded = {k: int(v) for k, v in report["unrecorded_losses"].items()}
    assert set(unrecorded) <= {"sink:otlp/shutdown_deadline"}, unrecorded
    expected = {k: n - unrecorded.get(k, 0) for k, n in losses.items()}
    assert recorded == {k: n for k, n in expected.items() if n}, (
        "the recording's Loss events and the report disagree",
        recorded,
        losses,
        unrecorded,
    )


def test_the_last_intervals_losses_reach_the_recording(cells: dict[tuple[str, str], Any]) -> None:
    outcome = cells["deadline", ""]
    if isinstance(outcome, BaseException):
        raise outcome
    report, recorded, kernels, _ = outcome
    losses = {k: int(v) for k, v in report["losses"].items()}
    print(f"drop_newest intake, block lanes, receiver stuck: deadline hit {report['deadline_hit']}, "
          f"ref holds {kernels} kernels; losses {losses}")  # fmt: skip
    assert report["deadline_hit"]
    # What the deadline left in the intake, in the distributor's hands and in the OTLP lane: counted
    # after draining ran out, before the final accounting, so the recording has it too.
    assert losses.get("intake/shutdown_deadline", 0) + losses.get("sink:otlp/shutdown_deadline", 0) > 0, (
        losses
    )
    # What the deadline left in the intake is in the recording exactly. The stuck OTLP lane may also
    # drop the final accounting chunk itself at the deadline (tens of control events); that drop is
    # counted after the chunk was built, so the report lists it as unrecorded, as
    # docs/reliability.md says. Whether the chunk got into that lane before the deadline is timing.
    unrecorded = {k: int(v) for k, v in report["unrecorded_losses"].items()}
    assert set(unrecorded) <= {"sink:otlp/shutdown_deadline"} and sum(unrecorded.values()) <= 64, unrecorded
    expected = {k: n - unrecorded.get(k, 0) for k, n in losses.items()}
    assert recorded == {k: n for k, n in expected.items() if n}, (
        "the recording's Loss events and the report disagree"
    )
    assert recorded.get("intake/shutdown_deadline") == losses.get("intake/shutdown_deadline"), (
        recorded,
        losses,
    )
    for name, stats in report["sinks"].items():
        assert stats["events_in"] == stats["events_out"] + stats["events_dropped"], (name, stats)
