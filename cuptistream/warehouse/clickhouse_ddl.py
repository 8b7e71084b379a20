"""ClickHouse DDL for the Kafka ``value_format: jsonl`` rows, generated from the event Structs.

The rows (``cuptistream.recording.rows``) are the event's fields, then the envelope
(``RowEnvelope``), times in Unix-epoch ns. The schema has three parts:

* **A landing table** ``cuptistream_rows``: the Kafka engine reading one topic as ``JSONEachRow``,
  with one column per field name of any event type. A field whose value is a list, a map or a
  nested Struct, or whose name two types give different types (``records``, ``category``), lands
  as its JSON text (String) and is parsed by the view that routes its type, so every row of every
  type fits the one table. A scalar that msgspec leaves out at a non-zero default lands Nullable,
  so its view can put the default back.
* **A table per event type**, named after the ``type`` tag: the event's fields typed
  (``DateTime64(9, 'UTC')`` for times, ``LowCardinality(String)`` for names, ``Map`` for maps,
  ``Nullable`` only where the Struct field may be None), a ``duration_ns`` for events with a
  start and an end, the envelope (``device_uuid`` only for types with a ``device_id``), and
  ``job``: the row's ``attributes['job']`` (``session.attributes``), else its ``session_id`` (one
  ``cuptistream run``, or one collector). Partitioned by day of the event's time, sorted by
  (job, host, pid, time): a job's ranks are read together, and a fleet query over a span reads
  only its days. A type without a time of its own (a device, a stack table, ...) is timed by
  ``received``, when ClickHouse took it.
* **A materialized view per type** (``<type>_mv``) that routes the landing table's rows of that
  ``type`` into its table.

Every type gets its table, not a chosen few: a type the rows carry and no view takes would be
dropped silently, an empty table costs nothing, and one generic rule keeps the schema free of
per-type code. Retention is a TTL per table: ``TtlDays.records`` for the per-record families,
``TtlDays.summaries`` for the statistics, accounting and lifecycle families (``SUMMARIES``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import msgspec
from msgspec import inspect as mi

from cuptistream.events import EVENT_TYPES, Event
from cuptistream.recording.rows import RowEnvelope

LANDING = "cuptistream_rows"
SCHEMA = "clickhouse/schema.sql"  # package data of cuptistream.warehouse
QUERIES = (
    "top_kernels",
    "slow_ranks",
    "gpu_busy",
    "losses",
    "gpu_time_by_code",
    "hw_utilization",
    "kernel_utilization",
)

# Time fields: epoch ns in a row (rows.py adds the clock offset, or they were epoch already).
_TIMES = ("start", "end", "timestamp", "device_timestamp", "interval_start", "interval_end", "since", "until")
# The field that orders and partitions a type's table, first found; device_timestamp may be 0.
_ORDER_TIMES = ("start", "timestamp", "interval_start", "since")
_UNSIGNED = frozenset({"address", "cubin_crc", "external_id"})  # 64-bit values past Int64
_FREE_TEXT = frozenset({"message", "cache_path"})  # strings too varied for a dictionary
# Families kept longer: statistics, accounting, lifecycle and what joins to them (stack tables).
SUMMARIES = frozenset({
    "activity_stats", "gpu_stats", "stack_stats", "stack_table", "loss", "error", "self_stats",
    "trace_window", "governor", "cupti_yield", "device", "resource", "environment", "memory_pool",
})  # fmt: skip
_ENVELOPE_TYPES = {
    "session_id": "LowCardinality(String)", "seq": "UInt64", "schema_version": "UInt16",
    "host": "LowCardinality(String)", "pid": "UInt32", "ppid": "UInt32",
    "process_name": "LowCardinality(String)", "rank": "Nullable(UInt32)", "local_rank": "Nullable(UInt32)",
    "world_size": "Nullable(UInt32)", "device_uuid": "LowCardinality(Nullable(String))",
    "attributes": "Map(LowCardinality(String), String)",
}  # fmt: skip
_JOB = "if({a}['job'] != '', {a}['job'], {s})"


@dataclass(frozen=True)
class TtlDays:
    """How long rows stay, in days (0: for ever)."""

    records: int = 14  # kernels, copies, API calls, samples: the bulk
    summaries: int = 400  # statistics, losses, errors, stack tables: small, read over months


@dataclass(frozen=True)
class KafkaSettings:
    broker_list: str = "kafka:9092"
    topic: str = "cuptistream.rows"
    group: str = "clickhouse-cuptistream"
    consumers: int = 1


def _q(name: str) -> str:
    return f"`{name}`"


def _scalar(t: mi.Type) -> str | None:
    if isinstance(t, mi.BoolType):
        return "Bool"
    if isinstance(t, mi.IntType):
        return "Int64"
    if isinstance(t, mi.FloatType):
        return "Float64"
    if isinstance(t, mi.StrType):
        return "String"
    return None


def _inner(t: mi.Type) -> str:
    """The ClickHouse type of a value inside a container."""
    scalar = _scalar(t)
    if scalar is not None:
        return scalar
    if isinstance(t, mi.ListType):
        return f"Array({_inner(t.item_type)})"
    if isinstance(t, mi.TupleType):
        return f"Tuple({', '.join(_inner(i) for i in t.item_types)})"
    if isinstance(t, mi.DictType):
        return f"Map(String, {_inner(t.value_type)})"
    if isinstance(t, mi.StructType):
        return f"Tuple({', '.join(f'{f.name} {_inner(f.type)}' for f in t.fields)})"
    optional = _optional(t)
    if optional is not None and _scalar(optional) is not None:  # a value that may be missing (null)
        return f"Nullable({_scalar(optional)})"
    if isinstance(t, mi.UnionType):  # a mixed value (Activity.fields): its JSON text
        return "String"
    raise TypeError(f"no ClickHouse type for {t!r}")


def _optional(t: mi.Type) -> mi.Type | None:
    """X of ``X | None`` where X is one scalar or a number (int | float: Float64)."""
    if not isinstance(t, mi.UnionType):
        return None
    rest = [i for i in t.types if not isinstance(i, mi.NoneType)]
    if len(rest) == len(t.types):
        return None
    if len(rest) == 1:
        return rest[0]
    if {type(i) for i in rest} == {mi.IntType, mi.FloatType}:
        return mi.FloatType()
    return None


@dataclass(frozen=True)
class _Column:
    name: str
    typed: str  # the typed table's column type
    landing: str  # the landing column's type
    scalar: bool  # lands as itself, not as JSON text
    default: Any  # the Struct field's default (msgspec.NODEFAULT: required)
    time: bool = False
    raw_map: bool = False  # a map of mixed values: kept as their JSON texts


def _column(f: mi.Field) -> _Column:
    default = f.default if f.default is not msgspec.NODEFAULT else msgspec.NODEFAULT
    inner = _optional(f.type)
    if f.name in _TIMES and isinstance(f.type, mi.IntType):
        return _Column(f.name, "DateTime64(9, 'UTC')", "Int64", True, default, time=True)
    base = inner if inner is not None else f.type
    scalar = _scalar(base) if not isinstance(f.type, mi.UnionType) or inner is not None else None
    if scalar is not None:
        if scalar == "Int64" and f.name in _UNSIGNED:
            scalar = "UInt64"
        typed = f"Nullable({scalar})" if inner is not None else scalar
        if scalar == "String" and f.name not in _FREE_TEXT:
            typed = f"LowCardinality({typed})"
        zero = {"Bool": False, "Int64": 0, "UInt64": 0, "Float64": 0.0, "String": ""}[scalar]
        nullable = inner is not None or (default is not msgspec.NODEFAULT and default != zero)
        return _Column(f.name, typed, f"Nullable({scalar})" if nullable else scalar, True, default)
    if default is not msgspec.NODEFAULT and any(_flat(default)):
        raise TypeError(f"{f.name}: a non-empty default {default!r} would be lost in its JSON text")
    raw_map = isinstance(f.type, mi.DictType) and isinstance(f.type.value_type, mi.UnionType)
    return _Column(f.name, _inner(f.type), "String", False, default, raw_map=raw_map)


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flat(v)]
    return [value]


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _columns(cls: type[Event]) -> list[_Column]:
    return [_column(f) for f in mi.type_info(cls).fields]  # type: ignore[attr-defined]


def _base(t: str) -> str:
    return t[9:-1] if t.startswith("Nullable(") else t


def _landing_columns() -> dict[str, str]:
    """Every field name of every type, with one landing type: JSON text where types disagree."""
    out: dict[str, str] = {"type": "String"}
    for cls in EVENT_TYPES.values():
        for column in _columns(cls):
            known = out.setdefault(column.name, column.landing)
            if known == column.landing:
                continue
            same = _base(known) == _base(column.landing) and column.scalar
            out[column.name] = f"Nullable({_base(known)})" if same else "String"
    for f in mi.type_info(RowEnvelope).fields:  # type: ignore[attr-defined]
        out[f.name] = _ENVELOPE_TYPES[f.name].replace("LowCardinality(String)", "String")
        out[f.name] = out[f.name].replace("LowCardinality(Nullable(String))", "Nullable(String)")
    out["attributes"] = "Map(String, String)"
    return out


def _src(name: str) -> str:
    # Qualified: an alias of the same name (``fromUnixTimestamp64Nano(start) AS start``) must not
    # stand for the landing column in the view's other expressions.
    return f"{_q(LANDING)}.{_q(name)}"


def _select(column: _Column, landing: str) -> str:
    """The view's expression for ``column`` from its landing column of type ``landing``."""
    src = _src(column.name)
    if column.time:
        return f"fromUnixTimestamp64Nano({src}, 'UTC')"
    if not column.scalar or (landing == "String" and column.landing != "String"):
        if column.raw_map:
            return f"CAST(JSONExtractKeysAndValuesRaw({src}), 'Map(String, String)')"
        if column.scalar and column.typed.endswith("String)"):
            return src
        typed = column.typed[15:-1] if column.typed.startswith("LowCardinality(") else column.typed
        return f"JSONExtract({src}, '{typed}')"
    if landing.startswith("Nullable(") and not column.typed.startswith(
        ("Nullable(", "LowCardinality(Nullable(")
    ):
        default = column.default if column.default is not msgspec.NODEFAULT else None
        if default is None:
            default = {"Bool": False, "String": "", "Float64": 0.0}.get(landing[9:-1], 0)
        return f"ifNull({src}, {_literal(default)})"
    return src


def _table(tag: str, cls: type[Event], landing: dict[str, str], ttl: TtlDays) -> str:
    columns = _columns(cls)
    names = {c.name for c in columns}
    order_time = next((t for t in _ORDER_TIMES if t in names), "received")
    defs = [f"    {_q(c.name)} {c.typed}" for c in columns]
    select = [f"    {_select(c, landing[c.name])} AS {_q(c.name)}" for c in columns]
    if {"start", "end"} <= names:
        defs.append("    `duration_ns` Int64")
        select.append(f"    {_src('end')} - {_src('start')} AS `duration_ns`")
    if order_time == "received":
        defs.append("    `received` DateTime64(9, 'UTC') DEFAULT now64(9, 'UTC')")
    for f in mi.type_info(RowEnvelope).fields:  # type: ignore[attr-defined]
        if f.name == "device_uuid" and "device_id" not in names:
            continue
        defs.append(f"    {_q(f.name)} {_ENVELOPE_TYPES[f.name]}")
        select.append(f"    {_src(f.name)} AS {_q(f.name)}")
    defs.append("    `job` LowCardinality(String)")
    select.append(f"    {_JOB.format(a=_src('attributes'), s=_src('session_id'))} AS `job`")
    days = ttl.summaries if tag in SUMMARIES else ttl.records
    keep = f"\nTTL toDateTime({_q(order_time)}) + INTERVAL {days} DAY" if days else ""
    table = (
        f"CREATE TABLE IF NOT EXISTS {_q(tag)}\n(\n" + ",\n".join(defs) + "\n)\nENGINE = MergeTree\n"
        f"PARTITION BY toYYYYMMDD({_q(order_time)})\nORDER BY (`job`, `host`, `pid`, {_q(order_time)}){keep};"
    )
    view = (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {_q(tag + '_mv')} TO {_q(tag)} AS\nSELECT\n"
        + ",\n".join(select)
        + f"\nFROM {_q(LANDING)}\nWHERE `type` = {_literal(tag)};"
    )
    return f"-- {tag}: cuptistream.events.{cls.__name__}\n{table}\n\n{view}"


def clickhouse_schema(ttl: TtlDays | None = None, kafka: KafkaSettings | None = None) -> str:
    """The whole schema: the landing Kafka table, then a table and a view per event type."""
    ttl = ttl or TtlDays()
    kafka = kafka or KafkaSettings()
    landing = _landing_columns()
    header = (
        "-- cuptistream: ClickHouse schema for Kafka value_format: jsonl rows (docs/warehouse.md).\n"
        "-- Generated from the event Structs by scripts/clickhouse_schema.py; do not edit.\n"
        f"-- TTL: {ttl.records} days for per-record families, {ttl.summaries} days for statistics, "
        "accounting and lifecycle (0: kept for ever).\n"
    )
    settings = {
        "kafka_broker_list": _literal(kafka.broker_list),
        "kafka_topic_list": _literal(kafka.topic),
        "kafka_group_name": _literal(kafka.group),
        "kafka_format": "'JSONEachRow'",
        "kafka_num_consumers": str(kafka.consumers),
        "input_format_skip_unknown_fields": "1",  # rows of a newer schema with a field added
        "input_format_json_read_objects_as_strings": "1",  # lists, maps, Structs: JSON text
        "input_format_json_read_arrays_as_strings": "1",
        "input_format_json_read_numbers_as_strings": "1",
        "input_format_json_read_bools_as_strings": "1",
    }
    queue = (
        f"CREATE TABLE IF NOT EXISTS {_q(LANDING)}\n(\n"
        + ",\n".join(f"    {_q(name)} {t}" for name, t in landing.items())
        + "\n)\nENGINE = Kafka\nSETTINGS\n"
        + ",\n".join(f"    {k} = {v}" for k, v in settings.items())
        + ";"
    )
    parts = [header, queue, *(_table(tag, cls, landing, ttl) for tag, cls in EVENT_TYPES.items())]
    return "\n\n".join(parts) + "\n"


def query_text(name: str) -> str:
    """The shipped query ``name`` (one of ``QUERIES``)."""
    return resources.files("cuptistream.warehouse").joinpath(f"clickhouse/queries/{name}.sql").read_text()
