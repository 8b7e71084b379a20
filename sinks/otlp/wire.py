"""Spans written straight to protobuf wire format, for speed.

Building a ``Span`` message with twenty ``KeyValue`` children costs tens of microseconds in Python;
writing the same bytes costs a few, and attributes repeat so much (device, stream, kernel name) that
their encodings are cached. The layout follows ``opentelemetry/proto/trace/v1/trace.proto``; the
tests decode every request with the official classes, which keeps this honest.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from google.protobuf.message import Message

from cuptistream.protowire import field_bytes, varint
from cuptistream.protowire import tag as _tag

from .common import AttrValue, any_value

_F64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")


_T_TRACE_ID, _T_SPAN_ID, _T_PARENT = _tag(1, 2) + b"\x10", _tag(2, 2) + b"\x08", _tag(4, 2) + b"\x08"
_T_KIND_INTERNAL = _tag(6, 0) + b"\x01"
_T_START, _T_END = _tag(7, 1), _tag(8, 1)

_ATTR_CACHE: dict[tuple[str, object, type], bytes] = {}
_ATTR_CACHE_MAX = 65_536


def _any_value(value: AttrValue) -> bytes:
    if isinstance(value, bool):
        return _tag(2, 0) + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _tag(3, 0) + varint(value)
    if isinstance(value, float):
        return _tag(4, 1) + _DOUBLE.pack(value)
    if isinstance(value, str):
        return field_bytes(1, value.encode())
    return any_value(value).SerializeToString()  # arrays: rare, let protobuf do it


def attribute(key: str, value: AttrValue) -> bytes:
    """Field 9 of a Span (and of most OTLP messages): one encoded ``KeyValue``."""
    cache_key = (key, value, type(value)) if not isinstance(value, list) else None
    if cache_key is not None and (hit := _ATTR_CACHE.get(cache_key)) is not None:
        return hit
    encoded = field_bytes(9, field_bytes(1, key.encode()) + field_bytes(2, _any_value(value)))
    if cache_key is not None:
        if len(_ATTR_CACHE) >= _ATTR_CACHE_MAX:
            _ATTR_CACHE.clear()
        _ATTR_CACHE[cache_key] = encoded
    return encoded


def span(
    trace_id: bytes,
    span_id: bytes,
    parent_id: bytes,
    name: str,
    start: int,
    end: int,
    attributes: Mapping[str, AttrValue | None],
    status: Message | None = None,
) -> bytes:
    """One ``Span`` (kind INTERNAL), encoded."""
    parts = [_T_TRACE_ID, trace_id, _T_SPAN_ID, span_id]
    if parent_id:
        parts += (_T_PARENT, parent_id)
    parts += (
        field_bytes(5, name.encode()),
        _T_KIND_INTERNAL,
        _T_START,
        _F64.pack(start),
        _T_END,
        _F64.pack(end),
    )
    parts += [attribute(k, v) for k, v in attributes.items() if v is not None]
    if status is not None:
        parts.append(field_bytes(15, status.SerializeToString()))
    return b"".join(parts)


def traces_request(
    groups: Sequence[tuple[Message, Sequence[bytes]]], scope: Message, schema_url: str = ""
) -> bytes:
    """An ``ExportTraceServiceRequest`` with one ResourceSpans (with one ScopeSpans) per
    (resource, spans) group; ``schema_url`` names the semantic conventions the attributes follow."""
    scope_head = field_bytes(1, scope.SerializeToString())
    schema = field_bytes(3, schema_url.encode()) if schema_url else b""
    out = []
    for resource, spans in groups:
        scope_spans = scope_head + b"".join(field_bytes(2, s) for s in spans) + schema
        resource_spans = field_bytes(1, resource.SerializeToString()) + field_bytes(2, scope_spans) + schema
        out.append(field_bytes(1, resource_spans))
    return b"".join(out)
