"""The probe's emitter: what sources in the observed process hand their data to.

- Raw CUPTI activity buffers go through a ``SlotOutlet``: CUPTI fills shared-memory slots in
  place, and completing one is a header write plus one small message (no copy, no per-record work).
- Events (callbacks, state, PC sampling, SASS) are encoded once on the emitting thread and queued
  in a byte-bounded ``Intake`` (the pipeline's ``memory_budget`` and ``full_policy``); a sender
  thread packs the queued chunks into event slots. Only the sender waits for a free slot.
- Losses are counted here and sent to the collector, which owns the accounting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from cuptistream.channel import messages
from cuptistream.channel.outlet import PoolOutlet
from cuptistream.channel.shm import ACTIVITY, CHUNK, CHUNK_PREFIX, READY, SlotPool
from cuptistream.config import FullPolicy
from cuptistream.events import ClockSync, Event
from cuptistream.pipeline.intake import Intake
from cuptistream.plugin import Emitter
from cuptistream.probe.link import ProbeLink
from cuptistream.recording.codec import Chunk, encode_chunk

_HOUSEKEEPING_S = 1.0  # losses, clock reading, reconnect attempts
_SLOT_POLL_S = 0.001


class SlotOutlet(PoolOutlet):
    """Activity buffers as slots of one pool; one decode stream at the collector."""

    def __init__(self, link: ProbeLink, pool_index: int, pool: SlotPool, stream: int) -> None:
        super().__init__(pool)
        self.link = link
        self.pool_index = pool_index
        self.stream = stream
        self._ready = messages.Ready(pool=pool_index)
        self.buffers = 0

    def complete(self, address: int, valid: int, dropped: int = 0) -> None:
        slot = self.pool.slot_of(address)
        if slot is None:
            return
        self.pool.publish(slot, ACTIVITY, self.stream, valid, dropped)
        self.buffers += 1
        # Not sent (no collector now): the slot stays READY for the next collector's drain.
        self.link.post(self._ready)

    def reader_alive(self) -> bool:
        return self.link.alive()

    def send_trace_span(self, span: messages.TraceSpan, wait: float = 2.0) -> bool:
        # On the same socket as the ``Ready`` of the buffers completed before it, so after them.
        span.stream = self.stream
        return self.link.post(span, wait=wait)

    def wait_consumed(self, timeout: float) -> bool:
        """Wait until the collector has read every published buffer (while it is there)."""
        deadline = time.monotonic() + timeout
        while self.link.alive() and bool((self.pool.headers["state"] == READY).any()):
            if time.monotonic() > deadline:
                return False
            time.sleep(_SLOT_POLL_S * 5)
        return True


class ProbeEmitter(Emitter):
    def __init__(
        self,
        link: ProbeLink,
        budget_bytes: int,
        policy: FullPolicy,
        slot_size: int,
        slots: int,
        clock: Callable[[], ClockSync | None],
    ) -> None:
        self.link = link
        self._clock = clock
        # Its drops are the probe's (``probe/queue_full``), not the collector intake's: the collector's
        # ``events_in`` counts only what reached it.
        self.intake = Intake(budget_bytes, policy, self._now_ns, stage="probe")
        self.pool_index, self.pool = link.add_pool("events", slot_size, slots)
        self.outlets: list[SlotOutlet] = []
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._flush_requested = self._flush_done = 0
        self._stopping = False
        self._given_up = False  # past the shutdown deadline: no more waiting for slots
        self._thread = threading.Thread(target=self._send_loop, name="cuptistream-probe-sender", daemon=True)

    def start(self) -> None:
        self.intake.set_waker(self._wake.set)
        self._thread.start()

    def _now_ns(self) -> int:
        clock = self._clock()
        return clock.cupti_ns if clock is not None else time.monotonic_ns()

    # --- Emitter ------------------------------------------------------------------------------

    def emit(self, events: Sequence[Event]) -> None:
        if not events:
            return
        chunk = encode_chunk(events)
        if chunk.nbytes + CHUNK_PREFIX.size > self.pool.slot_size and len(events) > 1:
            half = len(events) // 2
            self.emit(events[:half])
            self.emit(events[half:])
            return
        self.emit_chunk(chunk)

    def emit_chunk(self, chunk: Chunk) -> None:
        if chunk.nbytes + CHUNK_PREFIX.size > self.pool.slot_size:
            self.link.count_lost("probe", "chunk_larger_than_slot", chunk.count)
            return
        self.intake.emit_chunk(chunk)

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        self.link.count_lost(stage, reason, count, unit)

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        try:
            report = messages.ErrorReport(
                origin=origin, message=message, severity=severity, result_code=result_code,
                timestamp=self._now_ns(),
            )  # fmt: skip
            if not self.link.post(report):
                self.link.count_lost("probe", "error_not_delivered", 1)
        except Exception:
            self.link.count_lost("probe", "error_not_delivered", 1)

    def open_activity_stream(self, stream: messages.OpenStream, buffer_size: int, buffers: int) -> SlotOutlet:
        index, pool = self.link.add_pool(stream.source, buffer_size, buffers)
        outlet = SlotOutlet(self.link, index, pool, self.link.add_stream(stream))
        self.outlets.append(outlet)
        return outlet

    # --- the sender thread --------------------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event queued before this call is in a published slot."""
        with self._flushed:
            self._flush_requested += 1
            target = self._flush_requested
            self._wake.set()
            return self._flushed.wait_for(lambda: self._flush_done >= target, timeout)

    def give_up(self) -> None:
        """The shutdown deadline passed: hand-offs blocked on a full queue return (their events
        counted lost), and the sender stops waiting for free slots."""
        self._given_up = True
        self.intake.close()

    def close(self, timeout: float) -> None:
        """Send what is queued (up to ``timeout`` in all), then stop the sender; the rest is counted
        lost."""
        ends = time.monotonic() + timeout
        if not self.flush(timeout):
            self._given_up = True  # the collector is not taking slots: stop waiting for them
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, ends - time.monotonic()) + 0.1)  # 0.1: counting what it holds
        if self._thread.is_alive():
            # Still waiting for a free slot with chunks in hand: stop it waiting, so what it holds
            # is counted before the losses are forwarded (a chunk counted later was counted nowhere).
            self._given_up = True
            self._thread.join(1.0)
        self.intake.close()
        chunks, _ = self.intake.take(max_chunks=1 << 30)
        self.link.count_lost("probe", "not_sent_at_exit", sum(c.count for c in chunks))
        self._count_unread_slots()
        self._forward_losses()

    def _count_unread_slots(self) -> None:
        """At exit without a collector: slots published but never read go with this process's
        memory, so they are counted (events of the events pool; buffers of the activity pools)."""
        if self.link.alive():
            return  # it drains them after the goodbye
        unread = self.pool.ready()
        if unread:
            events = int(self.pool.headers["count"][unread].sum())
            self.link.count_lost("probe", "collector_unavailable", events)
        for outlet in self.outlets:
            if buffers := len(outlet.pool.ready()):
                self.link.count_lost("probe", "collector_unavailable", buffers, unit="buffers")

    def _send_loop(self) -> None:
        next_housekeeping = 0.0
        while True:
            self._wake.wait(_HOUSEKEEPING_S)
            self._wake.clear()
            with self._flushed:
                requested = self._flush_requested
            while True:
                chunks, _ = self.intake.take(max_chunks=256)  # no control events: report_error sends them
                if not chunks:
                    break
                self._pack(chunks)
            with self._flushed:
                self._flush_done = requested
                self._flushed.notify_all()
            if time.monotonic() >= next_housekeeping:
                next_housekeeping = time.monotonic() + _HOUSEKEEPING_S
                self._housekeeping()
            if self._stopping:
                return

    def _housekeeping(self) -> None:
        clock = self._clock()
        if not self.link.connected and self.link.reconnect(clock):
            self.link.post(messages.Ready(pool=self.pool_index))
            for outlet in self.outlets:
                self.link.post(messages.Ready(pool=outlet.pool_index))
        if clock is not None:
            self.link.post(messages.ClockReading(clock=clock))
        self._forward_losses()

    def _forward_losses(self) -> None:
        for (stage, reason, unit), count in self.intake.pop_losses().items():
            self.link.count_lost(stage, reason, count, unit)
        self.link.send_losses()

    def _pack(self, chunks: list[Chunk]) -> None:
        """Copy chunks into event slots, several per slot (each behind its length and event count, so
        the collector gets the same chunks), publishing each slot when full."""
        slot: int | None = None
        used = count = 0
        for chunk in chunks:
            size = CHUNK_PREFIX.size + chunk.nbytes
            if slot is not None and used + size > self.pool.slot_size:
                self._publish(slot, used, count)
                slot = None
            if slot is None:
                slot = self._take_slot()
                used = count = 0
                if slot is None:
                    reason = "not_sent_at_exit" if self._given_up else "collector_unavailable"
                    self.link.count_lost("probe", reason, chunk.count)
                    continue
            view = self.pool.view(slot)
            CHUNK_PREFIX.pack_into(view, used, chunk.nbytes, chunk.count)
            view[used + CHUNK_PREFIX.size : used + size] = chunk.payload
            used += size
            count += chunk.count
        if slot is not None:
            self._publish(slot, used, count)

    def _take_slot(self) -> int | None:
        """A free event slot, waiting while the collector is there and reading; None without one."""
        while (slot := self.pool.take()) is None:
            if not self.link.alive():  # a killed collector frees nothing; reconnecting is housekeeping's
                return None
            if self._given_up:
                return None
            time.sleep(_SLOT_POLL_S)
        return slot

    def _publish(self, slot: int, used: int, count: int) -> None:
        if count == 0:
            self.pool.unpublish(slot)
            return
        self.pool.publish(slot, CHUNK, 0, used, 0, count)
        self.link.post(messages.Ready(pool=self.pool_index))
