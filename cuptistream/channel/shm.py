"""``SlotPool``: fixed-size slots in one anonymous shared-memory file (memfd), each with a header.

The probe creates the pool and hands its file descriptor to the collector, which maps the same
pages. Ownership of a slot moves with its ``state`` word, and each transition has one writer, so no
lock is shared between the processes:

- ``FREE → FILLING``: the probe takes a slot (``take``), under its own thread lock;
- ``FILLING → READY``: the probe publishes it (``publish``) after writing the data and the header;
- ``READY → FREE``: the collector releases it (``release``) after copying everything it needs.

The header's ``seq`` orders published slots, so a collector that drains a pool after the probe died
(``ready()``) replays them in the order they were completed. The state word is written last (and
read first); on x86-64, stores become visible in program order, which is what this relies on.

Failure modes: ``ChannelError`` (one line) when the memfd cannot be created or mapped, e.g. in a
sandbox that forbids ``memfd_create`` or with ``RLIMIT_MEMLOCK``/cgroup limits too low.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading

import numpy as np

from cuptistream.errors import ChannelError as ChannelError

FREE, FILLING, READY = 0, 1, 2
ACTIVITY, CHUNK = 1, 2  # what a READY slot holds: a CUPTI activity buffer, or encoded event chunks
CHUNK_PREFIX = struct.Struct("<II")  # before each chunk in a CHUNK slot: payload bytes, event count

HEADER_DTYPE = np.dtype(
    [
        ("state", "<u4"), ("kind", "<u4"), ("stream", "<u4"), ("_pad", "<u4"),
        ("seq", "<u8"), ("valid", "<u8"), ("dropped", "<u8"), ("count", "<u8"),
        ("_reserved", "<u8", 4),
    ]
)  # fmt: skip
assert HEADER_DTYPE.itemsize == 80
_ALIGN = 4096


def _data_offset(slots: int) -> int:
    header = slots * HEADER_DTYPE.itemsize
    return (header + _ALIGN - 1) // _ALIGN * _ALIGN


class SlotPool:
    """``slots`` slots of ``slot_size`` bytes (a multiple of 8) in one shared mapping."""

    def __init__(self, fd: int, slot_size: int, slots: int, *, owner: bool) -> None:
        self.fd = fd
        self.slot_size = slot_size
        self.slots = slots
        self.owner = owner  # True in the probe (it created the memfd)
        self.nbytes = _data_offset(slots) + slot_size * slots
        try:
            self._map = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise ChannelError(f"cannot map the shared-memory pool ({error.strerror})") from None
        raw = np.frombuffer(self._map, dtype=np.uint8)
        self.headers = np.ndarray((slots,), dtype=HEADER_DTYPE, buffer=self._map, offset=0)
        self._bytes = memoryview(self._map)
        self._data_start = _data_offset(slots)
        self.base_address = int(raw.ctypes.data) + self._data_start
        self._lock = threading.Lock()
        self._seq = 0
        self._hint = 0

    @classmethod
    def create(cls, name: str, slot_size: int, slots: int) -> SlotPool:
        """A new zero-filled pool backed by an anonymous memfd (pages are allocated when touched)."""
        slot_size -= slot_size % 8
        try:
            fd = os.memfd_create(f"cuptistream-{name}", os.MFD_CLOEXEC)
        except (AttributeError, OSError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise ChannelError(
                f"cannot create shared memory for the collector (memfd_create: {reason}); "
                "run on Linux >= 3.17 without a seccomp profile that blocks memfd_create"
            ) from None
        try:
            os.ftruncate(fd, _data_offset(slots) + slot_size * slots)
        except OSError as error:
            os.close(fd)
            raise ChannelError(f"cannot size the shared-memory pool ({error.strerror})") from None
        return cls(fd, slot_size, slots, owner=True)

    # --- the probe's side ---------------------------------------------------------------------

    def take(self) -> int | None:
        """A FREE slot, now FILLING; None when every slot is in use. Thread-safe within the probe."""
        states = self.headers["state"]
        with self._lock:
            for step in range(self.slots):
                slot = (self._hint + step) % self.slots
                if states[slot] == FREE:
                    states[slot] = FILLING
                    self._hint = slot + 1
                    return slot
        return None

    def address(self, slot: int) -> int:
        return self.base_address + slot * self.slot_size

    def slot_of(self, address: int) -> int | None:
        offset = address - self.base_address
        if offset < 0 or offset % self.slot_size or offset // self.slot_size >= self.slots:
            return None
        return offset // self.slot_size

    def publish(
        self, slot: int, kind: int, stream: int, valid: int, dropped: int = 0, count: int = 0
    ) -> None:
        """Hand a FILLING slot to the collector (state written last)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        header = self.headers[slot]
        header["kind"], header["stream"], header["seq"] = kind, stream, seq
        header["valid"], header["dropped"], header["count"] = valid, dropped, count
        self.headers["state"][slot] = READY

    def unpublish(self, slot: int) -> None:
        """Take back a slot the collector will never see (it is gone): FREE again."""
        self.headers["state"][slot] = FREE

    def reclaim_filling(self) -> int:
        """Free every FILLING slot: the buffers CUPTI held when it detached (``cuptiFinalize``), which
        it never completes. How many there were."""
        with self._lock:
            states = self.headers["state"]
            filling = states == FILLING
            states[filling] = FREE
            return int(np.count_nonzero(filling))

    def in_use(self) -> int:
        return int(np.count_nonzero(self.headers["state"] != FREE))

    # --- both sides ---------------------------------------------------------------------------

    def view(self, slot: int, nbytes: int | None = None) -> memoryview:
        start = slot * self.slot_size
        start += self._data_start
        return self._bytes[start : start + (self.slot_size if nbytes is None else nbytes)]

    # --- the collector's side -----------------------------------------------------------------

    def ready(self) -> list[int]:
        """READY slots in the order they were published. In lists, not numpy: a pool holds 4-16
        slots, and numpy's four calls cost 5x as much there (a drain runs on every ``Ready``)."""
        ready = [slot for slot, state in enumerate(self.headers["state"].tolist()) if state == READY]
        if len(ready) > 1:
            ready.sort(key=self.headers["seq"].tolist().__getitem__)
        return ready

    def release(self, slot: int) -> None:
        self.headers["state"][slot] = FREE

    def close(self) -> None:
        """Unmap and close the descriptor. Views handed out must be gone by now."""
        self.headers = None  # type: ignore[assignment]
        self._bytes.release()
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes with the process
        try:
            os.close(self.fd)
        except OSError:
            pass
