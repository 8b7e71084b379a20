"""Config of the OTLP sink: where to send, how to encode, how hard to retry, how to map.

Validation that can be done without the network happens here, in ``__post_init__``, so a bad URL or
a bad combination of keys is a one-line ``ConfigError`` naming the key path when the YAML is loaded.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

import msgspec

from cuptistream.config import Duration, SinkConfig, Size, Strict, require_at_least, require_positive

Signal = Literal["traces", "metrics", "logs"]
SIGNAL_PATHS: dict[Signal, str] = {"traces": "/v1/traces", "metrics": "/v1/metrics", "logs": "/v1/logs"}


class TlsConfig(Strict):
    ca_file: str | None = None  # PEM bundle that signs the collector's certificate
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None  # its private key
    insecure_skip_verify: bool = False  # test setups only: accept any server certificate

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together; set both or neither")


class RetryConfig(Strict):
    initial_backoff: Duration = Duration(0.5)
    max_backoff: Duration = Duration(10.0)
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        require_at_least("multiplier", self.multiplier, 1)
        require_positive("initial_backoff", self.initial_backoff)


def check_url(url: str, key: str) -> None:
    """Raise ValueError (turned into a ConfigError with the key path) unless ``url`` is http(s)://host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{key}: expected a URL like http://127.0.0.1:4318, got {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a non-numeric port
    except ValueError:
        raise ValueError(f"{key}: the port in {url!r} is not a number") from None


class OtlpSinkConfig(SinkConfig):
    """``type: otlp``. See docs/otlp.md for every key and the mapping it drives."""

    endpoint: str | None = None  # base URL; /v1/traces, /v1/metrics and /v1/logs are appended
    traces_endpoint: str | None = None  # full URL, overrides endpoint for traces
    metrics_endpoint: str | None = None
    logs_endpoint: str | None = None
    signals: list[Signal] = msgspec.field(default_factory=lambda: ["traces", "metrics", "logs"])
    encoding: Literal["protobuf", "json"] = "protobuf"
    compression: Literal["gzip", "none"] = "gzip"
    headers: dict[str, str] = {}  # plain, non-secret headers
    headers_env: dict[str, str] = {}  # header name -> environment variable holding its value
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    timeout: Duration = Duration(10.0)  # one HTTP request
    deadline: Duration = Duration(30.0)  # everything for one batch, retries included
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    max_request_bytes: Size = Size(4 * 1024 * 1024)  # encoded, before compression; larger requests are split
    trace_grouping: Literal["nvtx_top_level", "window"] = "nvtx_top_level"
    trace_window: Duration = Duration(1.0)  # window length; also the fallback for work outside any range
    reorder_window: Duration = Duration(2.0)  # how long a span may wait for its parent to arrive
    max_pending_spans: int = 200_000  # beyond this, the oldest waiting spans are sent unparented
    max_kernel_names: int = 500  # distinct kernel names with their own metric series; the rest -> "other"
    max_function_names: int = 500  # the same cap for PC-sampling and SASS function names
    scope_name: str = "cuptistream"

    def __post_init__(self) -> None:
        if not self.signals:
            raise ValueError("signals: enable at least one of traces, metrics, logs")
        for key in ("endpoint", "traces_endpoint", "metrics_endpoint", "logs_endpoint"):
            if getattr(self, key):
                check_url(getattr(self, key), key)
        for signal in self.signals:
            if self.signal_url(signal) is None:
                raise ValueError(f"endpoint: required for {signal} (or set {signal}_endpoint)")
        for limit in ("max_request_bytes", "max_kernel_names", "max_function_names", "max_pending_spans"):
            if getattr(self, limit) <= 0:
                raise ValueError(f"{limit}: must be positive")
        if self.trace_window <= 0:
            raise ValueError("trace_window: must be positive, e.g. 1s")

    def signal_url(self, signal: Signal) -> str | None:
        explicit: str | None = getattr(self, f"{signal}_endpoint")
        if explicit:
            return explicit
        if self.endpoint:
            return self.endpoint.rstrip("/") + SIGNAL_PATHS[signal]
        return None
