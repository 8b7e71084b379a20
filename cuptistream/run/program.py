"""``cuptistream run``: any command, every Python process in it probed, this process collecting.

This process checks the config and opens the sinks (a bad value, a missing secret, an unusable
directory fail before the program starts; sinks connect in the background, or first with
``require_healthy``: ``--require-healthy``), listens on a private Unix socket, and starts the
command with ``cuptistream/probe/boot`` on ``PYTHONPATH``: every Python process of the tree (the
program, its subprocesses, spawned and forked workers, what a shell script or ``torchrun`` starts)
arms a probe that starts when it first initializes CUDA and feeds this collector.
``python``/``python3`` and ``*.py`` run under the interpreter cuptistream is installed in. SIGINT
and SIGTERM are passed on to the command. When it exits, however it exits (a SIGKILL too), the
collector waits up to ``shutdown_deadline`` for the probes still connected, drains every buffer they
handed over, then the pipeline. The command's exit status is kept (128+N for a command killed by
signal N).
"""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from cuptistream.channel.sockets import ENV_COLLECTOR
from cuptistream.collector import blas_threads, memory
from cuptistream.collector.collector import Collector
from cuptistream.collector.process import write_config
from cuptistream.collector.status import StatusLine
from cuptistream.config import Config, load
from cuptistream.errors import UserError
from cuptistream.probe.bootstrap import BOOT_DIR, ENV_PROBE_CONFIG, ENV_PROBE_START, ENV_QUIET


@dataclass(frozen=True)
class Program:
    argv: list[str]  # the command as it is executed
    native_cuda: bool = False  # a compiled CUDA program: no Python process to probe in it


_PYTHON_NAMES = ("python", "python3")  # run under the interpreter cuptistream is installed in


def parse_program(command: list[str]) -> Program:
    """Accept any command: ``python [options] script.py ...``, ``python -m mod``, ``script.py``,
    ``torchrun ...``, a shell script. Every Python process it starts is probed."""
    if not command:
        raise UserError("run: no program given; use `cuptistream run -c cfg.yaml -- python script.py`")
    head = command[0]
    if head.endswith(".py") and not os.access(head, os.X_OK):
        command = [sys.executable, *command]
    elif head in _PYTHON_NAMES:
        command = [sys.executable, *command[1:]]
    if Path(command[0]).resolve() == Path(sys.executable).resolve():
        _check_python_arguments(command[1:])
        return Program(command)
    found = shutil.which(command[0])
    if found is None:
        raise UserError(f"run: command {command[0]!r} not found; check the name or give its path")
    return Program(command, native_cuda=native_cuda_program(found))


_TAKES_VALUE = ("-X", "-W", "--check-hash-based-pycs")  # interpreter options with a separate value


def _check_python_arguments(rest: list[str]) -> None:
    options = 0
    while options < len(rest) and rest[options].startswith("-") and rest[options] not in ("-m", "-c", "-"):
        options += 2 if rest[options] in _TAKES_VALUE else 1  # flags such as -u, -O, -X dev
    if options >= len(rest):
        raise UserError("run: python needs a script, -m module or -c code")
    head = rest[options]
    if head in ("-m", "-c") and options + 1 >= len(rest):
        raise UserError(f"run: python {head} needs an argument")
    if head not in ("-m", "-c", "-") and not Path(head).is_file():
        raise UserError(f"run: script {head!r} not found")


_ELF = b"\x7fELF"
_CUDA_LIBRARIES = (b"libcudart.so", b"libcuda.so")  # linked, or dlopened by a static cudart
_SCAN_LIMIT = 256 * 1024 * 1024


def native_cuda_program(path: str) -> bool:
    """Whether ``path`` is a compiled program that uses CUDA itself (an ELF file naming the CUDA
    runtime or driver library) rather than a Python interpreter, a script or a launcher."""
    try:
        with open(path, "rb") as file:
            if file.read(4) != _ELF or os.fstat(file.fileno()).st_size > _SCAN_LIMIT:
                return False
            # Mapped, not read: a large binary is searched without a copy of it in memory.
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                python = data.find(b"Py_Initialize") >= 0
                return not python and any(data.find(name) >= 0 for name in _CUDA_LIBRARIES)
    except (OSError, ValueError):
        return False


def probe_start(cfg: Config) -> str:
    """``probe.start`` with ``auto`` resolved: wait for CUDA only where a source traces it."""
    if cfg.probe.start != "auto":
        return cfg.probe.start
    sources = [source_class for _, source_class in cfg.enabled_sources()]
    return "cuda" if any(source.traces_cuda for source in sources) else "process"


def _environment(address: str, config_path: str, session_id: str, cfg: Config, quiet: bool) -> dict[str, str]:
    """The program's environment: every Python process in it (children, workers, what a shell
    script starts) loads ``boot/sitecustomize.py`` and finds the collector and config here."""
    env = dict(os.environ)
    blas_threads.as_user_had_it(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOT_DIR), env.get("PYTHONPATH", "")) if p)
    env[ENV_COLLECTOR] = address
    env[ENV_PROBE_CONFIG] = config_path
    env[ENV_PROBE_START] = probe_start(cfg)
    env["CUPTISTREAM_SESSION_ID"] = session_id
    if quiet:
        env[ENV_QUIET] = "1"
    else:
        env.pop(ENV_QUIET, None)
    return env


def probe_environment(
    address: str, config: str | Path, *, session_id: str | None = None, quiet: bool = False
) -> dict[str, str]:
    """The environment ``run`` gives its command, pointed at a collector already listening at
    ``address`` (a node ``cuptistream collector --socket``): for a launcher that starts the program
    itself (``torchrun``, a scheduler's wrapper). Every Python process started with it arms a probe
    that starts as ``config``'s ``probe.start`` says and feeds that collector."""
    path = str(Path(config).resolve())
    cfg = load(path)
    return _environment(address, path, session_id or uuid.uuid4().hex[:16], cfg, quiet)


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
    require_healthy: bool = False,
) -> int:
    cfg = load(config)
    if output:
        use_output(cfg, output)
    # Raises ConfigError, SinkUnavailableError before the program starts (with require_healthy:
    # also a sink not up within its connect_timeout).
    memory.limit_malloc_arenas()  # this process is the collector: before its threads start
    collector = Collector(cfg, require_healthy=require_healthy).start()
    workdir = tempfile.mkdtemp(prefix="cuptistream-")
    try:
        address = collector.listen(
            os.path.join(workdir, "collector.sock"), role="run", label=_label(program.argv)
        )
        env = _environment(address, write_config(cfg, workdir), collector.session_id, cfg, quiet)
        if program.native_cuda and not quiet:
            _note_native(program.argv[0])
        status = StatusLine.for_stream(collector, sys.stderr, quiet=quiet)  # None unless a terminal
        signalled: list[float] = []  # when SIGINT/SIGTERM first came: the shutdown deadline starts
        try:
            code = _run_child(program.argv, env, signalled)
        finally:
            if status is not None:
                status.stop()  # erased before the shutdown summary
        began = signalled[0] if signalled else None  # else the program's exit, now
        summary = None if quiet else "session"
        report = collector.conclude(report_json=report_json, summary=summary, began=began)
        if report is not None and report.probes == 0 and not quiet and not program.native_cuda:
            print(f"cuptistream: no Python process of `{program.argv[0]}` initialized CUDA, so nothing "
                  "was probed; if it reaches CUDA other than through torch, cuda.bindings, cuda.core or "
                  "cupy, set `probe: {start: process}`", file=sys.stderr)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


def _label(argv: list[str]) -> str:
    """The command as ``cuptistream trace`` lists it: short, one line."""
    words = [os.path.basename(argv[0]), *argv[1:]]
    text = " ".join(words).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def _note_native(executable: str) -> None:
    print(f"cuptistream: {executable} is a compiled CUDA program; only Python processes are "
          "probed, so its own GPU work is not recorded (docs/multiprocess.md: non-Python programs)",
          file=sys.stderr)  # fmt: skip


def _run_child(argv: list[str], env: dict[str, str], signalled: list[float]) -> int:
    """Run the program, passing SIGINT and SIGTERM on; the first one's ``time.monotonic()`` is
    appended to ``signalled``."""
    try:
        child = subprocess.Popen(argv, env=env)
    except OSError as error:
        raise UserError(f"run: cannot start {argv[0]}: {error.strerror}") from None

    def forward(signum: int, frame: FrameType | None) -> None:
        if not signalled:
            signalled.append(time.monotonic())
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - returncode if returncode < 0 else returncode
