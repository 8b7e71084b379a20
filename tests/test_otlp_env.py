"""The standard OTEL_EXPORTER_OTLP_* variables configure the OTLP sink where its config keys are unset,
against the real receiver; and a permanent refusal (405 on /v1/metrics) ends that signal only."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cuptistream.config import build, convert
from cuptistream.errors import ConfigError, PermanentSinkError
from cuptistream.sinks.otlp import OtlpSink, OtlpSinkConfig
from tests.otlp_batches import make_batch, other_events, step_events
from tests.otlp_receiver import Answer, OtlpReceiver
from tests.test_otlp import deliver

ALL = ("ENDPOINT", "HEADERS", "TIMEOUT", "PROTOCOL", "COMPRESSION")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: Any) -> None:
    for name in ALL:
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{name}", raising=False)
        for signal in ("TRACES", "METRICS", "LOGS"):
            monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{signal}_{name}", raising=False)


@pytest.fixture
def receiver() -> Any:
    with OtlpReceiver() as r:
        yield r


def sink(**keys: Any) -> OtlpSink:
    return OtlpSink(convert({"type": "otlp", "name": "otlp", **keys}, OtlpSinkConfig))


def test_endpoint_headers_timeout_and_protocol_from_the_environment(
    receiver: OtlpReceiver, monkeypatch: Any
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint + "/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20s3cret,x-team=ml")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-team=logs-team")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/json")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")
    s = sink()  # no endpoint key: the variables are enough
    assert s.cfg.settings("traces", dict(__import__("os").environ)).timeout == 2.5
    assert deliver(s, make_batch(step_events() + other_events())) == []
    by_path = {r.path: r for r in receiver.received}
    assert set(by_path) == {"/v1/traces", "/v1/metrics", "/v1/logs"}
    traces, logs = by_path["/v1/traces"], by_path["/v1/logs"]
    assert traces.headers["Authorization"] == "Bearer s3cret" and traces.headers["x-team"] == "ml"
    assert logs.headers["x-team"] == "logs-team"  # the signal's variable over the general one
    assert (
        logs.headers["Content-Type"] == "application/json"
        and traces.headers["Content-Type"] == "application/x-protobuf"
    )
    assert "Content-Encoding" not in traces.headers
    assert len(receiver.log_records()) == 2 and len(receiver.spans()) == 16


def test_config_keys_win_over_the_environment(receiver: OtlpReceiver, monkeypatch: Any) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/elsewhere")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=from-env,x-keep=1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    s = sink(
        endpoint=receiver.endpoint,
        headers={"Authorization": "from-config"},
        encoding="protobuf",
        timeout="5s",
    )
    assert deliver(s, make_batch(step_events() + other_events())) == []
    assert {r.path for r in receiver.received} == {"/v1/traces", "/v1/metrics", "/v1/logs"}
    headers = receiver.received[0].headers
    assert headers["Authorization"] == "from-config" and headers["x-keep"] == "1"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert s.cfg.settings("traces", {"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}).timeout == 5.0


def test_signal_endpoint_variable_is_used_as_is(receiver: OtlpReceiver, monkeypatch: Any) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", receiver.endpoint + "/v1/logs")
    assert deliver(sink(signals=["logs"]), make_batch(other_events())) == []
    assert [r.path for r in receiver.received] == ["/v1/logs"]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten", "OTEL_EXPORTER_OTLP_TIMEOUT: expected milliseconds"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "-5", "must be a positive number of milliseconds"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift", "expected grpc, http/protobuf or http/json"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", "OTEL_EXPORTER_OTLP_ENDPOINT: expected a URL"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", "expected gzip or none"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer hunter2", "entry 1 is not name=value"),
    ],
)
def test_bad_variables_are_one_line_errors(monkeypatch: Any, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    if variable != "OTEL_EXPORTER_OTLP_ENDPOINT":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    with pytest.raises(ConfigError) as info:
        build({"sinks": [{"type": "otlp"}]})
    text = str(info.value)
    assert message in text and "\n" not in text
    assert "hunter2" not in text  # header values are secrets


def test_no_endpoint_anywhere_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="or the environment variable OTEL_EXPORTER_OTLP_ENDPOINT"):
        build({"sinks": [{"type": "otlp"}]})


def test_header_values_are_never_logged(receiver: OtlpReceiver, monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20hunter2")
    receiver.answer("/v1/traces", Answer(401))
    with caplog.at_level(logging.DEBUG):
        errors = deliver(sink(endpoint=receiver.endpoint, signals=["traces"]), make_batch(step_events()))
    assert len(errors) == 1 and "HTTP 401" in str(errors[0]) and isinstance(errors[0], PermanentSinkError)
    assert "hunter2" not in caplog.text and "hunter2" not in str(errors[0])


# --- permanent refusals ---------------------------------------------------------------------


def test_405_on_metrics_ends_metrics_while_traces_go_on(receiver: OtlpReceiver) -> None:
    receiver.answer("/v1/metrics", *[Answer(405)] * 5)  # a traces-only backend
    s = sink(endpoint=receiver.endpoint, signals=["traces", "metrics"])
    batches = [make_batch(step_events(), seq=seq, session="s") for seq in range(3)]
    for seq, batch in enumerate(batches):  # distinct events per batch, so spans are not deduplicated
        for ev in batch.events:
            ev.start += seq * 100_000  # type: ignore[attr-defined]
            ev.end += seq * 100_000  # type: ignore[attr-defined]
    errors = deliver(s, *batches)
    assert len(errors) == 1  # one clear error, not one per batch
    text = str(errors[0])
    assert (
        "refused metrics with HTTP 405" in text and "/v1/metrics" in text and "off for this session" in text
    )
    assert "\n" not in text
    assert receiver.count("/v1/metrics") == 1  # never retried, never asked again
    assert receiver.count("/v1/traces") == 3 and len(receiver.spans()) == 3 * 16
    st = s.stats()
    assert st["signals_ended"] == 1 and st["retries"] == 0 and st["spans_sent"] == 48
    assert st["metric_points_dropped"] > 0  # the first request's points, then every later export's


@pytest.mark.parametrize(("status", "ends"), [(400, True), (404, True), (413, False), (500, False)])
def test_which_refusals_end_a_signal(receiver: OtlpReceiver, status: int, ends: bool) -> None:
    receiver.answer("/v1/logs", Answer(status))
    s = sink(endpoint=receiver.endpoint, signals=["logs"])
    errors = deliver(s, make_batch(other_events()), make_batch(other_events(), seq=1))
    assert receiver.count("/v1/logs") == (1 if ends else 2)
    assert s.stats()["signals_ended"] == int(ends)
    # An ended signal's events are lost in every later batch too, and each batch says so.
    assert s.stats()["log_records_dropped"] == (4 if ends else 2) and len(errors) == (2 if ends else 1)


@pytest.mark.parametrize(("status", "reason"), [(401, "unauthorized"), (403, "forbidden")])
def test_refused_credentials_stop_the_sink_with_one_line(
    receiver: OtlpReceiver, status: int, reason: str
) -> None:
    receiver.answer("/v1/logs", Answer(status))
    s = sink(endpoint=receiver.endpoint, signals=["logs"])
    errors = deliver(s, make_batch(other_events()), make_batch(other_events(), seq=1))
    assert len(errors) == 1 and isinstance(errors[0], PermanentSinkError) and errors[0].reason == reason
    text = str(errors[0])
    assert f"HTTP {status}" in text and "check" in text and "\n" not in text
    assert receiver.count("/v1/logs") == 1  # never retried, nothing sent after it


@pytest.mark.parametrize("status", [408, 429])
def test_408_and_429_are_retried(receiver: OtlpReceiver, status: int) -> None:
    receiver.answer("/v1/logs", Answer(status, {"Retry-After": "0"}))
    s = sink(endpoint=receiver.endpoint, signals=["logs"])
    assert deliver(s, make_batch(other_events())) == []
    assert receiver.count("/v1/logs") == 2 and s.stats()["log_records_sent"] == 2
