"""The OTLP sink (``type: otlp``): GPU activity as OpenTelemetry traces, metrics, logs and profiles.

- ``otlp``: the ``Sink`` (per-process state, mapping in a worker thread, delivery);
- ``otlp_config`` / ``otlp_env``: the YAML keys, and the ``OTEL_EXPORTER_OTLP_*`` variables;
- ``otlp_traces`` (the span tree), ``otlp_span_attributes`` (each span's name and attributes),
  ``otlp_metrics``, ``otlp_logs``, ``otlp_profiles``, ``otlp_hw``: events -> OTLP;
- ``otlp_requests``: a signal's request body, and a response's partial success;
- ``otlp_wire``, ``otlp_encoding``, ``otlp_common``: hand-written protobuf, JSON, splitting, Resource;
- ``otlp_transport`` / ``otlp_grpc``: one request over HTTP (and its TLS context) or gRPC.

``docs/otlp.md`` describes the mapping and the delivery rules.
"""

from .otlp import OtlpSink
from .otlp_config import OtlpSinkConfig

__all__ = ["OtlpSink", "OtlpSinkConfig"]
