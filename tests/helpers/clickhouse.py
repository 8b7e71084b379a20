"""A ClickHouse engine in process (chDB) holding the shipped warehouse schema, loaded with rows that
cuptistream itself writes in the Kafka ``value_format: jsonl`` layout; for the warehouse tests and
for benchmarks that time the shipped queries on more rows.

The schema's landing table reads a Kafka topic; chDB has no broker to read, so ``Warehouse``
creates that table with the Null engine instead (same columns, same settings for the JSON), and
inserting rows into it runs the same materialized views that route each ``type`` to its table. The
tables' TTLs are left out too: ClickHouse drops rows already past them at insert, and the committed
captures are older than the retention.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import chdb.session
import msgspec

from cuptistream import events as ev
from cuptistream.recording.reader import read
from cuptistream.recording.rows import encode_rows
from cuptistream.warehouse.clickhouse_ddl import LANDING, SCHEMA, query_text

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "cuptistream" / "warehouse" / SCHEMA
_JSON_SETTINGS = (
    "input_format_skip_unknown_fields = 1, input_format_json_read_objects_as_strings = 1, "
    "input_format_json_read_arrays_as_strings = 1, input_format_json_read_numbers_as_strings = 1, "
    "input_format_json_read_bools_as_strings = 1"
)


def statements(schema: str) -> list[str]:
    """The schema's statements, the Kafka engine of the landing table replaced by Null, no TTL."""
    schema = re.sub(r"ENGINE = Kafka\nSETTINGS\n.*?;", "ENGINE = Null;", schema, flags=re.S)
    schema = re.sub(r"\nTTL [^;]*", "", schema)
    return [part.strip() for part in schema.split(";\n") if "CREATE" in part]


def recording_rows(directories: Iterable[Path]) -> Iterator[bytes]:
    """The jsonl rows of every batch of the recordings in ``directories``, one chunk per batch."""
    for directory in directories:
        for batch in read(directory).batches():
            yield encode_rows(batch)


def batch_rows(batches: Iterable[ev.Batch]) -> Iterator[bytes]:
    """The jsonl rows of ``batches`` (copies: ``encode_rows`` moves the events' times)."""
    for batch in batches:
        yield encode_rows(msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=ev.Batch))


_session: chdb.session.Session | None = None
_folder: tempfile.TemporaryDirectory[str] | None = None
_databases = itertools.count()


def _chdb() -> chdb.session.Session:
    """The process's chDB session: chDB runs one embedded server per process, at one path."""
    global _session, _folder
    if _session is None:
        _folder = tempfile.TemporaryDirectory(prefix="chdb-")
        _session = chdb.session.Session(_folder.name)
    return _session


class Warehouse:
    """A database of its own in the process's chDB, with the shipped schema (or ``schema``)."""

    def __init__(self, schema: str | None = None) -> None:
        self.session = _chdb()
        self.database = f"cuptistream_{os.getpid()}_{next(_databases)}"
        self.session.query(f"CREATE DATABASE {self.database}")
        for statement in statements(schema if schema is not None else SCHEMA_PATH.read_text()):
            self._run(statement)

    def _run(self, text: str, fmt: str = "CSV", params: dict[str, str] | None = None) -> Any:
        self.session.query(f"USE {self.database}")  # the session may serve another Warehouse too
        return self.session.query(text, fmt, params=params or {})

    def insert(self, rows: Iterable[bytes], chunk_bytes: int = 16 << 20) -> int:
        """Insert jsonl rows through the landing table; returns the rows inserted."""
        count = 0
        part: list[bytes] = []
        size = 0
        for chunk in rows:
            part.append(chunk)
            size += len(chunk)
            count += chunk.count(b"\n")
            if size >= chunk_bytes:
                self._insert(b"".join(part))
                part, size = [], 0
        if part:
            self._insert(b"".join(part))
        return count

    def _insert(self, data: bytes) -> None:
        head = f"INSERT INTO {LANDING} SETTINGS {_JSON_SETTINGS} FORMAT JSONEachRow\n"
        self._run(head + data.decode())

    def execute(self, text: str) -> None:
        """Run a statement that returns no rows (DDL, INSERT ... SELECT)."""
        self._run(text)

    def sql(
        self, text: str, params: dict[str, Any] | None = None, settings: str = ""
    ) -> list[dict[str, Any]]:
        """Rows of ``text`` as dicts (64-bit integers as numbers, not quoted); ``settings``: more
        query settings (``name = value, ...``)."""
        settings = ", ".join(
            s for s in ("output_format_json_quote_64bit_integers = 0, output_format_json_quote_decimals = 0",
                        settings) if s
        )  # fmt: skip
        result = self._run(f"{text.rstrip().rstrip(';')}\nSETTINGS {settings}", "JSONEachRow",
                           {k: str(v) for k, v in (params or {}).items()})  # fmt: skip
        return [msgspec.json.decode(line) for line in result.bytes().splitlines() if line.strip()]

    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of the shipped query ``name`` with its parameters."""
        return self.sql(query_text(name), params)

    def close(self) -> None:
        self.session.query(f"DROP DATABASE IF EXISTS {self.database} SYNC")
