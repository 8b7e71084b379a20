"""A watchdog for CUPTI calls that might never return.

A mid-run SASS flush can wedge inside CUPTI. A stuck C call cannot be cancelled
from Python, so the sampling sources wrap each risky call in ``watchdog.call(name)``; a monitor
thread notices a call that has run past ``timeout``, runs ``on_wedged(name, seconds)`` once, and the
source stops issuing CUPTI calls (``wedged`` is set) so stop() returns instead of joining a hung
thread. The stuck thread is a daemon and is left behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Watchdog:
    def __init__(
        self, timeout: float, on_wedged: Callable[[str, float], None], name: str = "watchdog"
    ) -> None:
        self.timeout = timeout
        self.on_wedged = on_wedged
        self.wedged = threading.Event()
        self._calls: dict[int, tuple[str, float]] = {}  # thread id -> (call, since)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    @contextmanager
    def call(self, name: str) -> Iterator[None]:
        key = threading.get_ident()
        with self._lock:
            self._calls[key] = (name, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(key, None)

    def _watch(self) -> None:
        tick = min(1.0, self.timeout / 4)
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                late = [
                    (name, now - since) for name, since in self._calls.values() if now - since > self.timeout
                ]
            if late and not self.wedged.is_set():
                self.wedged.set()
                name, seconds = late[0]
                self.on_wedged(name, seconds)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
