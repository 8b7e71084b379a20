"""Budget mode's ``between_windows: detach`` in the activity source: CUPTI detached after each
window, attached afresh at the next, never again after a CUDA graph.

No CUDA driver or libcupti can run on this machine, so two stand-ins answer for them, and only them:
``FakeLibcupti`` answers every libcupti function with success and records the call, and
``FakeCupti`` (tests/test_callbacks_subscriber.py) stands in for cupti-python's subscriber calls,
with ``DriverCalls`` as the program's thread whose CUDA calls' exits it reports.
The source, its window logic, the process-wide subscriber, ``driver.park`` and the shared-memory
outlet are the real ones. The GPU runs the same paths for real (tests/gpu/test_budget_gpu.py)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from cuptistream.channel.messages import OpenStream, TraceSpan
from cuptistream.channel.outlet import ActivityOutlet
from cuptistream.collector.inline import InlineOutlet
from cuptistream.cupti import driver, gpus, library, subscriber
from cuptistream.cupti.kinds import KINDS
from cuptistream.cupti.subscriber import Domain, Subscriber
from sources.activity import ActivitySource, ActivitySourceConfig
from sources.activity.source import GRAPH_CBIDS
from sources.activity.windows import Windows
from tests.gpu.workloads.collect import Collect
from tests.test_callbacks_subscriber import DriverCalls, FakeCupti


class FakeLibcupti:
    """Every ``cupti*`` function returns CUPTI_SUCCESS; ``calls`` counts them by name, ``kinds`` keeps
    the kind each ``cuptiActivityEnable``/``Disable`` call named, in order."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.kinds: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("cupti"):
            raise AttributeError(name)

        def function(*args: Any) -> int:
            self.calls[name] += 1
            if name in ("cuptiActivityEnable", "cuptiActivityEnableAndDump", "cuptiActivityDisable"):
                self.kinds.append((name, args[0]))
            return 0

        return function


class Spans(Collect):
    """The in-memory emitter, keeping the spans the source announces."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[TraceSpan] = []

    def open_activity_stream(self, stream: OpenStream, buffer_size: int, buffers: int) -> ActivityOutlet:
        outlet = InlineOutlet(stream, buffer_size, buffers, self)
        spans = self.spans

        def send_trace_span(span: TraceSpan, wait: float = 2.0) -> bool:
            spans.append(span)
            return True

        outlet.send_trace_span = send_trace_span  # type: ignore[method-assign]
        return outlet


@pytest.fixture
def cupti(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeLibcupti, FakeCupti]]:
    lib, callbacks = FakeLibcupti(), FakeCupti()
    monkeypatch.setattr(library, "libcupti", lambda: lib)
    monkeypatch.setattr(driver, "require_gpu", lambda: None)
    monkeypatch.setattr(driver, "timestamp", itertools.count(1_000_000).__next__)
    monkeypatch.setattr(driver, "_users", {})
    monkeypatch.setattr(driver, "detached_once", False)
    monkeypatch.setattr(gpus, "any_context_active", lambda: False)  # started before CUDA, as under `run`
    monkeypatch.setattr(subscriber, "_process_subscriber", Subscriber(callbacks))
    monkeypatch.setattr(Windows, "start", lambda self: None)  # the test opens and closes the windows
    program = DriverCalls(callbacks)  # the program's CUDA calls: CUPTI detaches at one's exit
    yield lib, callbacks
    program.stop()


def _source(emitter: Collect, **fields: Any) -> ActivitySource:
    config = ActivitySourceConfig(
        **{"type": "activity", "kinds": ["concurrent_kernel", "device"], "mode": "budget",
           "between_windows": "detach", **fields}
    )  # fmt: skip
    source = ActivitySource(config, emitter)
    source.start()
    return source


def _said_once(emitter: Collect, severity: str, text: str) -> None:
    """The activity source reported exactly one error event, of ``severity``, saying ``text``."""
    ((origin, message, said, _),) = emitter.errors
    assert origin == "source:activity" and said == severity and text in message, (origin, said, message)


def _window(source: ActivitySource) -> None:
    window = source.begin_window(False, 0)
    assert window is not None
    source.end_window(window)


def test_windows_detach_cupti_and_attach_it_afresh(cupti: tuple[FakeLibcupti, FakeCupti]) -> None:
    lib, callbacks = cupti
    emitter = Spans()
    source = _source(emitter)
    _window(source)  # attached since the start: detached after it
    assert lib.calls["cuptiFinalize"] == 1 and source.detached == 1
    assert callbacks.callback is not None  # the subscriber (graph watch here, the state source's too) is back
    registered, dumped = lib.calls["cuptiActivityRegisterCallbacks"], lib.calls["cuptiActivityEnableAndDump"]
    _window(source)  # attached afresh: callbacks registered again, the resource kind dumped again
    assert lib.calls["cuptiActivityRegisterCallbacks"] == registered + 1
    assert lib.calls["cuptiActivityEnableAndDump"] == dumped + 1
    assert lib.calls["cuptiFinalize"] == 2
    opened = [span for span in emitter.spans if span.kinds and not span.end]
    assert [span.fresh for span in opened] == [False, True]
    assert opened[0].kinds == ["concurrent_kernel", "device"]
    source.stop()
    assert not emitter.errors


def test_a_window_says_it_is_closing_before_its_forced_flush(
    cupti: tuple[FakeLibcupti, FakeCupti], monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, _ = cupti
    emitter = Spans()
    source = _source(emitter)
    flushed_after: list[int] = []
    forced = lib.cuptiActivityFlushAll

    def flush_all(flag: int) -> int:
        if flag == driver.FLAG_FLUSH_FORCED:
            flushed_after.append(len(emitter.spans))
        return forced(flag)

    monkeypatch.setattr(lib, "cuptiActivityFlushAll", flush_all, raising=False)
    window = source.begin_window(False, 0)
    assert window is not None
    source.end_window(window)
    opened, closing, closed = [span for span in emitter.spans if span.window == window]
    assert not opened.end and closing.closing and closing.end > opened.start
    assert closed.end == closing.end and not closed.closing
    assert flushed_after[0] == emitter.spans.index(closing) + 1  # the notice, then the flush, then the close
    source.stop()


def test_a_cuda_graph_keeps_cupti_attached_for_good(cupti: tuple[FakeLibcupti, FakeCupti]) -> None:
    lib, callbacks = cupti
    emitter = Spans()
    source = _source(emitter)
    _window(source)
    assert lib.calls["cuptiFinalize"] == 1
    callbacks.callback(None, Domain.RESOURCE, GRAPH_CBIDS[0], 0)  # the program made a graph
    _window(source)  # attached afresh, then not detached again
    _window(source)
    assert lib.calls["cuptiFinalize"] == 1 and source.detached == 1
    opened = [span.fresh for span in emitter.spans if span.kinds and not span.end]
    assert opened == [False, True, False]
    _said_once(emitter, "warning", "made a CUDA graph")
    source.stop()


def test_cupti_in_use_before_the_source_started_is_never_detached(
    cupti: tuple[FakeLibcupti, FakeCupti], monkeypatch: pytest.MonkeyPatch
) -> None:
    lib, _ = cupti
    monkeypatch.setattr(gpus, "any_context_active", lambda: True)  # a session started mid-program
    emitter = Spans()
    source = _source(emitter)
    _window(source)
    _window(source)
    assert lib.calls["cuptiFinalize"] == 0
    _said_once(emitter, "warning", "CUDA was in use before the source started")
    source.stop()
    assert lib.calls["cuptiFinalize"] == 1  # at stop, as ever


def test_another_source_holding_cupti_keeps_it_attached(cupti: tuple[FakeLibcupti, FakeCupti]) -> None:
    lib, _ = cupti
    driver.acquire("pc_sampling")
    emitter = Spans()
    source = _source(emitter)
    _window(source)
    _window(source)
    assert lib.calls["cuptiFinalize"] == 0
    source.stop()
    driver.release("pc_sampling", finalize=False)
    _said_once(emitter, "info", "another source of ours holds CUPTI")  # counted per window:
    assert source.stayed_attached == {"another source of ours holds CUPTI": 2}


def test_a_paused_source_stops_watching_for_graphs_and_never_detaches(
    cupti: tuple[FakeLibcupti, FakeCupti],
) -> None:
    """Another tool (torch.profiler) takes CUPTI: no callback of ours may stay registered."""
    lib, callbacks = cupti
    emitter = Spans()
    source = _source(emitter)
    assert callbacks.enabled_cbids == {(Domain.RESOURCE, cbid) for cbid in GRAPH_CBIDS}
    source.pause()
    assert callbacks.callback is None  # unsubscribed: the slot is free for the other tool
    source.resume()
    _window(source)
    assert lib.calls["cuptiFinalize"] == 0
    source.stop()


def test_buffers_the_collector_has_not_read_keep_cupti_attached_and_say_so(
    cupti: tuple[FakeLibcupti, FakeCupti],
) -> None:
    """The records' names point into CUPTI's memory: no detach before the collector read them."""
    lib, _ = cupti
    emitter = Spans()
    source = _source(emitter)
    read_in_time = source.outlet.wait_consumed
    source.outlet.wait_consumed = lambda timeout: False  # a collector that lags
    _window(source)
    _window(source)
    assert lib.calls["cuptiFinalize"] == 0 and source.detached == 0
    source.outlet.wait_consumed = read_in_time  # it catches up: the next window detaches
    _window(source)
    assert lib.calls["cuptiFinalize"] == 1 and source.detached == 1
    _said_once(emitter, "info", "had not read its buffers")
    assert source.stayed_attached == {"the collector had not read its buffers in 10 s": 2}
    source.stop()


def _disabled(lib: FakeLibcupti) -> list[str]:
    names = {spec.kind: spec.name for spec in KINDS.values()}
    return [names[kind] for call, kind in lib.kinds if call == "cuptiActivityDisable"]


def test_attached_between_windows_copies_stay_on_with_a_span_and_kernels_toggle(
    cupti: tuple[FakeLibcupti, FakeCupti],
) -> None:
    """Toggling the copy and memset kinds per window with CUPTI attached crashes a CUPTI thread under
    DDP on CUPTI 13.0: only the kernel kind goes off after a window; the others
    stay on, announced by one open span, so the statistics count them as traced throughout."""
    lib, _ = cupti
    emitter = Spans()
    source = _source(
        emitter, kinds=["concurrent_kernel", "memcpy", "memset", "device"], between_windows="attach"
    )
    for _ in range(3):
        _window(source)
    assert _disabled(lib) == ["concurrent_kernel"] * 3
    enabled = [KINDS[name].kind for name in ("memcpy", "memset")]
    assert [kind for call, kind in lib.kinds if call == "cuptiActivityEnable" and kind in enabled] == enabled
    kept = [span for span in emitter.spans if span.kinds == ["memcpy", "memset"]]
    assert len(kept) == 1 and not kept[0].end
    first_window_end = next(
        span.end for span in emitter.spans if span.end and "concurrent_kernel" in span.kinds
    )
    assert kept[0].start == first_window_end  # covered without a gap from the first window on
    later = [span for span in emitter.spans if not span.end and "concurrent_kernel" in span.kinds][1:]
    assert later and all("memcpy" in span.kinds for span in later)
    source.stop()
    assert [span.end > 0 for span in emitter.spans if span.window == kept[0].window] == [False, True]
    assert sorted(_disabled(lib)[3:]) == ["device", "memcpy", "memset"]  # stop turns everything off


def test_windows_that_detach_still_turn_copies_off_before_cupti_finalize(
    cupti: tuple[FakeLibcupti, FakeCupti], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Detaching, the copies go off with the kernels (the path 658 DDP detaches ran without a crash);
    once a CUDA graph keeps CUPTI attached they stay on as with ``attach``."""
    lib, callbacks = cupti
    emitter = Spans()
    source = _source(emitter, kinds=["concurrent_kernel", "memcpy", "device"])
    _window(source)
    assert sorted(_disabled(lib)) == ["concurrent_kernel", "device", "memcpy"]
    assert lib.calls["cuptiFinalize"] == 1
    callbacks.callback(None, Domain.RESOURCE, GRAPH_CBIDS[0], 0)  # a graph: attached for good
    lib.kinds.clear()
    _window(source)
    _window(source)
    assert "memcpy" not in _disabled(lib) and _disabled(lib).count("concurrent_kernel") == 2
    assert any(span.kinds == ["memcpy"] and not span.end for span in emitter.spans)
    source.stop()


def test_copies_kept_on_go_off_while_another_tool_has_cupti_and_stay_on_after(
    cupti: tuple[FakeLibcupti, FakeCupti],
) -> None:
    """A pause (torch.profiler takes CUPTI) turns every kind off and closes the copies' span; the
    first window after the resume keeps them on again, under a new span."""
    lib, _ = cupti
    emitter = Spans()
    source = _source(emitter, kinds=["concurrent_kernel", "memcpy", "device"], between_windows="attach")
    _window(source)
    source.pause()
    assert "memcpy" in _disabled(lib)
    kept = [span for span in emitter.spans if span.kinds == ["memcpy"]]
    assert [bool(span.end) for span in kept] == [False, True]  # opened, closed by the pause
    source.resume()
    _window(source)
    _window(source)
    kept = [span for span in emitter.spans if span.kinds == ["memcpy"]]
    assert [bool(span.end) for span in kept] == [False, True, False] and kept[2].window != kept[0].window
    source.stop()
