"""The batch envelope's resource: who produced the data (host, process, rank, job)."""

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


# (rank, local rank, world size) variables, most specific launcher first: torchrun/torch.distributed,
# SLURM's srun, Open MPI's mpirun, MPICH/Intel MPI's PMI.
_RANK_VARIABLES = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def job_rank(environ: Mapping[str, str] = os.environ) -> tuple[int | None, int | None, int | None]:
    """(rank, local_rank, world_size) from the first launcher whose rank variable is set."""
    for rank, local, size in _RANK_VARIABLES:
        if rank in environ:
            return _int(environ.get(rank)), _int(environ.get(local)), _int(environ.get(size))
    return None, None, None


def current_resource(job_env: Iterable[str], command_line: bool = False) -> Resource:
    """This process's resource. The command line is left empty unless ``command_line`` (the config's
    ``session.command_line``): arguments can carry secrets, and the conventions make it opt-in."""
    rank, local_rank, world_size = job_rank()
    return Resource(
        host=socket.gethostname(),
        pid=os.getpid(),
        ppid=os.getppid(),
        process_name=_process_name(),
        command_line=_command_line() if command_line else [],
        job=job_attributes(job_env),
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
    )
