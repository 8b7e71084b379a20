"""A real OTLP/gRPC receiver for tests: ``grpc.server`` with the ``opentelemetry-proto`` service
servicers on a free loopback port. It records every request (decoded by the generated stubs) with
its metadata, and can be scripted to fail with a status code, delay, or answer a partial success.
Requests it accepts are checked against the semantic conventions when it closes, like the HTTP one.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.otlp_receiver import data_points_in, log_records_in, spans_in

PATHS = {
    "traces": "/v1/traces",
    "metrics": "/v1/metrics",
    "logs": "/v1/logs",
    "profiles": "/v1development/profiles",
}  # for the convention checker


@dataclass
class Reply:
    code: grpc.StatusCode = grpc.StatusCode.OK
    delay: float = 0.0
    rejected: int = 0
    message: str = ""


@dataclass
class Call:
    signal: str
    metadata: dict[str, str]
    message: Any  # None where the reply was scripted as an error
    code: grpc.StatusCode


class OtlpGrpcReceiver:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.script: dict[str, deque[Reply]] = {signal: deque() for signal in PATHS}
        self.fallback = Reply()  # the reply where the script has none
        self._stopping = threading.Event()  # ends a delayed reply when the server stops
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        receiver = self

        def servicer(base: type, signal: str, response: type) -> Any:
            class Servicer(base):  # type: ignore[misc, valid-type]
                def Export(self, request: Any, context: Any) -> Any:
                    return receiver._handle(signal, request, context, response)

            return Servicer()

        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            servicer(
                trace_service_pb2_grpc.TraceServiceServicer,
                "traces",
                trace_service_pb2.ExportTraceServiceResponse,
            ),
            self.server,
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            servicer(
                metrics_service_pb2_grpc.MetricsServiceServicer,
                "metrics",
                metrics_service_pb2.ExportMetricsServiceResponse,
            ),
            self.server,
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            servicer(
                logs_service_pb2_grpc.LogsServiceServicer, "logs", logs_service_pb2.ExportLogsServiceResponse
            ),
            self.server,
        )
        profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(
            servicer(
                profiles_service_pb2_grpc.ProfilesServiceServicer,
                "profiles",
                profiles_service_pb2.ExportProfilesServiceResponse,
            ),
            self.server,
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpGrpcReceiver:
        self.server.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stopping.set()
        self.server.stop(grace=None)
        if exc_type is None:
            from tests.semconv_check import violations

            problems = sorted(
                {
                    p
                    for c in self.calls
                    if c.message is not None
                    for p in violations(PATHS[c.signal], c.message)
                }
            )
            assert not problems, f"{len(problems)} convention problems: " + "; ".join(problems[:20])

    def answer(self, signal: str, *replies: Reply) -> None:
        with self.lock:
            self.script[signal].extend(replies)

    def _handle(self, signal: str, request: Any, context: Any, response: type) -> Any:
        with self.lock:
            script = self.script[signal]
            reply = script.popleft() if script else self.fallback
        if reply.delay:
            self._stopping.wait(reply.delay)
        metadata = {k: v for k, v in context.invocation_metadata()}
        with self.lock:
            self.calls.append(
                Call(signal, metadata, request if reply.code == grpc.StatusCode.OK else None, reply.code)
            )
        if reply.code != grpc.StatusCode.OK:
            context.abort(reply.code, f"scripted {reply.code.name}")
        out = response()
        if reply.rejected:
            field = {"traces": "rejected_spans", "metrics": "rejected_data_points"}.get(
                signal, "rejected_log_records"
            )
            setattr(out.partial_success, field, reply.rejected)
            out.partial_success.error_message = reply.message
        return out

    # --- what arrived ------------------------------------------------------------------------

    def count(self, signal: str) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c.signal == signal)

    def messages(self, signal: str) -> list[Any]:
        with self.lock:
            return [c.message for c in self.calls if c.signal == signal and c.message is not None]

    def spans(self) -> list[Any]:
        return spans_in(self.messages("traces"))

    def log_records(self) -> list[Any]:
        return log_records_in(self.messages("logs"))

    def data_points(self) -> list[tuple[str, Any]]:
        return data_points_in(self.messages("metrics"))
