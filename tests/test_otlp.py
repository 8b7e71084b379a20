"""The OTLP sink against a real HTTP receiver that decodes with opentelemetry-proto.

Events are hand-built (no GPU here); tests/test_otlp_fixtures.py feeds real CUPTI output.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections import Counter
from typing import Any

import pytest
import trio
from google.protobuf import json_format

from cuptistream.config import build, convert
from cuptistream.errors import ConfigError, PermanentSinkError, SinkUnavailableError
from cuptistream.events import Batch
from cuptistream.plugin import DeliveryError
from cuptistream.sinks.otlp import OtlpSink, OtlpSinkConfig
from tests.otlp_batches import (
    OFFSET,
    SPAN_COUNTS,
    TID,
    UUID,
    api,
    kernel,
    make_batch,
    other_events,
    outgoing,
    step_events,
)
from tests.otlp_receiver import Answer, OtlpReceiver


def attrs(obj: Any) -> dict[str, Any]:
    out = {}
    for kv in obj.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = (
            [v.string_value for v in value.array_value.values]
            if kind == "array_value"
            else getattr(value, kind)
        )
    return out


def sink_for(endpoint: str, **extra: Any) -> OtlpSink:
    return OtlpSink(convert({"type": "otlp", "name": "otlp", "endpoint": endpoint, **extra}, OtlpSinkConfig))


def deliver(sink: OtlpSink, *batches: Batch, close: bool = True) -> list[BaseException]:
    """open, write each batch, close; returns the DeliveryErrors raised by writes, and a
    PermanentSinkError, after which nothing more is written (as the pipeline does)."""
    errors: list[BaseException] = []

    async def main() -> None:
        await sink.open()
        for batch in batches:
            try:
                await sink.write(outgoing(batch))
            except DeliveryError as error:
                errors.append(error)
            except PermanentSinkError as error:
                errors.append(error)
                break
        if close:
            await sink.close()

    trio.run(main)
    return errors


@pytest.fixture
def receiver() -> Any:
    with OtlpReceiver() as r:
        yield r


def by_name(spans: list[Any]) -> dict[str, Any]:
    return {s.name: s for s in spans}


# --- the mapping ----------------------------------------------------------------------------


def test_traces_metrics_and_logs_arrive_well_formed(receiver: OtlpReceiver) -> None:
    sink = sink_for(receiver.endpoint)
    assert deliver(sink, make_batch(step_events() + other_events()), close=False) == []
    assert sink.stats()["spans_waiting"] == 0  # everything resolved within the batch: sent by write
    spans = receiver.spans()
    assert Counter(attrs(s)["cuda.activity.kind"] for s in spans) == SPAN_COUNTS
    assert len({s.span_id for s in spans}) == len(spans)
    assert all(len(s.trace_id) == 16 and len(s.span_id) == 8 for s in spans)

    s = by_name(spans)
    assert (s["k_a"].start_time_unix_nano, s["k_a"].end_time_unix_nano) in {
        (OFFSET + 1000, OFFSET + 2000),
        (OFFSET + 9500, OFFSET + 9700),
    }
    assert (s["step"].start_time_unix_nano, s["step"].end_time_unix_nano) == (OFFSET + 100, OFFSET + 10_000)
    assert s["memcpy HtoD"].end_time_unix_nano == OFFSET + 6500

    # NVTX parenting: step ⊃ forward ⊃ cudaLaunchKernel(1); the other calls sit directly in step.
    step, forward = s["step"], s["forward"]
    assert step.parent_span_id == b"" and forward.parent_span_id == step.span_id
    launches = {attrs(x)["cuda.correlation_id"]: x for x in spans if x.name == "cudaLaunchKernel"}
    assert launches[1].parent_span_id == forward.span_id
    assert launches[6].parent_span_id == step.span_id
    for name in ("cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamSynchronize", "cudaGraphLaunch"):
        assert s[name].parent_span_id == step.span_id, name
    assert s["cuLaunchKernel"].parent_span_id == launches[1].span_id

    # API → GPU work: each piece of work is a child of the runtime call with its correlation id.
    calls = {attrs(x)["cuda.correlation_id"]: x for x in spans if attrs(x)["cuda.activity.kind"] == "api"
             and attrs(x)["cuda.api.domain"] == "runtime"}  # fmt: skip
    work = [x for x in spans if attrs(x)["cuda.activity.kind"] not in ("api", "nvtx")]
    assert len(work) == 7
    for w in work:
        assert w.parent_span_id == calls[attrs(w)["cuda.correlation_id"]].span_id, w.name
    assert {x.trace_id for x in spans} == {step.trace_id}  # nvtx_top_level: one trace per step

    ka = attrs(launches[1])  # attribute scheme
    assert ka["thread.id"] == TID and ka["cuda.api.cbid"] == 211
    kern = attrs(next(x for x in spans if x.name == "k_b"))
    assert kern["hw.id"] == UUID and kern["hw.model"] == "NVIDIA H100 80GB HBM3"
    assert (
        kern["cuda.graph.node.id"] == 11 and kern["cuda.kernel.grid.x"] == 64 and kern["cuda.stream.id"] == 13
    )

    # Resource from the envelope, the job and the user's attributes.
    res = attrs(receiver.messages("/v1/traces")[0].resource_spans[0].resource)
    assert res["service.name"] == "trainer" and res["team"] == "ml"
    assert res["host.name"] == "gpu-host-1" and res["process.pid"] == 4242
    assert res["process.command_line"] == "python train.py --lr 0.1"  # this batch's probe opted in
    assert res["job.rank"] == "0" and res["job.world_size"] == "8"
    assert res["cuda.device.uuids"] == [UUID] and res["cuptistream.session.id"] == "sess-1"
    assert res["telemetry.sdk.name"] == "cuptistream" and res["telemetry.sdk.version"]
    assert res["process.executable.name"] == "python" and len(res["service.instance.id"]) == 36

    # Metrics: cumulative sums equal to the events' sums.
    points = {(name, tuple(sorted(attrs(p).items()))): p for name, p in receiver.data_points()}

    def value(name: str, **labels: Any) -> int | float:
        point = points[(name, tuple(sorted(labels.items())))]
        return point.as_double if point.WhichOneof("value") == "as_double" else int(point.as_int)

    assert value("cuda.kernel.duration", **{"cuda.kernel.name": "k_a", "cuda.device.id": 0}) == 1.2e-6
    assert value("cuda.kernel.count", **{"cuda.kernel.name": "k_a", "cuda.device.id": 0}) == 2
    assert value("cuda.kernel.count", **{"cuda.kernel.name": "k_b", "cuda.device.id": 0}) == 1
    assert value("cuda.memcpy.bytes", **{"cuda.memcpy.kind": "HtoD", "cuda.device.id": 0}) == 4096
    assert value("cuda.memset.bytes", **{"cuda.device.id": 0}) == 512
    pc = {"cuda.function.name": "k_a", "cuda.device.id": 0}
    assert value("cuda.pc_sampling.samples", **pc, **{"cuda.pc_sampling.stall_reason": "selected"}) == 8
    assert (
        value("cuda.pc_sampling.samples", **pc, **{"cuda.pc_sampling.stall_reason": "long_scoreboard"}) == 10
    )
    assert value("cuda.pc_sampling.dropped", **{"cuda.device.id": 0}) == 3
    sass = {"cuda.sass.metric": "smsp__sass_inst_executed", "cuda.function.name": "k_b", "cuda.device.id": 0}
    assert value("cuda.sass.value", **sass) == 10
    loss = {
        "cuptistream.stage": "intake",
        "cuptistream.loss.reason": "queue_full",
        "cuptistream.loss.unit": "events",
    }
    assert value("cuptistream.lost", **loss) == 5
    assert (
        value("cuptistream.stage.events", **{"cuptistream.stage": "intake", "cuptistream.direction": "in"})
        == 100
    )
    metric = receiver.messages("/v1/metrics")[0].resource_metrics[0].scope_metrics[0].metrics[0]
    assert metric.sum.is_monotonic and metric.sum.aggregation_temporality == 2  # cumulative

    # Logs: Error events with mapped severities.
    logs = {r.body.string_value: r for r in receiver.log_records()}
    assert (
        logs["buffer nearly full"].severity_text == "WARN"
        and logs["buffer nearly full"].severity_number == 13
    )
    assert logs["device lost"].severity_number == 21
    assert logs["buffer nearly full"].time_unix_nano == OFFSET + 500
    assert attrs(logs["buffer nearly full"])["cuda.result_code"] == 7
    assert sink.stats()["spans_sent"] == sum(SPAN_COUNTS.values())
    assert sink.stats()["log_records_sent"] == 2


def test_metrics_accumulate_across_batches_and_cap_kernel_names(receiver: OtlpReceiver) -> None:
    sink = sink_for(receiver.endpoint, signals=["metrics"], max_kernel_names=1)
    first = make_batch([kernel(1, 0, 100, "k_a"), kernel(2, 0, 50, "k_b")])
    second = make_batch([kernel(3, 0, 100, "k_a"), kernel(4, 0, 30, "k_c")], seq=1)
    assert deliver(sink, first, second) == []
    last: dict[tuple[str, str], int] = {}
    for name, p in receiver.data_points():
        if name == "cuda.kernel.duration":
            last[(name, attrs(p)["cuda.kernel.name"])] = round(p.as_double * 1e9)
    assert last == {("cuda.kernel.duration", "k_a"): 200, ("cuda.kernel.duration", "other"): 80}
    assert sink.stats()["kernel_names_overflowed"] == 2


def test_json_encoding_round_trips_to_the_same_messages(receiver: OtlpReceiver) -> None:
    batch = make_batch(step_events() + other_events())
    deliver(sink_for(receiver.endpoint, signals=["traces", "logs"]), batch)
    with OtlpReceiver() as json_receiver:
        deliver(sink_for(json_receiver.endpoint, signals=["traces", "logs"], encoding="json"), batch)
        assert json_receiver.received[0].headers["Content-Type"] == "application/json"
        for path in ("/v1/traces", "/v1/logs"):
            via_json, via_proto = json_receiver.messages(path), receiver.messages(path)
            assert len(via_json) == 1 and len(via_proto) == 1
            # ids are deterministic, so the two encodings carry identical content (logs differ only in
            # observed time, which is the time of sending)
            for rec in [*_log_records(via_json[0]), *_log_records(via_proto[0])]:
                rec.observed_time_unix_nano = 0
            assert via_json[0] == via_proto[0]
            again = json_format.Parse(json_format.MessageToJson(via_json[0]), type(via_json[0])())
            assert again == via_json[0]


def _log_records(message: Any) -> list[Any]:
    return [r for rl in getattr(message, "resource_logs", []) for sl in rl.scope_logs for r in sl.log_records]


def test_parent_range_arriving_in_a_later_batch(receiver: OtlpReceiver) -> None:
    """CUPTI reports a range when it ends: the call (batch 0) waits for its range (batch 1), the
    kernel (batch 2) then finds its released call."""
    from cuptistream.events import NvtxRange

    sink = sink_for(receiver.endpoint, signals=["traces"], reorder_window="60s")
    b0 = make_batch([NvtxRange(name="warmup", start=0, end=10, thread_id=TID), api(1, 300, 400)])
    b1 = make_batch([NvtxRange(name="step", start=100, end=10_000, thread_id=TID)], seq=1)
    b2 = make_batch([kernel(1, 1000, 2000)], seq=2)

    async def main() -> None:
        await sink.open()
        await sink.write(outgoing(b0))
        assert [s.name for s in receiver.spans()] == ["warmup"]
        assert sink.stats()["spans_waiting"] == 1
        await sink.write(outgoing(b1))
        await sink.write(outgoing(b2))
        await sink.close()

    trio.run(main)
    s = by_name(receiver.spans())
    assert s["cudaLaunchKernel"].parent_span_id == s["step"].span_id
    assert s["k_a"].parent_span_id == s["cudaLaunchKernel"].span_id
    assert s["k_a"].trace_id == s["step"].trace_id != s["warmup"].trace_id


def test_window_grouping_and_unparented_work(receiver: OtlpReceiver) -> None:
    """Without API or NVTX records, work is never held; trace = the root's 1 s window."""
    sink = sink_for(receiver.endpoint, signals=["traces"], trace_grouping="window", trace_window="1s")
    base = 1_000_000_000 - OFFSET % 1_000_000_000  # CUPTI time of an epoch-second boundary
    batch = make_batch([kernel(1, base + 10, base + 20), kernel(2, base + 500, base + 600),
                        kernel(3, base + 1_000_000_100, base + 1_000_000_200)])  # fmt: skip
    deliver(sink, batch, close=False)
    spans = sorted(receiver.spans(), key=lambda x: x.start_time_unix_nano)
    assert len(spans) == 3 and all(x.parent_span_id == b"" for x in spans)
    assert spans[0].trace_id == spans[1].trace_id != spans[2].trace_id


def test_waiting_spans_are_flushed_on_close(receiver: OtlpReceiver) -> None:
    from cuptistream.events import NvtxRange

    sink = sink_for(receiver.endpoint, signals=["traces"], reorder_window="60s")
    batch = make_batch(
        [NvtxRange(name="r", start=0, end=10, thread_id=TID), api(1, 300, 400), kernel(1, 500, 600)]
    )
    deliver(sink, batch)
    s = by_name(receiver.spans())
    assert set(s) == {"r", "cudaLaunchKernel", "k_a"}  # the call waited for a range, then went out at close
    assert (
        s["cudaLaunchKernel"].parent_span_id == b""
        and s["k_a"].parent_span_id == s["cudaLaunchKernel"].span_id
    )
    assert sink.stats()["spans_sent"] == 3 and sink.stats()["spans_waiting"] == 0


def test_same_events_give_the_same_ids(receiver: OtlpReceiver) -> None:
    deliver(sink_for(receiver.endpoint, signals=["traces"]), make_batch(step_events()))
    deliver(sink_for(receiver.endpoint, signals=["traces"]), make_batch(step_events()))
    first, second = receiver.messages("/v1/traces")
    assert first == second
    deliver(sink_for(receiver.endpoint, signals=["traces"]), make_batch(step_events(), session="sess-2"))
    assert {
        s.span_id for s in receiver.messages("/v1/traces")[2].resource_spans[0].scope_spans[0].spans
    }.isdisjoint({s.span_id for s in first.resource_spans[0].scope_spans[0].spans})


# --- delivery: the failure matrix -----------------------------------------------------------

N_SPANS = sum(SPAN_COUNTS.values())


def test_503_storm_with_retry_after_is_retried(receiver: OtlpReceiver) -> None:
    # The backoff alone (20 s) would overrun the 10 s deadline: success proves Retry-After is used.
    receiver.answer("/v1/traces", *[Answer(503, {"Retry-After": "1"})] * 2)
    sink = sink_for(
        receiver.endpoint,
        signals=["traces"],
        retry={"max_elapsed": "10s", "initial_backoff": "20s", "max_backoff": "20s"},
    )
    assert deliver(sink, make_batch(step_events())) == []
    times = [r.at for r in receiver.received]
    assert len(times) == 3 and times[1] - times[0] >= 0.9 and times[2] - times[1] >= 0.9
    st = sink.stats()
    assert (st["requests"], st["retries"], st["spans_sent"], st["spans_dropped"]) == (3, 2, N_SPANS, 0)
    assert len(receiver.spans()) == N_SPANS


def test_503_storm_past_the_deadline_drops_and_raises(receiver: OtlpReceiver) -> None:
    receiver.answer("/v1/traces", *[Answer(503, {"Retry-After": "1"})] * 10)
    sink = sink_for(receiver.endpoint, signals=["traces"], retry={"max_elapsed": "2.5s"})
    started = time.monotonic()
    errors = deliver(sink, make_batch(step_events()))
    assert time.monotonic() - started < 4
    assert len(errors) == 1 and "16 spans not delivered" in str(errors[0]) and "HTTP 503" in str(errors[0])
    st = sink.stats()
    assert (st["requests"], st["retries"], st["spans_dropped"], st["spans_sent"]) == (3, 2, N_SPANS, 0)


def test_400_is_permanent(receiver: OtlpReceiver) -> None:
    receiver.answer("/v1/traces", Answer(400))
    sink = sink_for(receiver.endpoint)
    errors = deliver(sink, make_batch(step_events() + other_events()))
    assert len(errors) == 1 and "refused traces with HTTP 400" in str(errors[0])
    assert receiver.count("/v1/traces") == 1  # never retried
    st = sink.stats()
    assert (st["spans_dropped"], st["retries"], st["log_records_sent"]) == (N_SPANS, 0, 2)


def test_partial_success_is_counted_not_retried(receiver: OtlpReceiver, caplog: Any) -> None:
    receiver.answer("/v1/traces", Answer(rejected=3, message="3 spans too old"))
    sink = sink_for(receiver.endpoint, signals=["traces"])
    with caplog.at_level(logging.WARNING, logger="cuptistream.sinks.otlp"):
        errors = deliver(sink, make_batch(step_events()))
    # Answered but not kept: those 3 events are not delivered, the rest of the batch is.
    assert len(errors) == 1 and isinstance(errors[0], DeliveryError) and errors[0].lost == {"rejected": 3}
    assert receiver.count("/v1/traces") == 1
    st = sink.stats()
    assert (st["spans_rejected"], st["spans_sent"], st["retries"]) == (3, N_SPANS - 3, 0)
    assert "3 spans too old" in caplog.text


def test_slow_server_hits_timeout_then_deadline(receiver: OtlpReceiver) -> None:
    receiver.answer("/v1/traces", *[Answer(delay=1.5)] * 3)
    sink = sink_for(
        receiver.endpoint,
        signals=["traces"],
        timeout="0.4s",
        retry={"max_elapsed": "1s", "initial_backoff": "0.1s"},
    )
    started = time.monotonic()
    errors = deliver(sink, make_batch(step_events()))
    assert time.monotonic() - started < 2.5
    assert len(errors) == 1 and "deadline" in str(errors[0]) and "ReadTimeout" in str(errors[0])
    st = sink.stats()
    assert st["spans_dropped"] == N_SPANS and st["spans_sent"] == 0 and st["requests"] >= 2


def test_oversized_batch_is_split(receiver: OtlpReceiver) -> None:
    events = [
        e
        for i in range(200)
        for e in (api(i + 1, i * 1000, i * 1000 + 100), kernel(i + 1, i * 1000 + 200, i * 1000 + 300))
    ]
    sink = sink_for(receiver.endpoint, signals=["traces"], compression="none", max_request_bytes="16KiB")
    assert deliver(sink, make_batch(events)) == []
    assert receiver.count("/v1/traces") > 2
    assert all(len(r.raw) <= 16 * 1024 for r in receiver.received)
    spans = receiver.spans()
    assert len(spans) == 400 and len({s.span_id for s in spans}) == 400
    assert sink.stats()["spans_sent"] == 400


def test_an_item_over_the_limit_on_its_own_is_dropped(receiver: OtlpReceiver) -> None:
    sink = sink_for(receiver.endpoint, signals=["traces"], max_request_bytes=1500)
    errors = deliver(sink, make_batch([kernel(1, 0, 10, name="k" * 3000), kernel(2, 20, 30, "small")]))
    assert len(errors) == 1 and isinstance(errors[0], DeliveryError) and errors[0].lost == {"too_large": 1}
    assert [s.name for s in receiver.spans()] == ["small"]
    assert sink.stats()["spans_dropped"] == 1


def test_failed_metrics_are_resent_with_the_next_batch(receiver: OtlpReceiver) -> None:
    receiver.answer("/v1/metrics", Answer(500))  # not retried, but a later request may succeed
    sink = sink_for(receiver.endpoint, signals=["metrics"])
    errors = deliver(sink, make_batch([kernel(1, 0, 100)]), make_batch([kernel(2, 0, 50, "k_b")], seq=1))
    assert errors == []  # cumulative metrics lose nothing
    names = {
        (n, attrs(p)["cuda.kernel.name"]): p.as_int
        for n, p in receiver.data_points()
        if n == "cuda.kernel.count"
    }
    assert names == {("cuda.kernel.count", "k_a"): 1, ("cuda.kernel.count", "k_b"): 1}
    assert sink.stats()["metric_exports_failed"] == 1


def test_unreachable_collector_fails_connect_and_batches_within_the_deadline() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    sink = sink_for(
        f"http://127.0.0.1:{port}", signals=["traces"], retry={"max_elapsed": "1s", "initial_backoff": "0.1s"}
    )

    async def connect() -> None:
        await sink.open()  # local checks only: no network
        await sink.connect()

    with pytest.raises(
        SinkUnavailableError, match=rf"^sinks\[otlp\]: http://127.0.0.1:{port}/v1/traces: ConnectError$"
    ):
        trio.run(connect)
    errors = deliver(sink, make_batch(step_events()))
    assert len(errors) == 1 and "ConnectError" in str(errors[0])
    assert sink.stats()["spans_dropped"] == N_SPANS and sink.stats()["retries"] >= 2


# --- config and headers ---------------------------------------------------------------------


def test_headers_from_env_are_sent(receiver: OtlpReceiver, monkeypatch: Any) -> None:
    monkeypatch.setenv("OTLP_TEST_TOKEN", "Bearer s3cret")
    sink = sink_for(receiver.endpoint, signals=["logs"], headers_env={"Authorization": "OTLP_TEST_TOKEN"})
    deliver(sink, make_batch(other_events()))
    assert receiver.received[0].headers["Authorization"] == "Bearer s3cret"
    assert receiver.received[0].headers["Content-Encoding"] == "gzip"


def test_missing_header_env_is_a_one_line_error(monkeypatch: Any) -> None:
    monkeypatch.delenv("OTLP_ABSENT", raising=False)
    sink = sink_for("http://127.0.0.1:1", headers_env={"Authorization": "OTLP_ABSENT"})
    expected = "sinks[otlp].headers_env.Authorization: environment variable OTLP_ABSENT is not set"
    with pytest.raises(ConfigError, match=re.escape(expected)) as info:
        trio.run(sink.open)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"endpoint": "127.0.0.1:4318"}, "sinks[0]: endpoint: expected a URL like http://127.0.0.1:4318"),
        ({"endpoint": "http://h:port"}, "port in 'http://h:port' is not a number"),
        ({}, "endpoint: required for traces"),
        ({"endpoint": "http://h:4318", "encoding": "xml"}, "sinks[0].encoding"),
        (
            {"endpoint": "http://h:4318", "tls": {"cert_file": "c.pem"}},
            "cert_file and tls.key_file go together",
        ),
    ],
)
def test_bad_config_is_one_line(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build({"sinks": [{"type": "otlp", **entry}]})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_per_signal_endpoints(receiver: OtlpReceiver) -> None:
    sink = sink_for("http://127.0.0.1:1", signals=["logs"], logs_endpoint=receiver.endpoint + "/v1/logs")
    assert deliver(sink, make_batch(other_events())) == []
    assert len(receiver.log_records()) == 2


def test_wire_encoded_span_matches_the_official_classes() -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    from cuptistream.sinks.otlp import wire as otlp_wire

    status = Status(code=Status.STATUS_CODE_ERROR, message="cudaMalloc returned 2")
    attributes = {
        "s": "ü",
        "i": -3,
        "big": 2**62,
        "f": 0.25,
        "b": True,
        "z": 0,
        "arr": ["a", "b"],
        "none": None,
    }
    data = otlp_wire.span(b"\x01" * 16, b"\x02" * 8, b"\x03" * 8, "name", 5, 2**63 + 7, attributes, status)
    span = Span.FromString(data)
    assert (span.trace_id, span.span_id, span.parent_span_id) == (b"\x01" * 16, b"\x02" * 8, b"\x03" * 8)
    assert (span.name, span.kind, span.start_time_unix_nano, span.end_time_unix_nano) == (
        "name",
        1,
        5,
        2**63 + 7,
    )
    assert attrs(span) == {"s": "ü", "i": -3, "big": 2**62, "f": 0.25, "b": True, "z": 0, "arr": ["a", "b"]}
    assert span.status == status
    assert (
        Span.FromString(otlp_wire.span(b"\x01" * 16, b"\x02" * 8, b"", "n", 0, 0, {})).parent_span_id == b""
    )
