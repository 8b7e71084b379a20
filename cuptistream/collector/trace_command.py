"""``cuptistream trace --for 30s``: a full-trace window on a running job, without a restart.

It finds the collector (the only one running, from ``collector.registry``; or ``--collector`` with
its pid or socket), asks it on its control socket (``collector.control``) to open a window on the
probes chosen by ``--pid``/``--rank`` (default: all), and returns once every chosen probe's window
closed and every sink has delivered its events: one line per probe on stdout, exit 0. A problem is
one line on stderr and a non-zero exit: 2 when nothing could be asked (no collector, no such probe),
1 when a probe's window was not delivered (it cannot trace on demand, or time ran out).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from cuptistream.collector import registry
from cuptistream.config.units import parse_duration
from cuptistream.errors import UserError

if TYPE_CHECKING:  # the control socket's code (and numpy) loads when `trace` runs, not with every command
    from cuptistream.collector.control import ProbeResult, TraceReply

_ANSWER_GRACE_S = 10.0  # the collector's own waits end before ours


def add_command(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register ``trace`` on the CLI's subcommands; returns its handler by name."""
    parser = commands.add_parser(
        "trace",
        help="open a full-trace window on a running job (--for 30s) and wait until it is delivered",
        description="Ask a running collector (of `cuptistream run`, or a node `cuptistream collector`) "
        "to trace a full window on its probes now, charged to no overhead budget; returns when the "
        "window's data has been delivered by every sink.",
    )
    parser.add_argument(
        "--for", dest="length", required=True, metavar="DURATION", help="window length: 10s, 500ms"
    )
    parser.add_argument(
        "--pid", action="append", default=[], metavar="PID", help="only this process (repeat, or 1,2)"
    )
    parser.add_argument(
        "--rank", action="append", default=[], metavar="RANK", help="only this rank (repeat, or 0,1)"
    )
    parser.add_argument(
        "--collector",
        metavar="PID|SOCKET",
        help="which collector: its pid or socket (default: the only one running)",
    )
    parser.add_argument(
        "--timeout",
        default="30s",
        metavar="DURATION",
        help="wait this long past the window for delivery (30s)",
    )
    parser.add_argument(
        "--metrics",
        metavar="SET",
        help="also measure each kernel of the window with CUPTI's range profiler: a set (utilization, "
        "memory, speed_of_light) or metric names separated by commas; kernels are serialized and "
        "replayed once per pass while the window lasts",
    )
    parser.add_argument("--format", default="text", help="text (default) or json")
    return {"trace": _cmd_trace}


def _numbers(values: list[str], option: str, what: str) -> list[int]:
    numbers = []
    for value in values:
        for part in value.split(","):
            if not part.strip().isdigit():
                raise UserError(f"trace: {option} takes {what} like 12 or 12,13, not {part!r}")
            numbers.append(int(part))
    return numbers


def _duration(value: str, option: str, positive: bool) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as error:
        raise UserError(f"trace: {option}: {error}") from None
    if positive and seconds <= 0:
        raise UserError(f"trace: {option} must be longer than 0s")
    return seconds


def find_control(collector: str | None) -> str:
    """The control socket of the collector ``collector`` names (a pid, or its socket path), or of
    the only registered one. Raises ``UserError`` (one line) when there is none or several."""
    from cuptistream.collector.control import SUFFIX

    if collector is not None and not collector.isdigit():
        path = collector if collector.endswith(SUFFIX) else collector + SUFFIX
        if os.path.exists(path):
            return path
        if os.path.exists(collector):  # a socket file stays behind a stopped collector
            raise UserError(f"trace: no collector takes trace requests at {collector} (no {path}): "
                            "it has stopped, or predates `cuptistream trace`")  # fmt: skip
        raise UserError(f"trace: no collector socket at {collector}; pass the path its --socket named")
    running = registry.running()
    listing = "; ".join(entry.describe() for entry in running)
    if collector is not None:
        chosen = [entry for entry in running if entry.pid == int(collector)]
        if len(chosen) == 1:
            return chosen[0].control
        if chosen:  # collectors of cuptistream.session(...) in one process
            sockets = "; ".join(entry.describe() for entry in chosen)
            raise UserError(
                f"trace: pid {collector} runs {len(chosen)} collectors; pass one's socket: {sockets}"
            )
        found = f"running: {listing}" if running else "none is running"
        raise UserError(f"trace: no collector with pid {collector}; {found}")
    if not running and (problem := registry.unusable()):
        raise UserError(f"trace: collectors cannot register: {problem}; fix it, or pass --collector SOCKET")
    if not running:
        raise UserError(
            f"trace: no collector is running (none registered in {registry.directory()}); start "
            "`cuptistream run` or `cuptistream collector`, or pass --collector SOCKET"
        )
    if len(running) > 1:
        raise UserError(
            f"trace: {len(running)} collectors are running; pick one with --collector PID: {listing}"
        )
    return running[0].control


def _cmd_trace(args: argparse.Namespace) -> int:
    from cuptistream.collector.control import TraceRequest, ask

    if args.format not in ("text", "json"):
        raise UserError(f"trace: --format must be text or json, not {args.format!r}")
    metrics = ""
    if args.metrics is not None:
        from cuptistream.cupti.kernel_metrics import parse_spec

        try:
            metrics = ",".join(parse_spec(args.metrics))  # each probe checks them on its chips
        except UserError as error:
            raise UserError(f"trace: {error}") from None
    request = TraceRequest(
        metrics=metrics,
        seconds=_duration(args.length, "--for", positive=True),
        pids=_numbers(args.pid, "--pid", "process ids"),
        ranks=_numbers(args.rank, "--rank", "ranks"),
        timeout=_duration(args.timeout, "--timeout", positive=False),
    )
    path = find_control(args.collector)
    reply = ask(path, request, timeout=request.seconds + request.timeout + _ANSWER_GRACE_S)
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(reply).decode() + "\n")
        sys.stdout.flush()
    if reply.error:
        raise UserError(f"trace: {reply.error}")
    return _report(reply, text=args.format == "text")


def _report(reply: TraceReply, text: bool) -> int:
    failed = [probe for probe in reply.probes if probe.problem]
    if text:
        for probe in reply.probes:
            if not probe.problem:
                print(_line(probe), flush=True)
    for probe in failed:
        print(f"cuptistream: trace: {_who(probe)}: {probe.problem}", file=sys.stderr)
    if reply.dropped:
        lost = ", ".join(f"{stage} {n}" for stage, n in sorted(reply.dropped.items()))
        print(f"cuptistream: trace: sinks counted events lost while the window was delivered ({lost}); "
              "their loss events say which", file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


def _who(probe: ProbeResult) -> str:
    return f"pid {probe.pid}" + (f" rank {probe.rank}" if probe.rank is not None else "")


def _clock(unix_ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(unix_ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%H:%M:%S.%f")[:-3]


def _line(probe: ProbeResult) -> str:
    """E.g. ``pid 123 rank 0: window 10:00:01.250-10:00:11.262 UTC (10.01 s), 5123 records delivered
    (activity)``; with ``--metrics``, the kernels' metrics are ``kernel_metrics`` events among them."""
    length = (probe.end - probe.start) / 1e9
    if probe.start_unix_ns and probe.end_unix_ns:
        span = f"{_clock(probe.start_unix_ns)}-{_clock(probe.end_unix_ns)} UTC"
    else:
        span = f"{probe.start}-{probe.end} ns (CUPTI clock)"
    sources = ", ".join(probe.sources)
    refused = "".join(f"; {name} refused: {why}" for name, why in probe.refused.items())
    delivered = f"{probe.records} records delivered ({sources}{refused})"
    return f"{_who(probe)}: window {span} ({length:.2f} s), {delivered}"
