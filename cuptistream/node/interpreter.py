"""Which Python a node install is for: asked of the interpreter itself, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cuptistream.errors import UserError
from cuptistream.probe.boot._cuptistream_node import SUPPORTED

# Runs under the target interpreter, whatever its version: no f-strings, standard library only.
_ASK = (
    "import json, site, sys, sysconfig; print(json.dumps({"
    "'implementation': sys.implementation.name, 'version': list(sys.version_info[:2]), "
    "'soabi': sysconfig.get_config_var('SOABI') or '', 'platform': sysconfig.get_platform(), "
    "'executable': sys.executable, 'prefix': sys.prefix, 'purelib': sysconfig.get_paths()['purelib'], "
    "'site_packages': site.getsitepackages()}))"
)


@dataclass(frozen=True)
class Interpreter:
    executable: str
    implementation: str  # "cpython"
    version: tuple[int, int]
    soabi: str  # "cpython-311-x86_64-linux-gnu": compiled packages must match it
    platform: str
    prefix: str
    purelib: str  # where a plain ``pip install`` puts pure-Python packages
    site_packages: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.implementation} {self.version[0]}.{self.version[1]} ({self.executable})"

    def supported(self) -> bool:
        return self.implementation == "cpython" and SUPPORTED[0] <= self.version <= SUPPORTED[1]


def inspect(python: str, command: str = "install") -> Interpreter:
    """Ask ``python`` (a path, or a name on PATH) what it is. Raises ``UserError``."""
    try:
        done = subprocess.run([python, "-I", "-c", _ASK], capture_output=True, text=True, timeout=60)
    except OSError as error:
        raise UserError(f"node {command}: cannot run {python} ({error.strerror}); pass --python with the "
                        f"environment's interpreter") from None  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UserError(f"node {command}: {python} did not answer in 60 s; pass --python with the "
                        f"environment's interpreter") from None  # fmt: skip
    try:
        facts = json.loads(done.stdout)
    except ValueError:
        why = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UserError(f"node {command}: {python} is not a Python this can inspect ({why}); pass "
                        f"--python with CPython {_supported_text()}") from None  # fmt: skip
    return Interpreter(
        executable=facts["executable"], implementation=facts["implementation"],
        version=(facts["version"][0], facts["version"][1]), soabi=facts["soabi"], platform=facts["platform"],
        prefix=facts["prefix"], purelib=facts["purelib"], site_packages=tuple(facts["site_packages"]),
    )  # fmt: skip


def this_interpreter() -> Interpreter:
    return inspect(sys.executable)


def _supported_text() -> str:
    (a, b), (c, d) = SUPPORTED
    return f"{a}.{b} to {c}.{d}"


def resolve(python: str | None, site_packages: str | None, *, command: str) -> tuple[Interpreter, Path]:
    """The interpreter and the site-packages folder a command is aimed at: ``--python`` (its
    ``purelib``), ``--site-packages`` (the interpreter of the virtualenv that holds it), or both
    (the folder must be one of the interpreter's). Raises ``UserError``."""
    if python is None and site_packages is None:
        raise UserError(f"node {command}: no environment given; pass --python PATH or --site-packages DIR")
    if python is None:
        assert site_packages is not None
        python = _venv_python(Path(site_packages), command)
    interpreter = inspect(python, command)
    if site_packages is None:
        return interpreter, Path(interpreter.purelib)
    folder = Path(site_packages).resolve()
    known = {Path(p).resolve() for p in (*interpreter.site_packages, interpreter.purelib)}
    if folder not in known:
        listed = ", ".join(sorted(str(p) for p in known))
        raise UserError(f"node {command}: {site_packages} is not a site-packages folder of "
                        f"{interpreter.executable} ({listed}); pass one of those")  # fmt: skip
    return interpreter, folder


def _venv_python(site_packages: Path, command: str) -> str:
    """The interpreter of the virtualenv whose site-packages this is."""
    if not site_packages.is_dir():
        raise UserError(f"node {command}: {site_packages} is not a folder; pass a site-packages folder")
    for parent in site_packages.resolve().parents:
        if (parent / "pyvenv.cfg").is_file():
            for name in ("python3", "python"):
                candidate = parent / "bin" / name
                if os.access(candidate, os.X_OK):
                    return str(candidate)
    raise UserError(f"node {command}: cannot tell which Python uses {site_packages} (no virtualenv "
                    f"above it); add --python PATH")  # fmt: skip


def require_supported(interpreter: Interpreter, command: str) -> None:
    if not interpreter.supported():
        raise UserError(f"node {command}: {interpreter.name} is not supported; the probe runs on CPython "
                        f"{_supported_text()}: install for one of those")  # fmt: skip
