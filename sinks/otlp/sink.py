"""The OTLP sink: GPU activity as traces, metrics and logs for any OpenTelemetry backend, over
OTLP/HTTP or (with the ``[grpc]`` extra) OTLP/gRPC.

``write`` maps a batch (in a worker thread, so the trio loop stays free), then sends each
request with retries inside one deadline per batch. Every observed process is its own Resource,
with its own span tree, metric series and start time. Outcomes are counted in ``stats()``:

* accepted items → ``*_sent``; items a backend refused in a partial success → ``*_rejected``
  (never retried);
* items lost to a refusal, the deadline, or being larger than ``max_request_bytes`` on their own →
  ``*_dropped``. Metrics are cumulative and re-sent on the next batch, so a failed metrics request is
  counted (``metric_exports_failed``) and sent again; the statistics' delta points (``stats``) and
  gauge readings are held until a metrics export is acknowledged.
* a refusal that every later request would get too (HTTP 4xx but 401, 403, 408, 413 and 429; gRPC
  UNIMPLEMENTED, NOT_FOUND, INVALID_ARGUMENT) ends that signal for the session: from then on its
  items are counted in ``*_dropped`` without being sent (loss reason ``signal_refused``).
* credentials refused (HTTP 401 or 403, gRPC UNAUTHENTICATED or PERMISSION_DENIED) stop the sink:
  ``PermanentSinkError`` (reason ``unauthorized`` or ``forbidden``), one line naming the fix, and the
  pipeline counts everything it would have sent as lost under that reason.

What the pipeline counts delivered is what the receiver acknowledged, in events (``otlp_ledger``):
``write`` raises ``DeliveryError`` with the batch's events that were not, by reason, and events of
earlier batches lost with it (spans that waited for their parent) are ``delivery_losses()``.

Request bodies and responses are ``otlp_requests``; the transports are ``otlp_transport`` and
``otlp_grpc``. See docs/otlp.md for the configuration and the mapping.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, ClassVar

import httpx
import trio
from opentelemetry.proto.metrics.v1.metrics_pb2 import ExponentialHistogramDataPoint, NumberDataPoint
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from cuptistream.config import SinkConfig
from cuptistream.errors import ConfigError, PermanentSinkError, SinkUnavailableError
from cuptistream.events import Batch, PcSampleBatch, StackStats, StackTable
from cuptistream.plugin import DeliveryError, OutgoingBatch, Sink, secret_from_env

from .common import resource, scope
from .config import OtlpSinkConfig, Signal
from .encoding import split
from .env import SignalSettings, resource_from_env
from .ledger import Ledger
from .logs import LOG_EVENTS, log_records
from .metrics import Exported, MetricsAggregator
from .requests import partial_success, request_body, require_profiles
from .stats import StatsPoint, StatsPoints
from .traces import SPAN_EVENTS, SpanAssembler
from .transport import Attempt, HttpTransport, Outcome, Transport, ssl_context

__all__ = ["OtlpSink", "OtlpSinkConfig"]

log = logging.getLogger("cuptistream.sinks.otlp")

_ITEMS = {"traces": "spans", "metrics": "metric_points", "logs": "log_records", "profiles": "profiles"}
PROFILE_EVENTS = (PcSampleBatch, StackStats)  # one profiles item each (a StackStats: up to four profiles)
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
    stats: StatsPoints  # the collector's statistics: delta points, held until acknowledged
    exported: Exported = field(default_factory=lambda: (set(), []))  # the export in flight
    stats_exported: list[StatsPoint] = field(default_factory=list)  # ... and its statistics points
    drains: dict[tuple[int, int], int] = field(default_factory=dict)  # (device, context) -> last drain, epoch
    stack_frames: Any = None  # its StackTable events (``stack_profiles.StackFrames``), with profiles on
    seen: float = 0.0  # monotonic time of its latest batch


@dataclass
class _Request:
    signal: Signal
    body: bytes  # encoded and compressed
    items: int


# Loss reasons for credentials refused, by the answer; the fix each one names.
_REFUSED = {
    "HTTP 401": ("unauthorized", "the backend refused the credentials; check headers, headers_env or "
                 "OTEL_EXPORTER_OTLP_HEADERS"),
    "gRPC UNAUTHENTICATED": ("unauthorized", "the backend refused the credentials; check headers, "
                             "headers_env or OTEL_EXPORTER_OTLP_HEADERS"),
    "HTTP 403": ("forbidden", "the credentials may not write here; check the token's permissions or "
                 "the endpoint"),
    "gRPC PERMISSION_DENIED": ("forbidden", "the credentials may not write here; check the token's "
                               "permissions or the endpoint"),
}  # fmt: skip


class OtlpSink(Sink):
    config_type: ClassVar[type[SinkConfig]] = OtlpSinkConfig
    retries_itself = True  # per request, honouring Retry-After and partial success (transport.py)

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
        self._ledger = Ledger()
        self._lost: Counter[str] = Counter()  # events lost in the write (or close) under way, by reason
        self._items_lost: Counter[str] = Counter()  # ... as items ("spans"), for its message
        # Events only metrics carry, since the last metrics export the receiver acknowledged: the
        # metrics are cumulative, so the next export that succeeds delivers them.
        self._metric_events = 0
        self._stopped = ""  # why the sink stopped for good (credentials refused); "" while it runs
        self._ended_now = False  # the write under way ended a signal

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

    def _transport(self, signal: Signal, settings: SignalSettings, headers: dict[str, str]) -> Transport:
        if settings.protocol == "grpc":
            from .grpc import GrpcTransport

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

    async def connect(self) -> None:
        """One empty export per signal, each answered 2xx: the receiver is up and takes our
        credentials. Runs in the background (the pipeline cancels it after ``connect_timeout`` and
        retries). Raises ``SinkUnavailableError`` naming the endpoint and the answer (connection
        refused, 503, no answer, a stalled TLS handshake), and ``PermanentSinkError`` for refused
        credentials or a receiver certificate that does not verify."""
        answers: list[tuple[Transport, Attempt]] = []

        async def ask(signal: Signal, transport: Transport) -> None:
            empty = b"{}" if signal in self._json else b""
            body = transport.compress(empty)
            answers.append((transport, await transport.attempt(body, self.cfg.request_timeout)))

        async with trio.open_nursery() as nursery:  # together: a slow receiver costs one timeout
            for signal, transport in self._transports.items():
                nursery.start_soon(ask, signal, transport)
        for transport, attempt in answers:
            if attempt.outcome is Outcome.STOP:
                reason, fix = _REFUSED.get(attempt.reason, ("unauthorized", "check the credentials"))
                self._stopped = reason
                raise PermanentSinkError(
                    f"{self.where()}: {attempt.reason} from {transport.url}: {fix}; the sink sends nothing "
                    "this session",
                    reason,
                )
            if "TLS certificate verify failed" in attempt.reason:  # no retry makes it verify
                self._stopped = "tls_certificate_rejected"
                raise PermanentSinkError(
                    f"{self.where()}: {transport.url}: {attempt.reason}; check tls.ca_file (the CA that "
                    "signs the receiver's certificate); the sink sends nothing this session",
                    self._stopped,
                )
            if attempt.outcome in (Outcome.RETRY, Outcome.FAIL):  # END: ``write`` ends that signal
                raise SinkUnavailableError(f"{self.where()}: {transport.url}: {attempt.reason}")

    async def write(self, batch: OutgoingBatch) -> None:
        if self._stopped:  # the pipeline stops writing to a stopped sink; a caller that did not:
            lost = {self._stopped: batch.event_count}
            raise DeliveryError(f"{self.where()}: stopped ({self._stopped})", lost)
        decoded = batch.batch
        self._lost, self._items_lost, self._ended_now = Counter(), Counter(), False
        requests = await trio.to_thread.run_sync(self._encode, decoded)
        problem = ""
        try:
            problem = await self._deliver(requests)
        except trio.Cancelled:  # the shutdown deadline: no metrics export will carry them in time
            self._lost["shutdown_deadline"] += self._metric_events
            self._metric_events = 0
            raise
        finally:  # also when cancelled or stopped: what was not acknowledged is counted
            own = self._ledger.settle(batch.event_count, self._lost)
        if own or self._ended_now:  # a signal refused for good is said even where it lost no event
            what = ", ".join(f"{n} {items}" for items, n in self._items_lost.items() if n)
            what = what or f"{sum(own.values())} events (in metrics)" if own else "nothing lost yet"
            why = problem or "too large or rejected: see the sink's counters"
            raise DeliveryError(f"{self.where()}: {what} not delivered ({why})", own)

    async def close(self) -> None:
        try:
            if not self._stopped:
                self._lost, self._items_lost = Counter(), Counter()
                try:
                    requests = await trio.to_thread.run_sync(self._encode_final)
                    await self._deliver(requests)
                finally:  # every batch was counted delivered already: all of it is ``earlier``
                    self._lost["delivery_failed"] += self._metric_events  # no export took them
                    self._metric_events = 0
                    self._ledger.settle(0, self._lost)
        finally:
            for transport in self._transports.values():
                await transport.aclose()
            if self._client is not None:
                await self._client.aclose()

    def delivery_losses(self) -> dict[str, int]:
        return dict(self._ledger.earlier)

    def stats(self) -> dict[str, int]:
        processes = self._processes.values()
        return {
            **self.counters,
            "spans_waiting": sum(p.spans.pending for p in processes),
            "spans_unparented_by_timeout": sum(p.spans.forced for p in processes),
            "kernel_names_overflowed": sum(p.metrics.kernel_names.overflowed for p in processes),
            "function_names_overflowed": sum(p.metrics.function_names.overflowed for p in processes),
            "stats_points_overflowed": sum(p.stats.overflowed for p in processes),
        }

    # --- mapping (worker thread) -------------------------------------------------------------

    def _process(self, batch: Batch) -> tuple[Origin, _Process]:
        origin = (batch.session_id, batch.resource.host, batch.resource.pid)
        process = self._processes.get(origin)
        if process is None:
            cfg = self.cfg
            metrics = MetricsAggregator(cfg.max_kernel_names, cfg.max_function_names)
            process = self._processes[origin] = _Process(
                resource(batch, self._env_resource),
                SpanAssembler(
                    grouping=cfg.trace_grouping,
                    window_s=cfg.trace_window,
                    reorder_window_s=cfg.reorder_window,
                    max_pending=cfg.max_pending_spans,
                ),
                metrics,
                StatsPoints(metrics.kernel_names, metrics.hw_id, metrics.gpu),
            )
        return origin, process

    def _sending(self, signal: Signal) -> bool:
        return signal in self._transports and signal not in self._ended

    def _encode(self, batch: Batch) -> list[_Request]:
        self._metric_events += self._only_in_metrics(batch)
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
            process.stats.add(batch)
            for other_origin in idle:
                self._processes[other_origin].metrics.finish()
                self._processes[other_origin].stats.finish()
            requests += self._metric_requests()
        if self._sending("logs"):
            records = [(origin, r) for r in log_records(batch, time.time_ns())]
            requests += self._requests("logs", records)
        elif "logs" in self._transports:
            self._count_ended("logs", sum(1 for ev in batch.events if isinstance(ev, LOG_EVENTS)))
        if "profiles" in self._transports:
            windows = [(origin, w) for w in self._windows(batch, process)]
            if self._sending("profiles"):
                requests += self._requests("profiles", windows)
            else:
                self._count_ended("profiles", len(windows))
        for other_origin in idle:  # its requests are encoded: they no longer need it
            del self._processes[other_origin]
        return requests

    def _only_in_metrics(self, batch: Batch) -> int:
        """Events of ``batch`` that no configured signal but metrics carries (see ``otlp_ledger``)."""
        if "metrics" not in self._transports:
            return 0
        carried: list[type] = []
        for signal, kinds in (("traces", SPAN_EVENTS), ("logs", LOG_EVENTS), ("profiles", PROFILE_EVENTS)):
            if signal in self._transports:
                carried += kinds
        kinds_tuple = tuple(carried)
        return sum(1 for ev in batch.events if not isinstance(ev, kinds_tuple))

    def _windows(self, batch: Batch, process: _Process) -> list[Any]:
        """Each PC-sampling drain with the window it covers (since the context's previous drain), and
        each interval of GPU time by stack with the process's frames."""
        from .profiles import Window
        from .stack_profiles import StackFrames, StackWindow

        offset = batch.clock.offset_ns
        windows: list[Any] = []
        for ev in batch.events:
            if isinstance(ev, PcSampleBatch):
                end = ev.timestamp + offset
                start = process.drains.get((ev.device_id, ev.context_id), end)
                process.drains[(ev.device_id, ev.context_id)] = end
                windows.append(Window(ev, batch.session_id, min(start, end), end))
            elif isinstance(ev, StackTable):
                if process.stack_frames is None:
                    process.stack_frames = StackFrames()
                process.stack_frames.add(ev)
            elif isinstance(ev, StackStats):
                frames = process.stack_frames if process.stack_frames is not None else StackFrames()
                start, end = ev.interval_start + offset, ev.interval_end + offset
                windows.append(StackWindow(ev, frames, batch.session_id, start, end))
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
                process.stats.finish()
            requests += self._metric_requests()
        return requests

    def _metric_requests(self) -> list[_Request]:
        points: list[tuple[Origin, str, NumberDataPoint | ExponentialHistogramDataPoint]] = []
        for origin, process in self._processes.items():
            exported, process.exported = process.metrics.export()
            process.stats_exported = process.stats.export()
            points += [(origin, name, point) for name, point in exported]
            points += [(origin, name, point) for name, point in process.stats_exported]
        if not self._sending("metrics"):
            self._count_ended("metrics", len(points))
            for process in self._processes.values():  # nothing will take them: do not pile them up
                process.metrics.commit(process.exported)
                process.stats.commit(process.stats_exported)
            return []
        return self._requests("metrics", points)

    def _count_ended(self, signal: Signal, items: int) -> None:
        self.counters[f"{_ITEMS[signal]}_dropped"] += items
        if signal != "metrics":  # metric points are not events; their events: ``_deliver``
            self._lost["signal_refused"] += items
            self._items_lost[_ITEMS[signal]] += items

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
            if signal != "metrics":
                self._lost["too_large"] += too_large
                self._items_lost[_ITEMS[signal]] += too_large
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

    async def _deliver(self, requests: list[_Request]) -> str:
        """Send ``requests`` within one ``retry.max_elapsed`` deadline; count in ``self._lost`` the
        events that were not acknowledged, by reason (also those a cancellation leaves unsent).
        Returns why some failed ("" if none). Raises ``PermanentSinkError`` when the credentials are
        refused: every event still held is counted lost too, and the sink sends nothing more."""
        deadline = trio.current_time() + self.cfg.retry.max_elapsed
        reasons: set[str] = set()
        ended_now: list[str] = []
        metrics_failed = ""  # why this write's metrics export failed
        pending = list(requests)
        try:
            while pending:
                request = pending[0]
                if request.signal in self._ended:  # refused for good earlier in this batch
                    self._count_ended(request.signal, request.items)
                    if request.signal == "metrics":
                        metrics_failed = "signal_refused"
                    pending.pop(0)
                    continue
                transport = self._transports[request.signal]
                result = await transport.post(request.body, deadline)
                pending.pop(0)
                self.counters["requests"] += result.attempts
                self.counters["retries"] += result.retries
                if result.ok:
                    self._accepted(request, result.body, result.content_type)
                    continue
                self.counters["requests_failed"] += 1
                reasons.add(result.reason)
                if result.stopped:
                    self._stop(request, result.reason, transport.url, pending)
                reason = "delivery_failed"
                if result.ended:
                    reason = "signal_refused"
                    self._ended[request.signal] = result.reason
                    self.counters["signals_ended"] += 1
                    ended_now.append(
                        f"the backend refused {request.signal} with {result.reason} at {transport.url}, so "
                        f"{request.signal} are off for this session; check the endpoint's path and that "
                        "the backend accepts this signal, or remove it from signals"
                    )
                if request.signal == "metrics":  # cumulative: sent again with the next batch
                    self.counters["metric_exports_failed"] += 1
                    metrics_failed = metrics_failed or reason
                    if not result.ended:
                        continue
                self.counters[f"{_ITEMS[request.signal]}_dropped"] += request.items
                if request.signal != "metrics":
                    self._lost[reason] += request.items
                    self._items_lost[_ITEMS[request.signal]] += request.items
        except BaseException:  # cancelled (the shutdown deadline) or stopped: the rest is lost too
            self._lost_unsent(pending, "shutdown_deadline")
            raise
        if "metrics" in self._ended:  # nothing will carry them
            self._lost["signal_refused"] += self._metric_events
            self._metric_events = 0
        elif not metrics_failed:
            for process in self._processes.values():
                process.metrics.commit(process.exported)
                process.stats.commit(process.stats_exported)
            if any(r.signal == "metrics" for r in requests):
                self._metric_events = 0  # acknowledged
        self._ended_now = bool(ended_now)
        return "; ".join(ended_now + sorted(reasons))

    def _accepted(self, request: _Request, body: bytes, content_type: str) -> None:
        items = _ITEMS[request.signal]
        self.counters["bytes_sent"] += len(request.body)
        rejected, message = partial_success(request.signal, body, content_type)
        rejected = min(rejected, request.items)
        self.counters[f"{items}_sent"] += request.items - rejected
        self.counters[f"{items}_rejected"] += rejected
        if rejected and request.signal != "metrics":  # answered, but not kept: not delivered
            self._lost["rejected"] += rejected
        if rejected or message:
            log.warning(
                "%s: the backend rejected %d of %d %s: %s",
                self.where(),
                rejected,
                request.items,
                items,
                message[:200] or "no reason given",
            )

    def _lost_unsent(self, pending: list[_Request], reason: str) -> None:
        for request in pending:
            self.counters[f"{_ITEMS[request.signal]}_dropped"] += request.items
            if request.signal != "metrics":
                self._lost[reason] += request.items
                self._items_lost[_ITEMS[request.signal]] += request.items
        pending.clear()

    def _stop(self, request: _Request, answer: str, url: str, pending: list[_Request]) -> None:
        """The credentials were refused: count this request, the rest of the write and every span
        still waiting as lost under the refusal's reason, and raise ``PermanentSinkError``."""
        reason, fix = _REFUSED.get(answer, ("unauthorized", "check the credentials"))
        self._stopped = reason
        self._lost_unsent([request], reason)
        self._lost_unsent(pending, reason)
        self._lost[reason] += self._metric_events
        self._metric_events = 0
        waiting = sum(p.spans.pending for p in self._processes.values())
        self.counters["spans_dropped"] += waiting
        self._lost[reason] += waiting
        self._processes.clear()
        raise PermanentSinkError(
            f"{self.where()}: {answer} from {url}: {fix}; the sink sends nothing more this session",
            reason,
        )
