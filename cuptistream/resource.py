"""The batch envelope's resource: who produced the data (host, process, job)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Mapping

from cuptistream.events import Resource


def _process_name() -> str:
    try:
        with open(f"/proc/{os.getpid()}/comm", encoding="utf-8") as comm:
            return comm.read().strip()
    except OSError:
        return os.path.basename(sys.executable)


def _command_line() -> list[str]:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
            return [part.decode(errors="replace") for part in cmdline.read().split(b"\0") if part]
    except OSError:
        return [sys.executable, *sys.argv]


def job_attributes(names: Iterable[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The named environment variables that are set (RANK, SLURM_JOB_ID, ...)."""
    return {name: environ[name] for name in names if name in environ}


def current_resource(job_env: Iterable[str]) -> Resource:
    return Resource(
        host=socket.gethostname(),
        pid=os.getpid(),
        process_name=_process_name(),
        command_line=_command_line(),
        job=job_attributes(job_env),
    )
