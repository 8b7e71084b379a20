"""``cuptistream compare``'s command: options checked, recordings opened, writer and plots chosen.

Every mistake is a ``UserError`` (one line, exit 2): a bad ``--interval``, ``--lateness``,
``--threshold`` or ``--min-diff``, an ``--interval`` that does not hold whole statistics intervals
(``compare_stats.StatisticsIntervalError``, for a rank compared on its statistics), a path or
pattern that holds no recording, ``--plot`` without matplotlib, an unwritable ``-o``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from typing import Any, TextIO

from cuptistream.analysis.compare import CompareResult, compare_streams, rank_key, rank_label
from cuptistream.analysis.compare_hardware import RULE as HARDWARE_RULE
from cuptistream.analysis.compare_read import DECODER
from cuptistream.analysis.compare_report import WRITERS, Writer
from cuptistream.analysis.names import DisplayNames
from cuptistream.analysis.outliers import Rule
from cuptistream.analysis.select import Selection
from cuptistream.analysis.sources import Recordings, expand
from cuptistream.analysis.stacks import code_of, join_stacks
from cuptistream.config.units import parse_duration
from cuptistream.errors import UserError


def _duration_ns(option: str, text: str) -> int:
    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = 0.0
    if seconds < 0.001:
        raise UserError(f"{option} {text!r}: expected a duration of 1ms or more, e.g. 10s or 500ms")
    return round(seconds * 1e9)


def lateness_ns(args: argparse.Namespace, interval_ns: int, sources: list[str]) -> int:
    """``--lateness``, or: a Kafka topic read to its end comes in chunks of minutes per partition;
    files per writer in order, and a followed topic as the job writes it."""
    if args.lateness:
        return _duration_ns("--lateness", args.lateness)
    kafka = any(s.startswith("kafka://") for s in sources) and not args.follow
    floor = 300_000_000_000 if kafka else 5_000_000_000
    return max(interval_ns, floor)


def rule_of(args: argparse.Namespace) -> Rule:
    if not args.threshold > 0:
        raise UserError(f"--threshold {args.threshold}: expected a positive number, e.g. 3.5")
    if not 0 <= args.min_diff < 1:
        raise UserError(f"--min-diff {args.min_diff}: expected a fraction in [0, 1), e.g. 0.02 for 2 %")
    return Rule(threshold=args.threshold, min_relative=args.min_diff)


def run_compare(args: argparse.Namespace, fmt: str, selection: Selection) -> int:
    interval_ns = _duration_ns("--interval", args.interval)
    sources = expand(args.paths)
    late_ns = lateness_ns(args, interval_ns, sources)
    rule = rule_of(args)
    if args.plot:
        from cuptistream.analysis.plot import require_matplotlib

        require_matplotlib()
    if args.follow and (len(sources) != 1 or not sources[0].startswith("kafka://") or fmt != "table"):
        raise UserError("--follow reads one kafka://host:port/topic while the job runs and prints lines; "
                        "give one topic and no --format, or drop --follow")  # fmt: skip
    recordings = Recordings(sources, decoder=DECODER)
    with ExitStack() as stack:
        out: TextIO = sys.stdout
        if args.output:
            try:
                out = stack.enter_context(open(args.output, "w", encoding="utf-8"))
            except OSError as error:
                raise UserError(
                    f"{args.output}: cannot write: {error.strerror}; choose another -o FILE"
                ) from None
        options: dict[str, Any] = {
            "selection": selection, "interval_ns": interval_ns, "lateness_ns": late_ns, "rule": rule,
            "top": args.top, "names": DisplayNames(mangled=args.mangled),
        }  # fmt: skip
        if args.follow:
            from cuptistream.analysis.follow import FollowWriter, compare_live, follow_kafka

            writer: Writer = FollowWriter(out, rule)
            result = compare_live(follow_kafka(sources[0]), writer.interval, **options)
        else:
            writer = WRITERS[fmt](out, rule)
            result = compare_streams(recordings.streams(), writer.interval, **options)
        if not result.total.rows:
            raise UserError(f"{recordings.spec}: no process to compare with these filters; widen them")
        meta: dict[str, Any] = {
            "sources": sources,
            "interval_ns": interval_ns,
            "lateness_ns": late_ns,
            "intervals": result.intervals,
            "batches": result.batches,
            "late_events": result.late_events,
            "statistics_interval_ns": result.statistics_interval_ns,
            "ranks": len(result.total.rows),
            "names": "mangled" if args.mangled else "demangled",
            "torn_tails": [t.describe() for t in recordings.torn_tails],
        }
        if result.hardware:
            meta["hardware_rule"] = HARDWARE_RULE
        if result.outliers and not args.follow:
            _name_code(result, Recordings(sources), selection)
        writer.finish(result, meta)
    if args.plot:
        from cuptistream.analysis.compare_plot import plot_compare

        for path in plot_compare(result, args.plot):
            print(path, file=sys.stderr)
    for tail in recordings.torn_tails:
        print(f"cuptistream: {tail.describe()}; every complete frame before it was read", file=sys.stderr)
    return 0


def _name_code(result: CompareResult, recordings: Recordings, selection: Selection, top: int = 3) -> None:
    """Where the recordings hold the launching stacks: each outlier's ``code_longer``, the lines of
    the program whose GPU time it spends more than the median rank, the most first."""
    joiner = join_stacks(recordings, selection)
    if not joiner.index.has_stacks():
        return
    by_rank: dict[str, dict[str, int]] = {}
    for stack in joiner.result():
        label = rank_label(rank_key(joiner.resources[(stack.host, stack.pid)]))
        lines = by_rank.setdefault(label, {})
        code = code_of(stack)
        lines[code] = lines.get(code, 0) + stack.gpu_ns
    for outlier in result.outliers:
        mine = by_rank.get(outlier["rank"], {})
        others = [lines for label, lines in by_rank.items() if label != outlier["rank"]]
        if not others:
            continue
        longer: list[tuple[float, str, int, float]] = []
        for code, ns in mine.items():
            median = statistics.median(lines.get(code, 0) for lines in others)
            if ns > median:
                longer.append((ns - median, code, ns, median))
        longer.sort(reverse=True)
        outlier["code_longer"] = [
            {"code": code, "diff_ns": diff, "rank_ns": ns, "median_ns": median}
            for diff, code, ns, median in longer[:top]
        ]
