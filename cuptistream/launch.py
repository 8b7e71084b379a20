"""Runs a Python program in this process with a session active (``cuptistream run``).

In-process, so CUPTI sees the program's CUDA work and the session shares its lifetime: the session
starts before the program's first line and drains after its last, on a normal exit, an exception,
SIGINT or SIGTERM. The program's exit code is kept.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from cuptistream.errors import UserError
from cuptistream.runtime import Session


@dataclass(frozen=True)
class Program:
    mode: str  # "path", "module" or "code"
    target: str
    argv: list[str]  # what the program sees as sys.argv


def _is_python(executable: str) -> bool:
    return Path(executable).name.startswith("python")


def parse_program(command: list[str]) -> Program:
    """Accept ``python script.py ...``, ``python -m mod ...``, ``python -c code ...`` or ``script.py ...``.

    The program runs in this process, so under the interpreter cuptistream is installed in,
    whichever ``python`` the command names."""
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
    if not rest:
        raise UserError("run: python needs a script, -m module or -c code")
    head = rest[0]
    if head == "-m" and len(rest) >= 2:
        return Program("module", rest[1], [rest[1], *rest[2:]])
    if head == "-c" and len(rest) >= 2:
        return Program("code", rest[1], ["-c", *rest[2:]])
    if head.startswith("-"):
        raise UserError(f"run: python option {head!r} is not supported; pass a script, -m module or -c code")
    if not Path(head).is_file():
        raise UserError(f"run: script {head!r} not found")
    return Program("path", head, rest)


def _execute(program: Program) -> None:
    sys.argv = list(program.argv)
    if program.mode == "path":
        sys.path.insert(0, os.path.dirname(os.path.abspath(program.target)))
        runpy.run_path(program.target, run_name="__main__")
    elif program.mode == "module":
        sys.path.insert(0, os.getcwd())
        runpy.run_module(program.target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, "")
        exec(compile(program.target, "<string>", "exec"), {"__name__": "__main__"})


def _exit_code(error: SystemExit) -> int:
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_program(config: str, program: Program, *, quiet: bool = False) -> int:
    session = Session(config, quiet=quiet)
    os.environ["CUPTISTREAM_SESSION_ID"] = session.session_id
    session.start()
    try:
        _execute(program)
        code = 0
    except SystemExit as error:
        code = _exit_code(error)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        session.stop()
    return code
