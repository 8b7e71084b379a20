"""Activity buffers: a bounded pool, and the two CUPTI buffer callbacks (one call per buffer).

CUPTI calls ``requested`` when it needs an empty buffer and ``completed`` when one is full or
flushed. Both run on CUPTI's or the application's thread, so each does O(1) work and returns:
``requested`` pops a buffer from the pool (or refuses one when the pool is at its limit, so CUPTI
drops records and counts them), ``completed`` puts ``(address, valid_bytes, dropped)`` on a
thread-safe queue for the decode thread. Nothing here waits on the pipeline.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from typing import Any

import numpy as np

from cuptistream.cupti import driver

_ALIGN = 8  # CUPTI requires 8-byte-aligned buffers

_RequestFunc = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_CompleteFunc = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)


class BufferPool:
    """Up to ``limit`` buffers of ``buffer_size`` bytes, allocated on demand and reused.

    ``take``/``give_back`` are safe from any thread. Memory use is at most ``limit * buffer_size``.
    """

    def __init__(self, buffer_size: int, limit: int, prealloc: int = 0) -> None:
        self.buffer_size = buffer_size - buffer_size % _ALIGN
        self.limit = max(limit, 1)
        self._lock = threading.Lock()
        self._arrays: dict[int, np.ndarray] = {}  # address -> backing array (keeps it alive)
        self._free: list[int] = []
        self.refused = 0  # requests refused because every buffer was in use
        for _ in range(min(prealloc, self.limit)):
            self._free.append(self._allocate())

    def _allocate(self) -> int:
        raw = np.empty(self.buffer_size + _ALIGN, dtype=np.uint8)
        shift = (-raw.ctypes.data) % _ALIGN
        array = raw[shift : shift + self.buffer_size]
        address = int(array.ctypes.data)
        self._arrays[address] = array
        return address

    def take(self) -> int | None:
        with self._lock:
            if self._free:
                return self._free.pop()
            if len(self._arrays) < self.limit:
                return self._allocate()
            self.refused += 1
            return None

    def give_back(self, address: int) -> None:
        with self._lock:
            if address in self._arrays:
                self._free.append(address)

    def view(self, address: int) -> memoryview:
        return memoryview(self._arrays[address].data)

    def owns(self, address: int) -> bool:
        return address in self._arrays

    @property
    def outstanding(self) -> int:
        """Buffers with CUPTI or waiting to be decoded."""
        with self._lock:
            return len(self._arrays) - len(self._free)


Completed = tuple[int, int, int]  # (address, valid bytes, records CUPTI dropped)


class BufferCallbacks:
    """The raw ``cuptiActivityRegisterCallbacks`` pair, feeding completed buffers to ``out``."""

    def __init__(self, pool: BufferPool, out: queue.SimpleQueue[Any]) -> None:
        self.pool = pool
        self.out = out
        self.errors = 0
        self.buffers_completed = 0
        self._lib = driver.libcupti()
        self._request_fn = _RequestFunc(self._requested)  # kept referenced: CUPTI holds the pointers
        self._complete_fn = _CompleteFunc(self._completed)

    def register(self) -> None:
        driver.call(
            "cuptiActivityRegisterCallbacks",
            ctypes.cast(self._request_fn, ctypes.c_void_p),
            ctypes.cast(self._complete_fn, ctypes.c_void_p),
        )
        global _registered
        _registered = self  # CUPTI may call these until the next registration or cuptiFinalize

    def _requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        try:
            address = self.pool.take()
            buffer[0] = address  # None (NULL) with size 0: CUPTI drops records and counts them
            size[0] = self.pool.buffer_size if address is not None else 0
            max_records[0] = 0  # as many as fit
        except Exception:
            self.errors += 1

    def _completed(
        self, context: int | None, stream_id: int, buffer: int | None, size: int, valid: int
    ) -> None:
        try:
            dropped = ctypes.c_size_t(0)
            self._lib.cuptiActivityGetNumDroppedRecords(context, stream_id, ctypes.byref(dropped))
            self.buffers_completed += 1
            if buffer is not None and self.pool.owns(buffer):
                self.out.put((buffer, valid, dropped.value))
            elif dropped.value:
                self.out.put((0, 0, dropped.value))
        except Exception:
            self.errors += 1


_registered: BufferCallbacks | None = None
