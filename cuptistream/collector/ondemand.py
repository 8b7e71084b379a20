"""``cuptistream trace`` in the collector: open a window on the chosen probes, wait for it to close,
then for every sink to have its events.

1. Choose the probes (connected, said hello) by pid and rank (the rank of their ``Resource``).
2. Send each an ``OpenWindow``; each answers how many windows it opened (``WindowAnswer``) within
   ``_ANSWER_S``, and closes them ``seconds`` later (``TraceSpan``s, after the windows' buffers).
3. The last close's mark is the intake's number after the windows' events; wait until no pipeline
   stage holds a chunk up to it (``Pipeline.holding_through``): every sink has delivered the
   window's events or counted them lost.

Everything past the window is bounded by the request's ``timeout``; what did not finish is said per
probe, and the stages still holding the events are named.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import trio

from cuptistream.channel.messages import OpenWindow
from cuptistream.collector.control import ProbeResult, TraceReply, TraceRequest
from cuptistream.collector.windows import ProbeWindows, Request, WindowRequests
from cuptistream.recording.producers import Producer

_ANSWER_S = 5.0  # a probe answers OpenWindow at once; one that does not is older than `trace`
_POLL_S = 0.02

T = TypeVar("T")


class Probe(Protocol):
    """What this needs of a probe connection (``collector.connection.ProbeConnection``)."""

    pid: int
    producer: Producer | None
    said_goodbye: bool
    ordinals: dict[str, int]  # the UUIDs of the GPUs its process sees

    @property
    def rank(self) -> int | None: ...

    def send(self, message: Any) -> bool: ...


class Stages(Protocol):
    """What this needs of the pipeline (``pipeline.core.Pipeline``), called in its trio thread."""

    def holding_through(self, seq: int) -> list[str]: ...

    def dropped_by_sinks(self) -> dict[str, int]: ...


class Lender(Protocol):
    """The collector's own PM sampling (``collector.samplers.SamplerGrants``), lent to a metrics window."""

    def lend(self, uuids: Iterable[str]) -> Sequence[Any]: ...

    def take_back(self, lent: Sequence[Any]) -> None: ...


class TraceHost(Protocol):
    """What this needs of the collector (``collector.Collector``)."""

    windows: WindowRequests

    @property
    def samplers(self) -> Lender: ...

    @property
    def pipeline(self) -> Stages: ...

    def probe_connections(self) -> Sequence[Probe]: ...

    def in_pipeline(self, function: Callable[..., T], *args: object) -> T: ...


def describe(probe: Probe) -> str:
    return f"pid {probe.pid}" + (f" (rank {probe.rank})" if probe.rank is not None else "")


def choose(probes: Sequence[Probe], pids: list[int], ranks: list[int]) -> list[Probe]:
    """The probes named by ``pids`` or ``ranks`` (none named: all). Raises ``LookupError`` with
    one line when a named pid or rank has no probe, or no probe is connected."""
    if not probes:
        raise LookupError("no probe is connected to this collector (is the program running and traced?)")
    chosen = [p for p in probes if (not pids and not ranks) or p.pid in pids or p.rank in ranks]
    missing = [f"pid {n}" for n in pids if all(p.pid != n for p in probes)]
    missing += [f"rank {n}" for n in ranks if all(p.rank != n for p in probes)]
    if missing:
        known = ", ".join(describe(p) for p in probes)
        raise LookupError(f"no probe with {', '.join(missing)}; connected: {known}")
    return chosen


def trace(host: TraceHost, ask: TraceRequest) -> TraceReply:
    """Open a window of ``ask.seconds`` on the chosen probes and return when its events were
    delivered, or ``ask.timeout`` after the window (a probe that did not finish says why)."""
    try:
        probes = choose(host.probe_connections(), ask.pids, ask.ranks)
    except LookupError as error:
        return TraceReply(error=str(error))
    entries: dict[object, ProbeWindows] = {p: ProbeWindows(pid=p.pid, rank=p.rank) for p in probes}
    request = host.windows.begin(ask.seconds, entries)
    # A metrics window's range profiler takes the counters the collector may be sampling itself.
    lent = host.samplers.lend(uuid for p in probes for uuid in p.ordinals) if ask.metrics else []
    try:
        dropped_before = host.in_pipeline(host.pipeline.dropped_by_sinks)
        for probe in probes:
            if not probe.send(OpenWindow(request=request.number, seconds=ask.seconds, metrics=ask.metrics)):
                host.windows.failed(probe, "it could not be asked (its connection is closing)")
        began = time.monotonic()
        host.windows.wait_answers(request, began + _ANSWER_S)
        host.windows.wait(request, began + ask.seconds + ask.timeout)
        host.samplers.take_back(lent)
        lent = []
        marks = [entry.mark for entry in entries.values() if entry.closed]
        waiting = _wait_delivered(host, max(marks, default=0), began + ask.seconds + ask.timeout)
        dropped_after = host.in_pipeline(host.pipeline.dropped_by_sinks)
    except trio.RunFinishedError:
        stopped = "the collector stopped before the window was delivered"
        return TraceReply(request=request.number, error=stopped)
    finally:
        host.samplers.take_back(lent)
        host.windows.end(request)
    grown = {stage: n - dropped_before.get(stage, 0) for stage, n in dropped_after.items()}
    results = [_result(probe, entries[probe], request, waiting) for probe in probes]
    dropped = {stage: n for stage, n in grown.items() if n}
    return TraceReply(request=request.number, probes=results, waiting_for=waiting, dropped=dropped)


def _wait_delivered(host: TraceHost, mark: int, deadline: float) -> list[str]:
    """Wait until no stage holds a chunk up to ``mark``; the stages still holding at ``deadline``."""
    if not mark:
        return []
    while True:
        holding = host.in_pipeline(host.pipeline.holding_through, mark)
        if not holding or time.monotonic() >= deadline:
            return holding
        time.sleep(_POLL_S)


def _result(probe: Probe, entry: ProbeWindows, request: Request, waiting: list[str]) -> ProbeResult:
    result = ProbeResult(
        pid=entry.pid, rank=entry.rank, windows=entry.windows, sources=entry.opened, refused=entry.refused,
        start=entry.start, end=entry.end, records=entry.records,
    )  # fmt: skip
    clock = probe.producer.clock_sync() if probe.producer is not None else None
    if clock is not None and entry.start:
        result.start_unix_ns = entry.start + clock.offset_ns
        result.end_unix_ns = entry.end + clock.offset_ns if entry.end else 0
    result.problem = _problem(entry, request, waiting)
    return result


def _problem(entry: ProbeWindows, request: Request, waiting: list[str]) -> str:
    if entry.problem:
        return entry.problem
    if not entry.answered:
        return f"no answer within {_ANSWER_S:.0f}s (its probe may predate `cuptistream trace`)"
    if entry.windows == 0:
        if entry.refused:
            return "refused: " + "; ".join(f"{name}: {why}" for name, why in entry.refused.items())
        return "cannot trace on demand: none of its sources opens windows (e.g. activity, replay)"
    if entry.closed < entry.windows:
        return f"{entry.windows - entry.closed} of {entry.windows} windows not closed in time"
    if waiting:
        return f"not yet delivered by {', '.join(waiting)} when time ran out"
    return ""
