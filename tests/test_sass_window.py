"""SASS metrics source windows: call order, config kept across sessions, decoding, losses.

No GPU here, so CUPTI cannot run. ``FakeSass`` stands in for the ``sass_api`` calls (SetConfig,
Enable, GetDataProperties, FlushData, Disable, ...): its FlushData writes real
``CUpti_SassMetrics_Data`` records and instance values into the ``FlushBuffer`` the source made,
with function names malloc'ed by libc as CUPTI does, so the source's real decoder reads them and
the real ``free_function_names`` frees them. The context and driver look-ups are faked too.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

import cuptistream.sources.sass as sassmod
from cuptistream.config import convert
from cuptistream.cupti import driver, subscriber
from cuptistream.cupti import sass_api as sass
from cuptistream.cupti.contexts import CONTEXT_CREATED
from cuptistream.cupti.library import CuptiError
from cuptistream.events import Event, SassMetricBatch, SassRecord
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk, decode_events
from cuptistream.sources.sass import SassConfig, SassMetricsSource

CTX, OTHER_GPU_CTX = 0x5A55_0000, 0x5A55_1000
IDS = {CTX: (0, 21), OTHER_GPU_CTX: (1, 22)}  # ctx -> (device id, CUPTI context id)
INST, THREAD_INST = "smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"
METRICS = {INST: (101, "warp instructions"), THREAD_INST: (102, "thread instructions")}


class RecordingEmitter(Emitter):
    """Records what a source hands the pipeline: events, losses (with unit) and error events."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.losses: list[tuple[str, str, int, str]] = []
        self.errors: list[tuple[str, str, str, int]] = []

    def emit(self, events: Sequence[Event]) -> None:
        self.events.extend(events)

    def emit_chunk(self, chunk: Chunk) -> None:
        self.events.extend(decode_events(chunk.payload))

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        self.losses.append((stage, reason, count, unit))

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        self.errors.append((origin, message, severity, result_code))


@dataclass
class Rec:
    """One patched-instruction record as FlushData writes it."""

    function: str
    pc_offset: int
    values: list[tuple[int, int]]  # (metric id, value) per instance
    crc: int = 0xC0DE_F00D
    function_index: int = 3


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]


def malloc_string(text: str) -> int:
    """A C string from libc malloc, as CUPTI allocates record names (free_function_names frees it)."""
    raw = text.encode() + b"\0"
    address = _libc.malloc(len(raw))
    assert address
    ctypes.memmove(address, raw, len(raw))
    return int(address)


class FakeSass:
    """Stands in for CUPTI's SASS metrics API, which needs a GPU that CI does not have."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.records: list[Rec] = []  # what the window collected
        self.instances = 2
        self.dropped = 0
        self.flush_error = 0
        self.patched_after_query = 0  # records CUPTI adds between GetDataProperties and FlushData
        self.name_at: Callable[[str], int] = malloc_string
        self.buffers: list[sass.FlushBuffer] = []

    def profiler_initialize(self) -> None:
        pass

    def chip_name(self, device: int) -> str:
        return "GH100"

    def metrics(self, chip: str) -> dict[str, tuple[int, str]]:
        return dict(METRICS)

    def set_config(self, device: int, configs: list[tuple[int, int]]) -> None:
        self.log.append(("set_config", device, list(configs)))

    def unset_config(self, device: int) -> None:
        self.log.append(("unset_config", device))

    def enable(self, ctx: int, lazy: bool) -> None:
        self.log.append(("enable", ctx, lazy))

    def data_properties(self, ctx: int) -> tuple[int, int]:
        self.log.append(("data_properties", ctx))
        reported = len(self.records) - self.patched_after_query
        return (reported, self.instances) if self.records else (0, 0)

    def flush(self, ctx: int, buffer: sass.FlushBuffer) -> None:
        self.log.append(("flush", ctx))
        if self.flush_error:
            raise CuptiError("cuptiSassMetricsFlushData", self.flush_error, "fake failure")
        # As CUPTI does: every record patched so far, also those after GetDataProperties; a buffer
        # without room for them is CUPTI's OUT_OF_MEMORY (or a corrupt heap).
        if buffer.records < len(self.records) or buffer.instances != self.instances:
            raise CuptiError("cuptiSassMetricsFlushData", 8, "buffer too small")
        self.buffers.append(buffer)
        for record, rec in zip(buffer.data, self.records, strict=False):
            record.cubinCrc, record.functionIndex = rec.crc, rec.function_index
            record.pcOffset = rec.pc_offset
            record.functionName = self.name_at(rec.function)
            values = (sass.InstanceValue * self.instances).from_address(record.pInstanceValues)
            for slot, (metric, value) in zip(values, rec.values, strict=True):
                slot.metricId, slot.value = metric, value

    def disable(self, ctx: int) -> int:
        self.log.append(("disable", ctx))
        return self.dropped


class Harness:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.fake = FakeSass(self.log)
        self.sub = SimpleNamespace(handlers={})
        self.others_hold_cupti = False
        self.contexts = [CTX]
        self.monkeypatch = monkeypatch
        self.sources: list[SassMetricsSource] = []
        fake = self.fake
        for name in (
            "profiler_initialize", "chip_name", "metrics", "set_config", "unset_config", "enable",
            "data_properties", "flush", "disable",
        ):  # fmt: skip
            # Stands in for the CUPTI SASS metrics call of that name, which needs a GPU CI does not have.
            monkeypatch.setattr(sass, name, getattr(fake, name))
        real_free = sass.free_function_names

        def free(buffer: sass.FlushBuffer) -> None:
            self.log.append(("free",))
            real_free(buffer)

        monkeypatch.setattr(sass, "free_function_names", free)
        real_decode = sassmod.decode_sass_records

        def decode(*args: Any) -> list[SassRecord]:
            self.log.append(("decode",))
            return real_decode(*args)

        monkeypatch.setattr(sassmod, "decode_sass_records", decode)
        # Stand in for the CUDA driver / CUPTI context calls, which need a GPU that CI does not have.
        monkeypatch.setattr(sassmod, "context_ids", lambda ctx: IDS[ctx])
        monkeypatch.setattr(sassmod, "current_context", lambda: 0)
        monkeypatch.setattr(sassmod, "active_primary_contexts", lambda: list(self.contexts))
        monkeypatch.setattr(sassmod, "make_current", lambda ctx: self.log.append(("make_current", ctx)))
        # Stand in for CUPTI attach/detach and cuptiGetTimestamp (need a GPU that CI does not have).
        monkeypatch.setattr(driver, "require_gpu", lambda: None)
        monkeypatch.setattr(driver, "detached_once", False)
        monkeypatch.setattr(driver, "acquire", lambda user: None)
        monkeypatch.setattr(driver, "release", lambda user: self.log.append(("release", user)))
        monkeypatch.setattr(driver, "held_by_others", lambda user: self.others_hold_cupti)
        monkeypatch.setattr(driver, "timestamp", lambda: 123_456_789)
        # Stands in for the CUPTI callback subscriber, which needs a GPU that CI does not have.
        monkeypatch.setattr(subscriber, "register", self._register)
        # A fresh process as far as the kept SASS config goes.
        monkeypatch.setattr(sassmod, "_kept_configs", {})

    def _register(self, domain: int, handler: Any, cbid: int | None = None) -> Any:
        table = self.sub.handlers
        table[cbid] = handler
        return SimpleNamespace(remove=lambda: table.pop(cbid, None))

    def session(self, **config: Any) -> tuple[SassMetricsSource, RecordingEmitter]:
        cfg = {
            "type": "sass",
            "metrics": [INST, THREAD_INST],
            "granularity": "sm",
            "window": 0,
            "initial_delay": 3600,  # the worker never opens a window itself: the test calls window()
            "watchdog_timeout": 5,
            **config,
        }
        emitter = RecordingEmitter()
        source = SassMetricsSource(convert(cfg, SassConfig), emitter)
        source.start()
        self.sources.append(source)
        return source, emitter

    def stop(self, source: SassMetricsSource) -> None:
        self.sources.remove(source)
        source.stop()

    def calls(self) -> list[str]:
        return [entry[0] for entry in self.log]


@pytest.fixture
def h(monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    harness = Harness(monkeypatch)
    yield harness
    for source in list(harness.sources):
        harness.stop(source)


CONFIGS = [(101, sass.GRANULARITY["sm"]), (102, sass.GRANULARITY["sm"])]
WINDOW = [
    Rec("vec_add", 0x10, [(101, 64), (101, 32)]),
    Rec("vec_add", 0x10, [(102, 2048), (102, 1024)]),  # the same instruction, the other metric
    Rec("reduce", 0x80, [(101, 7), (101, 0)], function_index=4),
]
DECODED = [
    SassRecord(
        cubin_crc=0xC0DE_F00D, function_name="vec_add", function_index=3, pc_offset=0x10,
        values={INST: [64, 32], THREAD_INST: [2048, 1024]},
    ),
    SassRecord(cubin_crc=0xC0DE_F00D, function_name="reduce", function_index=4, pc_offset=0x80,
               values={INST: [7, 0]}),
]  # fmt: skip


def test_window_calls_cupti_in_order_and_decodes_after_disable(h: Harness) -> None:
    source, emitter = h.session()
    assert h.log == []  # nothing is configured at start
    h.fake.records = list(WINDOW)
    source.window()
    assert h.log == [
        ("make_current", CTX),
        ("set_config", 0, CONFIGS),
        ("enable", CTX, True),
        ("data_properties", CTX),
        ("flush", CTX),
        ("disable", CTX),
        ("decode",),
        ("free",),
    ]
    (batch,) = emitter.events
    assert isinstance(batch, SassMetricBatch)
    assert (batch.device_id, batch.context_id, batch.timestamp) == (0, 21, 123_456_789)
    assert batch.records == DECODED
    assert all(record.functionName is None for record in h.fake.buffers[0].data)  # names freed
    assert emitter.losses == [] and emitter.errors == []
    assert source.windows_done == 1 and source.stats["records"] == 2
    h.fake.records = [Rec("reduce", 0x90, [(102, 5), (102, 6)])]
    source.window()  # configured already: no second SetConfig
    assert h.calls().count("set_config") == 1
    assert emitter.events[-1] == SassMetricBatch(
        timestamp=123_456_789, device_id=0, context_id=21,
        records=[SassRecord(cubin_crc=0xC0DE_F00D, function_name="reduce", function_index=3, pc_offset=0x90,
                            values={THREAD_INST: [5, 6]})],
    )  # fmt: skip


def test_lazy_patching_off_is_passed_to_enable(h: Harness) -> None:
    source, _ = h.session(lazy_patching=False, granularity="gpu")
    source.window()
    assert ("enable", CTX, False) in h.log
    assert ("set_config", 0, [(101, 0), (102, 0)]) in h.log


def test_config_is_kept_for_the_next_session_while_cupti_stays_attached(h: Harness) -> None:
    first, _ = h.session()
    first.window()
    h.others_hold_cupti = True  # another source keeps CUPTI attached past this session
    h.stop(first)
    assert "unset_config" not in h.calls()
    assert sassmod._kept_configs == {0: CONFIGS}
    h.log.clear()

    second, emitter = h.session()
    h.fake.records = list(WINDOW)
    second.window()
    assert h.calls() == ["make_current", "enable", "data_properties", "flush", "disable", "decode", "free"]
    assert emitter.events and emitter.events[0].records == DECODED  # type: ignore[attr-defined]
    h.others_hold_cupti = False  # CUPTI detaches after this one: unset first
    h.stop(second)
    assert h.calls()[-2:] == ["unset_config", "release"]
    assert sassmod._kept_configs == {}
    h.log.clear()

    third, _ = h.session()
    third.window()
    assert ("set_config", 0, CONFIGS) in h.log


def test_a_different_config_replaces_the_kept_one(h: Harness) -> None:
    first, _ = h.session()
    first.window()
    h.others_hold_cupti = True
    h.stop(first)
    h.log.clear()
    second, _ = h.session(metrics=[INST], granularity="smsp")
    second.window()
    assert h.log[1:3] == [("unset_config", 0), ("set_config", 0, [(101, 2)])]
    assert sassmod._kept_configs == {0: [(101, 2)]}


def test_records_dropped_at_disable_are_a_loss(h: Harness) -> None:
    source, emitter = h.session()
    h.fake.dropped = 4  # nothing flushed, four records written after the flush
    source.window()
    assert h.calls() == ["make_current", "set_config", "enable", "data_properties", "disable"]
    assert emitter.events == []
    assert emitter.losses == [("sass", "dropped_at_disable", 4, "records")]
    assert source.stats["dropped"] == 4
    h.fake.dropped = 3
    h.fake.records = list(WINDOW)
    source.window()
    assert emitter.losses[-1] == ("sass", "dropped_at_disable", 3, "records")
    assert len(emitter.events) == 1 and source.stats["dropped"] == 7


def test_records_patched_after_the_query_fit_and_are_decoded(h: Harness) -> None:
    """Kernels launched between GetDataProperties and FlushData add records. The buffer has room for
    them (a buffer sized to the query lets CUPTI corrupt the heap), and every one is decoded, none twice."""
    source, emitter = h.session()
    h.fake.records = list(WINDOW)
    h.fake.patched_after_query = 1  # the query saw all but one
    source.window()
    assert "disable" in h.calls() and emitter.losses == []
    (event,) = emitter.events
    assert event.records == DECODED


def test_a_failed_flush_still_disables(h: Harness) -> None:
    source, emitter = h.session()
    h.fake.records = list(WINDOW)
    h.fake.flush_error = 7
    with pytest.raises(CuptiError):
        source.window()
    assert h.calls()[-2:] == ["flush", "disable"]
    assert "decode" not in h.calls() and emitter.events == []
    assert source.windows_done == 0


def test_each_flush_decodes_with_a_fresh_name_cache(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # free() is replaced by a recorder so this test can put another name at the same address, as
    # malloc may do after the real free; the names live in one ctypes buffer the test owns.
    freed: list[sass.FlushBuffer] = []
    monkeypatch.setattr(sass, "free_function_names", freed.append)
    name = ctypes.create_string_buffer(32)

    def same_address(function: str) -> int:
        name.value = function.encode()
        return ctypes.addressof(name)

    h.fake.name_at = same_address
    source, emitter = h.session()
    h.fake.records = [Rec("kernel_a", 0x10, [(101, 1), (101, 1)])]
    source.window()
    h.fake.records = [Rec("kernel_b", 0x10, [(101, 2), (101, 2)])]
    source.window()
    names = [r.function_name for e in emitter.events for r in e.records]  # type: ignore[attr-defined]
    assert names == ["kernel_a", "kernel_b"]
    assert freed == h.fake.buffers


def test_windows_run_on_the_configured_device_only(h: Harness) -> None:
    h.contexts = []
    source, emitter = h.session()
    source.window()
    assert h.log == []  # no context yet: no CUPTI call
    h.sub.handlers[CONTEXT_CREATED](3, CONTEXT_CREATED, SimpleNamespace(context=OTHER_GPU_CTX))
    source.window()
    assert h.log == []  # device 1 is not ours
    h.sub.handlers[CONTEXT_CREATED](3, CONTEXT_CREATED, SimpleNamespace(context=CTX))
    h.fake.records = list(WINDOW)
    source.window()
    assert h.log[0] == ("make_current", CTX) and emitter.events[0].context_id == 21  # type: ignore[attr-defined]


def test_sass_refuses_to_start_after_cupti_was_detached(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "detached_once", True)
    with pytest.raises(Exception, match="cannot start after CUPTI was detached"):
        h.session()
    assert h.log == []


def test_windows_that_patch_nothing_are_told_once(h: Harness) -> None:
    source, emitter = h.session(window=0.01)
    h.fake.records = []  # CUPTI patched nothing (a window opened while the program was launching)
    for _ in range(5):
        source.window()
    assert source.windows_done == 5
    (warning,) = emitter.errors
    assert warning[2] == "warning" and "3 SASS windows in a row got no record" in warning[1]
    h.fake.records = list(WINDOW)
    source.window()  # a window with records starts the count again
    h.fake.records = []
    for _ in range(2):
        source.window()
    assert source.windows_done == 8 and len(emitter.errors) == 1  # told once, and not again at 2
