"""``cuptistream attach PID [--for 30s]``: the probe loaded into a running Python process, a window
recorded, and with ``--for`` the probe stopped and CUPTI finalized again.

The probe feeds the node collector (``/etc/cuptistream/node.yaml``), or with ``-c cfg.yaml`` a
collector this command runs, as ``cuptistream run`` does. Every problem is one line and leaves the
process as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuptistream.attach import inject
from cuptistream.attach.target import Target, counts, inspect_target
from cuptistream.config import Config, load
from cuptistream.config.units import parse_duration
from cuptistream.errors import UserError
from cuptistream.node import health, runtime
from cuptistream.probe.boot._cuptistream_node import SUPPORTED

LOADER = Path(__file__).resolve().parent / "loader.py"
_POLL_S = 0.05


def add_command(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register ``attach`` on the CLI's subcommands; returns its handler by name."""
    attach = commands.add_parser(
        "attach",
        help="load the probe into a running Python process and record a window",
        description="Load the probe into a running CPython 3.10-3.14 process started without "
        "cuptistream (sys.remote_exec on 3.14, ptrace before), feeding the node collector or, with -c, "
        "a collector run here. With --for, the probe stops after that long and CUPTI is finalized: the "
        "process runs on as it was. Needs the node install's probe runtime for the process's Python.",
    )
    attach.add_argument("pid", type=int, help="the process to attach to")
    attach.add_argument(
        "--for", dest="window", metavar="DURATION",
        help="detach after this long (e.g. 30s, 2min); default: stay attached until the process exits "
        "(with -c: until Ctrl-C)",
    )  # fmt: skip
    attach.add_argument("-c", "--config", help="collect here with this config (default: the node collector)")
    attach.add_argument("-o", "--output", metavar="DIR", help="with -c: the file sink's directory")
    attach.add_argument(
        "--root", type=Path, default=runtime.DEFAULT_ROOT,
        help=f"where the node install put the probe runtimes (default {runtime.DEFAULT_ROOT})",
    )  # fmt: skip
    attach.add_argument(
        "--wait", type=float, default=10.0, metavar="SECONDS",
        help="how long the process's main thread may take to reach Python code (default 10)",
    )  # fmt: skip
    attach.add_argument("--quiet", action="store_true", help="only errors")
    return {"attach": run}


@dataclass
class _Aim:
    """Where the probe sends its data, and the config it takes its sources from."""

    collector: str
    config: str
    session_id: str = ""
    finish: Callable[[], None] = lambda: None  # drains a collector this command runs


def run(args: argparse.Namespace) -> int:
    window = _window(args.window)
    target = inspect_target(args.pid)
    interpreter = target.interpreter
    if not interpreter.supported():
        low, high = (f"{v[0]}.{v[1]}" for v in SUPPORTED)
        raise UserError(f"attach: pid {target.pid} runs {interpreter.name}, which is not supported; the "
                        f"probe runs in CPython {low} to {high}")  # fmt: skip
    folder_runtime = runtime.runtime_dir(args.root.resolve(), interpreter)
    if not (folder_runtime / "cuptistream").is_dir():
        raise UserError(f"attach: no probe runtime for {interpreter.soabi} in {args.root}; run `cuptistream "
                        f"node install --python {interpreter.executable}` (or pass --root)")  # fmt: skip
    say = (lambda text: None) if args.quiet else (lambda text: print(f"cuptistream: {text}", file=sys.stderr))
    folder = tempfile.mkdtemp(prefix="cuptistream-attach-")
    aim: _Aim | None = None
    try:
        aim = _own_collector(args, target, folder) if args.config else _node_collector()
        stay = window is None and not args.config  # the node collector outlives this command
        params = {
            "folder": folder, "runtime": str(folder_runtime), "collector": aim.collector,
            "config": aim.config, "session_id": aim.session_id, "for_s": window, "stay": stay,
        }  # fmt: skip
        script = _write_loader(folder, params, target)
        how = inject.queue(target, script)
        started = _wait_started(folder, target, args.wait)
        failed = "".join(f"; {name} off: {why}" for name, why in started.get("failed", {}).items())
        version = "{}.{}".format(*interpreter.version)
        say(f"attached to pid {target.pid} (Python {version}, {how}): sources "
            f"{', '.join(started.get('sources', [])) or 'none'}{failed}")  # fmt: skip
        if stay:
            say(f"the probe stays in pid {target.pid} until it exits")
            return 0
        detached = _wait_detached(folder, target, window, say)
        if detached is not None:
            threads, fds = _settled(target)
            # numpy (which the probe imports) starts its BLAS thread pool once; those idle threads stay.
            loaded = started.get("numpy_loaded") and threads > target.threads
            blas = " (numpy's BLAS threads: the probe loaded numpy)" if loaded else ""
            say(f"detached from pid {target.pid}: {detached.get('cupti', '')}; threads {target.threads} -> "
                f"{threads}{blas}, fds {target.fds} -> {fds}")  # fmt: skip
        return 0
    finally:
        if aim is not None:
            aim.finish()
        shutil.rmtree(folder, ignore_errors=True)


def _window(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise UserError(f"attach: --for: {error}") from None
    if seconds <= 0:
        raise UserError("attach: --for must be longer than 0s")
    return seconds


def _node_collector() -> _Aim:
    node = health.check()
    fix = "start the node collector (`cuptistream node status` says what is wrong) or pass -c cfg.yaml"
    if not node.path or not node.configured:
        where = node.path or "CUPTISTREAM_NODE_CONFIG is empty"
        raise UserError(f"attach: no collector: no node config ({where}); {fix}")
    if not node.values:
        raise UserError(f"attach: no collector: {'; '.join(node.problems)}")
    if not node.reachable:
        raise UserError(f"attach: no collector reachable at {node.values['collector']}; {fix}")
    return _Aim(node.values["collector"], node.values["config"])


def _own_collector(args: argparse.Namespace, target: Target, folder: str) -> _Aim:
    """A collector in this process, as ``cuptistream run`` has: drained when the window ends."""
    from cuptistream.collector import memory
    from cuptistream.collector.collector import Collector
    from cuptistream.collector.process import write_config
    from cuptistream.run.program import use_output

    cfg: Config = load(args.config)
    if args.output:
        use_output(cfg, args.output)
    memory.limit_malloc_arenas()
    collector = Collector(cfg).start()
    mode = 0o600 if target.uid == os.geteuid() else 0o666  # root attaching to another user's process
    socket_path = os.path.join(folder, "collector.sock")
    address = collector.listen(socket_path, role="attach", label=f"pid {target.pid}", mode=mode)

    def finish() -> None:
        collector.conclude(summary=None if args.quiet else "attach")

    return _Aim(address, write_config(cfg, folder), collector.session_id, finish)


def _write_loader(folder: str, params: dict[str, Any], target: Target) -> str:
    """The loader with its parameters, and the ``go`` file it claims; readable by the target's user."""
    script = os.path.join(folder, "loader.py")
    text = LOADER.read_text(encoding="utf-8")
    text += f"\n_main(json.loads({json.dumps(params)!r}), _BUFFER)  # noqa: F821\n"
    Path(script).write_text(text, encoding="utf-8")
    Path(folder, "go").touch()
    if target.uid != os.geteuid():  # root attaching to another user's process: it reads and writes here
        for path in (folder, *(os.path.join(folder, name) for name in os.listdir(folder))):
            os.chown(path, target.uid, target.gid)
    return script


def _statuses(folder: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(folder, "status"), encoding="utf-8") as file:
            return [json.loads(line) for line in file if line.endswith("\n")]
    except (OSError, ValueError):
        return []


def _alive(pid: int) -> bool:
    return os.path.isdir(f"/proc/{pid}/task")


def _wait_started(folder: str, target: Target, wait_s: float) -> dict[str, Any]:
    ends = time.monotonic() + wait_s
    claimed = False
    while True:
        for status in _statuses(folder):
            if status["state"] == "started":
                return status
            if status["state"] == "failed":
                raise UserError(f"attach: the probe did not start in pid {target.pid}: {status['error']}; "
                                f"the process runs on as it was")  # fmt: skip
        if not _alive(target.pid):
            raise UserError(f"attach: pid {target.pid} exited before the probe started")
        claimed = claimed or not os.path.exists(os.path.join(folder, "go"))
        if time.monotonic() > ends:
            if claimed:  # the loader runs: starting the probe (imports, CUPTI) takes its time
                ends += wait_s
                continue
            try:
                os.rename(os.path.join(folder, "go"), os.path.join(folder, "cancelled"))
            except OSError:
                continue  # claimed just now
            raise UserError(f"attach: pid {target.pid}'s main thread ran no Python code within {wait_s:g} s "
                            f"(blocked in a C call or a sleep); nothing was loaded, try again or raise "
                            f"--wait")  # fmt: skip
        time.sleep(_POLL_S)


def _wait_detached(
    folder: str, target: Target, window: float | None, say: Callable[[str], None]
) -> dict[str, Any] | None:
    """Until the loader reports the detach; Ctrl-C (or SIGTERM) ends the window early. None when
    the process exited meanwhile (its probe handed over at exit)."""
    stop = os.path.join(folder, "stop")
    began = time.monotonic()
    deadline: float | None = None if window is None else began + window + 60.0
    while True:
        try:
            for status in _statuses(folder):
                if status["state"] == "detached":
                    return status
            if not _alive(target.pid):
                say(f"pid {target.pid} exited during the window; its probe handed over at its exit")
                return None
            if deadline is not None and time.monotonic() > deadline:
                raise UserError(f"attach: pid {target.pid} did not report its detach within a minute of the "
                                f"window's end; its probe may still run")  # fmt: skip
            time.sleep(_POLL_S)
        except KeyboardInterrupt:
            Path(stop).touch()
            say(f"stopping the window in pid {target.pid}")
            deadline = time.monotonic() + 60.0


def _settled(target: Target, wait_s: float = 2.0) -> tuple[int, int]:
    """The process's threads and fds once the loader's thread has ended (it reports first)."""
    ends = time.monotonic() + wait_s
    threads, fds = counts(target.pid)
    while threads > target.threads and time.monotonic() < ends:
        time.sleep(_POLL_S)
        threads, fds = counts(target.pid)
    return threads, fds
