"""Shared-memory slots that decode workers pack their replies' events into
(``pipeline.worker_replies: shared``), so that megabytes of events do not cross a socket.

Over the socket, a reply's events are copied twice by the kernel: out of the worker and into the
collector's mapping; packed into a slot that both processes map, they are not copied at all (see
docs/performance.md). The collector owns the slots:

- ``ReplySlots.take(size)`` (collector) names an idle slot of at least ``size`` bytes for the next
  ``Decode`` requests, creating one (a memfd) while the slots stay within ``max_bytes``; None when
  every slot is in use, and the reply's events then come over the socket as before.
  "Idle" is checked, not assumed, as ``ReplyMaps`` checks it: a slot's own mapping in the
  collector cannot be resized while any view points into it (an event chunk a sink still holds),
  so the worker never writes over bytes that something still reads.
- A probe connection's link packs reply after reply into one slot, an ``Arena`` of at least
  ``ARENA_BYTES``, and takes another only when the next reply does not fit the rest: a slot per
  reply would pin a whole MiB for the few hundred KB of a typical reply, so that a backlog in the
  sinks would use up every slot within ``max_bytes``, and each reply would then pay a scan of
  hundreds of slots, or the socket.
- The worker maps a slot the first time a request names it (its memfd comes with that request)
  and packs into the part the request gives it through a ``SlotWriter``; each chunk that landed
  there is named in the reply by slot, offset and size (``worker_protocol.EmitSlotChunk``), and
  ``view`` turns it back into bytes on the collector's side.
- Idle slots beyond ``idle_bytes`` give their pages back (``MADV_REMOVE``), the least recently
  taken first, at a ``take`` at most every ``TRIM_INTERVAL_S`` (or one that would make a slot);
  slots in use are the pipeline's, counted by its memory budget.

The pages are shared memory (RssShmem), reported apart from the collector's anonymous memory.
Thread-safe: every probe connection's thread takes from the one set of slots.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time

import numpy as np

from cuptistream.collector.reply_maps import is_idle

_ROUND = 1 << 20  # slot sizes in whole MiB, so that probes with similar buffers share slots
_ALIGN = 8
ARENA_BYTES = 4 << 20  # a link's slot: ~16 replayed replies, or one to three of a GPU's 4 MiB buffers
TRIM_INTERVAL_S = 0.5  # idle slots beyond the bound give their pages back within this


class _Slot:
    __slots__ = ("fd", "mapping", "resident", "size")

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("cuptistream-reply", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.mapping = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(self.fd)
            raise
        self.size = size
        self.resident = True  # may hold pages (False once they were given back)

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self.mapping.close()  # a view still alive: the mapping goes with the last one
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Taken:
    """A slot named in one request. ``hold`` (a view of the whole slot) keeps it from being taken
    again until ``release``, by which time the reply's chunks hold views of their own."""

    __slots__ = ("fd", "hold", "size", "slot")

    def __init__(self, slot: int, size: int, fd: int, hold: memoryview) -> None:
        self.slot, self.size, self.fd, self.hold = slot, size, fd, hold

    def release(self) -> None:
        self.hold.release()


class ReplySlots:
    """The collector's reply slots: at most ``max_bytes`` of them, ``idle_bytes`` kept resident
    while idle."""

    def __init__(self, max_bytes: int, idle_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.idle_bytes = idle_bytes
        self._slots: list[_Slot] = []
        self._recent: list[int] = []  # slot indices, the least recently taken first
        self._lock = threading.Lock()
        self._trim_due = 0.0
        self.created = 0
        self.taken = 0  # slots taken (an arena's replies share one)
        self.replies = 0  # requests that named a slot
        self.full = 0  # takes that found no idle slot (their replies' events came over the socket)

    def take(self, size: int) -> Taken | None:
        """An idle slot for replies of up to ``size`` bytes of events, held (``Taken.hold``) until
        the caller has viewed their chunks; None when no slot is idle and no other fits
        within ``max_bytes``. Raises nothing: a memfd that cannot be made means None."""
        with self._lock:
            chosen = self._idle_fit(size)
            now = time.monotonic()
            if chosen is None or now >= self._trim_due:
                self._trim(chosen)
                self._trim_due = now + TRIM_INTERVAL_S
            if chosen is None:
                rounded = -(-max(size, 1) // _ROUND) * _ROUND
                if sum(s.size for s in self._slots) + rounded > self.max_bytes:
                    self.full += 1
                    return None
                try:
                    self._slots.append(_Slot(rounded))
                except OSError:
                    self.full += 1
                    return None
                self.created += 1
                chosen = len(self._slots) - 1
            else:
                self._recent.remove(chosen)
            self._recent.append(chosen)
            slot = self._slots[chosen]
            slot.resident = True
            self.taken += 1
            return Taken(chosen, slot.size, slot.fd, memoryview(slot.mapping))

    def _idle_fit(self, size: int) -> int | None:
        """An idle slot of ``size`` to ``2 * size`` (+1 MiB) bytes: one whose pages are still in
        first (a slot given back is faulted in again page by page as the worker packs into it:
        88 faults per 1,000 records at 16 GPU programs when any idle slot would do), the least
        recently taken first (the likeliest to be idle: sinks let go of replies in order). It stops
        at the first: each test is a syscall, and a busy node has a hundred slots."""
        fitting = [i for i in self._recent if size <= self._slots[i].size <= 2 * size + _ROUND]
        for index in sorted(fitting, key=lambda i: not self._slots[i].resident):  # stable: keeps recency
            if is_idle(self._slots[index].mapping):
                return index
        return None

    def _trim(self, chosen: int | None) -> None:
        """Give back the pages of idle slots beyond ``idle_bytes``, keeping the most recently taken
        (the likeliest to be taken again soon). Tests every resident slot: run at most every
        ``TRIM_INTERVAL_S``, and when a take finds no idle slot (a new one would be made)."""
        kept = 0
        for index in reversed(self._recent):
            slot = self._slots[index]
            if index == chosen or not slot.resident:
                continue
            if not is_idle(slot.mapping):
                continue
            if kept + slot.size <= self.idle_bytes:
                kept += slot.size
            else:
                slot.mapping.madvise(mmap.MADV_REMOVE)
                slot.resident = False

    def count_reply(self) -> None:
        with self._lock:
            self.replies += 1

    def view(self, slot: int, offset: int, size: int) -> memoryview:
        """``size`` bytes at ``offset`` of ``slot``. Raises ValueError for a range outside it (a
        reply that does not match what was asked)."""
        mapping = self._slots[slot].mapping
        if offset < 0 or size < 0 or offset + size > len(mapping):
            raise ValueError(f"reply slot {slot}: {size} bytes at {offset} are outside its {len(mapping)}")
        return memoryview(mapping)[offset : offset + size]

    def close(self) -> None:
        """Forget every slot; mappings still viewed go when their last view does."""
        with self._lock:
            for slot in self._slots:
                slot.close()
            self._slots.clear()
            self._recent.clear()


class Arena:
    """One link's current reply slot, packed reply after reply: ``place`` says where the next
    reply's events go, ``packed`` where the last one ended. The link holds the slot (``Taken.hold``)
    until the next reply will not fit the rest, or ``release``; the slot is idle again once the
    sinks let go of its last reply's chunks. Used by one thread at a time (the link's connection)."""

    def __init__(self, slots: ReplySlots) -> None:
        self._slots = slots
        self._taken: Taken | None = None
        self._at = 0

    def place(self, need: int) -> tuple[Taken, int] | None:
        """The slot and the offset from which the next reply, of about ``need`` bytes, may use the
        rest of it; None when no slot can be had (the events come over the socket)."""
        taken = self._taken
        if taken is None or self._at + need > taken.size:
            self.release()
            taken = self._slots.take(max(need, ARENA_BYTES))
            if taken is None:
                return None
            self._taken, self._at = taken, 0
        self._slots.count_reply()
        return taken, self._at

    def packed(self, end: int, next_need: int) -> None:
        """The last reply's events reached ``end``: the next one goes after them. Where the next,
        of about ``next_need`` bytes, will not fit the rest, the slot goes now, not at that reply:
        a GPU's replies fill a slot each, and 16 links each holding one used up ``max_bytes``."""
        self._at = max(self._at, -(-end // _ALIGN) * _ALIGN)
        if self._taken is not None and self._at + next_need > self._taken.size:
            self.release()

    def release(self) -> None:
        """Let the slot go (the link closes, or the next reply needs another)."""
        if self._taken is not None:
            self._taken.release()
            self._taken = None


class SlotWriter:
    """The worker's side of one reply: hands out parts of a slot it mapped, from ``start`` on and
    in order, for the packer to write events into (``allocate``), and says where a chunk's payload
    lies (``locate``)."""

    def __init__(self, slot: int, mapping: mmap.mmap, start: int = 0) -> None:
        self.slot = slot
        self._bytes = np.frombuffer(mapping, dtype=np.uint8)
        self._at = start
        self._given: dict[int, tuple[int, np.ndarray]] = {}  # id(array) -> (offset, array)

    def allocate(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of the slot as a uint8 array, or None when they do not fit (the caller then
        allocates on its heap)."""
        start = -(-self._at // _ALIGN) * _ALIGN
        if start + nbytes > len(self._bytes):
            return None
        out = self._bytes[start : start + nbytes]
        self._at = start + nbytes
        self._given[id(out)] = (start, out)
        return out

    def locate(self, payload: bytes | memoryview) -> int | None:
        """The offset of ``payload`` in the slot, if it is one of the arrays handed out."""
        owner = payload.obj if isinstance(payload, memoryview) else None
        given = self._given.get(id(owner))
        if given is None or given[1] is not owner or len(payload) != owner.nbytes:  # type: ignore[union-attr]
            return None
        return given[0]

    def release(self) -> None:
        """The reply has gone: drop the views of the slot (the collector names it next time)."""
        self._given.clear()
        self._bytes = np.zeros(0, np.uint8)
