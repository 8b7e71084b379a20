"""Real CUPTI output (sources/captures/*.cupti, captured on an H100) through the OTLP sink to the receiver.

The expectations are computed from the events themselves, independently of the sink's code: span
counts per kind, epoch times, API→work parenting by correlation id, NVTX parenting by time
enclosure on the thread, and metric sums. The same checker runs on the hand-built step, so it is
exercised even where the fixtures have not been captured yet.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from cuptistream import events as ev
from cuptistream.config import convert
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures
from tests.gpu.workloads.collect import Collect
from tests.otlp_batches import make_batch, step_events
from tests.otlp_receiver import OtlpReceiver
from tests.test_otlp import attrs, deliver, sink_for

KINDS: dict[type, str] = {
    ev.Kernel: "kernel",
    ev.Memcpy: "memcpy",
    ev.Memset: "memset",
    ev.Synchronization: "synchronization",
    ev.GraphLaunch: "graph_launch",
    ev.ApiCall: "api",
    ev.NvtxRange: "nvtx",
}


def replayed_events() -> list[ev.Event]:
    from cuptistream.sources.replay import ReplayConfig, ReplaySource

    emitter = Collect()  # decodes inline (no collector process needed here)
    source = ReplaySource(convert({"type": "replay", "path": str(CAPTURES)}, ReplayConfig), emitter)
    source.start()
    source.stop()
    return emitter.events


def _innermost_range(call: ev.ApiCall, ranges: list[ev.NvtxRange]) -> ev.NvtxRange | None:
    enclosing = [
        r for r in ranges if r.thread_id == call.thread_id and r.start <= call.start and call.end <= r.end
    ]
    return max(enclosing, key=lambda r: (r.start, r.depth), default=None)


def check_sink_against_events(receiver: OtlpReceiver, events: list[ev.Event], batch_size: int) -> None:
    batches: list[ev.Batch] = []
    for seq, start in enumerate(range(0, len(events), batch_size)):
        batch = make_batch(events[start : start + batch_size], seq=seq)
        batch.clock = ev.ClockSync(
            cupti_ns=0, unix_ns=0
        )  # the fixtures' CUPTI timestamps are the epoch times
        batches.append(batch)
    sink = sink_for(receiver.endpoint, signals=["traces", "metrics"], reorder_window="1h")
    assert deliver(sink, *batches) == []

    spans = receiver.spans()
    want = Counter(KINDS[type(e)] for e in events if type(e) in KINDS)
    assert Counter(attrs(s)["cuda.activity.kind"] for s in spans) == want
    assert len({s.span_id for s in spans}) == len(spans)

    # Times: every kernel span matches a kernel event exactly (epoch ns = CUPTI ns + offset 0).
    kernels = [e for e in events if isinstance(e, ev.Kernel)]
    kernel_spans = [s for s in spans if attrs(s)["cuda.activity.kind"] == "kernel"]
    assert sorted((s.start_time_unix_nano, s.end_time_unix_nano) for s in kernel_spans) == sorted(
        (k.start, k.end) for k in kernels
    )

    # API → GPU work: work whose correlation id has a runtime call hangs under that call's span.
    by_id = {s.span_id: s for s in spans}
    runtime = {
        attrs(s)["cuda.correlation_id"]: s
        for s in spans
        if attrs(s)["cuda.activity.kind"] == "api" and attrs(s)["cuda.api.domain"] == "runtime"
    }
    linked = 0
    for s in spans:
        a = attrs(s)
        if a["cuda.activity.kind"] not in ("api", "nvtx") and a["cuda.correlation_id"] in runtime:
            assert s.parent_span_id == runtime[a["cuda.correlation_id"]].span_id
            assert s.trace_id == runtime[a["cuda.correlation_id"]].trace_id
            linked += 1
    calls = [e for e in events if isinstance(e, ev.ApiCall) and e.domain == "runtime"]
    work_ids = {e.correlation_id for e in events if isinstance(e, ev.Kernel | ev.Memcpy | ev.Memset)}
    assert linked >= sum(1 for c in calls if c.correlation_id in work_ids)

    # NVTX: a runtime call inside a range on its thread hangs under the innermost such range.
    ranges = [e for e in events if isinstance(e, ev.NvtxRange)]
    nvtx_spans = {
        (attrs(s)["thread.id"], s.start_time_unix_nano): s
        for s in spans
        if attrs(s)["cuda.activity.kind"] == "nvtx"
    }
    parented = 0
    for call in calls:
        inner = _innermost_range(call, ranges)
        span = runtime[call.correlation_id]
        if inner is None:
            assert (
                span.parent_span_id == b""
                or attrs(by_id[span.parent_span_id])["cuda.activity.kind"] != "nvtx"
            )
        else:
            assert span.parent_span_id == nvtx_spans[(inner.thread_id, inner.start)].span_id
            parented += 1

    # Metrics: the last cumulative value per kernel name equals the events' sum.
    durations: dict[str, int] = defaultdict(int)
    for k in kernels:
        durations[k.name] += k.end - k.start
    last: dict[str, int] = {}
    for name, point in receiver.data_points():
        if name == "cuda.kernel.duration":
            last[attrs(point)["cuda.kernel.name"]] = round(point.as_double * 1e9)  # seconds on the wire
    assert last == dict(durations)

    res = attrs(receiver.messages("/v1/traces")[0].resource_spans[0].resource)
    assert res["host.name"] == "gpu-host-1" and res["service.name"] == "trainer"
    assert parented or not ranges


def test_checker_on_the_hand_built_step() -> None:
    with OtlpReceiver() as receiver:
        check_sink_against_events(receiver, step_events(), batch_size=5)  # split across batches on purpose


@pytest.mark.skipif(not any(CAPTURES.glob("*.cupti")), reason="no real-GPU captures in sources/captures yet")
def test_real_gpu_fixtures_through_the_sink() -> None:
    events = replayed_events()
    assert any(isinstance(e, ev.Kernel) for e in events)
    with OtlpReceiver() as receiver:
        check_sink_against_events(receiver, events, batch_size=8192)
