"""What the process to attach to is, and whether this user may attach to it: each problem one line
with its fix, before anything touches the process."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from cuptistream.attach import elf
from cuptistream.errors import UserError
from cuptistream.node.interpreter import Interpreter, inspect

_CAP_SYS_PTRACE = 19
_PYTHON_FILE = re.compile(r"(^|/)(python[0-9.]*[a-z]*|libpython[0-9.]+[a-z]*\.so[0-9.]*)$")
# What the ptrace path calls in the target (``inject``): exported by every CPython 3.10 to 3.13.
PYTHON_SYMBOLS = {"Py_AddPendingCall", "PyRun_SimpleString"}


@dataclass(frozen=True)
class Target:
    pid: int
    uid: int
    gid: int
    interpreter: Interpreter
    python_files: tuple[str, ...]  # the interpreter's mapped files (its executable, a libpython)
    threads: int
    fds: int


def counts(pid: int) -> tuple[int, int]:
    """``pid``'s threads and open file descriptors now."""
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def inspect_target(pid: int) -> Target:
    """Raises ``UserError``: no such process, not this user's to attach to, not a CPython."""
    if pid <= 0 or not os.path.isdir(f"/proc/{pid}"):
        raise UserError(f"attach: no process with pid {pid}; check the pid (`ps -ef | grep python`)")
    if pid == os.getpid():
        raise UserError("attach: that is this command's own pid; give the pid of the program to observe")
    try:
        status = _status(pid)
        uid, gid = int(status["Uid"].split()[1]), int(status["Gid"].split()[1])
    except (OSError, KeyError, ValueError, IndexError):
        raise UserError(f"attach: no process with pid {pid} (it has exited)") from None
    check_permission(pid, uid)
    try:
        files = tuple(dict.fromkeys(m.path for m in elf.mappings(pid) if _PYTHON_FILE.search(m.path)))
        threads, fds = counts(pid)
    except PermissionError:
        raise UserError(_permission_text(pid, uid)) from None
    except OSError:
        raise UserError(f"attach: no process with pid {pid} (it has exited)") from None
    if not files:
        name = _name(pid)
        raise UserError(f"attach: pid {pid} ({name}) is not a Python process (no CPython in its memory); "
                        f"give the pid of a python process")  # fmt: skip
    return Target(pid, uid, gid, _interpreter(pid, files), files, threads, fds)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as file:
        return dict(line.split(":", 1) for line in file if ":" in line)


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as file:
            return file.read().strip()
    except OSError:
        return "?"


def _interpreter(pid: int, files: tuple[str, ...]) -> Interpreter:
    """Ask the process's own executable (as its mount namespace sees it) what Python it is."""
    try:
        executable = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        raise UserError(
            f"attach: cannot read /proc/{pid}/exe; attach as the process's user or root"
        ) from None
    same_root = os.path.samefile(f"/proc/{pid}/root", "/")
    runnable = executable if same_root else elf.readable_path(pid, executable)
    try:
        return inspect(runnable, command="attach")
    except UserError as error:
        raise UserError(f"attach: cannot tell which Python pid {pid} runs ({error}); only CPython can be "
                        f"attached to") from None  # fmt: skip


def ptrace_scope() -> int | None:
    """Yama's ``kernel.yama.ptrace_scope`` (None: no Yama)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="utf-8") as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return None


def has_cap_sys_ptrace() -> bool:
    try:
        effective = int(_status(os.getpid())["CapEff"].strip(), 16)
    except (OSError, KeyError, ValueError):
        return False
    return bool(effective >> _CAP_SYS_PTRACE & 1)


def check_permission(pid: int, uid: int) -> None:
    """Refuse, in one line with the fix, what the kernel would refuse: another user's process
    without CAP_SYS_PTRACE, or what Yama's ptrace_scope forbids."""
    privileged = has_cap_sys_ptrace()
    if uid != os.geteuid() and not privileged:
        raise UserError(f"attach: pid {pid} belongs to uid {uid}, not you (uid {os.geteuid()}); attach as "
                        f"that user, or as root (CAP_SYS_PTRACE)")  # fmt: skip
    scope = ptrace_scope()
    if scope == 3:
        raise UserError("attach: this host forbids ptrace (kernel.yama.ptrace_scope = 3, until reboot); "
                        "start the program under `cuptistream run` or the node hook instead")  # fmt: skip
    if scope == 2 and not privileged:
        raise UserError("attach: kernel.yama.ptrace_scope = 2 allows only CAP_SYS_PTRACE to attach; run as "
                        "root, or `sysctl kernel.yama.ptrace_scope=1` with the process's user")  # fmt: skip


def _permission_text(pid: int, uid: int) -> str:
    scope = ptrace_scope()
    why = f"kernel.yama.ptrace_scope = {scope}" if scope else "the kernel refused"
    fix = ("run as root or with CAP_SYS_PTRACE (a container: --cap-add SYS_PTRACE, or the pod's "
           "securityContext.capabilities.add: [SYS_PTRACE])")  # fmt: skip
    if scope == 1:
        fix += ", or `sysctl kernel.yama.ptrace_scope=0`"
    return f"attach: not allowed to attach to pid {pid} (uid {uid}): {why}; {fix}"


def permission_error(pid: int, uid: int) -> UserError:
    """The one line for a ptrace the kernel refused (EPERM)."""
    return UserError(_permission_text(pid, uid))
