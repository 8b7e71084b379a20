"""OTLP export requests and responses, per signal: the body of one request for items grouped by
Resource, what a response's partial success says was rejected, and the check that the installed
profiles proto is the layout ``otlp_profiles`` writes.

``otlp.OtlpSink`` decides what goes into which request and counts the outcomes; this module only
speaks the protocol's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.logs.v1.logs_pb2 import ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics, ScopeMetrics
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from cuptistream.errors import ConfigError
from cuptistream.plugin import sink_where

from .common import SCHEMA_URL
from .config import Signal
from .encoding import encode, from_json, to_json
from .metrics import METRICS, metrics_message
from .stats import STATS_METRICS
from .wire import traces_request

_METRIC_DEFS = {**METRICS, **STATS_METRICS}  # the raw records' and the statistics'

_RESPONSES: dict[Signal, type[Message]] = {
    "traces": ExportTraceServiceResponse,
    "metrics": ExportMetricsServiceResponse,
    "logs": ExportLogsServiceResponse,
}
_REJECTED_FIELD = {
    "traces": "rejected_spans",
    "metrics": "rejected_data_points",
    "logs": "rejected_log_records",
    "profiles": "rejected_profiles",
}


def request_body(
    signal: Signal, groups: Sequence[tuple[Resource, Any]], sc: InstrumentationScope, as_json: bool
) -> bytes:
    """One request's body (not compressed): ``groups`` is each Resource with its items of ``signal``."""
    message: Message
    if signal == "profiles":
        from .profiles import profiles_request

        message = profiles_request(groups, sc, SCHEMA_URL)
    elif signal == "traces":
        body = traces_request(groups, sc, SCHEMA_URL)
        if not as_json:
            return body
        message = ExportTraceServiceRequest.FromString(body)
    elif signal == "metrics":
        message = ExportMetricsServiceRequest(
            resource_metrics=[
                ResourceMetrics(
                    resource=res,
                    scope_metrics=[
                        ScopeMetrics(
                            scope=sc, metrics=metrics_message(g, _METRIC_DEFS), schema_url=SCHEMA_URL
                        )
                    ],
                    schema_url=SCHEMA_URL,
                )
                for res, g in groups
            ]
        )
    else:
        message = ExportLogsServiceRequest(
            resource_logs=[
                ResourceLogs(
                    resource=res,
                    scope_logs=[ScopeLogs(scope=sc, log_records=g, schema_url=SCHEMA_URL)],
                    schema_url=SCHEMA_URL,
                )
                for res, g in groups
            ]
        )
    return to_json(message) if as_json else encode(message, "protobuf")


def partial_success(signal: Signal, body: bytes, content_type: str) -> tuple[int, str]:
    """(items rejected, the backend's message) from an accepted request's response body."""
    if not body:
        return 0, ""
    if signal == "profiles":
        from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
            ExportProfilesServiceResponse,
        )

        response: Message = ExportProfilesServiceResponse()
    else:
        response = _RESPONSES[signal]()
    try:
        if "json" in content_type:
            from_json(body, response)
        else:
            response.ParseFromString(body)
    except (DecodeError, ValueError):
        return 0, ""  # a 2xx with a body we cannot read: the request was accepted
    partial = getattr(response, "partial_success")  # noqa: B009 - response type varies per signal
    return int(getattr(partial, _REJECTED_FIELD[signal])), str(partial.error_message)


def require_profiles(sink: str) -> None:
    """The profiles signal is alpha and its proto changes between releases: refuse one whose layout
    is not the one ``otlp_profiles`` writes (opentelemetry-proto 1.45.2, proto v1.10.0)."""
    try:
        from opentelemetry.proto.profiles.v1development.profiles_pb2 import ProfilesDictionary, Sample
    except ImportError:
        fields: set[str] = set()
    else:
        fields = {f.name for f in ProfilesDictionary.DESCRIPTOR.fields} | {
            f.name for f in Sample.DESCRIPTOR.fields
        }
    if not {"stack_table", "attribute_table", "stack_index"} <= fields:
        raise ConfigError(
            f"{sink_where(sink, 'signals')}: profiles needs the profiles proto of opentelemetry-proto "
            "1.45.2; install it with pip install 'cuptistream[profiles]', or remove profiles from signals"
        )
