"""The telemetry of a fleet in a warehouse: the Kafka ``value_format: jsonl`` rows loaded into
ClickHouse, and the questions the views answer for one job asked there of every job
(``docs/warehouse.md``).

``clickhouse_ddl`` generates the schema from the event Structs; ``clickhouse/schema.sql`` is its
shipped copy and ``clickhouse/queries/*.sql`` the questions, ClickHouse SQL with query parameters.
``dashboard`` puts the questions on a Grafana dashboard (``grafana/cuptistream-fleet.json``).
"""

from __future__ import annotations

from cuptistream.warehouse.clickhouse_ddl import QUERIES, SCHEMA, TtlDays, clickhouse_schema, query_text

__all__ = ["QUERIES", "SCHEMA", "TtlDays", "clickhouse_schema", "query_text"]
