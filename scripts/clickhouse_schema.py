"""Write cuptistream/warehouse/clickhouse/schema.sql, the ClickHouse schema of the Kafka
``value_format: jsonl`` rows, from the event Structs (``cuptistream.warehouse.clickhouse_schema``).
tests/test_warehouse.py fails when the shipped file is stale. With options, the schema for your own
broker, topic and retention goes to ``-o`` (or stdout) instead; see docs/warehouse.md.

    .venv/bin/python scripts/clickhouse_schema.py
    .venv/bin/python scripts/clickhouse_schema.py --broker kafka-1:9092 --topic gpu.rows \\
        --records-ttl-days 30 -o -
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cuptistream.warehouse.clickhouse_ddl import KafkaSettings, TtlDays, clickhouse_schema

PATH = Path(__file__).resolve().parent.parent / "cuptistream" / "warehouse" / "clickhouse" / "schema.sql"


def render(ttl: TtlDays | None = None, kafka: KafkaSettings | None = None) -> str:
    return clickhouse_schema(ttl, kafka)


def _fail(message: str) -> int:
    print(f"clickhouse_schema: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults, kafka = TtlDays(), KafkaSettings()
    records, summaries = defaults.records, defaults.summaries
    parser.add_argument(
        "--records-ttl-days",
        type=int,
        default=records,
        metavar="N",
        help=f"days kept of per-record tables (kernel, api, ...); 0: for ever (default {records})",
    )
    parser.add_argument(
        "--summaries-ttl-days",
        type=int,
        default=summaries,
        metavar="N",
        help=f"days kept of statistics, losses, errors, stack tables (default {summaries})",
    )
    parser.add_argument("--broker", default=kafka.broker_list, help="kafka_broker_list (default %(default)s)")
    parser.add_argument("--topic", default=kafka.topic, help="the topic of the rows (default %(default)s)")
    parser.add_argument(
        "--group", default=kafka.group, help="ClickHouse's consumer group (default %(default)s)"
    )
    parser.add_argument(
        "-o", "--output", default=None, help="file to write, '-' for stdout (default: the shipped one)"
    )
    args = parser.parse_args(argv)
    for option, value in (("--records-ttl-days", args.records_ttl_days),
                          ("--summaries-ttl-days", args.summaries_ttl_days)):  # fmt: skip
        if value < 0:
            return _fail(f"{option} {value}: give 0 (keep for ever) or a number of days")
    for option, value in (("--broker", args.broker), ("--topic", args.topic), ("--group", args.group)):
        if not value or "'" in value or "\\" in value:
            return _fail(f"{option} {value!r}: give a non-empty value without quotes or backslashes")
    text = render(
        TtlDays(args.records_ttl_days, args.summaries_ttl_days),
        KafkaSettings(args.broker, args.topic, args.group),
    )
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output) if args.output else PATH
    try:
        path.write_text(text)
    except OSError as error:
        return _fail(f"cannot write {path}: {error.strerror}; give a writable -o path or '-' for stdout")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
