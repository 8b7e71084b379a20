"""Sharing CUPTI with another tool (cuptistream.probe.coexist, cuptistream.probe.torch_profiler).

CUPTI cannot exist without a GPU, so CUPTI's subscriber slot is a fake here (``FakeCupti``: the
calls cupti-python makes, with a holder that can take and free the slot, and
``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`` naming it as cuptiSubscribe_v2 does). Everything
above it is real: the Subscriber, the state source, the sharing logic and its retry thread. torch is
not installed in CI either: the hook tests import a stand-in ``torch.autograd.profiler`` with the
three functions torch's profiler calls, from a real package on disk, in a subprocess.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cuptistream.config import SourceConfig
from cuptistream.cupti import subscriber
from cuptistream.events import CuptiYield, Event
from cuptistream.plugin import Source
from cuptistream.probe.coexist import CuptiSharing
from sources.state import StateConfig, StateSource

RETRY_S = 0.05


class FakeCuptiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"CUPTI error {status}")
        self.status = status


class FakeCupti:
    """CUPTI's one subscriber slot. ``holder`` set: another tool has it."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.ours: int | None = None
        self.enabled: set[tuple[int, int | None]] = set()
        self.lock = threading.Lock()

    def subscribe_v2(self, callback: Any, userdata: Any, params_address: int) -> int:
        with self.lock:
            if self.holder is not None or self.ours is not None:
                name = (self.holder or "cuptistream").encode()
                offset = subscriber._SubscriberParams.oldSubscriberName.offset
                target = ctypes.c_void_p.from_address(params_address + offset).value
                ctypes.memmove(target, name + b"\0", len(name) + 1)
                raise FakeCuptiError(39)
            self.ours = 7
            return 7

    def unsubscribe(self, handle: int) -> None:
        with self.lock:
            assert handle == self.ours
            self.ours = None
            self.enabled.clear()

    def enable_domain(self, enable: int, handle: int, domain: int) -> None:
        (self.enabled.add if enable else self.enabled.discard)((domain, None))

    def enable_callback(self, enable: int, handle: int, domain: int, cbid: int) -> None:
        (self.enabled.add if enable else self.enabled.discard)((domain, cbid))


class ActivityLike(Source):
    """Stands for the activity source: needs no subscriber, records its pauses and resumes."""

    needs_subscriber = False

    def __init__(self) -> None:
        super().__init__(SourceConfig(type="activity", name="activity"), emitter=None)  # type: ignore[arg-type]
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def stop(self) -> None:
        self.calls.append("stop")


class Harness:
    def __init__(self) -> None:
        self.cupti = FakeCupti()
        self.sub = subscriber.Subscriber(self.cupti)
        self.events: list[Event] = []
        self.notes: list[str] = []
        self.disabled: list[str] = []
        self.activity = ActivityLike()
        self.state = StateSource(StateConfig(type="state"), emitter=None, sub=self.sub)
        self.sharing = CuptiSharing(
            emit=self.events.extend,
            clock=time.monotonic_ns,
            disable=lambda source, error: self.disabled.append(f"{source.name}: {error}"),
            note=self.notes.append,
            retry_s=RETRY_S,
            sub=self.sub,
        )

    def yields(self) -> list[CuptiYield]:
        return [e for e in self.events if isinstance(e, CuptiYield)]


def wait_for(condition: Any, timeout: float = 3.0) -> bool:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_yield_then_take_back_with_the_subscriber_kept_by_the_tool() -> None:
    h = Harness()
    assert h.sharing.start([h.activity, h.state]) == [h.activity, h.state]
    assert h.cupti.ours is not None and (subscriber.Domain.STATE, None) in h.cupti.enabled

    h.sharing.yield_to("torch.profiler")
    assert h.activity.calls == ["start", "pause"]
    assert h.cupti.ours is None, "the subscriber must be free for the profiler"
    h.cupti.holder = "CUPTI for <not provided>"  # Kineto subscribes, and keeps it after it stops

    h.sharing.take_back("torch.profiler")
    assert h.activity.calls[-1] == "resume", "activity tracing needs no subscriber: it comes back at once"
    assert h.sharing.standing_by == ["state"]
    [span] = h.yields()
    assert span.tool == "torch.profiler" and span.reason == "tool_started"
    assert span.start <= span.end
    assert span.missed == ["activity", "state"]
    assert span.standby == ["state"] and span.holder == "'CUPTI for <not provided>'"
    assert sum("keeps CUPTI's callback subscriber" in n for n in h.notes) == 1

    time.sleep(5 * RETRY_S)  # retries while the tool holds it change nothing
    assert h.sharing.standing_by == ["state"] and h.cupti.ours is None
    h.cupti.holder = None  # the tool tears down
    assert wait_for(lambda: h.cupti.ours is not None), "the state source must subscribe again"
    assert h.sharing.standing_by == []
    assert h.disabled == []
    h.sharing.stop()


def test_a_second_cycle_yields_again_and_each_cycle_is_one_event() -> None:
    h = Harness()
    h.sharing.start([h.activity, h.state])
    for _ in range(3):
        h.sharing.yield_to("torch.profiler")
        h.sharing.yield_to("torch.profiler")  # prepare, then enable: one span
        h.sharing.take_back("torch.profiler")
    assert len(h.yields()) == 3
    assert h.activity.calls == ["start"] + ["pause", "resume"] * 3
    assert sum("stepping aside" in n for n in h.notes) == 1, "one line per tool, not per cycle"
    h.sharing.stop()


def test_held_at_start_by_a_named_tool_every_source_stands_by_then_starts() -> None:
    h = Harness()
    h.cupti.holder = "CUPTI for Nsight Systems"
    assert h.sharing.start([h.activity, h.state]) == [h.activity, h.state]
    assert h.activity.calls == [], "a named holder may be tracing activities: ours must not register"
    assert sorted(h.sharing.standing_by) == ["activity", "state"]
    [line] = h.notes
    assert "'CUPTI for Nsight Systems'" in line and "retry every 0.05s" in line
    h.cupti.holder = None
    assert wait_for(lambda: not h.sharing.standing_by)
    assert h.activity.calls == ["start"] and h.cupti.ours is not None
    [span] = h.yields()
    assert span.reason == "held_at_start" and span.tool == "'CUPTI for Nsight Systems'"
    assert "CUPTI is free again" in h.notes[-1]
    h.sharing.stop()


def test_stop_while_yielded_emits_the_open_span_and_calls_no_pause_again() -> None:
    h = Harness()
    h.sharing.start([h.activity, h.state])
    h.sharing.yield_to("torch.profiler")
    h.cupti.holder = "CUPTI for <not provided>"
    assert h.sharing.stop() == set(), "both pause by themselves: the probe stops them"
    [span] = h.yields()
    assert span.missed == ["activity", "state"]
    assert h.activity.calls == ["start", "pause"]
    h.sharing.take_back("torch.profiler")  # after stop: nothing
    assert h.activity.calls == ["start", "pause"]


def test_a_source_that_fails_to_come_back_is_disabled_not_retried() -> None:
    class Broken(ActivityLike):
        def resume(self) -> None:
            raise RuntimeError("cannot enable activity kind 'memcpy'")

    h = Harness()
    broken = Broken()
    h.sharing.start([broken])
    h.sharing.yield_to("torch.profiler")
    h.sharing.take_back("torch.profiler")
    assert h.disabled == ["activity: cannot enable activity kind 'memcpy'"]
    assert h.sharing.standing_by == []
    h.sharing.stop()


FAKE_PROFILER = '''
"""Stand-in for torch.autograd.profiler: the three functions torch's profiler calls, by global."""
calls = []

class ProfilerActivity:
    def __init__(self, name):
        self.name = name

CPU, CUDA = ProfilerActivity("CPU"), ProfilerActivity("CUDA")

def _prepare_profiler(config, activities):
    calls.append("prepare")

def _enable_profiler(config, activities, scopes=None):
    calls.append("enable")

def _disable_profiler():
    calls.append("disable")
    return "results"

def profile(activities):
    _prepare_profiler(None, activities)
    _enable_profiler(None, activities)
    return _disable_profiler()
'''

HOOK_CHECK = """
import sys
from cuptistream.probe import torch_profiler

seen = []

class Listener:
    def yield_to(self, tool):
        seen.append(("yield", tool, list(profiler.calls) if "profiler" in globals() else None))
    def take_back(self, tool):
        seen.append(("back", tool, list(profiler.calls)))

torch_profiler.listen(Listener())  # before torch is imported: the import watch installs the hooks
import torch.autograd.profiler as profiler
assert profiler._cuptistream_hooked
assert not torch_profiler.active()
assert profiler.profile([profiler.CPU]) == "results"
assert seen == [], seen
profiler.calls.clear()
assert profiler.profile([profiler.CPU, profiler.CUDA]) == "results"
assert seen == [
    ("yield", "torch.profiler", []),
    ("yield", "torch.profiler", ["prepare"]),
    ("back", "torch.profiler", ["prepare", "enable", "disable"]),
], seen
assert not torch_profiler.active()
print("hooks ok")
"""


def test_torch_profiler_hooks_yield_before_kineto_and_take_back_after(tmp_path: Path) -> None:
    package = tmp_path / "torch" / "autograd"
    package.mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "profiler.py").write_text(textwrap.dedent(FAKE_PROFILER))
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", HOOK_CHECK],
        cwd=root,
        env={"PYTHONPATH": f"{tmp_path}:{root}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "hooks ok" in result.stdout


def test_the_standby_interval_is_validated() -> None:
    from cuptistream.config import ConfigError, load

    with pytest.raises(ConfigError, match="standby_retry"):
        load(
            {
                "probe": {"standby_retry": "1ms"},
                "sources": [{"type": "synthetic"}],
                "sinks": [{"type": "null"}],
            }
        )


def test_a_yield_span_becomes_an_otlp_log_record() -> None:
    from opentelemetry.proto.logs.v1.logs_pb2 import SeverityNumber

    from cuptistream.sinks.otlp.logs import YIELD_EVENT_NAME, log_records
    from tests.otlp_batches import make_batch

    span = CuptiYield(
        tool="torch.profiler", start=1_000_000_000, end=1_250_000_000, missed=["activity:memcpy", "state"],
        standby=["state"], holder="CUPTI for <not provided>", reason="tool_started",
    )  # fmt: skip
    batch = make_batch([span])
    [record] = log_records(batch, observed_ns=5)
    assert record.event_name == YIELD_EVENT_NAME
    assert record.severity_number == SeverityNumber.SEVERITY_NUMBER_INFO
    assert record.time_unix_nano == span.start + batch.clock.offset_ns
    attrs = {kv.key: kv.value for kv in record.attributes}
    assert attrs["cuptistream.tool"].string_value == "torch.profiler"
    assert attrs["cuptistream.yield.duration_s"].double_value == pytest.approx(0.25)
    assert attrs["cuptistream.yield.missed"].string_value == "activity:memcpy,state"
    assert attrs["cuptistream.yield.standby"].string_value == "state"
    assert "for 0.250 s" in record.body.string_value


def test_the_summary_reports_what_was_left_to_other_tools(tmp_path: Path) -> None:
    from helpers.batchgen import header, run_sink

    from cuptistream.analysis.records import Recording
    from cuptistream.analysis.summary import summarize
    from cuptistream.plugin import OutgoingBatch
    from cuptistream.recording.codec import encode_batch, encode_chunk
    from cuptistream.sinks.file import FileSink, FileSinkConfig

    spans = [
        CuptiYield(tool="torch.profiler", start=10 * i, end=10 * i + 4, missed=["activity:kernel", "state"],
                   standby=["state"] if i else [], reason="tool_started")
        for i in range(1, 4)
    ]  # fmt: skip
    data = encode_batch(header(0), [encode_chunk(spans)])
    run_sink(
        FileSink(FileSinkConfig(type="file", directory=str(tmp_path))),
        [OutgoingBatch(data=data, seq=0, event_count=3)],
    )
    report = summarize(Recording(str(tmp_path), lean=True), top=None)
    [table] = [t for t in report.tables if t.name == "cupti_yields"]
    assert table.rows == [["torch.profiler", 3, 12, "activity:kernel,state", "state"]]
    assert report.meta["events"]["cupti_yield"] == 3
