"""OTLP/gRPC transport (the optional ``[grpc]`` extra: grpcio): the same retry loop and outcomes as
OTLP/HTTP, through the service stubs of ``opentelemetry-proto``.

Request bodies are already encoded (spans are written straight to wire format), so the stubs are
built on a channel view that drops their request serializer: the stub names the method and decodes
the response, the bytes go out as they are.

Status codes, per the OTLP specification: UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED, ABORTED,
OUT_OF_RANGE, DATA_LOSS and RESOURCE_EXHAUSTED are retried; UNAUTHENTICATED and PERMISSION_DENIED
stop the sink (HTTP 401 and 403: the credentials are refused); UNIMPLEMENTED, NOT_FOUND and
INVALID_ARGUMENT end the signal for the session (HTTP 405, 404 and 400); anything else drops that
request only.

Deadlines: grpcio enforces the call's ``timeout`` (connect and TLS handshake included, as gRPC
connects within a call's deadline). The blocking call runs in a worker thread that the sink stops
waiting for at that deadline (``abandon_on_cancel``), so a call grpcio does not end in time cannot
hold the sink, its shutdown or the program; the thread ends when grpcio gives up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import trio

from cuptistream.config import RetryConfig
from cuptistream.errors import ConfigError
from cuptistream.plugin import sink_where

from .config import TlsConfig
from .env import Signal
from .transport import Attempt, Outcome, Transport

try:
    import grpc
except ImportError:  # the [grpc] extra is not installed
    grpc = None

_RETRY = {"UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "OUT_OF_RANGE", "DATA_LOSS"}
_RETRY |= {"RESOURCE_EXHAUSTED"}
_END = {"UNIMPLEMENTED", "NOT_FOUND", "INVALID_ARGUMENT"}
_STOP = {"UNAUTHENTICATED", "PERMISSION_DENIED"}
# Past the call's own deadline, this long for grpcio to say so before the sink stops waiting.
_GRACE_S = 0.5


class _EncodedRequests:
    """A channel as the generated stubs see it, whose calls take requests already encoded."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def unary_unary(self, method: str, request_serializer: Any = None, **options: Any) -> Any:
        return self._channel.unary_unary(method, request_serializer=None, **options)


def _stub(signal: Signal, channel: Any) -> Callable[..., Any]:
    if signal == "traces":
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as traces

        return traces.TraceServiceStub(channel).Export
    if signal == "metrics":
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics

        return metrics.MetricsServiceStub(channel).Export
    if signal == "profiles":
        from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc as profiles

        return profiles.ProfilesServiceStub(channel).Export
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as logs

    return logs.LogsServiceStub(channel).Export


def require_grpc(sink: str) -> None:
    if grpc is None:
        raise ConfigError(
            f"{sink_where(sink, 'protocol')}: grpc needs grpcio; install it with "
            "pip install 'cuptistream[grpc]' or use protocol http/protobuf"
        )


def _channel(url: str, tls: TlsConfig, sink: str) -> Any:
    assert grpc is not None
    parts = urlsplit(url)
    target = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 4317)}"
    options = [("grpc.primary_user_agent", "cuptistream")]
    if parts.scheme == "http":  # the specification's rule: an http:// endpoint means no TLS
        return grpc.insecure_channel(target, options=options)
    if tls.insecure_skip_verify:
        raise ConfigError(
            f"{sink_where(sink, 'tls.insecure_skip_verify')}: not available with protocol grpc; give the "
            "collector's CA in tls.ca_file, or use an http:// endpoint for a plaintext connection"
        )

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as error:
            raise ConfigError(
                f"{sink_where(sink, 'tls')}: cannot read {path} ({error.strerror}); check ca_file, cert_file "
                "and key_file"
            ) from None

    credentials = grpc.ssl_channel_credentials(read(tls.ca_file), read(tls.key_file), read(tls.cert_file))
    return grpc.secure_channel(target, credentials, options=options)


class GrpcTransport(Transport):
    def __init__(
        self,
        signal: Signal,
        url: str,
        compression: str,
        headers: dict[str, str],
        timeout: float,
        retry: RetryConfig,
        tls: TlsConfig,
        sink: str,
    ) -> None:
        require_grpc(sink)
        assert grpc is not None
        self.url = url
        self.timeout = timeout
        self.retry = retry
        self._channel = _channel(url, tls, sink)
        self._export = _stub(signal, _EncodedRequests(self._channel))
        self._metadata = [(name.lower(), value) for name, value in headers.items()]  # gRPC: lower case
        self._compression = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression

    async def attempt(self, body: bytes, timeout: float) -> Attempt:
        with trio.move_on_after(timeout + _GRACE_S):
            return await trio.to_thread.run_sync(self._call, body, timeout, abandon_on_cancel=True)
        return Attempt(Outcome.RETRY, f"no answer within timeout ({timeout:g}s)")

    def _call(self, body: bytes, timeout: float) -> Attempt:
        assert grpc is not None
        try:
            response = self._export(
                body, timeout=timeout, metadata=self._metadata, compression=self._compression
            )
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
            name = code.name if code is not None else "UNKNOWN"
            outcome = (
                Outcome.RETRY if name in _RETRY
                else Outcome.STOP if name in _STOP
                else Outcome.END if name in _END
                else Outcome.FAIL
            )  # fmt: skip
            details = (str(error.details() or "") if hasattr(error, "details") else "").lower()
            tls = ""
            if "certificate" in details and "verif" in details:
                tls = " (TLS certificate verify failed: check tls.ca_file)"
            elif "handshake failed" in details:
                tls = " (TLS handshake failed: check tls.ca_file)"
            return Attempt(outcome, f"gRPC {name}{tls}")
        return Attempt(Outcome.OK, "", None, response.SerializeToString(), "application/grpc")

    async def aclose(self) -> None:
        self._channel.close()
