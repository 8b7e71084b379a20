"""Events → OTLP log records: Error events (CUPTI state errors, fatal errors, component failures)."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, SeverityNumber

from cuptistream.events import Batch, Error

from .otlp_common import key_values

EVENT_NAME = "cuptistream.error"
SEVERITY: dict[str, tuple[int, str]] = {
    "fatal": (SeverityNumber.SEVERITY_NUMBER_FATAL, "FATAL"),
    "error": (SeverityNumber.SEVERITY_NUMBER_ERROR, "ERROR"),
    "warning": (SeverityNumber.SEVERITY_NUMBER_WARN, "WARN"),
    "info": (SeverityNumber.SEVERITY_NUMBER_INFO, "INFO"),
}


def log_records(batch: Batch, observed_ns: int) -> list[LogRecord]:
    offset = batch.clock.offset_ns
    out = []
    for ev in batch.events:
        if not isinstance(ev, Error):
            continue
        number, text = SEVERITY.get(ev.severity, (SeverityNumber.SEVERITY_NUMBER_ERROR, ev.severity.upper()))
        attrs = {
            "cuptistream.origin": ev.origin,
            "cuda.result_code": ev.result_code or None,
        }
        out.append(
            LogRecord(
                time_unix_nano=ev.timestamp + offset,
                observed_time_unix_nano=observed_ns,
                severity_number=number,  # type: ignore[arg-type]
                severity_text=text,
                body=AnyValue(string_value=ev.message),
                attributes=key_values(attrs),
                event_name=EVENT_NAME,  # the record's field: the event.name attribute is deprecated
            )
        )
    return out
