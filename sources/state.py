"""The ``state`` source: CUPTI's own fatal errors, errors and warnings as ``Error`` events.

CUPTI reports problems it meets in the background (a buffer it could not allocate, a device it
cannot profile, ...) only at the next CUPTI call, unless a client subscribes to
``CUPTI_CB_DOMAIN_STATE``. This source does, and turns each notification into an ``Error`` event with
``origin="cupti_state"``, the severity (``fatal``, ``error``, ``warning``), CUPTI's message and its
result code.

State notifications are rare and a fatal one may be the last thing the process says, so each is
handed to the emitter at once (``report_error`` never blocks and never raises) rather than batched.
Except repeats: CUPTI says "User did not give a new activity buffer" once per buffer it asked for
while the activity source's pool was empty (tens of thousands of times in seconds for a busy
program, each of those records already counted as ``cupti_buffer_dropped``), and an event per
notification only fills the channel that is already full. So an error or warning whose result
and message repeat within ``REPEAT_WINDOW_S`` of their last report is counted, not sent; the next
report of it says how many came since, and ``stop`` reports what is still pending. Fatal errors are
always sent.

Failure modes: ``start()`` raises ``SubscriberBusy`` when another tool holds CUPTI's callback
subscriber, ``CuptiUnavailable`` without a driver.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any

from cuptistream.config import SourceConfig
from cuptistream.cupti import driver, subscriber
from cuptistream.cupti.subscriber import Domain, Registration, address_of
from cuptistream.plugin import Source

ORIGIN = "cupti_state"
SEVERITIES = {1: "fatal", 2: "error", 3: "warning"}  # CUPTI_CBID_STATE_FATAL_ERROR, _ERROR, _WARNING
REPEAT_WINDOW_S = 10.0  # an error or warning repeated within this is counted, not sent again


class StateConfig(SourceConfig):
    warnings: bool = True  # also report CUPTI's warnings, not only errors


class _StateData(ctypes.Structure):
    # CUpti_StateData (cupti_callbacks.h): a union holding ``notification {result; message}``.
    _fields_ = [("result", ctypes.c_int32), ("message", ctypes.c_char_p)]


def result_name(code: int) -> str:
    """``CUPTI_ERROR_UNKNOWN`` for 999; the number alone if cupti-python does not know it."""
    try:
        from cupti import cupti

        return "CUPTI_" + cupti.Result(code).name
    except (ImportError, ValueError):
        return f"CUPTI result {code}"


@dataclass
class _Reported:
    at: float  # monotonic time of the last report
    repeats: int = 0  # counted since, not sent


class StateSource(Source):
    config_type = StateConfig
    config: StateConfig

    def __init__(
        self, config: SourceConfig, emitter: Any, *, sub: subscriber.Subscriber | None = None
    ) -> None:
        super().__init__(config, emitter)
        self._subscriber = sub or subscriber.get()
        self._registration: Registration | None = None
        self.notifications = 0
        self._reported: dict[tuple[str, int, str], _Reported] = {}  # by (severity, result, message)
        self._lock = threading.Lock()  # CUPTI may notify from several threads

    def start(self) -> None:
        self._registration = self._subscriber.register(Domain.STATE, self._on_state)
        # The probe stamps these Error events with the first source clock it has: in a session of
        # this source alone, or beside a process whose probe has one, that must be CUPTI's too.
        self.clock = driver.timestamp

    def pause(self) -> None:
        """Let another tool have CUPTI's subscriber (``cuptistream.probe.coexist``)."""
        if self._registration is not None:
            self._registration.remove()
            self._registration = None

    def resume(self) -> None:
        """Subscribe again. Raises ``SubscriberBusy`` while the other tool keeps the subscriber."""
        if self._registration is None:
            self._registration = self._subscriber.register(Domain.STATE, self._on_state)

    def _on_state(self, domain: int, cbid: int, data: Any) -> None:
        severity = SEVERITIES.get(cbid)
        if severity is None or (severity == "warning" and not self.config.warnings):
            return
        address = address_of(data)
        if not address:
            return
        state = _StateData.from_address(address)
        text = (state.message or b"").decode(errors="replace").strip() or "no message"
        key = (severity, int(state.result), text)
        now = time.monotonic()
        with self._lock:
            self.notifications += 1
            seen = self._reported.get(key)
            if severity != "fatal" and seen is not None and now - seen.at < REPEAT_WINDOW_S:
                seen.repeats += 1
                return
            repeats = seen.repeats if seen is not None else 0
            self._reported[key] = _Reported(now)
        self._report(key, repeats, "since its last report")

    def _report(self, key: tuple[str, int, str], repeats: int, when: str) -> None:
        severity, result, text = key
        message = f"{result_name(result)} ({result}): {text}"
        if repeats:
            message += f" (and {repeats} more like it {when})"
        self.emitter.report_error(ORIGIN, message, severity, result)

    def stop(self) -> None:
        if self._registration is not None:
            self._registration.remove()
            self._registration = None
        with self._lock:
            pending = [(key, seen.repeats) for key, seen in self._reported.items() if seen.repeats]
            self._reported.clear()
        for key, repeats in pending:
            self._report(key, repeats, f"in the last {REPEAT_WINDOW_S:g} s, not sent one by one")
