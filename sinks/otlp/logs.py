"""Events → OTLP log records: Error events (CUPTI state errors, fatal errors, component failures), and
CuptiYield spans (cuptistream left CUPTI to another tool: what it did not see, and for how long)."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, SeverityNumber

from cuptistream.events import Batch, CuptiYield, Error

from .common import AttrValue, key_values

LOG_EVENTS = (Error, CuptiYield)  # the events that become log records, one record each
EVENT_NAME = "cuptistream.error"
YIELD_EVENT_NAME = "cuptistream.cupti_yield"
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
        if isinstance(ev, CuptiYield):
            out.append(_yield_record(ev, offset, observed_ns))
            continue
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


def _yield_record(ev: CuptiYield, offset: int, observed_ns: int) -> LogRecord:
    seconds = (ev.end - ev.start) / 1e9
    body = f"cuptistream left CUPTI to {ev.tool} for {seconds:.3f} s; not recorded: {', '.join(ev.missed)}"
    attrs: dict[str, AttrValue | None] = {
        "cuptistream.tool": ev.tool,
        "cuptistream.yield.reason": ev.reason,
        "cuptistream.yield.duration_s": seconds,
        "cuptistream.yield.missed": ",".join(ev.missed),
        "cuptistream.yield.standby": ",".join(ev.standby) or None,
        "cuptistream.yield.holder": ev.holder or None,
    }
    return LogRecord(
        time_unix_nano=ev.start + offset,
        observed_time_unix_nano=observed_ns,
        severity_number=SeverityNumber.SEVERITY_NUMBER_INFO,
        severity_text="INFO",
        body=AnyValue(string_value=body),
        attributes=key_values(attrs),
        event_name=YIELD_EVENT_NAME,
    )
