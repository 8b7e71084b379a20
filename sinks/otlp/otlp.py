"""The OTLP sink: GPU activity as traces, metrics and logs for any OpenTelemetry backend, over
OTLP/HTTP or (with the ``[grpc]`` extra) OTLP/gRPC.

``write`` maps a batch (in a worker thread, so the trio loop stays free), then sends each
request with retries inside one deadline per batch. Every observed process is its own Resource,
with its own span tree, metric series and start time. Outcomes are counted in ``stats()``:

* accepted items → ``*_sent``; items a backend refused in a partial success → ``*_rejected``
  (never retried);
* items lost to a refusal, the deadline, or being larger than ``max_request_bytes`` on their own →
  ``*_dropped``; then ``write`` raises ``DeliveryError`` so the pipeline counts the batch as lost.
  Metrics are cumulative and re-sent on the next batch, so a failed metrics request is counted
  (``metric_exports_failed``) but loses nothing.
* a refusal that every later request would get too (HTTP 4xx but 408, 413 and 429; gRPC
  UNIMPLEMENTED, UNAUTHENTICATED, ...) ends that signal for the session: one ``DeliveryError``
  says so, and from then on its items are counted in ``*_dropped`` without being sent.

Request bodies and responses are ``otlp_requests``; the transports are ``otlp_transport`` and
``otlp_grpc``. See docs/otlp.md for the configuration and the mapping.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
import trio
from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from cuptistream.component import DeliveryError, OutgoingBatch, Sink, secret_from_env
from cuptistream.config import SinkConfig
from cuptistream.errors import ConfigError
from cuptistream.events import Batch, Error, PcSampleBatch

from .otlp_common import resource, scope
from .otlp_config import OtlpSinkConfig, Signal
from .otlp_encoding import split
from .otlp_env import SignalSettings, resource_from_env
from .otlp_logs import log_records
from .otlp_metrics import Exported, MetricsAggregator
from .otlp_requests import partial_success, request_body, require_profiles
from .otlp_traces import SPAN_EVENTS, SpanAssembler
from .otlp_transport import HttpTransport, Transport, ssl_context

__all__ = ["OtlpSink", "OtlpSinkConfig"]

log = logging.getLogger("cuptistream.sinks.otlp")

_ITEMS = {"traces": "spans", "metrics": "metric_points", "logs": "log_records", "profiles": "profiles"}
Origin = tuple[str, str, int]  # session id, host, pid: one observed process, one Resource
# A process with no batch for this long has ended (or gone quiet): its last spans and utilization
# windows are sent and its state dropped, so a long-lived collector does not keep every process ever seen.
PROCESS_IDLE_S = 600.0


@dataclass
class _Process:
    """What the sink keeps per observed process."""

    resource: Resource
    spans: SpanAssembler
    metrics: MetricsAggregator
    exported: Exported = field(default_factory=lambda: (set(), []))  # the export in flight
    drains: dict[tuple[int, int], int] = field(default_factory=dict)  # (device, context) -> last drain, epoch
    seen: float = 0.0  # monotonic time of its latest batch


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
        self.counters: dict[str, int] = {
            f"{items}_{outcome}": 0
            for items in _ITEMS.values()
            for outcome in ("sent", "rejected", "dropped")
        }
        for name in (
            "requests", "retries", "requests_failed", "bytes_sent", "metric_exports_failed", "signals_ended"
        ):  # fmt: skip
            self.counters[name] = 0
        self._client: httpx.AsyncClient | None = None
        self._transports: dict[Signal, Transport] = {}
        self._json: set[Signal] = set()  # signals sent as OTLP/JSON
        self._ended: dict[Signal, str] = {}  # signal -> why the backend refuses it for good
        self._processes: dict[Origin, _Process] = {}
        self._env_resource: dict[str, str] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        cfg = self.cfg
        headers = dict(cfg.headers)
        for header, var in cfg.headers_env.items():
            headers[header] = secret_from_env(self.name, f"headers_env.{header}", var)
        self._env_resource = resource_from_env(os.environ)
        if "profiles" in cfg.signals:
            require_profiles(self.name)
        for signal in cfg.signals:
            try:
                settings = cfg.settings(signal, os.environ)
            except ValueError as error:  # an OTEL_* variable changed since the config was loaded
                raise ConfigError(f"{self.where()}: {error}") from None
            self._transports[signal] = self._transport(signal, settings, {**settings.headers, **headers})
            if settings.protocol == "http/json":
                self._json.add(signal)
        await self._probe()

    def _transport(self, signal: Signal, settings: SignalSettings, headers: dict[str, str]) -> Transport:
        if settings.protocol == "grpc":
            from .otlp_grpc import GrpcTransport

            return GrpcTransport(
                signal, settings.url, settings.compression, headers, settings.timeout, self.cfg.retry,
                self.cfg.tls, self.name,
            )  # fmt: skip
        if self._client is None:
            verify = ssl_context(self.cfg.tls, self.name)
            self._client = httpx.AsyncClient(verify=verify, follow_redirects=False)
        content_type = "application/json" if settings.protocol == "http/json" else "application/x-protobuf"
        return HttpTransport(
            self._client, settings.url, content_type, settings.compression, headers, settings.timeout,
            self.cfg.retry,
        )  # fmt: skip

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
                        "%s: %s is not reachable now (%s); batches will be retried",
                        self.where(),
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
            requests = await trio.to_thread.run_sync(self._encode_final)
            await self._deliver(requests)
        finally:
            for transport in self._transports.values():
                await transport.aclose()
            if self._client is not None:
                await self._client.aclose()

    def stats(self) -> dict[str, int]:
        processes = self._processes.values()
        return {
            **self.counters,
            "spans_waiting": sum(p.spans.pending for p in processes),
            "spans_unparented_by_timeout": sum(p.spans.forced for p in processes),
            "kernel_names_overflowed": sum(p.metrics.kernel_names.overflowed for p in processes),
            "function_names_overflowed": sum(p.metrics.function_names.overflowed for p in processes),
        }

    # --- mapping (worker thread) -------------------------------------------------------------

    def _process(self, batch: Batch) -> tuple[Origin, _Process]:
        origin = (batch.session_id, batch.resource.host, batch.resource.pid)
        process = self._processes.get(origin)
        if process is None:
            cfg = self.cfg
            process = self._processes[origin] = _Process(
                resource(batch, self._env_resource),
                SpanAssembler(
                    grouping=cfg.trace_grouping,
                    window_s=cfg.trace_window,
                    reorder_window_s=cfg.reorder_window,
                    max_pending=cfg.max_pending_spans,
                ),
                MetricsAggregator(cfg.max_kernel_names, cfg.max_function_names),
            )
        return origin, process

    def _sending(self, signal: Signal) -> bool:
        return signal in self._transports and signal not in self._ended

    def _encode(self, batch: Batch) -> list[_Request]:
        origin, process = self._process(batch)
        now = time.monotonic()
        process.seen = now
        idle = {o for o, p in self._processes.items() if now - p.seen > PROCESS_IDLE_S}
        requests: list[_Request] = []
        if self._sending("traces"):
            spans = [(origin, span) for span in process.spans.add(batch)]
            for other_origin, other in self._processes.items():  # their reorder windows run out too
                if other is not process and other.spans.pending:
                    release = other.spans.flush if other_origin in idle else other.spans.release
                    spans += [(other_origin, span) for span in release()]
            requests += self._requests("traces", spans)
        elif "traces" in self._transports:
            self._count_ended("traces", sum(1 for ev in batch.events if isinstance(ev, SPAN_EVENTS)))
        if "metrics" in self._transports:
            process.metrics.add(batch)
            for other_origin in idle:
                self._processes[other_origin].metrics.finish()
            requests += self._metric_requests()
        if self._sending("logs"):
            records = [(origin, r) for r in log_records(batch, time.time_ns())]
            requests += self._requests("logs", records)
        elif "logs" in self._transports:
            self._count_ended("logs", sum(1 for ev in batch.events if isinstance(ev, Error)))
        if "profiles" in self._transports:
            windows = [(origin, w) for w in self._windows(batch, process)]
            if self._sending("profiles"):
                requests += self._requests("profiles", windows)
            else:
                self._count_ended("profiles", len(windows))
        for other_origin in idle:  # its requests are encoded: they no longer need it
            del self._processes[other_origin]
        return requests

    def _windows(self, batch: Batch, process: _Process) -> list[Any]:
        """Each PC-sampling drain with the window it covers: since the context's previous drain."""
        from .otlp_profiles import Window

        offset = batch.clock.offset_ns
        windows = []
        for ev in batch.events:
            if isinstance(ev, PcSampleBatch):
                end = ev.timestamp + offset
                start = process.drains.get((ev.device_id, ev.context_id), end)
                process.drains[(ev.device_id, ev.context_id)] = end
                windows.append(Window(ev, batch.session_id, min(start, end), end))
        return windows

    def _encode_final(self) -> list[_Request]:
        """Everything still held: waiting spans and the last utilization windows."""
        requests: list[_Request] = []
        if self._sending("traces"):
            spans = [(o, span) for o, p in self._processes.items() for span in p.spans.flush()]
            requests += self._requests("traces", spans)
        if "metrics" in self._transports:
            for process in self._processes.values():
                process.metrics.finish()
            requests += self._metric_requests()
        return requests

    def _metric_requests(self) -> list[_Request]:
        points: list[tuple[Origin, str, NumberDataPoint]] = []
        for origin, process in self._processes.items():
            exported, process.exported = process.metrics.export()
            points += [(origin, name, point) for name, point in exported]
        if not self._sending("metrics"):
            self._count_ended("metrics", len(points))
            for process in self._processes.values():
                process.metrics.commit(process.exported)  # nothing will take them: do not pile them up
            return []
        return self._requests("metrics", points)

    def _count_ended(self, signal: Signal, items: int) -> None:
        self.counters[f"{_ITEMS[signal]}_dropped"] += items

    def _encode_items(self, signal: Signal, items: Sequence[Any]) -> bytes:
        """One request body for ``items`` ((origin, item) pairs), one Resource per origin."""
        groups = [(self._processes[o].resource, [i[-1] if signal != "metrics" else i[1:] for i in g])
                  for o, g in groupby(items, key=lambda i: i[0])]  # fmt: skip
        return request_body(signal, groups, scope(self.cfg.scope_name), signal in self._json)

    def _requests(self, signal: Signal, items: Sequence[Any]) -> list[_Request]:
        encode_items: Callable[[Sequence[Any]], bytes] = lambda part: self._encode_items(signal, part)  # noqa: E731
        bodies, too_large = split(items, encode_items, self.cfg.max_request_bytes)
        if too_large:
            self.counters[f"{_ITEMS[signal]}_dropped"] += too_large
            log.warning(
                "%s: %d %s larger than max_request_bytes (%d) on their own were dropped",
                self.where(),
                too_large,
                _ITEMS[signal],
                self.cfg.max_request_bytes,
            )
        compress = self._transports[signal].compress
        return [_Request(signal, compress(body), count) for body, count in bodies]

    # --- delivery (trio) ---------------------------------------------------------------------

    async def _deliver(self, requests: list[_Request]) -> None:
        deadline = trio.current_time() + self.cfg.retry.max_elapsed
        lost: dict[str, int] = {}
        reasons: set[str] = set()
        ended_now: list[str] = []
        metrics_ok = True
        for request in requests:
            items = _ITEMS[request.signal]
            if request.signal in self._ended:  # refused for good earlier in this batch
                self._count_ended(request.signal, request.items)
                if request.signal == "metrics":
                    metrics_ok = False
                continue
            transport = self._transports[request.signal]
            result = await transport.post(request.body, deadline)
            self.counters["requests"] += result.attempts
            self.counters["retries"] += result.retries
            if not result.ok:
                self.counters["requests_failed"] += 1
                reasons.add(result.reason)
                if result.ended:
                    self._ended[request.signal] = result.reason
                    self.counters["signals_ended"] += 1
                    ended_now.append(
                        f"the backend refused {request.signal} with {result.reason} at {transport.url}, so "
                        f"{request.signal} are off for this session"
                    )
                if request.signal == "metrics":
                    metrics_ok = False
                    self.counters["metric_exports_failed"] += 1
                    if not result.ended:
                        continue
                self.counters[f"{items}_dropped"] += request.items
                lost[items] = lost.get(items, 0) + request.items
                continue
            self.counters["bytes_sent"] += len(request.body)
            rejected, message = partial_success(request.signal, result.body, result.content_type)
            rejected = min(rejected, request.items)
            self.counters[f"{items}_sent"] += request.items - rejected
            self.counters[f"{items}_rejected"] += rejected
            if rejected or message:
                log.warning(
                    "%s: the backend rejected %d of %d %s: %s",
                    self.where(),
                    rejected,
                    request.items,
                    items,
                    message[:200] or "no reason given",
                )
        if metrics_ok and "metrics" in self._transports:
            for process in self._processes.values():
                process.metrics.commit(process.exported)
        if ended_now:
            what = ", ".join(f"{n} {items}" for items, n in lost.items())
            raise DeliveryError(
                f"{self.where()}: {'; '.join(ended_now)} ({what} dropped); check the endpoint's "
                "path and that the backend accepts this signal, or remove it from signals"
            )
        if lost:
            what = ", ".join(f"{n} {items}" for items, n in lost.items())
            raise DeliveryError(
                f"{self.where()}: {what} not delivered ({'; '.join(sorted(reasons))})"
            )
        if reasons:
            log.warning(
                "%s: metrics export failed (%s); will resend", self.where(), "; ".join(reasons)
            )
