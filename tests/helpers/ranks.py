"""Recordings of a job's ranks made from one replayed real-GPU capture, for ``cuptistream compare``
and the multi-rank trace export.

The capture (``sources/captures/torch_train.cupti``: 3 steps of a torch MLP) is decoded by the replay
source, as the collector decodes live buffers; each rank gets a copy of its events with its own
rank, pid and host. ``scale`` stretches the durations of one kernel name on one rank, the way a
straggler's slow kernel would look; ``shift_ns`` moves a rank's CUPTI clock (events and clock
reading together), so its Unix times stay the same while its raw times differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from cuptistream import events as ev
from cuptistream.cupti import capture
from sources.replay import ReplayConfig, ReplaySource
from tests.gpu.workloads.collect import Collect
from tests.helpers.fixture_recording import CAPTURES, Process, write_recording

CAPTURE = CAPTURES / "torch_train.cupti"


@dataclass(frozen=True)
class Scale:
    rank: int
    kernel: str  # the name as recorded
    factor: float


def replayed(path: Path = CAPTURE) -> tuple[list[ev.Event], ev.ClockSync]:
    sink = Collect()
    source = ReplaySource(ReplayConfig(type="replay", path=str(path)), sink)
    source.start()
    source.stop()
    clock = capture.read(path).clock or ev.ClockSync(cupti_ns=0, unix_ns=0)
    return list(sink.events), clock


def biggest_kernel(events: list[ev.Event]) -> str:
    """The kernel name with the most total GPU time."""
    totals: dict[str, int] = {}
    for e in events:
        if isinstance(e, ev.Kernel):
            totals[e.name] = totals.get(e.name, 0) + e.end - e.start
    return max(totals, key=lambda name: totals[name])


def _shifted(e: ev.Event, shift: int, factor: float | None) -> ev.Event:
    changes: dict[str, int] = {}
    for field in ("start", "end", "timestamp"):
        value = getattr(e, field, None)
        if value:
            changes[field] = value + shift
    if factor is not None and isinstance(e, ev.Kernel):
        changes["end"] = changes["start"] + round((e.end - e.start) * factor)
    return msgspec.structs.replace(e, **changes) if changes else e


def rank_processes(
    ranks: int, *, scale: Scale | None = None, hosts: int = 2, shift_ns: dict[int, int] | None = None,
    same_pid: bool = False,
) -> list[Process]:  # fmt: skip
    """``ranks`` copies of the capture, rank ``r`` on host ``node{r * hosts // ranks}``."""
    events, clock = replayed()
    out = []
    for rank in range(ranks):
        shift = (shift_ns or {}).get(rank, 0)
        slow = scale if scale is not None and scale.rank == rank else None
        mine = [
            _shifted(
                e, shift, slow.factor if slow and isinstance(e, ev.Kernel) and e.name == slow.kernel else None
            )
            for e in events
        ]
        host = f"node{rank * hosts // ranks}"
        resource = ev.Resource(
            host=host, pid=7000 if same_pid else 7000 + rank, process_name="torch_train",
            command_line=["python", "train.py"], rank=rank, local_rank=rank % max(ranks // hosts, 1),
            world_size=ranks,
        )  # fmt: skip
        rank_clock = ev.ClockSync(cupti_ns=clock.cupti_ns + shift, unix_ns=clock.unix_ns)
        out.append(Process(resource, rank_clock, mine))
    return out


def write_ranks(root: Path, processes: list[Process], batch_events: int = 200) -> list[Path]:
    """One recording directory per host, ``root/<host>/out``, as a node's collector writes them."""
    directories = []
    for host in sorted({p.resource.host for p in processes}):
        mine = [p for p in processes if p.resource.host == host]
        directories.append(write_recording(root / host / "out", mine, batch_events))
    return directories
