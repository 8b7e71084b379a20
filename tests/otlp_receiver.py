"""A real OTLP/HTTP receiver for tests: ``http.server`` in a thread on a free loopback port.

It decodes every request with the official ``opentelemetry-proto`` classes (protobuf, or OTLP/JSON
through ``google.protobuf.json_format``), independently of the code under test, and can be scripted
to answer with errors, ``Retry-After``, partial successes or delays, or to close the connection
without an answer. ``script`` holds one-shot answers per path; ``fallback`` (settable while it runs)
answers everything the script does not, so a test can drive phases of behaviour by time.
"""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
    ExportProfilesServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.loopback_http import LoopbackServer, QuietHandler

REQUESTS: dict[str, type[Message]] = {
    "/v1/traces": ExportTraceServiceRequest,
    "/v1/metrics": ExportMetricsServiceRequest,
    "/v1/logs": ExportLogsServiceRequest,
    "/v1development/profiles": ExportProfilesServiceRequest,
}
RESPONSES: dict[str, type[Message]] = {
    "/v1/traces": ExportTraceServiceResponse,
    "/v1/metrics": ExportMetricsServiceResponse,
    "/v1/logs": ExportLogsServiceResponse,
    "/v1development/profiles": ExportProfilesServiceResponse,
}


@dataclass
class Answer:
    """One scripted reply. ``rejected`` (with ``message``) makes a 200 carry a partial success.
    ``close``: after ``delay``, reset the connection (SO_LINGER 0) instead of answering; the request
    is recorded undecoded, like an error reply."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    rejected: int = 0
    message: str = ""
    close: bool = False


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes  # as sent, before decompression
    message: Message | None  # None where the reply was scripted as an error
    at: float  # when it was recorded: after the answer's delay, before the reply is written
    answer: Answer = field(default_factory=Answer)  # how it was answered
    arrived: float = 0.0  # when its body had been read


def otlp_json_to_message(data: bytes, cls: type[Message]) -> Message:
    """OTLP/JSON (hex ids) → a message, via protobuf's own JSON parser (which expects base64 ids)."""
    tree = json.loads(data)

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                else:
                    fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)

    fix(tree)
    return json_format.ParseDict(tree, cls())


def nested(messages: Iterable[Any], *fields: str) -> list[Any]:
    """Every item at the end of the path ``fields`` in each message, e.g. the spans of export
    requests: ``nested(requests, "resource_spans", "scope_spans", "spans")``."""
    items = list(messages)
    for name in fields:
        items = [item for parent in items for item in getattr(parent, name)]
    return items


def spans_in(requests: Iterable[Any]) -> list[Any]:
    return nested(requests, "resource_spans", "scope_spans", "spans")


def log_records_in(requests: Iterable[Any]) -> list[Any]:
    return nested(requests, "resource_logs", "scope_logs", "log_records")


def data_points_in(requests: Iterable[Any]) -> list[tuple[str, Any]]:
    """(metric name, data point) of every sum and gauge point."""
    return [
        (metric.name, point)
        for metric in nested(requests, "resource_metrics", "scope_metrics", "metrics")
        for point in (metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points)
    ]


class OtlpReceiver(LoopbackServer):
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: dict[str, deque[Answer]] = {path: deque() for path in REQUESTS}
        self.fallback = Answer()  # the answer where the script has none
        self.lock = threading.Lock()
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                receiver._handle(self, raw)

        super().__init__(Handler)

    def __exit__(self, exc_type: object, *exc: object) -> None:
        super().__exit__(exc_type, *exc)
        if exc_type is None:
            self.assert_conventions()

    def assert_conventions(self) -> None:
        """Every decoded request follows the semantic conventions (tests/semconv_check.py)."""
        from tests.semconv_check import violations

        with self.lock:
            decoded = [(r.path, r.message) for r in self.received if r.message is not None]
        problems = sorted({p for path, message in decoded for p in violations(path, message)})
        assert not problems, f"{len(problems)} convention problems: " + "; ".join(problems[:20])

    def answer(self, path: str, *answers: Answer) -> None:
        with self.lock:
            self.script[path].extend(answers)

    def _handle(self, handler: http.server.BaseHTTPRequestHandler, raw: bytes) -> None:
        path = handler.path
        arrived = time.monotonic()
        with self.lock:
            script = self.script.get(path)
            answer = script.popleft() if script else self.fallback
        if answer.delay:
            time.sleep(answer.delay)
        if answer.close:
            with self.lock:
                self.received.append(
                    Received(
                        path, dict(handler.headers.items()), raw, None, time.monotonic(), answer, arrived
                    )
                )
            handler.close_connection = True
            # No reply; closing with a zero linger time resets the connection (RST).
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        message = None
        if path in REQUESTS and answer.status == 200:
            body = gzip.decompress(raw) if handler.headers.get("Content-Encoding") == "gzip" else raw
            if handler.headers.get("Content-Type") == "application/json":
                message = otlp_json_to_message(body, REQUESTS[path])
            else:
                message = REQUESTS[path].FromString(body)
        with self.lock:
            self.received.append(
                Received(path, dict(handler.headers.items()), raw, message, time.monotonic(), answer, arrived)
            )
        reply = b""
        if answer.status == 200 and answer.rejected and path in RESPONSES:
            response = RESPONSES[path]()
            partial = response.partial_success
            field_name = {
                "/v1/traces": "rejected_spans",
                "/v1/metrics": "rejected_data_points",
                "/v1development/profiles": "rejected_profiles",
            }.get(path, "rejected_log_records")
            setattr(partial, field_name, answer.rejected)
            partial.error_message = answer.message
            reply = response.SerializeToString()
        try:
            handler.send_response(answer.status)
            for key, value in answer.headers.items():
                handler.send_header(key, value)
            handler.send_header("Content-Type", "application/x-protobuf")
            handler.send_header("Content-Length", str(len(reply)))
            handler.end_headers()
            handler.wfile.write(reply)
        except OSError:
            pass  # the client gave up (timeout tests)

    # --- what arrived ------------------------------------------------------------------------

    def messages(self, path: str) -> list[Any]:
        with self.lock:
            return [r.message for r in self.received if r.path == path and r.message is not None]

    def spans(self) -> list[Any]:
        return spans_in(self.messages("/v1/traces"))

    def data_points(self) -> list[tuple[str, Any]]:
        return data_points_in(self.messages("/v1/metrics"))

    def log_records(self) -> list[Any]:
        return log_records_in(self.messages("/v1/logs"))

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.received if r.path == path)
