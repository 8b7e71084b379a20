"""GPU time by the code that launched it: each kernel, copy and memset joined to a Python stack.

Two passes over a recording (``join_stacks``): the first indexes the stacks each thread was at
(``cuptistream.stacks.index.StackIndex``); the second follows each GPU record's correlation id to the API call
that launched it (its thread and start time) and asks the index which stack that was. Launches and
GPU records that wait for each other are kept in bounded tables (a kernel's API record comes
shortly before or after it); what falls out goes to ``[no stack recorded]``. Memory: the stack
events and waiting calls, the pending launches, and one total per (process, stack, operation).

A process recorded without raw GPU records (always-on recordings: ``records: on_demand``) is read
from the collector's ``StackStats`` instead: GPU time per stack, not split by kernel (the GPU
operation is ``STATS_WORK``), estimated where only part of an interval was traced. A process with
raw GPU records is joined from them alone, so nothing is counted twice.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cuptistream.analysis.names import DisplayNames
from cuptistream.analysis.records import Part, Recording, tag_of
from cuptistream.analysis.select import Selection
from cuptistream.analysis.summary_report import Table, cut
from cuptistream.errors import UserError
from cuptistream.stacks.index import (
    NO_PYTHON_STACK,
    NO_STACK_RECORDED,
    NONE_RECORDED,
    OTHER_STACK,
    Frame,
    ProcessKey,
    StackIndex,
)
from cuptistream.stacks.sampler import SYNTHETIC_FILE, THREAD_ID_MASK

__all__ = [
    "NO_PYTHON_STACK", "NO_STACK_RECORDED", "Frame", "StackIndex", "StackJoin", "StackTime", "index_stacks",
    "join_stacks",
]  # fmt: skip

_WORK = ("kernel", "memcpy", "memset")
PENDING = 1 << 20  # launches (and GPU records) waiting for their other half, per process
STATS_WORK = "[GPU work]"  # the operation of GPU time read from StackStats (not split by kernel)


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
    estimated: bool = False  # from StackStats scaled to whole intervals


class _Pending:
    """One process's launches and GPU records that wait for each other, bounded."""

    def __init__(self) -> None:
        self.launches: OrderedDict[int, tuple[int, int]] = OrderedDict()  # correlation -> (thread, start)
        self.work: OrderedDict[int, list[tuple[str, int]]] = OrderedDict()  # correlation -> [(what, ns)]


class StackJoin:
    """The second pass: folds batches in, each GPU record joined through ``index``; ``result()``
    sums them. ``kernel`` keeps only the GPU work whose shown name matches the regular expression."""

    def __init__(
        self, index: StackIndex, selection: Selection | None = None, *, kernel: str | None = None,
        mangled: bool = False,
    ) -> None:  # fmt: skip
        self.index = index
        self.selection = selection or Selection()
        self._kernel = re.compile(kernel) if kernel else None
        self.names = DisplayNames(mangled)
        self._pending: dict[ProcessKey, _Pending] = {}
        self._totals: dict[tuple[ProcessKey, int, str], list[int]] = {}  # -> [ns, launches]
        self._raw: set[ProcessKey] = set()  # processes with raw GPU records
        self._stats: dict[tuple[ProcessKey, int], list[int]] = {}  # StackStats' -> [ns, launches, estimated]

    @property
    def resources(self) -> dict[ProcessKey, Any]:
        return self.index.resources

    def add(self, part: Part) -> None:
        sel = self.selection
        if not sel.accepts(part.resource):
            return
        key = (part.resource.host, part.resource.pid)
        pending = self._pending.setdefault(key, _Pending())
        low, high = sel.window(part.offset_ns, part.events) if sel.timed else (None, None)
        for event in part.events:
            tag = tag_of(event)
            if tag == "stack_stats":
                self._add_stats(key, event, part.offset_ns, low, high)
            elif tag in _WORK:
                self._raw.add(key)
                if low is not None and not low <= event.start + part.offset_ns < high:
                    continue
                if sel.devices is not None and event.device_id not in sel.devices:
                    continue
                what = self._what(tag, event)
                if what is None:
                    continue
                launch = pending.launches.get(event.correlation_id)
                if launch is not None:
                    self._count(key, launch, what, event.end - event.start)
                else:  # its API record comes later (another buffer)
                    waiting = pending.work.setdefault(event.correlation_id, [])
                    waiting.append((what, event.end - event.start))
                    if len(pending.work) > PENDING:
                        for what_, ns in pending.work.popitem(last=False)[1]:
                            self._add(key, NONE_RECORDED, what_, ns)
            elif tag == "api":
                launch = (event.thread_id & THREAD_ID_MASK, event.start)
                for what, ns in pending.work.pop(event.correlation_id, ()):
                    self._count(key, launch, what, ns)
                pending.launches[event.correlation_id] = launch  # a graph launch: many kernels
                if len(pending.launches) > PENDING:
                    pending.launches.popitem(last=False)

    def _add_stats(self, key: ProcessKey, st: Any, offset: int, low: int | None, high: int | None) -> None:
        """One StackStats event: counted when its interval starts inside the window (as the
        summary counts the other statistics), estimated values where estimated."""
        if low is not None and high is not None and not low <= st.interval_start + offset < high:
            return
        if self.selection.devices is not None and st.device_id not in self.selection.devices:
            return
        ns, launches = (
            (st.estimated_gpu_ns, st.estimated_launches) if st.estimated else (st.gpu_ns, st.launches)
        )
        for stack, time, count in zip(st.stack_ids, ns, launches, strict=True):
            total = self._stats.get((key, stack))
            if total is None:
                total = self._stats[(key, stack)] = [0, 0, 0]
            total[0] += time
            total[1] += count
            total[2] |= st.estimated

    @property
    def from_statistics(self) -> set[ProcessKey]:
        """The processes read from StackStats: those without raw GPU records."""
        return {key for key, _ in self._stats} - self._raw

    def _count(self, key: ProcessKey, launch: tuple[int, int], what: str, ns: int) -> None:
        self._add(key, self.index.stack_at(key, *launch), what, ns)

    def _add(self, key: ProcessKey, stack: int, what: str, ns: int) -> None:
        total = self._totals.get((key, stack, what))
        if total is None:
            total = self._totals[(key, stack, what)] = [0, 0]
        total[0] += ns
        total[1] += 1

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

    def result(self) -> list[StackTime]:
        """GPU time and launches per (process, stack, operation), the most time first. GPU records
        whose API record never came go to ``[no stack recorded]``."""
        for key, pending in self._pending.items():
            for works in pending.work.values():
                for what, ns in works:
                    self._add(key, NONE_RECORDED, what, ns)
            pending.work.clear()
        frames: dict[tuple[ProcessKey, int], tuple[Frame, ...]] = {}
        out = []
        for (key, stack, what), (ns, n) in self._totals.items():
            shown = frames.get((key, stack))
            if shown is None:
                shown = frames[(key, stack)] = self.index.frames_of(key, stack)
            out.append(StackTime(key[0], key[1], shown, what, ns, n))
        statistics = self.from_statistics
        if statistics and self._kernel is not None:
            pids = ", ".join(str(pid) for _, pid in sorted(statistics))
            raise UserError(
                f"--kernel: process {pids} recorded GPU time per stack (stack_stats), not per kernel; "
                "leave out --kernel, or record raw records (activity records: all) to filter by kernel"
            )
        for (key, stack), (ns, n, estimated) in self._stats.items():
            if key in statistics and ns:
                shown = self._frames_of_stats(key, stack)
                out.append(StackTime(key[0], key[1], shown, STATS_WORK, ns, n, bool(estimated)))
        out.sort(key=lambda s: (-s.gpu_ns, s.host, s.pid, s.work))
        return out

    def _frames_of_stats(self, key: ProcessKey, stack: int) -> tuple[Frame, ...]:
        if stack == OTHER_STACK:
            return (Frame(SYNTHETIC_FILE, "[other stacks]", 0),)
        return self.index.frames_of(key, stack)


def index_stacks(recording: Recording, selection: Selection | None = None) -> StackIndex:
    """The first pass over ``recording``: the stacks of the processes ``selection`` keeps."""
    index = StackIndex()
    for part in recording.parts():
        if selection is None or selection.accepts(part.resource):
            index.add(part.resource, part.events)
    return index


def join_stacks(
    recording: Recording, selection: Selection | None = None, *, kernel: str | None = None,
    mangled: bool = False,
) -> StackJoin:  # fmt: skip
    """Both passes over ``recording``: its stacks indexed, then its GPU work joined to them."""
    index = index_stacks(recording, selection)
    joiner = StackJoin(index, selection, kernel=kernel, mangled=mangled)
    for part in recording.parts():
        joiner.add(part)
    return joiner


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
        if stack.work != STATS_WORK:  # StackStats are not split by kernel
            row[2][stack.work] = row[2].get(stack.work, 0) + stack.gpu_ns
    total = sum(row[0] for row in lines.values()) or 1
    rows = []
    for label, (ns, launches, works) in sorted(lines.items(), key=lambda kv: -kv[1][0]):
        main = sorted(works.items(), key=lambda kv: -kv[1])[:kernels_per_line]
        shown = "; ".join(f"{work} {share / ns:.0%}" for work, share in main)
        rows.append([label, ns, ns / total, launches, shown])
    title = "GPU time by code (the program's line that launched it" + statistics_note(stacks) + ")"
    table = Table("code", title, ["code", "total_ns", "share", "launches", "kernels"], rows)
    return cut(table, top)


def statistics_note(stacks: Sequence[StackTime]) -> str:
    """What the output should say where GPU time came from StackStats: "" where it did not."""
    if not any(s.work == STATS_WORK for s in stacks):
        return ""
    note = "; from the collector's statistics (stack_stats), not split by kernel"
    if any(s.estimated for s in stacks):
        note += "; estimated: scaled to whole intervals where only part was traced"
    return note
