"""The callbacks source, driven through the real subscriber with CUPTI's structs built in real memory.

No GPU here, so CUPTI never calls us on this machine. What stands in for it, and only that:
``FakeCupti`` (from the subscriber tests) takes the subscribe/enable calls and fires callbacks, and
``FakeIds`` answers the id and clock look-ups CUPTI would answer (cuptiGetContextId, cuptiGetTimestamp,
...). The cbdata and NVTX parameter structs are real ctypes structs laid out as in
``cupti_callbacks.h`` / ``nvToolsExt.h``, so the decoding under test reads real memory.
The last tests run the real session runtime with the real cupti-python, which has no driver here.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream import events as ev
from cuptistream.config import load as load_config
from cuptistream.cupti import api_functions
from cuptistream.cupti.contexts import ModuleResourceData
from cuptistream.cupti.subscriber import ApiCallbackData as _CallbackData
from cuptistream.cupti.subscriber import Subscriber, SubscriberBusy
from cuptistream.errors import ConfigError
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk, decode_events
from cuptistream.sources.callbacks import CallbacksConfig, CallbackSource
from cuptistream.sources.callbacks.structs import (
    EventAttributes,
    _GraphData,
    _NvtxData,
    _ResourceData,
    _SynchronizeData,
)
from tests.test_callbacks_subscriber import FakeCupti

RUNTIME, DRIVER, RESOURCE, SYNC, NVTX = 2, 1, 3, 4, 5


class MemoryEmitter(Emitter):
    """Collects what a source emits, as the pipeline's intake would receive it."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[ev.Event] = []
        self.losses: list[tuple[str, str, int]] = []
        self.errors: list[tuple[str, str, str]] = []
        self.fail = fail

    def emit(self, events: Sequence[ev.Event]) -> None:
        if self.fail:
            raise RuntimeError("pipeline is gone")
        self.events.extend(events)

    def emit_chunk(self, chunk: Chunk) -> None:
        self.events.extend(decode_events(chunk.payload))

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        self.losses.append((stage, reason, count))

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        self.errors.append((origin, message, severity))


class FakeIds:
    """Answers what CUPTI would: a ticking clock and ids derived from the handles."""

    def __init__(self) -> None:
        self.t = 1000

    def now(self) -> int:
        self.t += 10
        return self.t

    def context(self, context: int) -> tuple[int, int]:
        return 0, context % 1000

    def stream(self, context: int, stream: int) -> int:
        return stream % 1000

    def graph(self, graph: int) -> int:
        return graph % 1000

    def node(self, node: int) -> int:
        return node % 1000

    def cubin_crc(self, cubin: int, size: int) -> int:
        return sum(ctypes.string_at(cubin, size))  # depends on the bytes, as CUPTI's CRC does


class Harness:
    def __init__(self, **config: Any) -> None:
        self.fake = FakeCupti()
        self.emitter = MemoryEmitter()
        cfg = CallbacksConfig(type="callbacks", name="callbacks", nvtx_injection=False, **config)
        self.source = CallbackSource(
            cfg,
            self.emitter,
            cupti=RealEnums(),
            ids=FakeIds(),
            sub=Subscriber(self.fake),  # type: ignore[arg-type]
        )
        self.keep: list[Any] = []  # keeps ctypes memory alive while callbacks may read it

    def fire(self, domain: int, cbid: int, struct: ctypes.Structure) -> None:
        self.keep.append(struct)
        self.fake.fire(domain, cbid, ctypes.addressof(struct))

    def nvtx(self, cbid: int, params: ctypes.Structure | None = None, ret: Any = None) -> None:
        self.keep += [params, ret]
        data = _NvtxData(
            functionParams=ctypes.addressof(params) if params is not None else None,
            functionReturnValue=ctypes.addressof(ret) if ret is not None else None,
        )
        self.fire(NVTX, cbid, data)

    def events(self) -> list[ev.Event]:
        self.source.flush()
        return self.emitter.events


class RealEnums:
    """cupti-python's real cbid enums (they need no driver); the CUPTI calls are not used here."""

    def __init__(self) -> None:
        from cupti import cupti

        self.runtime_api_trace_cbid = cupti.runtime_api_trace_cbid
        self.driver_api_trace_cbid = cupti.driver_api_trace_cbid


class Message(ctypes.Structure):
    _fields_ = [("message", ctypes.c_char_p)]


class Attrib(ctypes.Structure):
    _fields_ = [("attrib", ctypes.c_void_p)]


class DomainAttrib(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_void_p), ("attrib", ctypes.c_void_p)]


def attributes(
    text: bytes, *, color: int | None = None, category: int = 0, payload: Any = None
) -> EventAttributes:
    a = EventAttributes(version=3, size=ctypes.sizeof(EventAttributes), category=category)
    a.messageType, a.message = 1, ctypes.cast(ctypes.c_char_p(text), ctypes.c_void_p).value
    a._keep = text  # type: ignore[attr-defined]
    if color is not None:
        a.colorType, a.color = 1, color
    if isinstance(payload, float):
        a.payloadType, a.payload.f64 = 3, payload
    elif isinstance(payload, int):
        a.payloadType, a.payload.i64 = 2, payload
    return a


def test_nested_push_pop_ranges_have_per_thread_depth() -> None:
    h = Harness(domains=["nvtx"])
    h.source.start()

    def nest(prefix: bytes, depth: int) -> None:
        for level in range(depth):
            h.nvtx(8, Message(prefix + b"%d" % level))  # nvtxRangePushA
        for _ in range(depth):
            h.nvtx(11)  # nvtxRangePop

    worker = threading.Thread(target=nest, args=(b"w", 3))
    nest(b"m", 4)
    worker.start()
    worker.join()
    h.nvtx(11)  # a pop with nothing pushed (pushed before we subscribed) is ignored
    ranges = [e for e in h.events() if isinstance(e, ev.NvtxRange)]
    h.source.stop()
    assert sorted((r.name, r.depth) for r in ranges) == [
        ("m0", 0), ("m1", 1), ("m2", 2), ("m3", 3), ("w0", 0), ("w1", 1), ("w2", 2)
    ]  # fmt: skip
    assert len({r.thread_id for r in ranges}) == 2
    by_name = {r.name: r for r in ranges}
    assert by_name["m0"].start < by_name["m3"].start < by_name["m3"].end < by_name["m0"].end


def test_ex_attributes_domains_registered_strings_markers_and_start_end() -> None:
    h = Harness(domains=["nvtx"])
    h.source.start()
    handle = ctypes.c_void_p(0xD0)
    name = Message(b"trainer")
    h.nvtx(41, name, handle)  # nvtxDomainCreateA returns the domain handle
    string_handle = ctypes.c_void_p(0x57)
    h.nvtx(39, DomainAttrib(0xD0, ctypes.cast(ctypes.c_char_p(b"forward"), ctypes.c_void_p)), string_handle)
    registered = EventAttributes(
        version=3, size=48, messageType=3, message=0x57, colorType=1, color=0xFF00FF00
    )
    h.nvtx(33, DomainAttrib(0xD0, ctypes.addressof(registered)))  # nvtxDomainRangePushEx
    h.keep.append(registered)
    h.nvtx(34, DomainAttrib(0xD0, None))  # nvtxDomainRangePop
    marker = attributes(b"checkpoint", category=7, payload=2.5)
    h.nvtx(3, Attrib(ctypes.addressof(marker)))  # nvtxMarkEx
    h.keep.append(marker)
    h.nvtx(1, Message(b"plain"))  # nvtxMarkA
    span = attributes(b"load", payload=-3, color=0x80112233)
    range_id = ctypes.c_uint64(42)
    h.nvtx(6, Attrib(ctypes.addressof(span)), range_id)  # nvtxRangeStartEx returns the id
    h.keep.append(span)
    ended = threading.Thread(target=h.nvtx, args=(7, ctypes.c_uint64(42)))  # nvtxRangeEnd elsewhere
    ended.start()
    ended.join()
    events = h.events()
    h.source.stop()
    ranges = {e.name: e for e in events if isinstance(e, ev.NvtxRange)}
    markers = {e.name: e for e in events if isinstance(e, ev.NvtxMarker)}
    assert ranges["forward"].domain == "trainer" and ranges["forward"].color == 0xFF00FF00
    assert (
        ranges["load"].range_id == 42 and ranges["load"].payload == -3 and ranges["load"].color == 0x80112233
    )
    assert ranges["load"].start < ranges["load"].end
    assert markers["checkpoint"].category == 7 and markers["checkpoint"].payload == 2.5
    assert markers["plain"].color is None and markers["plain"].payload is None


def test_api_calls_pair_entry_and_exit_by_correlation_id() -> None:
    h = Harness(domains=["runtime"], runtime_api=["cudaLaunchKernel"])
    h.source.start()
    launch = 211  # cudaLaunchKernel_v7000
    enabled = {cbid for (domain, cbid) in h.fake.enabled_cbids if domain == RUNTIME}
    assert launch in enabled and len(enabled) == 2  # plus the _ptsz variant
    status = ctypes.c_int32(0)
    for corr in (5, 6):
        for site in (0, 1):  # enter, exit
            data = _CallbackData(
                callbackSite=site, correlationId=corr, functionReturnValue=ctypes.addressof(status)
            )
            h.fire(RUNTIME, launch, data)
    calls = [e for e in h.events() if isinstance(e, ev.ApiCall)]
    h.source.stop()
    assert [(c.name, c.correlation_id, c.domain) for c in calls] == [
        ("cudaLaunchKernel", 5, "runtime"), ("cudaLaunchKernel", 6, "runtime")
    ]  # fmt: skip
    assert all(c.start < c.end for c in calls)
    assert h.fake.callback is None and not h.source._subscriber.active  # stop() unsubscribed


def test_resource_and_synchronize_callbacks() -> None:
    h = Harness(domains=["resource", "synchronize"])
    h.source.start()
    h.fire(RESOURCE, 1, _ResourceData(context=0x1007))  # context created
    h.fire(RESOURCE, 3, _ResourceData(context=0x1007, stream=0x2009))  # stream created
    cubin = ctypes.create_string_buffer(b"\x7fELF-cubin-bytes")
    module = ModuleResourceData(moduleId=12, cubinSize=len(cubin.raw), pCubin=ctypes.addressof(cubin))
    h.keep += [cubin, module]
    h.fire(RESOURCE, 6, _ResourceData(context=0x1007, descriptor=ctypes.addressof(module)))
    h.fire(RESOURCE, 7, _ResourceData(context=0x1007, descriptor=ctypes.addressof(module)))
    node = _GraphData(graph=0x3005, node=0x4006, nodeType=0)
    clone = _GraphData(graph=0x3008, node=0x4010, originalNode=0x4006, nodeType=0)
    h.keep += [node, clone]
    h.fire(RESOURCE, 13, _ResourceData(descriptor=ctypes.addressof(node)))  # graph node created
    h.fire(RESOURCE, 20, _ResourceData(descriptor=ctypes.addressof(clone)))  # graph node cloned
    h.fire(SYNC, 1, _SynchronizeData(context=0x1007, stream=0x2009))
    events = h.events()
    h.source.stop()
    resources = [e for e in events if isinstance(e, ev.ResourceChange)]
    assert [r.operation for r in resources] == [
        "context_create",
        "stream_create",
        "module_load",
        "module_unload",
    ]
    assert resources[1].stream_id == 0x2009 % 1000 and resources[0].context_id == 0x1007 % 1000
    assert resources[2].module_id == 12 and resources[2].cubin_size == len(cubin.raw)
    assert resources[2].cubin_crc == sum(cubin.raw) == resources[3].cubin_crc
    graphs = [e for e in events if isinstance(e, ev.GraphNode)]
    assert [(g.operation, g.graph_id, g.node_id, g.node_type, g.original_node_id) for g in graphs] == [
        ("node_create", 0x3005 % 1000, 0x4006 % 1000, "kernel", 0),
        ("node_clone", 0x3008 % 1000, 0x4010 % 1000, "kernel", 0x4006 % 1000),
    ]
    (sync,) = [e for e in events if isinstance(e, ev.Synchronization)]
    assert sync.sync_type == "stream_synchronize" and sync.stream_id == 0x2009 % 1000


def test_full_buffer_drops_and_counts_instead_of_blocking() -> None:
    h = Harness(domains=["nvtx"], max_buffered=3)
    h.source.start()
    for _ in range(5):
        h.nvtx(1, Message(b"m"))
    assert len(h.events()) == 3
    assert h.emitter.losses == [("source:callbacks", "buffer_full", 2)]
    h.source.stop()


def test_worker_failures_become_error_events() -> None:
    h = Harness(domains=["nvtx"])
    h.emitter.fail = True
    h.source.start()
    h.nvtx(1, Message(b"m"))
    h.source.flush()  # must not raise
    h.source.stop()
    assert h.emitter.errors and "pipeline is gone" in h.emitter.errors[0][1]


def test_handler_failures_are_reported_once_per_flush() -> None:
    h = Harness(domains=["nvtx"])
    h.source.start()
    h.fake.fire(NVTX, 1, None)  # no cbdata (cupti-python passes None for some callbacks): ignored
    h.fake.fire(NVTX, 1, object())  # cbdata the handler cannot read: it raises inside the callback
    h.source.flush()
    h.source.stop()
    assert any("CUPTI callback(s) failed" in message for _, message, _ in h.emitter.errors)


def test_api_patterns_follow_the_one_rule_of_api_functions() -> None:
    """callbacks and activity resolve runtime_api/driver_api alike (cupti.api_functions): a name is a
    glob without wildcards and selects its per-thread-stream twin; events carry the same names."""
    h = Harness(domains=["runtime", "driver"], runtime_api=["cudaMemcpy", "cudaLaunchKernel_ptsz"],
                driver_api=["cuMemcpyHtoD", "cuGraph*Launch"])  # fmt: skip
    names = h.source._api_names()
    runtime = {name for (domain, _), name in names.items() if domain == RUNTIME}
    assert runtime == {"cudaMemcpy", "cudaMemcpy_ptds", "cudaLaunchKernel_ptsz"}
    driver = {cbid: name for (domain, cbid), name in names.items() if domain == DRIVER}
    assert set(driver.values()) == {
        "cuMemcpyHtoD",
        "cuMemcpyHtoD_v2_ptds",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
    }
    assert sorted(driver) == api_functions.select_cbids("driver", ["cuMemcpyHtoD", "cuGraph*Launch"])
    assert all(api_functions.api_names("driver")[cbid] == name for cbid, name in driver.items())


@pytest.mark.parametrize("source_type", ["callbacks", "activity"])
def test_a_pattern_that_matches_nothing_is_a_config_error_in_every_source(source_type: str) -> None:
    extra = {"domains": ["runtime"]} if source_type == "callbacks" else {"kinds": ["runtime"]}
    source = {"type": source_type, "runtime_api": ["cudaLaunch*", "cudaFoo"], **extra}
    with pytest.raises(ConfigError, match=r"runtime_api pattern 'cudaFoo' matches no runtime API function"):
        load_config({"sources": [source], "sinks": [{"type": "null"}]})


def test_busy_subscriber_fails_start_with_the_holder_and_leaves_nothing_enabled() -> None:
    h = Harness(domains=["resource", "nvtx"])
    h.fake.holder = "Nsight Systems"
    with pytest.raises(SubscriberBusy, match="Nsight Systems"):
        h.source.start()
    assert not h.fake.enabled_domains and h.fake.callback is None
    h.source.stop()  # stopping a source that never started is harmless


def _session_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "sources": [{"type": "callbacks", "nvtx_injection": False}, {"type": "state"}],
        "sinks": [{"type": "file", "directory": str(tmp_path)}],
    }


def test_session_without_a_driver_disables_the_sources_with_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Real runtime, real cupti-python, real file sink; this machine has no CUDA driver.
    with cuptistream.session(_session_config(tmp_path)) as session:
        pass
    assert set(session.failed_sources) == {"callbacks", "state"}
    for message in session.failed_sources.values():
        assert message.startswith("CUPTI is unavailable: CUDA driver is not found") and "\n" not in message
    errors = [e for e in cuptistream.read(tmp_path) if e.__class__.__name__ == "Error"]
    assert {e.origin for e in errors} >= {"source:callbacks", "source:state"}  # type: ignore[attr-defined]
    assert "Traceback" not in capsys.readouterr().err
