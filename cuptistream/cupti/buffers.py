"""The two CUPTI activity-buffer callbacks (``cuptiActivityRegisterCallbacks``), one call per buffer.

CUPTI calls ``requested`` when it needs an empty buffer and ``completed`` when one is full or
flushed. Both run on CUPTI's or the application's thread, so each does O(1) work and returns:
``requested`` takes a shared-memory buffer from the outlet (or refuses one when all are in use, so
CUPTI drops records and counts them), ``completed`` hands the buffer to the collector with its
valid bytes and CUPTI's dropped-record count. Nothing here reads a record or waits.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

from cuptistream.cupti import library


class Buffers(Protocol):
    """Where the buffers come from and go to (the probe's ``channel.outlet.ActivityOutlet``): a
    fixed set of ``slot_size``-byte buffers, handed out and taken back by address."""

    slot_size: int

    def take(self) -> int | None: ...
    def complete(self, address: int, valid: int, dropped: int = 0) -> None: ...
    def give_back(self, address: int) -> None: ...
    def owns(self, address: int) -> bool: ...


_RequestFunc = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_CompleteFunc = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)


class BufferCallbacks:
    """The raw callback pair, feeding completed buffers to ``outlet``.

    ``on_dropped(count)`` is told about records CUPTI dropped that came with no buffer of ours."""

    def __init__(self, outlet: Buffers, on_dropped: Any) -> None:
        self.outlet = outlet
        self.on_dropped = on_dropped
        self.errors = 0
        self.refused = 0  # requests refused because every buffer was in use
        self.buffers_completed = 0
        self._lib = library.libcupti()
        self._request_fn = _RequestFunc(self._requested)  # kept referenced: CUPTI holds the pointers
        self._complete_fn = _CompleteFunc(self._completed)

    def register(self) -> None:
        library.call(
            "cuptiActivityRegisterCallbacks",
            ctypes.cast(self._request_fn, ctypes.c_void_p),
            ctypes.cast(self._complete_fn, ctypes.c_void_p),
        )
        global _registered
        _registered = self  # CUPTI may call these until the next registration or cuptiFinalize

    def _requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        try:
            address = self.outlet.take()
            if address is None:
                self.refused += 1
            buffer[0] = address  # None (NULL) with size 0: CUPTI drops records and counts them
            size[0] = self.outlet.slot_size if address is not None else 0
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
            if buffer is not None and self.outlet.owns(buffer):
                if valid:
                    self.outlet.complete(buffer, valid, dropped.value)
                    return
                self.outlet.give_back(buffer)
            if dropped.value:
                self.on_dropped(dropped.value)
        except Exception:
            self.errors += 1


_registered: BufferCallbacks | None = None
