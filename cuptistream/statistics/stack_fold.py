"""GPU time by launching stack, per interval, device and process, from whole record arrays: the
collector's side of the join ``cuptistream.analysis.stacks`` makes from raw records (``StackStats``).

The accumulator hands over each array of kernels, copies and memsets it keeps (interval, device,
correlation id, duration); the decode stream hands over the API records and the process's stack
events. An interval's GPU work is joined when the accumulator closes the interval: through its
correlation id to the API record that launched it (thread, start), then to the stack that thread was
at (``StackIndex.stacks_at``, numpy over the whole interval). Joining at the close rather than on
arrival is what lets the stack events come after the activity buffers: the probe's sampler sends
them about once a second (``stacks.sampler``), and the sample after a launch, about one
``stacks.interval`` later, can still move it; the accumulator closes an interval only once the
records show time ``LATENESS_NS`` (3 s) past its end, while buffers come every
``activity.flush_interval``. GPU work whose API record has not come by then counts as -1
(``[no stack recorded]``).

Bounds: an interval's GPU work is held until the interval closes (three int64 columns a record).
API records are kept while a later interval may still need them (started at most one interval
before the oldest open one), and never more than ``MAX_LAUNCHES``: past that the oldest go, counted
in ``launches_dropped``. The index keeps what the open intervals need (``StackIndex.forget_before``).

A stream gets a fold only where its probe samples stacks (``OpenStream.stacks``): one that does not
costs nothing here. Nothing is emitted for a process that sends no stack events or a stream without
API records. Once an interval has closed with no stack event yet, a stream traced continuously
(``activity.mode: full``) holds no more GPU work until one comes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from cuptistream.cupti.api_functions import api_names
from cuptistream.events import StackStats
from cuptistream.stacks.index import KERNEL_LAUNCHES, NONE_RECORDED, OTHER_STACK, StackIndex
from cuptistream.stacks.sampler import THREAD_ID_MASK

MAX_LAUNCHES = 1 << 20  # API records held for GPU work still to come
_DOMAINS = {4: "driver", 5: "runtime"}  # CUpti_ActivityKind of the API records -> api_names' domain

Work = tuple[np.ndarray, np.ndarray, np.ndarray]  # device, correlation id, duration


class StackFold:
    """The stack statistics of one decode stream (one process). Not thread-safe."""

    def __init__(self, interval_ns: int, max_stacks: int, process_id: int) -> None:
        self.interval_ns = interval_ns
        self.max_stacks = max_stacks
        self.process_id = process_id
        self.index = StackIndex()
        self._key = ("", process_id)
        self._work: dict[int, list[Work]] = {}  # interval -> arrays of GPU work
        self._launches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # correlation, thread, start
        self._held = 0  # API records in ``_launches``
        self._launching: dict[int, bool] = {}  # kind << 32 | cbid -> whether the call launches GPU work
        self.saw_api = False
        self.saw_stacks = False
        self._holding = True
        self.launches_dropped = 0  # API records dropped past MAX_LAUNCHES
        self.unjoined = 0  # GPU records whose API record never came (counted as -1)

    # --- in ---------------------------------------------------------------------------------------

    def stack_events(self, events: Iterable[Any]) -> None:
        """The process's ``StackTable`` and ``StackChanges`` events (others are ignored)."""
        stacks = [e for e in events if type(e).__struct_config__.tag in ("stack_table", "stack_changes")]
        if stacks:
            self.saw_stacks = self._holding = True
            self.index.add_events(self._key, stacks)

    def api(self, kind: int, records: np.ndarray) -> None:
        """One array of runtime or driver API records: launches by correlation id, and the calls
        that launch nothing (synchronize, copies) for the index's waiting-call handling."""
        if not len(records):
            return
        self.saw_api = True
        if not self._holding:
            return
        correlation = records["correlation_id"].astype(np.int64)
        thread = records["thread_id"].astype(np.int64) & THREAD_ID_MASK
        start = records["start"].astype(np.int64)
        self._launches.append((correlation, thread, start))
        self._held += len(records)
        while self._held > MAX_LAUNCHES and len(self._launches) > 1:
            dropped = len(self._launches.pop(0)[0])
            self._held -= dropped
            self.launches_dropped += dropped
        waits = ~self._launches_work(kind, records["cbid"].astype(np.int64))
        if waits.any():
            end = records["end"].astype(np.int64)
            self.index.add_waits(self._key, thread[waits], start[waits], end[waits])

    def _launches_work(self, kind: int, cbids: np.ndarray) -> np.ndarray:
        """Per record, whether its function launches GPU work (by name, as the index tells)."""
        distinct = np.unique(cbids)
        table = api_names(_DOMAINS[kind]) if kind in _DOMAINS else {}
        flags = []
        for cbid in distinct.tolist():
            code = kind << 32 | cbid
            flag = self._launching.get(code)
            if flag is None:
                name = table.get(cbid) or f"cbid_{cbid}"
                flag = self._launching[code] = name.startswith(KERNEL_LAUNCHES)
            flags.append(flag)
        return np.asarray(flags, bool)[np.searchsorted(distinct, cbids)]

    def work(
        self, interval: np.ndarray, device: np.ndarray, correlation: np.ndarray, duration: np.ndarray
    ) -> None:
        """GPU records the accumulator keeps: each one's interval, device, correlation id, duration."""
        if not self._holding:
            return
        low, high = int(interval.min()), int(interval.max())
        for at in [low] if low == high else np.unique(interval).tolist():
            rows = slice(None) if low == high else interval == at
            self._work.setdefault(at, []).append((device[rows], correlation[rows], duration[rows]))

    # --- out --------------------------------------------------------------------------------------

    def emit(
        self, interval: int, low: int, high: int, traced: int, scales: tuple[bool, float, float] | None
    ) -> list[StackStats]:
        """The interval's events, one per device (none without stacks, API records or traced
        kernels). ``scales``: the accumulator's (estimated, time scale, count scale)."""
        work = self._work.pop(interval, None)
        if not work or scales is None or not (self.saw_api and self.saw_stacks):
            return []
        device, correlation, duration = (np.concatenate(c) for c in zip(*work, strict=True))
        stack = self._stacks_of(correlation)
        estimated, scale, count_scale = scales
        events = []
        one = device.min() == device.max()
        for dev in [int(device[0])] if one else np.unique(device).tolist():
            rows = slice(None) if one else device == dev
            ids, ns, launches = self._rows(stack[rows], duration[rows])
            events.append(StackStats(
                interval_start=low, interval_end=high, device_id=dev, process_id=self.process_id,
                traced_ns=traced, stack_ids=ids, gpu_ns=ns, launches=launches, estimated=estimated,
                estimated_gpu_ns=[round(v * scale) for v in ns],
                estimated_launches=[round(v * count_scale) for v in launches],
            ))  # fmt: skip
        return events

    def _stacks_of(self, correlation: np.ndarray) -> np.ndarray:
        """Each GPU record's stack id: its API record's thread and start, looked up in the index."""
        out = np.full(len(correlation), NONE_RECORDED, np.int64)
        if self._launches:
            ids, thread, start = (np.concatenate(c) for c in zip(*self._launches, strict=True))
            order = np.argsort(ids, kind="stable")
            ids, thread, start = ids[order], thread[order], start[order]
            latest = np.append(ids[1:] != ids[:-1], True)  # a correlation id's latest API record
            ids, thread, start = ids[latest], thread[latest], start[latest]
            at = np.minimum(np.searchsorted(ids, correlation), len(ids) - 1)
            found = ids[at] == correlation
            out[found] = self.index.stacks_at(self._key, thread[at[found]], start[at[found]])
        self.unjoined += int(np.count_nonzero(out == NONE_RECORDED))
        return out

    def _rows(self, stack: np.ndarray, duration: np.ndarray) -> tuple[list[int], list[int], list[int]]:
        """(stack ids, GPU ns, launches): the top ``max_stacks`` by GPU time, the rest as one -3 row."""
        ids, inverse = np.unique(stack, return_inverse=True)
        ns = np.rint(np.bincount(inverse, weights=duration, minlength=len(ids))).astype(np.int64)
        count = np.bincount(inverse, minlength=len(ids))
        order = np.lexsort((ids, -ns))  # the most time first; ties by id
        kept, rest = order[: self.max_stacks], order[self.max_stacks :]
        out_ids, out_ns, out_n = ids[kept].tolist(), ns[kept].tolist(), count[kept].tolist()
        if len(rest):
            out_ids.append(OTHER_STACK)
            out_ns.append(int(ns[rest].sum()))
            out_n.append(int(count[rest].sum()))
        return out_ids, out_ns, out_n

    def closed_until(self, time: int, windowed: bool) -> None:
        """Every interval before ``time`` is closed: forget what no open one needs. ``windowed``:
        the stream traces in windows (budget mode), whose stacks come with each window."""
        if not self.saw_stacks and not windowed:
            self._holding = False
            self._work.clear()
            self._launches.clear()
            self._held = 0
            return
        keep = time - self.interval_ns  # GPU work still open may have been launched this early
        while self._launches and int(self._launches[0][2].max()) < keep:
            self._held -= len(self._launches.pop(0)[0])
        self.index.forget_before(self._key, keep)
