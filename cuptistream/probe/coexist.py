"""Sharing CUPTI with the program's own profiler: step aside while it runs, come back after.

CUPTI (before 13.3's multi-subscriber API, which every tool must opt into) has one callback
subscriber and one pair of activity-buffer callbacks per process. So two tools cannot trace at once:

- torch.profiler (Kineto) started while cuptistream holds the subscriber records 0 GPU kernels;
  it subscribes once and never retries.
- Started the other way round, the program hangs. Our buffer callbacks are Python and need the GIL.
  With ours registered over Kineto's, torch stops Kineto holding the GIL, CUPTI takes its own lock
  and calls the registered callbacks; a callback of ours on our flush thread then waits for the GIL
  while the main thread waits for CUPTI's lock.

``CuptiSharing`` avoids both. Every source that uses CUPTI starts through it:

- ``yield_to(tool)`` (the torch.profiler hooks call it before Kineto touches CUPTI): each source
  hands over what it holds and lets CUPTI go (``Yielding.pause``: kinds off, a forced flush, our
  flush thread stopped, subscriber callbacks removed). No callback of ours stays registered.
- ``take_back(tool)`` (after the tool stopped): each source comes back (``Yielding.resume``). One
  that needs the callback subscriber while the tool keeps it (Kineto keeps its subscriber for the
  life of the process) stands by and retries every ``retry_s``; the activity source needs no
  subscriber and resumes at once. The span becomes one ``CuptiYield`` event.
- A tool that holds CUPTI before the probe starts (Nsight Systems or Compute, another cuptistream, a
  torch.profiler already running): ``start`` prints one line naming it, as CUPTI names it, and the
  sources stand by, retried every ``retry_s``, while the program runs normally.

Failure modes: none of these methods raises. A source that fails to come back for another reason
than a busy subscriber is disabled with an Error event, as at start.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from cuptistream.cupti import subscriber
from cuptistream.events import CuptiYield, Event
from cuptistream.plugin import Source
from cuptistream.probe import torch_profiler

# What Kineto's subscriber is called: Kineto gives CUPTI no name.
UNNAMED_HOLDERS = ("", "CUPTI for <not provided>")


@runtime_checkable
class Yielding(Protocol):
    """A CUPTI source that can step aside and come back without losing what it held."""

    def pause(self) -> None:
        """Hand over everything held, then release every CUPTI registration of this source."""

    def resume(self) -> None:
        """Register with CUPTI again. Raises ``SubscriberBusy`` while another tool holds the
        subscriber; the source then stays paused."""


@dataclass
class _Span:
    tool: str
    reason: str
    began: int = field(default_factory=time.monotonic_ns)
    missed: list[str] = field(default_factory=list)


class CuptiSharing:
    """Starts, pauses, resumes and stands by the probe's CUPTI sources. Thread-safe."""

    def __init__(
        self,
        *,
        emit: Callable[[list[Event]], None],
        clock: Callable[[], int],
        disable: Callable[[Source, BaseException], None],
        note: Callable[[str], None],
        retry_s: float,
        on_span_end: Callable[[], None] = lambda: None,
        sub: subscriber.Subscriber | None = None,
    ) -> None:
        self._emit = emit
        self._on_span_end = on_span_end
        self._clock = clock
        self._disable = disable
        self._note = note
        self._retry_s = retry_s
        self._subscriber = sub or subscriber.get()
        self._lock = threading.RLock()
        self._running: list[Source] = []
        self._paused: list[Source] = []  # stepped aside for the tool in ``_span``
        self._standby: dict[Source, str] = {}  # waiting for CUPTI -> who held it when last tried
        self._unstarted: set[Source] = set()  # stood by at start: ``start()``, not ``resume()``, brings them
        self._span: _Span | None = None  # a yield in progress
        self._waiting: _Span | None = None  # sources stood by since the probe started
        self._said: set[str] = set()
        self._wake = threading.Event()
        self._closed = False
        self._retry_thread: threading.Thread | None = None
        self.yields = 0

    # --- the probe's start and stop -----------------------------------------------------------

    def start(self, sources: list[Source]) -> list[Source]:
        """Start each source, or stand it by when another tool holds CUPTI. Returns the sources
        that run or wait (the others failed and were disabled)."""
        holder, blocks_activity = self._foreign_holder()
        kept: list[Source] = []
        for source in sources:
            if holder is not None and _waits_for(source, blocks_activity):
                self._standby[source] = holder
                self._unstarted.add(source)
                kept.append(source)
                continue
            try:
                source.start()
            except subscriber.SubscriberBusy as busy:
                self._standby[source] = busy.holder
                self._unstarted.add(source)
            except Exception as error:
                self._disable(source, error)
                continue
            else:
                self._running.append(source)
            kept.append(source)
        if self._standby:
            names = ", ".join(s.name for s in self._standby)
            who = self._name(next(iter(self._standby.values())))
            self._note(
                f"CUPTI is held by {who}; {names} stand by and retry every {self._retry_s:g}s "
                "(the program runs normally)"
            )
            self._waiting = _Span(tool=who, reason="held_at_start")
            self._waiting.missed = _missed(list(self._standby))
            self._start_retries()
        return kept

    def stop(self) -> set[Source]:
        """End retries; emit the open span, if any. Returns the sources stopped already (a source
        without ``pause`` steps aside by stopping); the probe stops the others, and a paused
        source's ``stop`` makes no CUPTI call."""
        with self._lock:
            self._closed = True
            self._wake.set()
            if self._span is not None:
                self._finish_span(self._span)
                self._span = None
            if self._waiting is not None:
                self._finish_span(self._waiting)
                self._waiting = None
            stopped = {source for source in self._paused if not isinstance(source, Yielding)}
        if self._retry_thread is not None:
            self._retry_thread.join(timeout=2 * self._retry_s + 1)
        return stopped

    @property
    def standing_by(self) -> list[str]:
        with self._lock:
            return [s.name for s in self._standby]

    # --- another tool takes CUPTI, then gives it back -----------------------------------------

    def yield_to(self, tool: str) -> None:
        """Step every CUPTI source aside for ``tool``. Idempotent while a yield is in progress."""
        with self._lock:
            if self._closed or self._span is not None:
                return
            self.yields += 1
            span = self._span = _Span(tool=tool, reason="tool_started")
            span.missed = _missed(self._running + list(self._standby))
            for source in reversed(self._running):
                try:
                    _pause(source)
                except Exception as error:
                    self._disable(source, error)
                    continue
                self._paused.insert(0, source)
            self._running.clear()
        if tool not in self._said:
            self._said.add(tool)
            self._note(f"stepping aside while {tool} uses CUPTI; tracing resumes when it stops")

    def take_back(self, tool: str) -> None:
        """The tool stopped: bring the paused sources back; stand by those it still blocks."""
        with self._lock:
            span = self._span
            if self._closed or span is None:
                return
            self._span = None
            for source in self._paused:
                self._try_resume(source)
            self._paused.clear()
            self._finish_span(span)
            if self._standby:
                self._start_retries()

    # --- internals ----------------------------------------------------------------------------

    def _try_resume(self, source: Source) -> bool:
        """Under the lock. True when the source runs again."""
        try:
            if isinstance(source, Yielding) and source not in self._unstarted:
                source.resume()
            else:
                source.start()
        except subscriber.SubscriberBusy as busy:
            self._standby[source] = busy.holder
            return False
        except Exception as error:
            self._standby.pop(source, None)
            self._disable(source, error)
            return False
        self._standby.pop(source, None)
        self._unstarted.discard(source)
        self._running.append(source)
        return True

    def _finish_span(self, span: _Span) -> None:
        # Both ends on the clock CUPTI uses now: Kineto installs its own timestamp source at its
        # first trace, so CUPTI's clock can jump inside the first span (by many minutes).
        end = self._clock()
        start = end - (time.monotonic_ns() - span.began)
        self._on_span_end()
        standby = [s.name for s in self._standby]
        holders = set(self._standby.values())
        self._emit(
            [
                CuptiYield(
                    tool=span.tool,
                    start=start,
                    end=end,
                    missed=span.missed,
                    standby=standby,
                    holder=self._name(holders.pop()) if holders else "",
                    reason=span.reason,
                )
            ]
        )
        if standby and span.reason == "tool_started":
            key = f"kept:{','.join(standby)}"
            if key not in self._said:
                self._said.add(key)
                self._note(
                    f"{span.tool} keeps CUPTI's callback subscriber after it stops; "
                    f"{', '.join(standby)} stand by and retry every {self._retry_s:g}s"
                )

    def _start_retries(self) -> None:
        if self._retry_thread is None:
            self._retry_thread = threading.Thread(
                target=self._retry_loop, name="cuptistream-standby", daemon=True
            )
            self._retry_thread.start()

    def _retry_loop(self) -> None:
        while not self._wake.wait(self._retry_s):
            with self._lock:
                if self._closed:
                    return
                if self._span is not None or not self._standby:
                    continue  # a yield is in progress; take_back decides
                holder, blocks_activity = self._foreign_holder()
                for source in list(self._standby):
                    if holder is not None and _waits_for(source, blocks_activity):
                        self._standby[source] = holder
                    else:
                        self._try_resume(source)
                if not self._standby and self._waiting is not None:
                    self._finish_span(self._waiting)
                    self._waiting = None
                    self._note("CUPTI is free again; tracing started")

    def _foreign_holder(self) -> tuple[str | None, bool]:
        """Who holds CUPTI against us now (None: nobody), and whether activity tracing must wait too.

        A running torch.profiler blocks everything. A holder CUPTI names (Nsight, another tool) does
        too: it may be tracing activities. An unnamed holder beside an idle torch.profiler is Kineto's
        subscriber, kept after its last trace: only the callback sources wait for it."""
        if torch_profiler.active():
            return "torch.profiler", True
        try:
            holder = self._subscriber.foreign_holder()
        except Exception:  # CUPTI cannot run here: each source fails at start with its own line
            return None, False
        if holder is None:
            return None, False
        idle_kineto = holder in UNNAMED_HOLDERS and torch_profiler.loaded()
        return holder, not idle_kineto

    @staticmethod
    def _name(holder: str) -> str:
        return repr(holder) if holder else "another CUPTI tool (it gave no name)"


def _waits_for(source: Source, blocks_activity: bool) -> bool:
    """Whether ``source`` must wait while another tool holds CUPTI. Most CUPTI sources register
    callbacks (state, callbacks) or arm a launch hook (PC sampling, SASS), so they always wait; the
    activity source sets ``needs_subscriber = False`` and waits only for a holder that may trace
    activities (``blocks_activity``)."""
    return blocks_activity or bool(getattr(source, "needs_subscriber", True))


def _pause(source: Source) -> None:
    if isinstance(source, Yielding):
        source.pause()
    else:  # no pause of its own: stop hands everything over; start brings it back
        source.stop()


def _missed(sources: list[Source]) -> list[str]:
    missed: list[str] = []
    for source in sources:
        kinds = getattr(source.config, "kinds", None)
        if isinstance(kinds, list) and kinds:
            missed += [f"{source.name}:{kind}" for kind in kinds]
        else:
            missed.append(source.name)
    return missed
