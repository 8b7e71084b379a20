"""Rendering ``cuptistream compare`` as it runs: text for a terminal, JSON or CSV for scripts.

Each writer gets every closed interval (``interval``) as it closes, then the whole span (``finish``),
and writes as it goes, so its memory does not grow with the span either. Text shows one line per
interval (its flags) and the whole span's table; JSON and CSV carry every row with raw integers (ns,
bytes). JSON: ``{"rule", "intervals": [...], "total", "outliers", "ignored", "shared_devices",
"meta"}``; CSV: one stream of tables, the first column naming the table (``interval``, ``total``,
``kernel``, ``outlier``, ``kernel_hardware``, ``ignored``, ``shared_device``), a header row starting
each. Where the recordings carry PmKernelStats, each outlier's longer kernels come with their
hardware utilization against the other ranks' and a verdict (``compare_hardware``). The text names
the ignored processes and the shared GPUs in one line each.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from typing import Any, Protocol, TextIO

from cuptistream.analysis.compare import CompareResult, IntervalResult
from cuptistream.analysis.compare_hardware import SHOWN, WORDS
from cuptistream.analysis.outliers import Flag, Rule, reference_words
from cuptistream.analysis.report import _duration, _size

COLUMNS = [
    "rank",
    "rank_id",
    "hosts",
    "pids",
    "busy_fraction",
    "busy_ns",
    "compute_ns",
    "nccl_ns",
    "copy_ns",
    "copy_bytes",
    "kernels",
    "basis",
]


class Writer(Protocol):
    def interval(self, result: IntervalResult) -> None: ...
    def finish(self, result: CompareResult, meta: dict[str, Any]) -> None: ...


def _flag_text(f: Flag) -> str:
    peer = f.reference == "peer"
    rel = f"{100 * f.relative:+.1f} %" if f.relative is not None else f"{f.value:g} ({f.reference} 0)"
    z = "against its peer" if peer else f"z {f.z:+.1f}" if f.z is not None else "MAD 0"
    basis = ", work basis" if f.basis == "work" else ""
    return f"{f.rank} {f.metric} {rel} ({z}{basis})"


def _clock(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%H:%M:%S")


class TextWriter:
    """For people: a line per interval, then the whole span's table, the flags and their causes."""

    def __init__(self, out: TextIO, rule: Rule) -> None:
        self.out = out
        self.out.write(rule.text() + "\n")

    def interval(self, result: IntervalResult) -> None:
        flags = "; ".join(_flag_text(f) for f in result.flags) or "no flags"
        busy = [r["busy_fraction"] for r in result.rows]
        spread = f"busy {100 * min(busy):.0f}-{100 * max(busy):.0f} %" if busy else "no GPU work"
        self.out.write(
            f"[{_clock(result.start_unix_ns)}-{_clock(result.end_unix_ns)} UTC] {len(result.rows)} ranks, "
            f"{spread}: {flags}\n"
        )
        self.out.flush()

    def finish(self, result: CompareResult, meta: dict[str, Any]) -> None:
        total = result.total
        out = self.out
        out.write(
            f"\n== Whole span: {_duration(total.span_ns)}, {result.intervals} interval(s) of "
            f"{_duration(result.interval_ns)}, {len(total.rows)} ranks\n"
        )
        header = ["rank", "busy %", "compute", "nccl", "copy", "copied", "kernels"]
        cells = [
            [
                r["rank"],
                f"{100 * r['busy_fraction']:.1f}",
                _duration(r["compute_ns"]),
                _duration(r["nccl_ns"]),
                _duration(r["copy_ns"]),
                _size(r["copy_bytes"]),
                str(r["kernels"]),
            ]
            for r in total.rows
        ]
        flagged = {(f.rank, f.metric) for f in total.flags}
        metric_of = ["", "busy_fraction", "compute_ns", "nccl_ns", "copy_ns", "copy_bytes", "kernels"]
        for row, r in zip(cells, total.rows, strict=True):
            for i in range(1, len(row)):
                if (r["rank"], metric_of[i]) in flagged:
                    row[i] += " *"
        _table(out, header, cells)
        if result.ignored:
            out.write(
                "ignored (not compared): "
                + "; ".join(f"{i['rank']} ({i['reason']})" for i in result.ignored)
                + "\n"
            )
        _statistics_line(out, result)
        for d in result.shared_devices:
            out.write(
                f"shared GPU {d['uuid']}{' (' + d['name'] + ')' if d['name'] else ''} by "
                f"{', '.join(d['ranks'])}: {d['rule']}\n"
            )
        if total.top_kernels:
            out.write(f"\n== Top {len(total.top_kernels)} kernels: time per rank\n")
            for i, name in enumerate(total.top_kernels, 1):
                out.write(f"  k{i} {_short(name)}\n")
            _table(
                out,
                ["rank", *(f"k{i}" for i in range(1, len(total.top_kernels) + 1))],
                [
                    [r["rank"], *(_duration(r["top_kernels"][n]) for n in total.top_kernels)]
                    for r in total.rows
                ],
            )
        out.write("\n== Outliers (* above)\n")
        if not result.outliers:
            out.write("   none: no rank differs from the median rank by the rule\n")
        for o in result.outliers:
            flags = [Flag(**m) for m in o["metrics"]]
            reference = reference_words(flags)
            out.write(f"{o['rank']}: {o['cause']}\n")
            out.write(
                f"   flagged in {o['flagged_intervals']} of {o['intervals']} interval(s); "
                + "; ".join(_flag_text(f) for f in flags)
                + "\n"
            )
            for title, rows in (("longer", o["kernels_longer"]), ("shorter", o["kernels_shorter"])):
                for k in rows:
                    out.write(
                        f"   {title} by {_duration(abs(k['diff_ns']))} than {reference} "
                        f"({k['rank_count']} vs {k['median_count']:g} launches): {_short(k['name'], 90)}\n"
                    )
            for h in o.get("kernels_hardware", []):  # recorded with PM sampling: how well it ran
                out.write(f"   {_hardware_text(h)}: {_short(h['name'], 90)}\n")
            for c in o.get("code_longer", []):  # recorded with stacks: the program's lines
                diff = _duration(c["diff_ns"])
                out.write(f"   code longer by {diff} than {reference}: {_short(c['code'], 90)}\n")
        if meta.get("late_events"):
            out.write(
                f"\n{meta['late_events']} events came after their interval closed (in the whole span only)\n"
            )


_FIELD_WORDS = {
    "sm_active": "SM",
    "tensor_active": "tensor",
    "dram_active": "DRAM",
    "sm_occupancy": "occupancy",
}


def _hardware_text(h: dict[str, Any]) -> str:
    """``less efficient (tensor 31 % vs 52 %, SM 70 % vs 88 %, ...): ran less efficiently: ...``"""
    pairs = [
        f"{_FIELD_WORDS[f]} {h['rank_pct'][f]:.0f} % vs {h['others_pct'][f]:.0f} %"
        for f in SHOWN
        if f in h["rank_pct"] and f in h["others_pct"]
    ]
    where = f" ({', '.join(pairs)} on the others)" if pairs else ""
    return f"{h['verdict']}{where}: {WORDS[h['verdict']]}"


def _statistics_line(out: TextIO, result: CompareResult) -> None:
    """One line per basis other than raw records: which ranks, and how their intervals were summed."""
    by_basis: dict[str, list[str]] = {}
    for r in result.total.rows:
        if r["basis"] != "records":
            by_basis.setdefault(r["basis"], []).append(r["rank"])
    size = result.statistics_interval_ns
    for basis, ranks in by_basis.items():
        summed = f", {_duration(size)} intervals summed into {_duration(result.interval_ns)}" if size else ""
        out.write(f"from the collector's statistics, not raw records: {', '.join(ranks)}: {basis}{summed}\n")


def _short(name: str, width: int = 100) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _table(out: TextIO, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for row in [header, *rows]:
        out.write(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            + "\n"
        )


class JsonWriter:
    """``{"rule", "intervals": [...], "total", "outliers", "meta"}``, written as intervals close."""

    def __init__(self, out: TextIO, rule: Rule) -> None:
        self.out = out
        self.first = True
        out.write('{"rule": ' + json.dumps(rule.describe()) + ',\n"intervals": [')

    def interval(self, result: IntervalResult) -> None:
        self.out.write(("\n" if self.first else ",\n") + json.dumps(_interval_dict(result)))
        self.first = False

    def finish(self, result: CompareResult, meta: dict[str, Any]) -> None:
        self.out.write('\n],\n"total": ' + json.dumps(_interval_dict(result.total)))
        self.out.write(',\n"outliers": ' + json.dumps(result.outliers))
        self.out.write(',\n"ignored": ' + json.dumps(result.ignored))
        self.out.write(',\n"shared_devices": ' + json.dumps(result.shared_devices))
        self.out.write(',\n"meta": ' + json.dumps(meta) + "}\n")


def _interval_dict(result: IntervalResult) -> dict[str, Any]:
    return {
        "start_unix_ns": result.start_unix_ns,
        "end_unix_ns": result.end_unix_ns,
        "span_ns": result.span_ns,
        "top_kernels": result.top_kernels,
        "ranks": result.rows,
        "flags": [f.as_dict() for f in result.flags],
    }


class CsvWriter:
    """Tables in one stream: ``interval`` rows as intervals close, then ``total``, ``kernel``, ``outlier``."""

    def __init__(self, out: TextIO, rule: Rule) -> None:
        self.out = out
        self.csv = csv.writer(out, lineterminator="\n")
        self.csv.writerow(["table", "start_unix_ns", "end_unix_ns", "span_ns", *COLUMNS, "flags"])

    def _rows(self, table: str, result: IntervalResult) -> None:
        flags: dict[str, list[str]] = {}
        for f in result.flags:
            flags.setdefault(f.rank, []).append(f"{f.metric}:{f.direction}")
        for r in result.rows:
            cells = [" ".join(map(str, r[c])) if isinstance(r[c], list) else r[c] for c in COLUMNS]
            self.csv.writerow(
                [
                    table,
                    result.start_unix_ns,
                    result.end_unix_ns,
                    result.span_ns,
                    *cells,
                    " ".join(flags.get(r["rank"], [])),
                ]
            )

    def interval(self, result: IntervalResult) -> None:
        self._rows("interval", result)

    def finish(self, result: CompareResult, meta: dict[str, Any]) -> None:
        self._rows("total", result.total)
        self.csv.writerow(["table", "rank", "kernel", "ns"])
        for r in result.total.rows:
            for name, ns in r["top_kernels"].items():
                self.csv.writerow(["kernel", r["rank"], name, ns])
        self.csv.writerow(["table", "rank", "cause", "metrics", "kernel_longer", "diff_ns"])
        for o in result.outliers:
            top = o["kernels_longer"][0] if o["kernels_longer"] else {"name": "", "diff_ns": ""}
            metrics = " ".join(f"{m['metric']}:{m['direction']}" for m in o["metrics"])
            self.csv.writerow(["outlier", o["rank"], o["cause"], metrics, top["name"], top["diff_ns"]])
        if any("kernels_hardware" in o for o in result.outliers):
            self.csv.writerow(["table", "rank", "kernel", "verdict", *(f"{f}_pct" for f in SHOWN),
                               *(f"others_{f}_pct" for f in SHOWN)])  # fmt: skip
            for o in result.outliers:
                for h in o.get("kernels_hardware", []):
                    self.csv.writerow(["kernel_hardware", o["rank"], h["name"], h["verdict"],
                                       *(h["rank_pct"].get(f, "") for f in SHOWN),
                                       *(h["others_pct"].get(f, "") for f in SHOWN)])  # fmt: skip
        if result.ignored:
            self.csv.writerow(["table", "rank", "hosts", "pids", "kernels", "reason"])
            for i in result.ignored:
                self.csv.writerow(["ignored", i["rank"], " ".join(i["hosts"]), " ".join(map(str, i["pids"])),
                                   i["kernels"], i["reason"]])  # fmt: skip
        if result.shared_devices:
            self.csv.writerow(["table", "uuid", "name", "ranks", "rule"])
            for d in result.shared_devices:
                self.csv.writerow(["shared_device", d["uuid"], d["name"], " ".join(d["ranks"]), d["rule"]])


WRITERS: dict[str, type[TextWriter] | type[JsonWriter] | type[CsvWriter]] = {
    "table": TextWriter,
    "json": JsonWriter,
    "csv": CsvWriter,
}
