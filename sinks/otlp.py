"""The OTLP/HTTP sink: GPU activity as traces, metrics and logs for any OpenTelemetry backend.

``write`` maps a batch (in a worker thread, so the trio loop stays free), then posts each
request with retries inside one deadline per batch. Outcomes are counted in ``stats()``:

* accepted items → ``*_sent``; items a backend refused in a partial success → ``*_rejected``
  (never retried);
* items lost to a permanent error (4xx, other 5xx), the deadline, or being larger than
  ``max_request_bytes`` on their own → ``*_dropped``; then ``write`` raises ``DeliveryError`` so
  the pipeline counts the batch as lost. Metrics are cumulative and re-sent on the next batch, so
  a failed metrics request is counted (``metric_exports_failed``) but loses nothing.

See docs/otlp.md for the configuration and the mapping.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
import trio
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint, ResourceMetrics, ScopeMetrics
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from cuptistream.component import DeliveryError, OutgoingBatch, Sink
from cuptistream.config import SinkConfig
from cuptistream.errors import ConfigError
from cuptistream.events import Batch

from .otlp_common import resource, scope
from .otlp_config import OtlpSinkConfig, Signal, TlsConfig
from .otlp_encoding import encode, from_json, split, to_json
from .otlp_logs import log_records
from .otlp_metrics import MetricsAggregator, Series, metrics_message
from .otlp_traces import SpanAssembler
from .otlp_transport import Transport
from .otlp_wire import traces_request

__all__ = ["OtlpSink", "OtlpSinkConfig"]

log = logging.getLogger("cuptistream.sinks.otlp")

_ITEMS = {"traces": "spans", "metrics": "metric_points", "logs": "log_records"}
_RESPONSES: dict[Signal, type[Message]] = {
    "traces": ExportTraceServiceResponse,
    "metrics": ExportMetricsServiceResponse,
    "logs": ExportLogsServiceResponse,
}
_REJECTED_FIELD = {
    "traces": "rejected_spans",
    "metrics": "rejected_data_points",
    "logs": "rejected_log_records",
}


@dataclass
class _Request:
    signal: Signal
    body: bytes  # encoded and compressed
    items: int


class OtlpSink(Sink):
    config_type: ClassVar[type[SinkConfig]] = OtlpSinkConfig

    def __init__(self, config: SinkConfig) -> None:
        super().__init__(config)
        assert isinstance(config, OtlpSinkConfig)
        self.cfg = config
        self.spans = SpanAssembler(
            grouping=config.trace_grouping,
            window_s=config.trace_window,
            reorder_window_s=config.reorder_window,
            max_pending=config.max_pending_spans,
        )
        self.metrics = MetricsAggregator(config.max_kernel_names, config.max_function_names)
        self.counters: dict[str, int] = {
            f"{items}_{outcome}": 0
            for items in _ITEMS.values()
            for outcome in ("sent", "rejected", "dropped")
        }
        for name in ("requests", "retries", "requests_failed", "bytes_sent", "metric_exports_failed"):
            self.counters[name] = 0
        self._client: httpx.AsyncClient | None = None
        self._transports: dict[Signal, Transport] = {}
        self._resource: tuple[str, Resource] | None = None
        self._dirty_series: set[Series] = set()

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        cfg = self.cfg
        headers = dict(cfg.headers)
        for header, var in cfg.headers_env.items():
            value = os.environ.get(var)
            if value is None:
                raise ConfigError(
                    f"sink {self.name!r}: headers_env.{header} names the environment variable {var}, "
                    "which is not set; export it before starting"
                )
            headers[header] = value
        self._client = httpx.AsyncClient(verify=_ssl_context(cfg.tls, self.name), follow_redirects=False)
        content_type = "application/json" if cfg.encoding == "json" else "application/x-protobuf"
        for signal in cfg.signals:
            url = cfg.signal_url(signal)
            assert url is not None  # checked when the config was loaded
            self._transports[signal] = Transport(
                self._client, url, content_type, cfg.compression, headers, cfg.timeout, cfg.retry
            )
        await self._probe()

    async def _probe(self) -> None:
        """Warn in one line if a collector is not listening now; collectors restart, so it is not fatal."""
        for url in {t.url for t in self._transports.values()}:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            with trio.move_on_after(2):
                try:
                    stream = await trio.open_tcp_stream(parts.hostname or "", port)
                except OSError as error:
                    log.warning(
                        "otlp sink %r: %s is not reachable now (%s); batches will be retried",
                        self.name,
                        url,
                        error.strerror or type(error).__name__,
                    )
                else:
                    await stream.aclose()

    async def write(self, batch: OutgoingBatch) -> None:
        decoded = batch.batch
        requests = await trio.to_thread.run_sync(self._encode, decoded)
        await self._deliver(requests)

    async def close(self) -> None:
        try:
            if "traces" in self._transports and self.spans.pending:
                requests = await trio.to_thread.run_sync(self._encode_spans, self.spans.flush())
                await self._deliver(requests)
        finally:
            if self._client is not None:
                await self._client.aclose()

    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            "spans_waiting": self.spans.pending,
            "spans_unparented_by_timeout": self.spans.forced,
            "kernel_names_overflowed": self.metrics.kernel_names.overflowed,
            "function_names_overflowed": self.metrics.function_names.overflowed,
        }

    # --- mapping (worker thread) -------------------------------------------------------------

    def _session_resource(self, batch: Batch) -> Resource:
        if self._resource is None or self._resource[0] != batch.session_id:
            self._resource = (batch.session_id, resource(batch))
        return self._resource[1]

    def _encode(self, batch: Batch) -> list[_Request]:
        res, enc = self._session_resource(batch), self.cfg.encoding
        requests: list[_Request] = []
        if "traces" in self._transports:
            requests += self._encode_spans(self.spans.add(batch))
        if "metrics" in self._transports:
            self.metrics.add(batch)
            points, self._dirty_series = self.metrics.export()
            requests += self._requests(
                "metrics",
                points,
                lambda items: encode(_metrics_request(res, self.cfg, items), self.cfg.encoding),
            )
        if "logs" in self._transports:
            records = log_records(batch, time.time_ns())
            requests += self._requests(
                "logs", records, lambda items: encode(_logs_request(res, self.cfg, items), enc)
            )
        return requests

    def _encode_spans(self, spans: list[bytes]) -> list[_Request]:
        assert self._resource is not None
        res, sc = self._resource[1], scope(self.cfg.scope_name)
        if self.cfg.encoding == "json":
            return self._requests(
                "traces",
                spans,
                lambda items: to_json(ExportTraceServiceRequest.FromString(traces_request(res, sc, items))),
            )
        return self._requests("traces", spans, lambda items: traces_request(res, sc, items))

    def _requests(
        self, signal: Signal, items: Sequence[Any], encode_items: Callable[[Sequence[Any]], bytes]
    ) -> list[_Request]:
        bodies, too_large = split(items, encode_items, self.cfg.max_request_bytes)
        if too_large:
            self.counters[f"{_ITEMS[signal]}_dropped"] += too_large
            log.warning(
                "otlp sink %r: %d %s larger than max_request_bytes (%d) on their own were dropped",
                self.name,
                too_large,
                _ITEMS[signal],
                self.cfg.max_request_bytes,
            )
        compress = self._transports[signal].compress
        return [_Request(signal, compress(body), count) for body, count in bodies]

    # --- delivery (trio) ---------------------------------------------------------------------

    async def _deliver(self, requests: list[_Request]) -> None:
        deadline = trio.current_time() + self.cfg.deadline
        lost: dict[str, int] = {}
        reasons: set[str] = set()
        metrics_ok = True
        for request in requests:
            result = await self._transports[request.signal].post(request.body, deadline)
            self.counters["requests"] += result.attempts
            self.counters["retries"] += result.retries
            items = _ITEMS[request.signal]
            if not result.ok:
                self.counters["requests_failed"] += 1
                reasons.add(result.reason)
                if request.signal == "metrics":
                    metrics_ok = False
                    self.counters["metric_exports_failed"] += 1
                    continue
                self.counters[f"{items}_dropped"] += request.items
                lost[items] = lost.get(items, 0) + request.items
                continue
            self.counters["bytes_sent"] += len(request.body)
            rejected, message = self._partial_success(request.signal, result.body, result.content_type)
            rejected = min(rejected, request.items)
            self.counters[f"{items}_sent"] += request.items - rejected
            self.counters[f"{items}_rejected"] += rejected
            if rejected or message:
                log.warning(
                    "otlp sink %r: the backend rejected %d of %d %s: %s",
                    self.name,
                    rejected,
                    request.items,
                    items,
                    message[:200] or "no reason given",
                )
        if metrics_ok and "metrics" in self._transports:
            self.metrics.commit(self._dirty_series)
        if lost:
            what = ", ".join(f"{n} {items}" for items, n in lost.items())
            raise DeliveryError(
                f"otlp sink {self.name!r}: {what} not delivered ({'; '.join(sorted(reasons))})"
            )
        if reasons:
            log.warning(
                "otlp sink %r: metrics export failed (%s); will resend", self.name, "; ".join(reasons)
            )

    def _partial_success(self, signal: Signal, body: bytes, content_type: str) -> tuple[int, str]:
        if not body:
            return 0, ""
        response = _RESPONSES[signal]()
        try:
            if "json" in content_type:
                from_json(body, response)
            else:
                response.ParseFromString(body)
        except (DecodeError, ValueError):
            return 0, ""  # a 2xx with a body we cannot read: the request was accepted
        partial = getattr(response, "partial_success")  # noqa: B009 - response type varies per signal
        return int(getattr(partial, _REJECTED_FIELD[signal])), str(partial.error_message)


def _metrics_request(
    res: Resource, cfg: OtlpSinkConfig, points: Sequence[tuple[str, NumberDataPoint]]
) -> ExportMetricsServiceRequest:
    scoped = ScopeMetrics(scope=scope(cfg.scope_name), metrics=metrics_message(points))
    return ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(resource=res, scope_metrics=[scoped])]
    )


def _logs_request(
    res: Resource, cfg: OtlpSinkConfig, records: Sequence[LogRecord]
) -> ExportLogsServiceRequest:
    scoped = ScopeLogs(scope=scope(cfg.scope_name), log_records=records)
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(resource=res, scope_logs=[scoped])])


def _ssl_context(tls: TlsConfig, sink: str) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file and tls.key_file:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(
            f"sink {sink!r}: tls: cannot load a certificate or key ({error.strerror or error}); "
            "check ca_file, cert_file and key_file"
        ) from None
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
