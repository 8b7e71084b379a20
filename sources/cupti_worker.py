"""What the pc_sampling and sass sources share: CUPTI held for the session, resource callbacks, a
watchdog over CUPTI calls that might never return, and one worker thread of the source's own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from cuptistream.cupti import driver, subscriber
from cuptistream.cupti.watchdog import Watchdog
from cuptistream.plugin import Source

ResourceHandler = Callable[[int, int, Any], None]


class CuptiWorkerSource(Source):
    label: ClassVar[str]  # what the source collects, for the message when a CUPTI call wedges

    def _hold_cupti(self, watchdog_timeout: float) -> None:
        """Start the watchdog and hold CUPTI. From here on, a failed start must call ``_release()``."""
        self._origin = f"source:{self.name}"
        self._registrations: list[subscriber.Registration] = []
        self._watchdog = Watchdog(watchdog_timeout, self._on_wedged, f"cuptistream-{self.name}-watchdog")
        driver.acquire(self.name)
        # The clock the events are stamped on (``_now``): the probe pairs it with the Unix clock for
        # every batch's envelope. Without it, a session of this source alone had no CUPTI reading and
        # its batches paired the monotonic clock with the Unix clock (event times ~56 years late).
        self.clock = driver.timestamp

    def _register_resource_callbacks(self, handlers: Iterable[tuple[int, ResourceHandler]]) -> None:
        for cbid, handler in handlers:
            self._registrations.append(subscriber.register(subscriber.Domain.RESOURCE, handler, cbid=cbid))

    def _start_worker(self, run: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=run, name=f"cuptistream-{self.name}", daemon=True)
        self._thread.start()

    def _watched(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, a CUPTI call the watchdog reports if it does not return."""
        with self._watchdog.call(name):
            return fn(*args)

    @staticmethod
    def _now() -> int:
        """An event timestamp: CUPTI's clock, as the other sources' events carry."""
        try:
            return driver.timestamp()
        except Exception:  # CUPTI gone (detached): Unix time rather than no event
            return time.time_ns()

    def _release(self) -> None:
        for registration in self._registrations:
            registration.remove()
        self._registrations = []
        self._watchdog.close()
        try:
            driver.release(self.name)
        except Exception as error:  # release is best effort
            self.emitter.report_error(self._origin, f"releasing CUPTI failed: {error}", severity="warning")

    def _on_wedged(self, call: str, seconds: float) -> None:
        self.emitter.report_error(
            self._origin,
            f"{call} has not returned after {seconds:.0f} s; {self.label} is disabled for the rest of this "
            "session (no further CUPTI calls are made by this source)",
        )
