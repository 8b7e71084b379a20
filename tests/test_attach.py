"""``cuptistream attach PID``: the probe loaded into a plain ``python`` loop that runs from a fresh
virtualenv with nothing of ours in it, from the node install's probe runtime, with real processes, a
real collector and real files. There is no GPU here: the activity source says so, as under ``run``.

Attaching needs ptrace: these tests skip, with the reason, where this user may not trace its own
children (Yama's ptrace_scope 3, or a seccomp profile that forbids ptrace).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream.attach import inject, ptrace
from cuptistream.attach.target import counts, inspect_target, ptrace_scope
from cuptistream.events import Error

CLI = [sys.executable, "-m", "cuptistream.cli"]
LOOP = "import time\nfor i in range(100000):\n    print('step', i, flush=True)\n    time.sleep(0.02)\n"


def _ptrace_refused() -> str | None:
    """Why this machine cannot attach to a child of ours, or None."""
    if not ptrace.supported():
        return "attaching before Python 3.14 uses ptrace on x86-64 Linux only"
    if ptrace_scope() == 3:
        return "kernel.yama.ptrace_scope is 3: no ptrace on this host"
    # From a sibling, as `cuptistream attach` runs beside its target: Yama's ptrace_scope 1 lets a
    # process trace its descendants only, which a check from this (the parent) process would pass.
    child = subprocess.Popen(["sleep", "5"])
    seize = (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.ptrace(0x4206, int(sys.argv[1]), None, None) != 0:  # PTRACE_SEIZE\n"
        "    print(os.strerror(ctypes.get_errno()))\n"
    )
    try:
        refused = subprocess.run(
            [sys.executable, "-c", seize, str(child.pid)], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    finally:
        child.kill()
        child.wait()
    return f"ptrace refused here: {refused}" if refused else None


_REFUSED = _ptrace_refused()
# Real processes traced and injected: seconds each.
pytestmark = [pytest.mark.skipif(_REFUSED is not None, reason=_REFUSED or ""), pytest.mark.slow]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def _python(version: str) -> str | None:
    """The real executable of CPython ``version`` here (not a launcher script such as pyenv's
    shims: the pid must be the interpreter's), or None."""
    for candidate in (
        f"python{version}",
        *sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")),
    ):
        found = shutil.which(str(candidate))
        if not found:
            continue
        ask = "import sys; print(sys.executable, '%d.%d' % sys.version_info[:2])"
        done = subprocess.run([found, "-c", ask], capture_output=True, text=True, env=_clean_env())
        words = done.stdout.split()
        if done.returncode == 0 and len(words) == 2 and words[1] == version:
            return words[0]
    return None


class Node:
    """The node install's probe runtime (prepared through a hooked venv), and a second, plain venv
    that has nothing of ours, not even the hook: its processes start without cuptistream."""

    def __init__(self, work: Path) -> None:
        self.root = work / "node-root"
        hooked = work / "hooked"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(hooked)], check=True)
        done = subprocess.run([*CLI, "node", "install", "--python", str(hooked / "bin" / "python"), "--root",
                               str(self.root)], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        plain = work / "plain"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(plain)], check=True)
        self.python = str(plain / "bin" / "python")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("attach"))


class Loop:
    """A plain ``python -c`` loop that prints its progress."""

    def __init__(self, python: str, code: str = LOOP, **env: str) -> None:
        # numpy, which the probe imports, starts OpenBLAS's thread pool in a process that had no
        # numpy; those idle threads would stay after the detach (the command says so).
        self.proc = subprocess.Popen([python, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=_clean_env(OPENBLAS_NUM_THREADS="1", **env))  # fmt: skip
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline()
        self.pid = self.proc.pid

    def step(self) -> int:
        assert self.proc.stdout is not None
        return int(self.proc.stdout.readline().split()[1])

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, stderr = self.proc.communicate(timeout=30)
        return stderr


@pytest.fixture
def loop(node: Node) -> Iterator[Loop]:
    running = Loop(node.python)
    yield running
    if running.proc.poll() is None:
        running.stop()


def _configs(tmp_path: Path, sock: Path) -> tuple[Path, Path]:
    probes = tmp_path / "probes.json"
    probes.write_text(json.dumps({"sources": [{"type": "activity"}], "probe": {"start": "process"},
                                  "sinks": [{"type": "file", "directory": str(tmp_path / "out")}]}))  # fmt: skip
    node_config = tmp_path / "node.yaml"
    node_config.write_text(f"collector: {sock}\nconfig: {probes}\nstart: process\n")
    return probes, node_config


def _attach(
    *args: str, node_config: Path | str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = _clean_env(CUPTISTREAM_NODE_CONFIG=str(node_config))
    return subprocess.run([*CLI, "attach", *args], capture_output=True, text=True, timeout=timeout, env=env)


def _recorded(out: Path, pid: int) -> tuple[list[Any], list[Error]]:
    batches = [b for b in cuptistream.read(out).batches() if b.resource.pid == pid]
    errors = [e for b in batches for e in b.events if isinstance(e, Error)]
    return batches, errors


def test_attach_for_a_window_records_the_process_and_leaves_it_as_it_was(
    node: Node, loop: Loop, tmp_path: Path
) -> None:
    sock = tmp_path / "c.sock"
    probes, node_config = _configs(tmp_path, sock)
    collector = subprocess.Popen([*CLI, "collector", "-c", str(probes), "--socket", str(sock)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert collector.stdout is not None and collector.stdout.readline().startswith("listening")
        before = counts(loop.pid)
        done = _attach(str(loop.pid), "--for", "2s", "--root", str(node.root), node_config=node_config)
        assert done.returncode == 0, done.stderr
        after = counts(loop.pid)
    finally:
        collector.send_signal(signal.SIGTERM)
        collector.communicate(timeout=60)
    assert after == before, done.stderr  # threads and fds
    assert f"attached to pid {loop.pid} (Python 3.{sys.version_info[1]}" in done.stderr
    assert "activity off: no NVIDIA driver" in done.stderr
    assert f"detached from pid {loop.pid}" in done.stderr
    assert loop.proc.poll() is None
    progress = loop.step()
    assert loop.step() == progress + 1  # it kept running, and runs on
    assert loop.stop() == ""  # not a word from us on the program's stderr
    batches, errors = _recorded(tmp_path / "out", loop.pid)
    assert batches
    assert batches[0].resource.pid == loop.pid
    messages = [(e.origin, e.message) for e in errors]
    assert any(o == "source:activity" and "no NVIDIA driver" in m for o, m in messages), messages
    assert any(o == "attach" and "CUDA graphs captured before the attach" in m for o, m in messages)


def test_attach_with_its_own_collector(node: Node, loop: Loop, tmp_path: Path) -> None:
    probes, _ = _configs(tmp_path, tmp_path / "unused.sock")
    out = tmp_path / "own"
    done = _attach(str(loop.pid), "--for", "1s", "-c", str(probes), "-o", str(out), "--root", str(node.root))
    assert done.returncode == 0, done.stderr
    assert f"detached from pid {loop.pid}" in done.stderr and "drained" in done.stderr
    assert loop.proc.poll() is None
    batches, errors = _recorded(out, loop.pid)
    assert batches and any("no NVIDIA driver" in e.message for e in errors)


def test_a_main_thread_that_runs_no_python_code_in_time_is_left_alone(node: Node, tmp_path: Path) -> None:
    sleeper = Loop(
        node.python, "print('ready', flush=True)\nimport time\ntime.sleep(4)\nprint('done', flush=True)\n"
    )
    probes, _ = _configs(tmp_path, tmp_path / "unused.sock")
    done = _attach(str(sleeper.pid), "--wait", "1", "-c", str(probes), "--root", str(node.root))
    assert done.returncode == 2 and "ran no Python code within 1 s" in done.stderr, done.stderr
    stdout, stderr = sleeper.proc.communicate(timeout=30)
    assert sleeper.proc.returncode == 0 and stdout == "done\n" and stderr == ""  # the queued call did nothing


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_the_pending_call_runs_in_other_pythons(version: str, tmp_path: Path) -> None:
    """The injection alone (the probe runtime is per ABI): a script queued into each CPython here."""
    python = _python(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    target = Loop(python)
    try:
        script = tmp_path / "script.py"
        script.write_text(f"import sys, threading\nopen({str(tmp_path / 'ran')!r}, 'w').write("
                          f"'%d.%d %s' % (sys.version_info[:2] + (threading.current_thread().name,)))\n")  # fmt: skip
        assert inject.queue(inspect_target(target.pid), str(script)) == "ptrace: Py_AddPendingCall"
        ends = time.monotonic() + 10
        while not (tmp_path / "ran").exists() and time.monotonic() < ends:
            time.sleep(0.05)
        assert (tmp_path / "ran").read_text() == f"{version} MainThread"
        progress = target.step()
        assert target.step() == progress + 1
    finally:
        assert target.stop() == ""


def _one_line(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("cuptistream: attach"), done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr


def test_errors_are_one_line_and_leave_the_process_untouched(node: Node, loop: Loop, tmp_path: Path) -> None:
    _one_line(_attach("999999999"), "no process with pid 999999999")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        _one_line(_attach(str(sleeper.pid)), "is not a Python process")
    finally:
        sleeper.kill()
        sleeper.wait()
    _one_line(_attach(str(loop.pid), "--root", str(tmp_path / "none")), "no probe runtime for cpython-3")
    missing = tmp_path / "absent.yaml"
    _one_line(_attach(str(loop.pid), "--root", str(node.root), node_config=missing), "no collector")
    _, node_config = _configs(tmp_path, tmp_path / "down.sock")
    _one_line(
        _attach(str(loop.pid), "--root", str(node.root), node_config=node_config), "no collector reachable"
    )
    _one_line(_attach(str(loop.pid), "--for", "soon"), "--for: expected a duration")
    old = _python("3.9")
    if old:
        older = Loop(old)
        try:
            _one_line(_attach(str(older.pid)), "cpython 3.9")
        finally:
            older.stop()
    assert loop.proc.poll() is None
    progress = loop.step()
    assert loop.step() == progress + 1 and loop.stop() == ""  # running, and not a word on its stderr


def test_another_users_process_is_refused_without_cap_sys_ptrace(loop: Loop) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the command as another user")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]  # fmt: skip
    readable = subprocess.run([*nobody, sys.executable, "-c", "import cuptistream.cli"], capture_output=True,
                              timeout=60, env=_clean_env())  # fmt: skip
    if readable.returncode != 0:  # e.g. a checkout under a 0700 temporary folder
        pytest.skip("uid 65534 cannot import cuptistream from this checkout")
    done = subprocess.run(
        [*nobody, *CLI, "attach", str(loop.pid)], capture_output=True, text=True, timeout=60, env=_clean_env(),
    )  # fmt: skip
    _one_line(done, f"pid {loop.pid} belongs to uid 0, not you (uid 65534)")
