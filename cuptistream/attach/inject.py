"""Having a running CPython's main thread execute a file at its next safe point (between two
bytecodes, with the GIL, as a signal handler runs):

- CPython 3.14 and later: ``sys.remote_exec`` (PEP 768), asked of the target's own interpreter.
- CPython 3.10 to 3.13 on x86-64 Linux: ``ptrace``. One thread is stopped for two calls: libc's
  ``mmap`` for a page that holds the code's text, and ``Py_AddPendingCall(PyRun_SimpleString,
  page)``, which queues the text for the main thread. Neither takes a lock the interrupted code could
  hold, and nothing Python runs on the stopped thread: the pending call runs later where the
  interpreter allows it. The thread is let go at once.

The queued text only executes the file in a namespace of its own and swallows every exception (a
failing pending call would raise ``SystemError`` in the program's main thread).
"""

from __future__ import annotations

import errno
import mmap
import os
import subprocess

from cuptistream.attach import elf, ptrace
from cuptistream.attach.target import PYTHON_SYMBOLS, Target, permission_error
from cuptistream.errors import UserError

_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_PRIVATE_ANONYMOUS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
_MAP_FAILED = 2**64 - 1


def runner_text(path: str, buffer: tuple[int, int] | None) -> str:
    """What the target runs: ``path`` executed in a fresh namespace, every exception swallowed."""
    return (
        "try:\n"
        f"    exec(compile(open({path!r}, 'rb').read(), {path!r}, 'exec'), "
        f"{{'__name__': '_cuptistream_attach', '_BUFFER': {buffer!r}}})\n"
        "except BaseException:\n"
        "    pass\n"
    )


def queue(target: Target, script: str) -> str:
    """Queue ``script`` (a file the target can read) for the target's main thread; how, in words.
    Raises ``UserError``."""
    if target.interpreter.version >= (3, 14):
        return _remote_exec(target, script)
    return _pending_call(target, script)


def _remote_exec(target: Target, script: str) -> str:
    runner = os.path.join(os.path.dirname(script), "runner.py")
    with open(runner, "w", encoding="utf-8") as file:
        file.write(runner_text(script, None))
    os.chmod(runner, 0o644)
    code = f"import sys; sys.remote_exec({target.pid}, {runner!r})"
    done = subprocess.run(
        [target.interpreter.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        if "PermissionError" in why or "Operation not permitted" in why:
            raise permission_error(target.pid, target.uid)
        raise UserError(f"attach: sys.remote_exec into pid {target.pid} failed: {why}; the program may "
                        f"have turned remote debugging off (-X disable_remote_debug, "
                        f"PYTHON_DISABLE_REMOTE_DEBUG)")  # fmt: skip
    return "sys.remote_exec"


def _pending_call(target: Target, script: str) -> str:
    version = "{}.{}".format(*target.interpreter.version)
    if not ptrace.supported():
        raise UserError(f"attach: pid {target.pid} runs Python {version}; before 3.14 attaching uses ptrace, "
                        f"which this build supports on x86-64 Linux only; run the program on Python 3.14+ "
                        f"or under `cuptistream run`")  # fmt: skip
    libraries = [m.path for m in elf.mappings(target.pid) if "/libc" in m.path or "libc.so" in m.path]
    files = [*target.python_files, *dict.fromkeys(libraries)]
    symbols = elf.find_symbols(target.pid, {*PYTHON_SYMBOLS, "mmap"}, files)
    missing = sorted({*PYTHON_SYMBOLS, "mmap"} - set(symbols))
    if missing:
        raise UserError(f"attach: pid {target.pid} (Python {version}) does not export {', '.join(missing)}; "
                        f"it cannot be attached to: start it under `cuptistream run`")  # fmt: skip
    size = mmap.PAGESIZE
    try:
        with ptrace.Tracee(target.pid) as thread:
            page = thread.call(symbols["mmap"], 0, size, _PROT_RW, _MAP_PRIVATE_ANONYMOUS, -1, 0)
            if page == _MAP_FAILED or page == 0:
                raise UserError(f"attach: pid {target.pid} could not map a page for the attach; nothing was "
                                f"changed")  # fmt: skip
            text = runner_text(script, (page, size)).encode() + b"\0"
            if len(text) > size:
                raise UserError(f"attach: the path {script} is too long; set TMPDIR to a shorter folder")
            thread.write(page, text)
            queued = thread.call(symbols["Py_AddPendingCall"], symbols["PyRun_SimpleString"], page)
            if queued != 0:
                raise UserError(f"attach: pid {target.pid}'s queue of pending calls is full; try again")
    except ptrace.PtraceError as error:
        if error.errno == errno.EPERM:
            raise permission_error(target.pid, target.uid) from None
        if error.errno == errno.ESRCH:
            raise UserError(f"attach: pid {target.pid} exited") from None
        raise UserError(f"attach: ptrace on pid {target.pid} failed: {error.strerror}; the process "
                        f"runs on as it was") from None  # fmt: skip
    except TimeoutError as error:
        raise UserError(
            f"attach: pid {target.pid}: {error}; the process runs on as it was, try again"
        ) from None
    return "ptrace: Py_AddPendingCall"
