"""Which Python stack each thread of a recording was at, when: the first of the stack join's two
passes (``cuptistream.analysis.stacks``).

It keeps, per process, what the probe sent about stacks (``StackTable``, ``StackChanges``:
``cuptistream.stacks``) and when each thread waited in an API call that launches no kernel
(synchronize, copies); ``stack_at(process, thread, time)`` then answers for any launch:

- a change happened between the sample that saw it and the one before: a launch in between goes to
  the side of their midpoint;
- a sample taken inside one of the thread's waiting calls shows the line that waits, not one that
  launches (a loop that launches, then synchronizes is seen waiting most of the time): its launches
  take the line of the same function, with the same calls around it, seen outside a wait (the latest
  before, else the first after), where there is one;
- a thread that runs no Python (autograd's backward threads, C++ workers) takes the stack of a
  thread that was inside ``backward()`` then (innermost frame ``[autograd backward]``), else
  ``[no Python stack]``; a process without stacks gives ``[no stack recorded]``.

Memory: the stack events and the waiting calls of every process, not its launches or GPU work. A
reader that runs for days (the collector) drops what no later launch needs (``forget_before``).

``stacks_at`` answers for whole arrays of launches at once (numpy: Python per thread and per stack
segment touched, never per launch), with the same answers as ``stack_at``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuptistream.events import Resource
from cuptistream.stacks.sampler import BACKWARD, NO_PYTHON, SYNTHETIC_FILE, THREAD_ID_MASK

NO_PYTHON_STACK = "[no Python stack]"
NO_STACK_RECORDED = "[no stack recorded]"
# Stack ids the index gives besides the probe's (which are positive).
NONE_RECORDED, NO_PYTHON_ID = -1, -2
OTHER_STACK = -3  # StackStats' row of the stacks past ``statistics.max_stacks``
KERNEL_LAUNCHES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch")
_OVERLAPPING = 64  # backward() spans looked at before a launch is called one without a stack
_NESTED = 4  # API calls nest (a runtime call around its driver calls): intervals looked back at
_LATEST = 2**63 - 1  # an open backward() span's end, as int64

ProcessKey = tuple[str, int]  # (host, pid): pids repeat across the hosts of a job


@dataclass(frozen=True)
class Frame:
    file: str
    function: str
    line: int

    @property
    def synthetic(self) -> bool:
        return self.file == SYNTHETIC_FILE

    def label(self) -> str:
        return self.function if self.synthetic else f"{self.function} ({self.file}:{self.line})"


@dataclass
class _Process:
    frames: dict[int, Frame] = field(default_factory=dict)
    stacks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # thread -> [(time seen, stack, moved after)]: the sample that saw the change and the one before
    changes: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    # thread -> [(start, end)] of its API calls that launch no kernel (synchronize, copies, ...)
    waits: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    timelines: _Timelines | None = None


class StackIndex:
    """Folds the events of processes in (``add``); then ``stack_at`` and ``frames_of`` answer.
    Processes are keyed by (host, pid)."""

    def __init__(self) -> None:
        self._processes: dict[ProcessKey, _Process] = {}
        self.resources: dict[ProcessKey, Resource] = {}  # who each process was (rank, ...)

    def add(self, resource: Resource, events: Iterable[Any]) -> None:
        """One batch of ``resource``'s events (full or light Structs)."""
        key = (resource.host, resource.pid)
        self.resources.setdefault(key, resource)
        self.add_events(key, events)

    def add_events(self, process: ProcessKey, events: Iterable[Any]) -> None:
        """``add`` for a process known by its key alone (the collector knows a stream's pid, not
        its ``Resource``)."""
        proc = self._processes.setdefault(process, _Process())
        for event in events:
            tag = type(event).__struct_config__.tag
            if tag == "api":
                if not event.name.startswith(KERNEL_LAUNCHES):
                    thread = event.thread_id & THREAD_ID_MASK
                    proc.waits.setdefault(thread, []).append((event.start, event.end))
                    proc.timelines = None
            elif tag == "stack_table":
                rows = zip(event.frame_ids, event.files, event.functions, event.lines, strict=True)
                for fid, file, function, line in rows:
                    proc.frames[fid] = Frame(file, function, line)
                for sid, frames in zip(event.stack_ids, event.stacks, strict=True):
                    proc.stacks[sid] = tuple(frames)
                proc.timelines = None
            elif tag == "stack_changes":
                interval = event.interval_ns
                previous = event.previous or [0] * len(event.times)
                rows = zip(event.thread_ids, event.times, event.stack_ids, previous, strict=True)
                for thread, at, stack, before in rows:
                    proc.changes.setdefault(thread, []).append((at, stack, before or at - interval))
                proc.timelines = None

    def add_waits(
        self, process: ProcessKey, threads: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> None:
        """API calls that launch no kernel, as arrays (CUPTI thread ids, start and end times):
        ``add``'s ``api`` events without a Struct each."""
        if not len(threads):
            return
        proc = self._processes.setdefault(process, _Process())
        threads = threads.astype(np.int64) & THREAD_ID_MASK
        for thread in np.unique(threads).tolist():
            rows = threads == thread
            proc.waits.setdefault(thread, []).extend(
                zip(starts[rows].tolist(), ends[rows].tolist(), strict=True)
            )
        proc.timelines = None

    def forget_before(self, process: ProcessKey, time: int) -> None:
        """Drop what launches at or after ``time`` do not need: per thread, the changes before the
        last one seen at or before ``time``, and waiting calls that ended before that. (A launch
        seen waiting then looks for its function's launching line among the changes kept.)"""
        proc = self._processes.get(process)
        if proc is None:
            return
        dropped = False
        for thread, changes in proc.changes.items():
            changes.sort()
            keep = bisect.bisect_right(changes, (time, 2**63, 2**63)) - 1
            if keep > 0:
                del changes[:keep]
                dropped = True
            waits = proc.waits.get(thread)
            if waits and changes:
                since = min(changes[0][0], changes[0][2])
                kept = [w for w in waits if w[1] >= since]
                if len(kept) < len(waits):
                    proc.waits[thread] = kept
                    dropped = True
        for thread in [t for t in proc.waits if t not in proc.changes]:
            proc.waits[thread] = [w for w in proc.waits[thread] if w[1] >= time]
            dropped = True
        if dropped:
            proc.timelines = None

    def has_stacks(self) -> bool:
        return any(proc.changes for proc in self._processes.values())

    def stack_at(self, process: ProcessKey, thread: int, at: int) -> int:
        """The stack id ``thread`` (CUPTI's thread id) of ``process`` launched from at ``at``
        (CUPTI clock); ``NONE_RECORDED`` or ``NO_PYTHON_ID`` where there is none."""
        proc = self._processes.get(process)
        if proc is None or not proc.changes:
            return NONE_RECORDED
        if proc.timelines is None:
            proc.timelines = _Timelines(proc)
        return proc.timelines.stack_at(thread & THREAD_ID_MASK, at)

    def stacks_at(self, process: ProcessKey, threads: np.ndarray, at: np.ndarray) -> np.ndarray:
        """``stack_at`` for arrays of launches: each launch's thread (CUPTI's) and time, the stack
        ids as an int64 array."""
        proc = self._processes.get(process)
        if proc is None or not proc.changes:
            return np.full(len(at), NONE_RECORDED, np.int64)
        if proc.timelines is None:
            proc.timelines = _Timelines(proc)
        return proc.timelines.stacks_at(threads.astype(np.int64) & THREAD_ID_MASK, at.astype(np.int64))

    def frames_of(self, process: ProcessKey, stack: int) -> tuple[Frame, ...]:
        """A stack id's frames, outermost first."""
        proc = self._processes.get(process)
        if stack == NO_PYTHON_ID:
            return (Frame(SYNTHETIC_FILE, NO_PYTHON_STACK, 0),)
        if proc is None or stack not in proc.stacks:
            return (Frame(SYNTHETIC_FILE, NO_STACK_RECORDED, 0),)
        unknown = Frame(SYNTHETIC_FILE, "[unknown frame]", 0)
        return tuple(proc.frames.get(fid, unknown) for fid in proc.stacks[stack])


class _Timelines:
    """One process's threads' stacks over time, built once all its stack events are in."""

    def __init__(self, proc: _Process) -> None:
        self.proc = proc
        # thread -> (first possible start of its first stack, midpoints between samples, stacks,
        # whether each was seen while the thread waited in an API call)
        self.timelines: dict[int, tuple[int, list[int], list[int], list[bool]]] = {}
        # (thread, a stack's place: its outer frames and innermost function) -> when each stack of
        # that place was seen outside a wait
        self.launching: dict[tuple[int, tuple[Any, ...]], tuple[list[int], list[int]]] = {}
        spans = []  # (start, end, stack) while a thread was inside backward()
        for thread, changes in proc.changes.items():
            changes.sort()
            waiting = _waiting(changes, proc.waits.get(thread, []))
            midpoints = [(at + before) // 2 for at, _, before in changes]
            self.timelines[thread] = (changes[0][2], midpoints, [s for _, s, _ in changes], waiting)
            for (at, stack, _), waited in zip(changes, waiting, strict=True):
                if not waited and stack != NO_PYTHON:
                    times, stacks = self.launching.setdefault((thread, self._place(stack)), ([], []))
                    times.append(at)
                    stacks.append(stack)
            for i, (_, stack, before) in enumerate(changes):
                ids = proc.stacks.get(stack, ())
                leaf = proc.frames.get(ids[-1]) if ids else None
                if leaf is not None and leaf.synthetic and leaf.function == BACKWARD:
                    # It entered backward() after the sample before the one that saw it there.
                    end = changes[i + 1][0] if i + 1 < len(changes) else 2**63
                    spans.append((before, end, stack))
        spans.sort()
        self.backward = spans
        self.backward_starts = [s for s, _, _ in spans]
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # for ``stacks_at``

    def _place(self, stack: int) -> tuple[Any, ...]:
        """The stack but for its innermost frame's line: the calls around it and the function."""
        ids = self.proc.stacks.get(stack, ())
        if not ids:
            return ()
        leaf = self.proc.frames.get(ids[-1])
        return (ids[:-1], (leaf.file, leaf.function) if leaf is not None else ids[-1])

    def stack_at(self, thread: int, at: int) -> int:
        stack = self._thread_at(thread, at)
        if stack == NO_PYTHON:
            stack = self._in_backward(at)
        return NO_PYTHON_ID if stack == NO_PYTHON else stack

    def _thread_at(self, thread: int, at: int) -> int:
        timeline = self.timelines.get(thread)
        if timeline is None:
            return NO_PYTHON
        first, midpoints, stacks, waiting = timeline
        # A stack moved to between two samples is taken from their midpoint on.
        i = bisect.bisect_right(midpoints, at) - 1
        if i < 0 and at <= first:
            return NO_PYTHON
        i = max(i, 0)
        if not waiting[i]:
            return stacks[i]
        seen = self.launching.get((thread, self._place(stacks[i])))
        if seen is None:
            return stacks[i]  # the right function still: the only line of it seen
        times, launching = seen
        j = bisect.bisect_right(times, at) - 1
        return launching[max(j, 0)]

    def stacks_at(self, threads: np.ndarray, at: np.ndarray) -> np.ndarray:
        """``stack_at`` over arrays: the same steps, each on every launch of a thread at once."""
        out = np.full(len(at), NO_PYTHON, np.int64)
        for thread in np.unique(threads).tolist():
            timeline = self.timelines.get(thread)
            if timeline is None:
                continue
            first, _, stacks, _ = timeline
            midpoints, ids, waiting = self._arrays_of(thread)
            rows = np.flatnonzero(threads == thread)
            times = at[rows]
            i = np.searchsorted(midpoints, times, side="right") - 1
            before = (i < 0) & (times <= first)
            i = np.maximum(i, 0)
            found = ids[i]
            waited = waiting[i] & ~before
            for segment in np.unique(i[waited]).tolist():  # each stack seen waiting, once
                seen = self.launching.get((thread, self._place(stacks[segment])))
                if seen is None:
                    continue
                mine = waited & (i == segment)
                j = np.searchsorted(np.asarray(seen[0], np.int64), times[mine], side="right") - 1
                found[mine] = np.asarray(seen[1], np.int64)[np.maximum(j, 0)]
            found[before] = NO_PYTHON
            out[rows] = found
        outside = out == NO_PYTHON
        if outside.any():
            out[outside] = self._in_backward_many(at[outside])
        out[out == NO_PYTHON] = NO_PYTHON_ID
        return out

    def _arrays_of(self, thread: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arrays = self._arrays.get(thread)
        if arrays is None:
            _, midpoints, stacks, waiting = self.timelines[thread]
            arrays = self._arrays[thread] = (
                np.asarray(midpoints, np.int64),
                np.asarray(stacks, np.int64),
                np.asarray(waiting, bool),
            )
        return arrays

    def _in_backward_many(self, at: np.ndarray) -> np.ndarray:
        """``_in_backward`` for an array of times: the spans before each, latest start first."""
        out = np.full(len(at), NO_PYTHON, np.int64)
        if not self.backward:
            return out
        starts = np.asarray(self.backward_starts, np.int64)
        ends = np.asarray([min(end, _LATEST) for _, end, _ in self.backward], np.int64)
        stacks = np.asarray([stack for _, _, stack in self.backward], np.int64)
        i = np.searchsorted(starts, at, side="right") - 1
        open_ = np.ones(len(at), bool)
        for back in range(_OVERLAPPING):
            j = i - back
            live = open_ & (j >= 0)
            if not live.any():
                break
            j = np.where(live, j, 0)
            hit = live & (ends[j] > at)
            out[hit] = stacks[j[hit]]
            open_ &= ~hit
        return out

    def _in_backward(self, at: int) -> int:
        i = bisect.bisect_right(self.backward_starts, at) - 1
        # Spans of several threads may overlap: the latest start that still covers ``at``.
        for j in range(i, max(i - _OVERLAPPING, -1), -1):
            start, end, stack = self.backward[j]
            if start <= at < end:
                return stack
        return NO_PYTHON


def _waiting(changes: list[tuple[int, int, int]], waits: list[tuple[int, int]]) -> list[bool]:
    """For each change, whether the sample that saw it fell inside one of the thread's waiting calls."""
    if not waits:
        return [False] * len(changes)
    waits.sort()
    starts = [start for start, _ in waits]
    out = []
    for at, _, _ in changes:
        i = bisect.bisect_right(starts, at) - 1
        out.append(any(waits[j][1] >= at for j in range(i, max(i - _NESTED, -1), -1)))
    return out
