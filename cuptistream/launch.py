"""``cuptistream run``: the program in its own process, probed, with this process as its collector.

This process opens the sinks (so an unusable sink fails before the program starts), listens on a
private Unix socket, and starts the program under the same interpreter with the probe injected
(``cuptistream/probe/boot`` on ``PYTHONPATH`` runs the probe before the program's first line).
SIGINT and SIGTERM are passed on to the program. When the program exits, however it exits (a
SIGKILL too), the collector drains every buffer the probe handed over, then the pipeline. The
program's exit status is kept (128+N for a program killed by signal N).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from cuptistream.channel.sockets import ENV_COLLECTOR
from cuptistream.collector.collector import Collector
from cuptistream.collector.process import write_config
from cuptistream.config import Config, load
from cuptistream.errors import UserError
from cuptistream.probe.bootstrap import BOOT_DIR, ENV_PROBE_CONFIG, ENV_QUIET


@dataclass(frozen=True)
class Program:
    argv: list[str]  # the interpreter's arguments: script and args, -m module ..., -c code ...


def _is_python(executable: str) -> bool:
    return Path(executable).name.startswith("python")


def parse_program(command: list[str]) -> Program:
    """Accept ``python [options] script.py ...``, ``python -m mod ...``, ``python -c code ...`` or
    ``script.py ...``. The program runs under the interpreter cuptistream is installed in."""
    if not command:
        raise UserError("run: no program given; use `cuptistream run -c cfg.yaml -- python script.py`")
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    if not _is_python(command[0]):
        raise UserError(
            f"run: {command[0]!r} is not a Python interpreter; cuptistream run takes "
            "`python script.py ...` or `python -m module ...`"
        )
    rest = command[1:]
    options = 0
    while options < len(rest) and rest[options].startswith("-") and rest[options] not in ("-m", "-c", "-"):
        options += 1  # interpreter flags such as -u, -O, -X dev
    if options >= len(rest):
        raise UserError("run: python needs a script, -m module or -c code")
    head = rest[options]
    if head in ("-m", "-c") and options + 1 >= len(rest):
        raise UserError(f"run: python {head} needs an argument")
    if head not in ("-m", "-c", "-") and not Path(head).is_file():
        raise UserError(f"run: script {head!r} not found")
    return Program(rest)


def _environment(address: str, config_path: str, session_id: str, quiet: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOT_DIR), env.get("PYTHONPATH", "")) if p)
    env[ENV_COLLECTOR] = address
    env[ENV_PROBE_CONFIG] = config_path
    env["CUPTISTREAM_SESSION_ID"] = session_id
    if quiet:
        env[ENV_QUIET] = "1"
    return env


def use_output(cfg: Config, directory: str) -> None:
    """``run -o DIR``: every enabled file sink writes to ``directory``."""
    file_sinks = [sink for sink in cfg.sinks if sink.type == "file" and sink.enabled]
    if not file_sinks:
        raise UserError("run: -o/--output needs a file sink in the config; add one or leave -o out")
    for sink in file_sinks:
        sink.directory = directory  # type: ignore[attr-defined]


def run_program(
    config: str,
    program: Program,
    *,
    quiet: bool = False,
    report_json: str | None = None,
    output: str | None = None,
) -> int:
    cfg = load(config)
    if output:
        use_output(cfg, output)
    collector = Collector(cfg).start()  # raises SinkUnavailableError etc. before the program starts
    workdir = tempfile.mkdtemp(prefix="cuptistream-")
    try:
        address = collector.listen(os.path.join(workdir, "collector.sock"))
        env = _environment(address, write_config(cfg, workdir), collector.session_id, quiet)
        code = _run_child([sys.executable, *program.argv], env)
        collector.conclude(report_json=report_json, summary=None if quiet else "session")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


def _run_child(argv: list[str], env: dict[str, str]) -> int:
    try:
        child = subprocess.Popen(argv, env=env)
    except OSError as error:
        raise UserError(f"run: cannot start {argv[0]}: {error.strerror}") from None

    def forward(signum: int, frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - returncode if returncode < 0 else returncode
