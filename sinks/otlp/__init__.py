"""The OTLP sink (``type: otlp``): GPU activity as OpenTelemetry traces, metrics, logs and profiles.

- ``sink``: the ``Sink`` (per-process state, mapping in a worker thread, delivery);
- ``config`` / ``env``: the YAML keys, and the ``OTEL_EXPORTER_OTLP_*`` variables;
- ``traces`` (the span tree), ``span_attributes`` (each span's name and attributes),
  ``metrics``, ``stats`` (the collector's statistics), ``logs``, ``profiles``, ``hw``: events -> OTLP;
- ``requests``: a signal's request body, and a response's partial success;
- ``wire``, ``encoding``, ``common``: hand-written protobuf, JSON, splitting, Resource;
- ``transport`` / ``grpc``: one request over HTTP (and its TLS context) or gRPC.

``docs/otlp.md`` describes the mapping and the delivery rules.
"""

from .config import OtlpSinkConfig
from .sink import OtlpSink

__all__ = ["OtlpSink", "OtlpSinkConfig"]
