"""The pm_sampling source's side of a counter loan (``cuptistream.cupti.counter_loans``): a metrics
window asks, on its own thread, for the device's counters; the source's worker, woken, stops and
disables its sampling, says the counters are free, and waits until every loan is over to sample
again."""

from __future__ import annotations

import threading


class Lending:
    """Registered as the device's lender while the source samples. Thread-safe."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake  # the worker's wake-up
        self._lock = threading.Lock()
        self._loans = 0
        self.asked = threading.Event()  # set while a loan is open: the worker lets go, or stays let go
        self._free = threading.Event()  # set while the worker holds nothing

    # --- the borrower's thread (``counter_loans.Lender``) -------------------------------------

    def lend(self, timeout: float) -> bool:
        with self._lock:
            self._loans += 1
            self.asked.set()
        self._wake.set()
        return self._free.wait(timeout)

    def take_back(self) -> None:
        with self._lock:
            self._loans = max(0, self._loans - 1)
            if not self._loans:
                self.asked.clear()
        self._wake.set()

    # --- the worker's thread ------------------------------------------------------------------

    def let_go(self) -> None:
        """The counters are disabled: the borrower may go on."""
        self._free.set()

    def taken_up(self) -> None:
        """The worker samples again (or is about to try)."""
        self._free.clear()
