"""The ``cuptistream`` command: run, collector, trace, cat, validate, kinds, source-lines, summary,
export, plot, node, attach.

Every error a user can cause is printed as one line (``cuptistream: <problem>; <fix>``) with a
non-zero exit code, never as a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from cuptistream.analysis.commands import add_commands as add_view_commands
from cuptistream.attach.command import add_command as add_attach_command
from cuptistream.collector import blas_threads
from cuptistream.collector.trace_command import add_command as add_trace_command
from cuptistream.errors import UserError
from cuptistream.node.command import add_command as add_node_command
from cuptistream.recording.repair import add_command as add_repair_command


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"cuptistream: {message}; see `cuptistream --help`", file=sys.stderr)
        raise SystemExit(2)


ENV_CONFIG = "CUPTISTREAM_CONFIG"  # the config path when -c is not given
_REQUIRE_HEALTHY = (
    "exit 4 with one line, before starting, unless every sink is up within its connect_timeout "
    "(default: start at once, sinks connect in the background)"
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuptistream")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cuptistream", description="Continuous GPU telemetry on NVIDIA CUPTI.")
    parser.add_argument("--version", action="version", version=f"cuptistream {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser(
        "run",
        help="run a command with telemetry on in every Python process it starts",
        description="Run a command (`python script.py ...`, `python -m module`, `torchrun ...`, a shell "
        "script) with a probe in every Python process that initializes CUDA, this process collecting; "
        "the command's exit code is kept.",
    )
    run.add_argument("-c", "--config", help=f"YAML config (see configs/); default: ${ENV_CONFIG}")
    run.add_argument("-o", "--output", metavar="DIR", help="write the file sink's files to DIR instead")
    run.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    run.add_argument(
        "--report-json", metavar="FILE", help="write the shutdown report (counts, collector CPU) as JSON"
    )
    run.add_argument("--require-healthy", action="store_true", help=_REQUIRE_HEALTHY)
    run.add_argument("program", nargs=argparse.REMAINDER, help="[--] command args... (e.g. torchrun ...)")

    collector = commands.add_parser(
        "collector",
        help="serve probes on a Unix socket (one collector for every process on a host)",
        description="Run the pipeline and sinks of a config for every probe that connects to SOCKET "
        "(probes find it through CUPTISTREAM_COLLECTOR or probe.collector). Stops on SIGTERM or SIGINT, "
        "draining what the probes handed over.",
    )
    collector.add_argument(
        "-c", "--config", required=True, help="YAML config: its pipeline and sinks are used"
    )
    collector.add_argument("--socket", required=True, help="the Unix socket path to listen on")
    collector.add_argument(
        "--socket-mode", type=_socket_mode, default=0o600, metavar="MODE",
        help="the socket's permissions, octal (default 0600: this user's processes only; a node "
        "collector serving every user's jobs: 0666, or 0660 with the service's group)",
    )  # fmt: skip
    collector.add_argument(
        "--until-idle", action="store_true", help="exit once the probes that came have left"
    )
    collector.add_argument("--session-id", default=None, help=argparse.SUPPRESS)
    collector.add_argument("--report-json", metavar="FILE", help="write the shutdown report as JSON at exit")
    collector.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    collector.add_argument("--require-healthy", action="store_true", help=_REQUIRE_HEALTHY)
    _COMMANDS.update(add_trace_command(commands))  # trace (cuptistream/collector/trace_command.py)

    cat = commands.add_parser("cat", help="print events from files or Kafka as JSON Lines")
    cat.add_argument("path", help="a file-sink file or directory, or kafka://host:port/topic")
    cat.add_argument("--strict", action="store_true", help="exit 1 on a torn tail too (corruption always is)")

    validate = commands.add_parser("validate", help="check a config file")
    validate.add_argument("config", metavar="FILE", help="YAML config")

    commands.add_parser("kinds", help="list the activity kinds CUPTI supports on this machine")

    lines = commands.add_parser(
        "source-lines",
        help="sum recorded PC samples per CUDA source line",
        description="Map every sampled PC to its source line with the cubins the pc_sampling source "
        "wrote (cubin_dir); needs cubins built with -lineinfo and the NVIDIA driver library.",
    )
    lines.add_argument("path", help="a file-sink file or directory")
    lines.add_argument("--cubins", required=True, help="the pc_sampling source's cubin_dir")
    lines.add_argument("--top", type=int, default=20, help="lines to print (default 20)")
    _COMMANDS.update(add_view_commands(commands))  # summary, export, plot, compare (cuptistream/analysis)
    _COMMANDS.update(add_repair_command(commands))  # repair (cuptistream/recording/repair.py)
    _COMMANDS.update(add_node_command(commands))  # node install/uninstall/status (cuptistream/node/)
    _COMMANDS.update(add_attach_command(commands))  # attach PID (cuptistream/attach/)
    return parser


def _cmd_validate(args: argparse.Namespace) -> int:
    from cuptistream.config import load

    cfg = load(args.config, given_as="as `cuptistream validate FILE`")
    sources = ", ".join(s.name for s in cfg.sources) or "none"
    sinks = ", ".join(s.name for s in cfg.sinks)
    print(f"{args.config}: valid (sources: {sources}; sinks: {sinks})")
    return 0


def _cmd_cat(args: argparse.Namespace) -> int:
    from cuptistream.recording import jsonl

    out = sys.stdout.buffer
    if args.path.startswith("kafka://"):
        from cuptistream.recording.kafka_reader import iter_kafka_batches

        for batch in iter_kafka_batches(args.path):
            out.write(jsonl.encode_batch(batch))
        return 0

    from cuptistream.recording.reader import TornTailWarning, read

    reader = read(args.path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornTailWarning)  # reported below, once per file
        for batch in reader.batches():
            out.write(jsonl.encode_batch(batch))
    out.flush()
    for damage in reader.damage:
        print(f"cuptistream: {damage.describe()}; every intact frame was printed", file=sys.stderr)
    # A torn tail is what a killed writer leaves (an error only with --strict); corruption is not.
    return 1 if any(not d.torn for d in reader.damage) or (args.strict and reader.damage) else 0


def _cmd_kinds(args: argparse.Namespace) -> int:
    from cuptistream.cupti.kind_support import list_kinds

    kinds = list_kinds()
    print(f"{'kind':<26} {'supported':<9} {'event':<20} record")
    for kind in kinds:
        supported = "yes" if kind.supported else "no"
        note = f"  ({kind.note})" if kind.note else ""
        print(f"{kind.name:<26} {supported:<9} {kind.event:<20} {kind.record}{note}")
    return 0


def _cmd_source_lines(args: argparse.Namespace) -> int:
    from cuptistream.analysis.source_lines import format_report, source_report

    for line in format_report(source_report(args.path, args.cubins), args.top):
        print(line)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from cuptistream.run.program import parse_program, run_program

    config = _config_path(args, "run")
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    target = parse_program(program)
    return run_program(
        config, target, quiet=args.quiet, report_json=args.report_json, output=args.output,
        require_healthy=args.require_healthy,
    )  # fmt: skip


def _config_path(args: argparse.Namespace, command: str) -> str:
    path: str | None = args.config or os.environ.get(ENV_CONFIG)
    if not path:
        raise UserError(f"{command}: no config; pass -c cfg.yaml or set {ENV_CONFIG}")
    return path


def _socket_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"--socket-mode {text!r} is not an octal mode such as 0660")
    return mode


def _cmd_collector(args: argparse.Namespace) -> int:
    from cuptistream.collector.serve import serve

    return serve(
        _config_path(args, "collector"), args.socket, until_idle=args.until_idle, session_id=args.session_id,
        report_json=args.report_json, quiet=args.quiet, require_healthy=args.require_healthy,
        socket_mode=args.socket_mode,
    )  # fmt: skip


_COMMANDS = {
    "run": _cmd_run, "collector": _cmd_collector, "cat": _cmd_cat, "validate": _cmd_validate,
    "kinds": _cmd_kinds, "source-lines": _cmd_source_lines,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    blas_threads.single_threaded()  # before anything loads numpy; the user's program is not ours
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except UserError as error:
        print(f"cuptistream: {error}", file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:
        return 0  # `cuptistream cat ... | head`
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
