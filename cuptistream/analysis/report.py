"""Rendering a summary ``Report`` as aligned text tables, CSV or JSON.

Text is for people (durations and sizes humanized, long names shortened); CSV and JSON keep the raw
integers (ns, bytes) so scripts never parse units. CSV holds every table in one stream: each row
starts with the table's name, and each table starts with its header row.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Literal

from cuptistream.analysis.summary_report import Report, Table

Format = Literal["table", "csv", "json"]
_NAME_WIDTH = 60


def render(report: Report, fmt: Format) -> str:
    if fmt == "json":
        tables = {
            t.name: {"title": t.title, "total_rows": t.total_rows, "rows": t.as_dicts()}
            for t in report.tables
        }
        return json.dumps({"meta": report.meta, **tables}, indent=1) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for table in report.tables:
            writer.writerow(["table", *table.columns])
            writer.writerows([table.name, *(_csv(v) for v in row)] for row in table.rows)
        return out.getvalue()
    return _text(report)


def _text(report: Report) -> str:
    meta = report.meta
    lines = [
        f"{meta['batches']} batches, {sum(meta['events'].values())} events selected, "
        f"{len(meta['processes'])} process(es), span {_duration(meta['span_ns'])}"
    ]
    for table in report.tables:
        lines.append("")
        more = f" (top {len(table.rows)} of {table.total_rows})" if table.total_rows > len(table.rows) else ""
        lines.append(f"== {table.title}{more}")
        if not table.rows:
            lines.append("   (none)")
            continue
        shown = [i for i, c in enumerate(table.columns) if c not in table.hidden]
        cells = [[_cell(table.columns[i], row[i]) for i in shown] for row in table.rows]
        header = [_header(table.columns[i]) for i in shown]
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
        numeric = [all(_is_number(row[i]) or row[i] is None for row in table.rows) for i in shown]
        for row in [header, *cells]:
            lines.append(
                "  ".join(
                    cell.rjust(w) if num else cell.ljust(w)
                    for cell, w, num in zip(row, widths, numeric, strict=True)
                ).rstrip()
            )
    return "\n".join(lines) + "\n"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _csv(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict) else value  # a column of values per metric


def _header(column: str) -> str:
    for suffix, unit in (("_ns", ""), ("_pct", " %"), ("gb_per_s", "GB/s"), ("_share", " %"), ("share", "%")):
        if column.endswith(suffix):
            return (column.removesuffix(suffix) + unit).replace("_", " ")
    return column.replace("_", " ")


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column.endswith("_ns"):
        return _duration(int(value))
    if column == "bytes":
        return _size(int(value))
    if column.endswith("share"):
        return f"{100 * value:.1f}"
    if column == "gb_per_s":
        return f"{value:.2f}"
    if (column in ("mean", "p95") or column.endswith("_pct")) and isinstance(
        value, float
    ):  # % of peak, or bytes per second
        return f"{value:,.1f}"
    if isinstance(value, str) and len(value) > _NAME_WIDTH:
        return value[: _NAME_WIDTH - 3] + "..."
    return str(value)


def _duration(ns: int) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns} ns"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def table_names(report: Report) -> list[str]:
    return [t.name for t in report.tables]


__all__ = ["Format", "Table", "render", "table_names"]
