"""When budget windows open: at phases of the process's own, or together with every rank of its job.

A rank inside a window runs slower (full tracing costs a DDP rank's step a noticeable fraction:
docs/performance.md, row "full mode per DDP rank", measures it against bare CUPTI), so in a job that
synchronizes its ranks (NCCL, gloo) it is the straggler for as long as the window is open, and its
untraced peers wait for it. With windows at phases of each rank's own, each rank's statistics come
from the moments it waited least: the all-reduce's share of kernel time comes out low, and
``compare`` flags clean ranks on NCCL time. When every rank traces the same moments, the job is
slowed as a whole, as in a ``full`` run, and what the ranks record is comparable.

``JobSchedule`` needs no messages between ranks: the wall clock is cut into slots of ``slot_s`` (the
source's longest window, the same in every rank of a job that shares a config), and a hash of the
job's key and the slot's number gives every slot one number ``u`` in [0, 1), the same in every rank.
A rank whose plan traces a fraction ``d = window / (window + pause)`` of the time opens a window at
the start of each slot with ``u < slot_s / (window + pause)``. Ranks with the same plan open the same
slots; a rank whose windows cost more (a smaller ``d``) opens a subset of the others' slots, so the
windows still coincide as far as the plans allow. The clock is ``time.time()``: exact between the
processes of one host, within NTP's error (milliseconds) between hosts, against windows of 20 ms to
200 ms.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from cuptistream.overhead import CLAIM_RETRY_S, Plan, Throttle
from cuptistream.pipeline.resource import job_rank

# Environment variables that name one job, the most specific first: every rank of the job sees the
# same values, and two jobs on one host see different ones.
_JOB_KEYS = (
    ("TORCHELASTIC_RUN_ID",),  # torchrun's --rdzv-id ("none" unless set: then the next line)
    ("SLURM_JOB_ID", "SLURM_STEP_ID"),
    ("PMIX_NAMESPACE",),  # PMIx launchers (Open MPI 5, srun --mpi=pmix): the job's namespace
    ("OMPI_MCA_orte_hnp_uri",),  # Open MPI 4 and older: the launcher's contact, one per mpirun
    ("PMI_PORT",),  # MPICH / Intel MPI's process manager, one per mpiexec
    ("MASTER_ADDR", "MASTER_PORT"),  # torch.distributed's rendezvous, torchrun or by hand
)


# Slots searched for the next window at most (a hash each, ~1 us): 10x the expected gap of a window
# every 2 hours of 0.2 s slots. Past it the window opens in the last slot searched.
_MAX_SEARCH = 360_000


def job_key(environ: Mapping[str, str] = os.environ) -> str | None:
    """A key every rank of this process's job shares, or None when the process is no rank of a job of
    two or more processes (nothing to align with)."""
    _, _, world_size = job_rank(environ)
    if world_size is None or world_size < 2:
        return None
    for names in _JOB_KEYS:
        values = [environ.get(name, "") for name in names]
        if values[0] and values[0] != "none":
            return "/".join(f"{name}={value}" for name, value in zip(names, values, strict=True))
    return f"WORLD_SIZE={world_size}"  # a job that names itself nowhere: align with its host's jobs


class Schedule(Protocol):
    """When the next budget window opens, in seconds from now, given the throttle's plan."""

    def first(self, plan: Plan) -> float:
        """Before the first window."""

    def next(self, plan: Plan) -> float:
        """After a window closed (``plan``: the one its measured cost gave)."""

    def missed(self, plan: Plan) -> float:
        """After the session's window slot was found taken (another source's window is open)."""


class FreeSchedule:
    """Phases of the process's own: the first window after ``first_delay`` (the throttle's: a random
    point of the first pause under a budget, none without one), then one pause after each window."""

    def __init__(self, first_delay: Callable[[], float]) -> None:
        self._first_delay = first_delay

    def first(self, plan: Plan) -> float:
        return self._first_delay()

    def next(self, plan: Plan) -> float:
        return plan.pause_s

    def missed(self, plan: Plan) -> float:
        return CLAIM_RETRY_S


class JobSchedule:
    """The windows of every rank of one job at the same moments (see the module's docstring).

    ``key`` is the job's (``job_key``), ``slot_s`` the source's longest window, and ``clock`` the wall
    clock every rank reads. A slot whose start this rank missed (its window slot taken by another
    source, or the previous window's pricing still under way) is left out: the next one the plan
    opens is taken, never a late one."""

    def __init__(self, key: str, slot_s: float, clock: Callable[[], float] = time.time) -> None:
        if slot_s <= 0:
            raise ValueError("slot_s must be above 0")
        self.key = key
        self.slot_s = slot_s
        self._clock = clock

    def draw(self, slot: int) -> float:
        """Slot ``slot``'s number in [0, 1): the same in every rank of the job."""
        digest = hashlib.blake2b(f"{self.key}#{slot}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def opens(self, slot: int, plan: Plan) -> bool:
        """Whether a rank planning ``plan`` opens a window at the start of ``slot``."""
        return self.draw(slot) < min(1.0, self.slot_s / (plan.window_s + plan.pause_s))

    def next_slot(self, plan: Plan, after: float) -> int:
        """The first slot that starts after ``after`` (wall-clock seconds) in which ``plan`` opens."""
        slot = math.floor(after / self.slot_s) + 1
        last = slot + _MAX_SEARCH
        while not self.opens(slot, plan) and slot < last:
            slot += 1
        return slot

    def first(self, plan: Plan) -> float:
        return self._until_next(plan)

    def next(self, plan: Plan) -> float:
        return self._until_next(plan)

    def missed(self, plan: Plan) -> float:
        return self._until_next(plan)

    def _until_next(self, plan: Plan) -> float:
        now = self._clock()
        return self.next_slot(plan, now) * self.slot_s - now


def schedule_for(
    throttle: Throttle, slot_s: float, align: str, environ: Mapping[str, str] = os.environ
) -> Schedule:
    """The schedule of ``throttle``'s windows, the longest ``slot_s``: ``align: job`` aligns the ranks
    of a job of two or more processes (``job_key``); any other process, or ``align: none``, runs free
    (``FreeSchedule``, first after ``throttle.first_delay``)."""
    key = job_key(environ) if align == "job" else None
    return FreeSchedule(throttle.first_delay) if key is None else JobSchedule(key, slot_s)
