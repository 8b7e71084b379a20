"""OTLP/gRPC against a real gRPC server started in the test (tests/otlp_grpc_receiver.py: grpc.server
with the opentelemetry-proto servicers), with the failure matrix of the HTTP tests."""

from __future__ import annotations

import socket
import time
from collections import Counter
from typing import Any

import grpc
import pytest

from cuptistream.config import convert
from cuptistream.errors import PermanentSinkError
from cuptistream.plugin import DeliveryError
from cuptistream.sinks.otlp import OtlpSink, OtlpSinkConfig
from tests.otlp_batches import SPAN_COUNTS, UUID, make_batch, other_events, step_events
from tests.otlp_grpc_receiver import OtlpGrpcReceiver, Reply
from tests.test_otlp import attrs, deliver

N_SPANS = sum(SPAN_COUNTS.values())


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: Any) -> None:
    for name in ("ENDPOINT", "PROTOCOL", "HEADERS", "TIMEOUT", "COMPRESSION"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{name}", raising=False)


@pytest.fixture
def receiver() -> Any:
    with OtlpGrpcReceiver() as r:
        yield r


def sink(endpoint: str, **keys: Any) -> OtlpSink:
    cfg = {"type": "otlp", "name": "otlp", "endpoint": endpoint, "protocol": "grpc", **keys}
    return OtlpSink(convert(cfg, OtlpSinkConfig))


def test_all_signals_arrive_decoded_by_the_stubs(receiver: OtlpGrpcReceiver) -> None:
    s = sink(receiver.endpoint, headers={"X-Team": "ml"})
    assert deliver(s, make_batch(step_events() + other_events())) == []
    spans = receiver.spans()
    assert Counter(attrs(x)["cuda.activity.kind"] for x in spans) == SPAN_COUNTS
    assert len(receiver.log_records()) == 2 and receiver.data_points()
    kernel = next(x for x in spans if x.name == "k_b")
    assert attrs(kernel)["hw.id"] == UUID
    call = receiver.calls[0]
    assert call.metadata["x-team"] == "ml"
    assert "cuptistream" in call.metadata["user-agent"]
    st = s.stats()
    assert (st["spans_sent"], st["log_records_sent"], st["retries"]) == (N_SPANS, 2, 0)


def test_protocol_and_endpoint_from_the_environment(receiver: OtlpGrpcReceiver, monkeypatch: Any) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)  # no path for gRPC
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0ken")
    s = OtlpSink(convert({"type": "otlp", "name": "otlp", "signals": ["logs"]}, OtlpSinkConfig))
    assert deliver(s, make_batch(other_events())) == []
    assert receiver.calls[0].metadata["authorization"] == "Bearer t0ken" and len(receiver.log_records()) == 2


def test_unavailable_is_retried(receiver: OtlpGrpcReceiver) -> None:
    receiver.answer("traces", Reply(grpc.StatusCode.UNAVAILABLE), Reply(grpc.StatusCode.RESOURCE_EXHAUSTED))
    s = sink(receiver.endpoint, signals=["traces"], retry={"initial_backoff": "50ms"})
    assert deliver(s, make_batch(step_events())) == []
    assert receiver.count("traces") == 3 and s.stats()["retries"] == 2 and s.stats()["spans_sent"] == N_SPANS


def test_unavailable_past_the_deadline_drops_and_raises(receiver: OtlpGrpcReceiver) -> None:
    receiver.answer("traces", *[Reply(grpc.StatusCode.UNAVAILABLE)] * 50)
    s = sink(receiver.endpoint, signals=["traces"], retry={"max_elapsed": "1s", "initial_backoff": "100ms"})
    started = time.monotonic()
    errors = deliver(s, make_batch(step_events()))
    assert time.monotonic() - started < 2.5
    assert len(errors) == 1 and "deadline" in str(errors[0]) and "UNAVAILABLE" in str(errors[0])
    assert s.stats()["spans_dropped"] == N_SPANS


def test_unimplemented_metrics_end_metrics_while_traces_go_on(receiver: OtlpGrpcReceiver) -> None:
    receiver.answer("metrics", *[Reply(grpc.StatusCode.UNIMPLEMENTED)] * 3)
    s = sink(receiver.endpoint, signals=["traces", "metrics"])
    batches = [make_batch(step_events(), seq=seq) for seq in range(3)]
    for seq, batch in enumerate(batches):
        for ev in batch.events:
            ev.start += seq * 100_000  # type: ignore[attr-defined]
            ev.end += seq * 100_000  # type: ignore[attr-defined]
    errors = deliver(s, *batches)
    assert len(errors) == 1 and "refused metrics with gRPC UNIMPLEMENTED" in str(errors[0])
    assert receiver.count("metrics") == 1 and receiver.count("traces") == 3
    assert s.stats()["signals_ended"] == 1 and s.stats()["spans_sent"] == 3 * N_SPANS


@pytest.mark.parametrize(
    ("code", "ends"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, True),
        (grpc.StatusCode.INTERNAL, False),
    ],
)
def test_which_codes_end_a_signal(receiver: OtlpGrpcReceiver, code: grpc.StatusCode, ends: bool) -> None:
    receiver.answer("logs", Reply(code))
    s = sink(receiver.endpoint, signals=["logs"])
    errors = deliver(s, make_batch(other_events()), make_batch(other_events(), seq=1))
    # An ended signal's events are lost in every later batch too, and each batch says so.
    assert len(errors) == (2 if ends else 1) and f"gRPC {code.name}" in str(errors[0])
    assert receiver.count("logs") == (1 if ends else 2) and s.stats()["signals_ended"] == int(ends)


@pytest.mark.parametrize(
    ("code", "reason"),
    [(grpc.StatusCode.UNAUTHENTICATED, "unauthorized"), (grpc.StatusCode.PERMISSION_DENIED, "forbidden")],
)
def test_refused_credentials_stop_the_sink(
    receiver: OtlpGrpcReceiver, code: grpc.StatusCode, reason: str
) -> None:
    receiver.answer("logs", Reply(code))
    s = sink(receiver.endpoint, signals=["logs"])
    errors = deliver(s, make_batch(other_events()), make_batch(other_events(), seq=1))
    assert len(errors) == 1 and isinstance(errors[0], PermanentSinkError) and errors[0].reason == reason
    assert f"gRPC {code.name}" in str(errors[0]) and "\n" not in str(errors[0])
    assert receiver.count("logs") == 1  # never retried, nothing sent after it


def test_partial_success_is_counted_not_retried(receiver: OtlpGrpcReceiver) -> None:
    receiver.answer("traces", Reply(rejected=3, message="too old"))
    s = sink(receiver.endpoint, signals=["traces"])
    errors = deliver(s, make_batch(step_events()))
    assert len(errors) == 1 and isinstance(errors[0], DeliveryError) and errors[0].lost == {"rejected": 3}
    assert receiver.count("traces") == 1
    assert (s.stats()["spans_rejected"], s.stats()["spans_sent"]) == (3, N_SPANS - 3)


def test_slow_server_hits_the_timeout_then_the_deadline(receiver: OtlpGrpcReceiver) -> None:
    receiver.answer("traces", *[Reply(delay=1.0)] * 3)
    s = sink(
        receiver.endpoint,
        signals=["traces"],
        timeout="300ms",
        retry={"max_elapsed": "1s", "initial_backoff": "50ms"},
    )
    errors = deliver(s, make_batch(step_events()))
    assert len(errors) == 1 and "DEADLINE_EXCEEDED" in str(errors[0])
    assert s.stats()["requests"] >= 2


def test_unreachable_server_fails_within_the_deadline() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = sink(
        f"http://127.0.0.1:{port}",
        signals=["traces"],
        timeout="300ms",
        retry={"max_elapsed": "1s", "initial_backoff": "100ms"},
    )
    started = time.monotonic()
    errors = deliver(s, make_batch(step_events()))
    assert time.monotonic() - started < 2.5
    assert len(errors) == 1 and "UNAVAILABLE" in str(errors[0]) and s.stats()["retries"] >= 1


def test_grpc_with_json_encoding_is_refused() -> None:
    from cuptistream.config import build
    from cuptistream.errors import ConfigError

    with pytest.raises(ConfigError, match="protocol grpc always sends protobuf"):
        build(
            {"sinks": [{"type": "otlp", "endpoint": "http://h:4317", "protocol": "grpc", "encoding": "json"}]}
        )
