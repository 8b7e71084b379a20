"""One user of a device's performance counters at a time, within a process.

PM sampling (``pm_sampling`` source) holds a device's counters all the time; CUPTI's range profiler
(``cuptistream trace --metrics``) needs the same counters for the length of its window, and
enabling it beside PM sampling fails. So the holder registers itself as the device's lender, and a
window borrows the devices it profiles: each lender stops and disables what it holds, the window
profiles, and giving the loan back lets the lenders take their counters up again.

A lender in another process is not reached from here: the collector grants each device's PM
sampling to one process, and a window in another process finds the counters held, as it would
with any other tool.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol


class Lender(Protocol):
    """What holds a device's counters and can let go of them for a while."""

    def lend(self, timeout: float) -> bool:
        """Let go of the counters (stop, disable) until ``take_back``; True once they are free,
        False if that did not happen within ``timeout`` s. Called once per loan."""
        ...

    def take_back(self) -> None:
        """The loan is over: take the counters up again (once every loan is over)."""
        ...


_lock = threading.Lock()
_lenders: dict[int, list[Lender]] = {}  # CUDA device ordinal -> who holds its counters


def register(device: int, lender: Lender) -> None:
    """``lender`` holds ``device``'s counters from now on."""
    with _lock:
        _lenders.setdefault(device, []).append(lender)


def unregister(device: int, lender: Lender) -> None:
    """``lender`` holds them no more (a loan it is in still gets its ``take_back``)."""
    with _lock:
        holders = _lenders.get(device, [])
        if lender in holders:
            holders.remove(lender)


class Loan:
    """The counters of some devices, borrowed. ``give_back`` is idempotent."""

    def __init__(self, lenders: list[tuple[int, Lender]], refused: list[int]) -> None:
        self._lenders = lenders
        self.refused = refused  # devices whose lender did not let go in time

    def give_back(self) -> None:
        lenders, self._lenders = self._lenders, []
        for _, lender in lenders:
            lender.take_back()


def borrow(devices: Iterable[int], timeout: float) -> Loan:
    """Borrow the counters of ``devices`` from whoever in this process holds them; each lender is
    given ``timeout`` s to let go. Devices nobody here holds are free already."""
    wanted = set(devices)
    with _lock:
        found = [(device, lender) for device in sorted(wanted) for lender in _lenders.get(device, [])]
    refused = [device for device, lender in found if not lender.lend(timeout)]
    return Loan(found, refused)
