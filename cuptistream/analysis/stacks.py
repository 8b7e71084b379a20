"""GPU time by the code that launched it: each kernel, copy and memset joined to a Python stack.

The join, per process: a GPU record's correlation id names the API call that launched it (its
thread and start time); the probe's ``StackChanges`` say which stack that thread was at then
(``cuptistream.stacks``). A change happened between the sample that saw it and the one before: a
launch in between goes to the side of their midpoint. A sample taken inside one of the thread's
waiting API calls (synchronize, copies) shows the line that waits: its launches take the line of the
same function seen outside a wait (``_Resolver._stack_at``).

Launches from threads that run no Python (autograd's backward threads, C++ workers) go to the stack
of a thread that was inside ``backward()`` at that moment (its innermost frame ``[autograd
backward]``), else to ``[no Python stack]``. A process recorded without stacks, or a launch whose
API record was not kept, goes to ``[no stack recorded]``.

Memory: every API call and GPU record of a process is held until the end of the read (a view of
a full trace; budget-mode recordings carry only their windows).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cuptistream.analysis.names import DisplayNames
from cuptistream.analysis.records import Part, tag_of
from cuptistream.analysis.select import Selection
from cuptistream.analysis.summary_report import Table, cut
from cuptistream.events import Resource
from cuptistream.stacks import BACKWARD, NO_PYTHON, SYNTHETIC_FILE, THREAD_ID_MASK

NO_PYTHON_STACK = "[no Python stack]"
NO_STACK_RECORDED = "[no stack recorded]"
_WORK = ("kernel", "memcpy", "memset")
_OVERLAPPING = 64  # backward() spans looked at before a launch is called one without a stack
_KERNEL_LAUNCHES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch")
_NESTED = 4  # API calls nest (a runtime call around its driver calls): intervals looked back at


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


@dataclass(frozen=True)
class StackTime:
    """GPU time of one (process, stack, GPU operation): frames outermost first; ``work`` is the
    kernel's name, or ``[memcpy HtoD]``, ``[memset]``."""

    host: str
    pid: int
    frames: tuple[Frame, ...]
    work: str
    gpu_ns: int
    launches: int


@dataclass
class _Process:
    frames: dict[int, Frame] = field(default_factory=dict)
    stacks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # thread -> [(time seen, stack, moved after)]: the sample that saw the change and the one before
    changes: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    interval_ns: int = 0
    launches: dict[int, tuple[int, int]] = field(default_factory=dict)  # correlation -> (thread, start)
    work: list[tuple[int, str, int]] = field(default_factory=list)  # (correlation, what, ns)
    # thread -> [(start, end)] of its API calls that launch no kernel (synchronize, copies, ...)
    waits: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


class StackJoin:
    """Folds batches (``records.Part``) in; ``result()`` joins and sums them. ``kernel`` keeps only
    the GPU work whose shown name matches the regular expression; ``work=False`` keeps none (for
    ``resolver`` alone)."""

    def __init__(
        self, selection: Selection | None = None, *, kernel: str | None = None, mangled: bool = False,
        work: bool = True,
    ) -> None:  # fmt: skip
        self.selection = selection or Selection()
        self._keep_work = work  # False: only what ``resolver`` needs (a trace export's first pass)
        self._kernel = re.compile(kernel) if kernel else None
        self.names = DisplayNames(mangled)
        self._processes: dict[tuple[str, int], _Process] = {}
        self.resources: dict[tuple[str, int], Resource] = {}  # (host, pid) -> who it was (rank, ...)

    def add(self, part: Part) -> None:
        sel = self.selection
        if not sel.accepts(part.resource):
            return
        key = (part.resource.host, part.resource.pid)  # pids repeat across the hosts of a job
        proc = self._processes.setdefault(key, _Process())
        self.resources.setdefault(key, part.resource)
        low, high = sel.window(part.offset_ns, part.events) if sel.timed else (None, None)
        for event in part.events:
            tag = tag_of(event)
            if tag in _WORK and self._keep_work:
                if low is not None and not low <= event.start + part.offset_ns < high:
                    continue
                if sel.devices is not None and event.device_id not in sel.devices:
                    continue
                what = self._what(tag, event)
                if what is not None:
                    proc.work.append((event.correlation_id, what, event.end - event.start))
            elif tag == "api":
                thread = event.thread_id & THREAD_ID_MASK
                proc.launches[event.correlation_id] = (thread, event.start)
                if not event.name.startswith(_KERNEL_LAUNCHES):
                    proc.waits.setdefault(thread, []).append((event.start, event.end))
            elif tag == "stack_table":
                self._table(proc, event)
            elif tag == "stack_changes":
                proc.interval_ns = interval = event.interval_ns
                previous = event.previous or [0] * len(event.times)
                rows = zip(event.thread_ids, event.times, event.stack_ids, previous, strict=True)
                for thread, at, stack, before in rows:
                    proc.changes.setdefault(thread, []).append((at, stack, before or at - interval))

    def _what(self, tag: str, event: Any) -> str | None:
        if tag == "kernel":
            self.names.learn((event,))
            what = self.names(event.name)
        elif tag == "memcpy":
            what = f"[memcpy {event.copy_kind}]"
        else:
            what = "[memset]"
        if self._kernel is not None and not self._kernel.search(what):
            return None
        return what

    @staticmethod
    def _table(proc: _Process, event: Any) -> None:
        rows = zip(event.frame_ids, event.files, event.functions, event.lines, strict=True)
        for fid, file, function, line in rows:
            proc.frames[fid] = Frame(file, function, line)
        for sid, frames in zip(event.stack_ids, event.stacks, strict=True):
            proc.stacks[sid] = tuple(frames)

    def resolver(self, pid: int, host: str | None = None) -> Callable[[int], tuple[Frame, ...]]:
        """correlation id -> the frames its launch was made from, in process ``pid`` (of ``host``,
        or of the first host seen with it), after the last ``add``."""
        key = next((k for k in self._processes if k[1] == pid and host in (None, k[0])), None)
        return _Resolver(self._processes[key] if key is not None else _Process())

    def has_stacks(self) -> bool:
        return any(proc.changes for proc in self._processes.values())

    def result(self) -> list[StackTime]:
        """GPU time and launches per (process, stack, operation), the most time first."""
        out: list[StackTime] = []
        for (host, pid), proc in self._processes.items():
            totals: dict[tuple[tuple[Frame, ...], str], list[int]] = {}
            resolve = _Resolver(proc)
            for correlation, what, ns in proc.work:
                total = totals.setdefault((resolve(correlation), what), [0, 0])
                total[0] += ns
                total[1] += 1
            out += [StackTime(host, pid, frames, what, ns, n) for (frames, what), (ns, n) in totals.items()]
        out.sort(key=lambda s: (-s.gpu_ns, s.host, s.pid, s.work))
        return out


class _Resolver:
    """correlation id -> the frames of the stack its launch was made from (one process)."""

    def __init__(self, proc: _Process) -> None:
        self.proc = proc
        # thread -> (first possible start of its first stack, midpoints between samples, stacks,
        # whether each was seen while the thread waited in an API call)
        self.timelines: dict[int, tuple[int, list[int], list[int], list[bool]]] = {}
        # (thread, a stack's place: its outer frames and its innermost function) -> when each stack of
        # that place was seen outside a wait
        self.launching: dict[tuple[int, tuple[Any, ...]], tuple[list[int], list[int]]] = {}
        backward = proc.frames.get
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
                leaf = backward(ids[-1]) if ids else None
                if leaf is not None and leaf.synthetic and leaf.function == BACKWARD:
                    # It entered backward() after the sample before the one that saw it there.
                    end = changes[i + 1][0] if i + 1 < len(changes) else 2**63
                    spans.append((before, end, stack))
        spans.sort()
        self.backward = spans
        self.backward_starts = [s for s, _, _ in spans]
        self._frames: dict[int, tuple[Frame, ...]] = {}
        self._none = (Frame(SYNTHETIC_FILE, NO_STACK_RECORDED, 0),)
        self._no_python = (Frame(SYNTHETIC_FILE, NO_PYTHON_STACK, 0),)

    def _place(self, stack: int) -> tuple[Any, ...]:
        """The stack but for its innermost frame's line: the calls around it and the function."""
        ids = self.proc.stacks.get(stack, ())
        if not ids:
            return ()
        leaf = self.proc.frames.get(ids[-1])
        return (ids[:-1], (leaf.file, leaf.function) if leaf is not None else ids[-1])

    def __call__(self, correlation: int) -> tuple[Frame, ...]:
        launch = self.proc.launches.get(correlation)
        if launch is None or not (self.timelines or self.backward):
            return self._none
        thread, at = launch
        stack = self._stack_at(thread, at)
        if stack == NO_PYTHON:
            stack = self._in_backward(at)
            if stack == NO_PYTHON:
                return self._no_python
        return self._frames_of(stack)

    def _stack_at(self, thread: int, at: int) -> int:
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
        # Seen waiting (in cudaDeviceSynchronize, say): that line waits, it does not launch. A loop
        # that launches, then synchronizes is seen waiting most of the time; its launches take the
        # line of the same function that was seen outside a wait, the latest before (else the first
        # after), where there is one.
        seen = self.launching.get((thread, self._place(stacks[i])))
        if seen is None:
            return stacks[i]
        times, launching = seen
        j = bisect.bisect_right(times, at) - 1
        return launching[max(j, 0)]

    def _in_backward(self, at: int) -> int:
        i = bisect.bisect_right(self.backward_starts, at) - 1
        # Spans of several threads may overlap: the latest start that still covers ``at``.
        for j in range(i, max(i - _OVERLAPPING, -1), -1):
            start, end, stack = self.backward[j]
            if start <= at < end:
                return stack
        return NO_PYTHON

    def _frames_of(self, stack: int) -> tuple[Frame, ...]:
        frames = self._frames.get(stack)
        if frames is None:
            ids = self.proc.stacks.get(stack)
            if ids is None:
                frames = self._none
            else:
                unknown = Frame(SYNTHETIC_FILE, "[unknown frame]", 0)
                frames = tuple(self.proc.frames.get(fid, unknown) for fid in ids)
            self._frames[stack] = frames
        return frames


def _waiting(changes: list[tuple[int, int, int]], waits: list[tuple[int, int]]) -> list[bool]:
    """For each change, whether the sample that saw it fell inside one of the thread's waiting API
    calls (those that launch no kernel: synchronize, copies)."""
    if not waits:
        return [False] * len(changes)
    waits.sort()
    starts = [start for start, _ in waits]
    out = []
    for at, _, _ in changes:
        i = bisect.bisect_right(starts, at) - 1
        out.append(any(waits[j][1] >= at for j in range(i, max(i - _NESTED, -1), -1)))
    return out


def join(parts: Iterable[Part], selection: Selection | None = None, **options: Any) -> list[StackTime]:
    """``StackJoin`` over ``parts``."""
    joiner = StackJoin(selection, **options)
    for part in parts:
        joiner.add(part)
    return joiner.result()


def code_of(stack: StackTime) -> str:
    """The program's line that launched it: the innermost frame that is not cuptistream's own (or
    the one saying why there is none)."""
    real = [f for f in stack.frames if not f.synthetic]
    return real[-1].label() if real else stack.frames[-1].function


def code_table(stacks: Sequence[StackTime], top: int | None = 20, kernels_per_line: int = 3) -> Table:
    """``summary``'s "GPU time by code": GPU time per line of the program (a stack's innermost frame
    that is not cuptistream's own), the most first, with the kernels that make most of it."""
    lines: dict[str, list[Any]] = {}  # label -> [ns, launches, {work: ns}]
    for stack in stacks:
        row = lines.setdefault(code_of(stack), [0, 0, {}])
        row[0] += stack.gpu_ns
        row[1] += stack.launches
        row[2][stack.work] = row[2].get(stack.work, 0) + stack.gpu_ns
    total = sum(row[0] for row in lines.values()) or 1
    rows = []
    for label, (ns, launches, works) in sorted(lines.items(), key=lambda kv: -kv[1][0]):
        main = sorted(works.items(), key=lambda kv: -kv[1])[:kernels_per_line]
        shown = "; ".join(f"{work} {share / ns:.0%}" for work, share in main)
        rows.append([label, ns, ns / total, launches, shown])
    table = Table("code", "GPU time by code (the program's line that launched it)",
                  ["code", "total_ns", "share", "launches", "kernels"], rows)  # fmt: skip
    return cut(table, top)
