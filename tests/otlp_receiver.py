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


class OtlpReceiver:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: dict[str, deque[Answer]] = {path: deque() for path in REQUESTS}
        self.fallback = Answer()  # the answer where the script has none
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                receiver._handle(self, raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
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
        return [
            span
            for m in self.messages("/v1/traces")
            for rs in m.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def data_points(self) -> list[tuple[str, Any]]:
        return [
            (metric.name, point)
            for m in self.messages("/v1/metrics")
            for rm in m.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            for point in (metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points)
        ]

    def log_records(self) -> list[Any]:
        return [
            rec
            for m in self.messages("/v1/logs")
            for rl in m.resource_logs
            for sl in rl.scope_logs
            for rec in sl.log_records
        ]

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.received if r.path == path)
