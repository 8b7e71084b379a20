"""The view subcommands of ``cuptistream``: summary, export, plot, compare, flame.

Only argparse here; each command imports its view when it runs, so ``cuptistream run`` and friends
never import numpy or matplotlib. Errors are ``UserError``s, printed by ``cli.main`` as one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cuptistream.errors import UserError

if TYPE_CHECKING:
    from cuptistream.analysis.select import Selection
    from cuptistream.recording.framing import TornTail


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="SOURCE",
        help="file-sink files or directories (globs too: 'node*/out'), or kafka://host:port/topic; "
        "several are read as one recording",
    )  # fmt: skip
    parser.add_argument("--since", metavar="TIME", help="from TIME: 30s (after the start), ISO time, @UNIX_S")
    parser.add_argument("--until", metavar="TIME", help="before TIME (same forms as --since)")
    parser.add_argument("--pid", metavar="PID[,PID]", help="only these processes")
    parser.add_argument("--rank", metavar="N[,N]", help="only these ranks (RANK, SLURM_PROCID, ...)")
    parser.add_argument("--device", metavar="N[,N]", help="only GPU work on these CUDA devices")
    parser.add_argument(
        "--mangled", action="store_true", help="kernel and function names as recorded (default: demangled)"
    )


def add_commands(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register the view subcommands; returns their handlers by name."""
    summary = commands.add_parser(
        "summary", help="tables of kernels, copies, API calls, NVTX, GPU busy, stalls, losses",
        description="Summarize a recording in one streaming pass (bounded memory).",
    )  # fmt: skip
    _filters(summary)
    summary.add_argument("--format", default="table", help="table (default), csv or json")
    summary.add_argument("--top", type=int, default=20, help="rows per table in --format table (default 20)")
    summary.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")

    export = commands.add_parser(
        "export", help="write a trace for ui.perfetto.dev or chrome://tracing",
        description="Write a Trace Event Format JSON trace (gzip-compressed when FILE ends in .gz). "
        "Both formats are JSON: Perfetto and chrome://tracing open the same file.",
    )  # fmt: skip
    _filters(export)
    export.add_argument("--format", default="perfetto", help="perfetto (default) or chrome-trace")
    export.add_argument("-o", "--output", metavar="FILE", required=True, help="trace.json or trace.json.gz")

    plot = commands.add_parser(
        "plot", help="PNG figures: GPU busy per stream, top kernels, stall reasons (needs matplotlib)",
        description="Write PNG figures to DIR. Needs matplotlib: pip install 'cuptistream[plot]'.",
    )  # fmt: skip
    _filters(plot)
    plot.add_argument(
        "-o", "--output", metavar="DIR", default="cuptistream-plots", help="folder for the PNGs"
    )
    plot.add_argument("--bins", type=int, default=200, help="time bins of the busy figure (default 200)")
    plot.add_argument("--top", type=int, default=15, help="kernels and functions shown (default 15)")

    compare = commands.add_parser(
        "compare", help="compare the ranks of a job: GPU busy, compute, NCCL, copies; flag the slow rank",
        description="Read several recordings as one job, grouped by rank (by pid without one), and compare "
        "the ranks per interval and over the whole span; flag outliers by median and MAD and name their "
        "likely cause and kernels (docs/analysis.md).",
    )  # fmt: skip
    _filters(compare)
    compare.add_argument("--interval", default="10s", metavar="DURATION", help="interval (default 10s)")
    compare.add_argument("--format", default="table", help="table (default), csv or json")
    compare.add_argument("--top", type=int, default=5, help="kernels named per rank and outlier (default 5)")
    compare.add_argument("--threshold", type=float, default=3.5, help="flag when |robust z| > this (3.5)")
    compare.add_argument("--min-diff", type=float, default=0.02, metavar="FRACTION",
                         help="and it differs from the median by this fraction or more (0.02)")  # fmt: skip
    compare.add_argument("--lateness", metavar="DURATION",
                         help="keep an interval open this long past its end for batches that come late "
                         "(default: the interval or 5s, 5min for kafka://)")  # fmt: skip
    compare.add_argument("--follow", action="store_true",
                         help="kafka://... only: keep reading while the job runs, a line when a rank becomes "
                         "an outlier; Ctrl-C prints the whole span")  # fmt: skip
    compare.add_argument("--plot", metavar="DIR", help="a PNG per metric across ranks (needs matplotlib)")
    compare.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")

    flame = commands.add_parser(
        "flame", help="GPU time by the code that launched it: pprof or speedscope flame graph",
        description="Join each kernel, copy and memset to the Python stack that launched it (recorded "
        "with `stacks:`) and write GPU time by stack: pprof (go tool pprof, Pyroscope, Grafana) or "
        "speedscope JSON.",
    )  # fmt: skip
    _filters(flame)
    flame.add_argument("--kernel", metavar="REGEX", help="only GPU work whose name matches REGEX")
    flame.add_argument("--format", help="pprof or speedscope (default: speedscope for .json, else pprof)")
    flame.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="gpu.pb.gz or gpu.speedscope.json"
    )
    return {"summary": _summary, "export": _export, "plot": _plot, "compare": _compare, "flame": _flame}


def selection(args: argparse.Namespace) -> Selection:
    from cuptistream.analysis.select import Selection, parse_ids, parse_time

    return Selection(
        pids=parse_ids("--pid", args.pid) if args.pid else None,
        ranks=parse_ids("--rank", args.rank) if args.rank else None,
        devices=parse_ids("--device", args.device) if args.device else None,
        since=parse_time("--since", args.since) if args.since else None,
        until=parse_time("--until", args.until) if args.until else None,
    )


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UserError(f"{option} {value!r}: expected one of {', '.join(allowed)}")
    return value


def _positive(option: str, value: int) -> int:
    if value < 1:
        raise UserError(f"{option} {value}: expected a positive number")
    return value


def _summary(args: argparse.Namespace) -> int:
    from cuptistream.analysis.report import render
    from cuptistream.analysis.sources import open_recordings
    from cuptistream.analysis.summary import summarize

    fmt = _choice("--format", args.format, ("table", "csv", "json"))
    top = _positive("--top", args.top) if fmt == "table" else None
    sel = selection(args)
    recording = open_recordings(args.paths, lean=True)
    report = summarize(recording, sel, top, mangled=args.mangled)
    counted = report.meta["events"]
    if counted.get("stack_changes") or counted.get("stack_stats"):  # recorded with stacks: more passes
        from cuptistream.analysis.stacks import code_table, join_stacks

        joiner = join_stacks(open_recordings(args.paths), sel, mangled=args.mangled)
        report.tables.insert(1, code_table(joiner.result(), top))
    text = render(report, fmt)  # type: ignore[arg-type]
    if args.output:
        _write_text(args.output, text)
    else:
        sys.stdout.write(text)
    _report_torn(recording.torn_tails)
    return 0


def _export(args: argparse.Namespace) -> int:
    from cuptistream.analysis.sources import open_recordings
    from cuptistream.analysis.trace_export import export_trace

    _choice("--format", args.format, ("perfetto", "chrome-trace"))
    sel = selection(args)
    recording = open_recordings(args.paths)
    stats = export_trace(recording, args.output, sel, mangled=args.mangled)
    print(f"cuptistream: wrote {stats.events} trace events ({stats.flows} flow arrows) to {args.output}",
          file=sys.stderr)  # fmt: skip
    _report_torn(recording.torn_tails)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from cuptistream.analysis.plot import plot_all, require_matplotlib
    from cuptistream.analysis.sources import open_recordings

    require_matplotlib()
    _positive("--bins", args.bins)
    _positive("--top", args.top)
    sel = selection(args)
    recording = open_recordings(args.paths, lean=True)
    for path in plot_all(recording, args.output, sel, bins=args.bins, top=args.top, mangled=args.mangled):
        print(path)
    _report_torn(recording.torn_tails)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from cuptistream.analysis.compare_cli import run_compare

    fmt = _choice("--format", args.format, ("table", "csv", "json"))
    _positive("--top", args.top)
    return run_compare(args, fmt, selection(args))


def _flame(args: argparse.Namespace) -> int:
    import re

    from cuptistream.analysis.flame import pprof, speedscope_text
    from cuptistream.analysis.sources import open_recordings
    from cuptistream.analysis.stacks import join_stacks, statistics_note

    form = args.format or ("speedscope" if args.output.endswith(".json") else "pprof")
    _choice("--format", form, ("pprof", "speedscope"))
    if args.kernel:
        try:
            re.compile(args.kernel)
        except re.error as error:
            raise UserError(f"--kernel {args.kernel!r}: not a regular expression ({error})") from None
    recording = open_recordings(args.paths)
    joiner = join_stacks(recording, selection(args), kernel=args.kernel, mangled=args.mangled)
    _report_torn(recording.torn_tails)
    stacks = joiner.result()
    if not stacks:
        raise UserError(f"{' '.join(args.paths)}: no kernel, copy or memset recorded in the selection")
    if form == "pprof":
        ranks = {key: r.rank for key, r in joiner.resources.items() if r.rank is not None}
        _write_bytes(args.output, pprof(stacks, ranks))
    else:
        names = {key: _process_name(r) for key, r in joiner.resources.items()}
        _write_text(args.output, speedscope_text(stacks, names))
    total = sum(s.gpu_ns for s in stacks)
    unknown = sum(s.gpu_ns for s in stacks if len(s.frames) == 1 and s.frames[0].synthetic)
    print(f"cuptistream: {args.output}: {total / 1e9:.3f} s of GPU time over {len(stacks)} stacks"
          f"{f', {unknown / total:.1%} without a stack' if unknown else ''}{statistics_note(stacks)}",
          file=sys.stderr)  # fmt: skip
    return 0


def _process_name(resource: Any) -> str:
    rank = f" rank {resource.rank}" if resource.rank is not None else ""
    return f"{resource.host} pid {resource.pid}{rank}"


def _write_text(path: str, text: str) -> None:
    _write_bytes(path, text.encode())


def _write_bytes(path: str, data: bytes) -> None:
    try:
        with open(path, "wb") as out:
            out.write(data)
    except OSError as error:
        raise UserError(f"{path}: cannot write: {error.strerror}; choose another -o FILE") from None


def _report_torn(tails: list[TornTail]) -> None:
    for tail in tails:
        print(f"cuptistream: {tail.describe()}; every complete frame before it was read", file=sys.stderr)
