"""Config of the OTLP sink: where to send, how to encode, how to map (retry and
timeout are the settings every sink shares: ``cuptistream.config.SinkConfig``).

Validation that can be done without the network happens here, in ``__post_init__``, so a bad URL or
a bad combination of keys is a one-line ``ConfigError`` naming the key path when the YAML is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

import msgspec

from cuptistream.config import Duration, SinkConfig, Size, Strict

from .env import Compression, ConfigKeys, Protocol, Signal, SignalSettings, check_url, effective

__all__ = ["OtlpSinkConfig", "Signal", "TlsConfig", "check_url"]


class TlsConfig(Strict):
    ca_file: str | None = None  # PEM bundle that signs the collector's certificate
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None  # its private key
    insecure_skip_verify: bool = False  # test setups only: accept any server certificate

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together; set both or neither")


class OtlpSinkConfig(SinkConfig):
    """``type: otlp``. See docs/otlp.md for every key and the mapping it drives.

    Keys left unset (None) fall back to the ``OTEL_EXPORTER_OTLP_*`` variables, then to the defaults;
    the shared ``timeout`` too (``OTEL_EXPORTER_OTLP_[<SIGNAL>_]TIMEOUT``). The shared ``retry`` settings
    drive the retries, and ``retry.max_elapsed`` is the deadline of one batch, every request included.
    """

    renamed_keys = {"deadline": "retry.max_elapsed"}

    endpoint: str | None = None  # base URL; /v1/traces, /v1/metrics and /v1/logs are appended (HTTP)
    traces_endpoint: str | None = None  # full URL, overrides endpoint for traces
    metrics_endpoint: str | None = None
    logs_endpoint: str | None = None
    profiles_endpoint: str | None = None  # the profiles signal is alpha: not in the default signals
    signals: list[Signal] = msgspec.field(default_factory=lambda: ["traces", "metrics", "logs"])
    protocol: Protocol | None = None  # default http/protobuf
    encoding: Literal["protobuf", "json"] | None = None  # HTTP body; protocol http/json is encoding json
    compression: Compression | None = None  # default gzip
    headers: dict[str, str] = {}  # plain, non-secret headers
    headers_env: dict[str, str] = {}  # header name -> environment variable holding its value
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    max_request_bytes: Size = Size(4 * 1024 * 1024)  # encoded, before compression; larger requests are split
    trace_grouping: Literal["nvtx_top_level", "window"] = "nvtx_top_level"
    trace_window: Duration = Duration(1.0)  # window length; also the fallback for work outside any range
    reorder_window: Duration = Duration(2.0)  # how long a span may wait for its parent to arrive
    max_pending_spans: int = 200_000  # beyond this, the oldest waiting spans are sent unparented
    max_kernel_names: int = 500  # distinct kernel names with their own metric series; the rest -> "other"
    max_function_names: int = 500  # the same cap for PC-sampling and SASS function names
    scope_name: str = "cuptistream"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.signals:
            raise ValueError("signals: enable at least one of traces, metrics, logs, profiles")
        for key in ("endpoint", "traces_endpoint", "metrics_endpoint", "logs_endpoint", "profiles_endpoint"):
            if getattr(self, key):
                check_url(getattr(self, key), key)
        if self.protocol == "grpc" and self.encoding == "json":
            raise ValueError("encoding: json is for OTLP/HTTP; protocol grpc always sends protobuf")
        for signal in self.signals:  # the environment's OTEL_* variables are checked here too
            self.settings(signal, os.environ)
        for limit in ("max_request_bytes", "max_kernel_names", "max_function_names", "max_pending_spans"):
            if getattr(self, limit) <= 0:
                raise ValueError(f"{limit}: must be positive")
        if self.trace_window <= 0:
            raise ValueError("trace_window: must be positive, e.g. 1s")

    def settings(self, signal: Signal, environ: Mapping[str, str]) -> SignalSettings:
        """Where and how ``signal`` is sent: these keys, else ``environ``'s OTEL_* variables."""
        protocol = self.protocol
        if protocol is None and self.encoding is not None:
            protocol = "http/json" if self.encoding == "json" else "http/protobuf"
        keys = ConfigKeys(
            endpoint=self.endpoint,
            signal_endpoint=getattr(self, f"{signal}_endpoint"),
            protocol=protocol,
            compression=self.compression,
            timeout=None if self.timeout is None else float(self.timeout),
            headers={**self.headers, **self.headers_env},
        )
        return effective(keys, signal, environ)
