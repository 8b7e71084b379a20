"""The intake: where sources hand events to the pipeline, from any thread.

A deque of encoded chunks, and the keeper of the pipeline's one memory budget in bytes: a chunk
counts against it from ``emit`` until every lane it went to has let go of it (delivered, dropped or
written off), so ``memory_budget`` bounds the events held anywhere in the pipeline, whatever the
number of probes or sinks. When a chunk does not fit, the full policy applies: ``drop_newest``
refuses the chunk, ``drop_oldest`` evicts queued chunks until it fits, ``block`` makes the emitting
thread wait for space.

Chunks that are views into one block of memory (a ``ChunkGroup``: a decode worker's reply) count as
the whole block, from the first of them in to the last one out: the block stays as long as any of
them is held. The first one needs room for all of it; the others come in on that room, so an
emitter never waits on room that only its own block's chunks could free.

Every dropped event is counted. ``emit`` never calls into trio beyond one ``run_sync_soon`` wake-up
per idle period, so a CUPTI thread handing over a buffer's events returns at once.

Control events (losses, errors, self-stats) skip the byte budget but have their own small cap, so
the accounting always gets through while a flood of errors cannot grow memory without bound.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cuptistream.config import FullPolicy
from cuptistream.events import Error, Event
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk

if TYPE_CHECKING:
    from cuptistream.recording.producers import Producer

CONTROL_CAP_EVENTS = 10_000


class Intake(Emitter):
    """``stage`` names this queue in its ``Loss`` events: ``intake`` in the collector, ``probe`` for
    the observed process's own queue, so each stage's drops add up against its own ``events_in``."""

    def __init__(
        self, budget_bytes: int, policy: FullPolicy, now_ns: Callable[[], int], stage: str = "intake"
    ) -> None:
        self.stage = stage
        self.budget_bytes = budget_bytes
        self.policy = policy
        self._now_ns = now_ns  # event clock, for Error timestamps
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._chunks: deque[Chunk] = deque()
        self._queued_bytes = 0
        self._downstream_bytes = 0  # handed to the lanes (``take``), not yet let go by all of them
        self._blocks_bytes = 0  # the groups' blocks, less their chunks counted in the two above
        self._control: list[tuple[Producer | None, Sequence[Event]]] = []
        self._control_events = 0
        self._closed = False
        self._wake: Callable[[], None] | None = None
        self._wake_pending = False
        # Every chunk handed to ``emit_chunk`` is numbered, 1, 2, ...: a delivery barrier waits
        # until no stage holds a chunk numbered up to a mark (``Pipeline.holding_through``).
        self.last_seq = 0
        self.events_in = 0
        self.bytes_in = 0
        self.events_out = 0
        self.bytes_out = 0
        self.errors_reported = 0  # Error events reported (for the live status line)
        # (stage, reason, unit) -> count; read and reset by the pipeline's loss reporter
        self.losses: Counter[tuple[str, str, str]] = Counter()

    # --- producer side (any thread) ----------------------------------------------------------

    def emit_chunk(self, chunk: Chunk) -> None:
        with self._lock:
            self.last_seq += 1
            chunk.seq = self.last_seq
            self.events_in += chunk.count
            self.bytes_in += chunk.nbytes
            if self._closed:
                self.losses[self.stage, "closed", "events"] += chunk.count
                self._gone(chunk, counted=False)
                return
            if not self._make_room(chunk):
                self.losses[self.stage, "queue_full", "events"] += chunk.count
                self._gone(chunk, counted=False)
                return
            group = chunk.group
            if group is not None:
                if not group.charged:  # its room, made above, is the whole block's
                    group.charged = True
                    self._blocks_bytes += group.nbytes
                self._blocks_bytes -= chunk.nbytes  # counted as queued now
            self._chunks.append(chunk)
            self._queued_bytes += chunk.nbytes
            wake = self._claim_wake()
        if wake is not None:
            wake()

    def _make_room(self, chunk: Chunk) -> bool:
        """Apply the full policy with the lock held. False: the chunk is dropped.

        An empty pipeline always takes one chunk, however large. Under ``drop_oldest`` only the
        intake's own chunks can be evicted: once it is empty the chunk is taken, and the lanes'
        queues (each bounded by its ``queue.max_bytes``) make the room."""
        if self._fits(chunk):
            return True
        if self.policy == "drop_newest":
            return False
        if self.policy == "drop_oldest":
            while self._chunks and not self._fits(chunk):
                old = self._chunks.popleft()
                self._queued_bytes -= old.nbytes
                self.losses[self.stage, "queue_full", "events"] += old.count
                self._gone(old)
            return True
        while not self._fits(chunk) and not self._closed:
            self._space.wait()
        return not self._closed

    def _fits(self, chunk: Chunk) -> bool:
        group = chunk.group
        if group is not None and group.charged:
            return True  # its block is counted already
        held = self.held_bytes
        return held == 0 or held + (chunk.nbytes if group is None else group.nbytes) <= self.budget_bytes

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        if count > 0:
            with self._lock:
                self.losses[stage, reason, unit] += count

    def report_error(
        self,
        origin: str,
        message: str,
        severity: str = "error",
        result_code: int = 0,
        producer: Producer | None = None,
    ) -> None:
        try:
            timestamp = self._now_ns()
        except Exception:
            timestamp = time.time_ns()
        error = Error(
            severity=severity, origin=origin, message=message, timestamp=timestamp, result_code=result_code
        )
        self.errors_reported += 1
        self.emit_control([error], producer)

    def for_producer(self, producer: Producer) -> Emitter:
        """An emitter whose events and errors are ``producer``'s (the collector's connections)."""
        return _ProducerEmitter(self, producer)

    def emit_control(self, events: Sequence[Event], producer: Producer | None = None) -> None:
        """Events outside the byte budget (errors, accounting) of ``producer`` (None: the collector)."""
        with self._lock:
            room = CONTROL_CAP_EVENTS - self._control_events
            if room < len(events):
                self.losses["control", "queue_full", "events"] += len(events) - max(room, 0)
                events = events[: max(room, 0)]
            if events:
                self._control.append((producer, events))
                self._control_events += len(events)
            wake = self._claim_wake()
        if wake is not None:
            wake()

    def _claim_wake(self) -> Callable[[], None] | None:
        if self._wake is None or self._wake_pending:
            return None
        self._wake_pending = True
        return self._wake

    # --- consumer side (the pipeline's trio thread) ------------------------------------------

    def set_waker(self, wake: Callable[[], None] | None) -> None:
        """``wake`` is called (outside the lock, at most once until the next ``take``) when data arrives."""
        with self._lock:
            self._wake = wake
            self._wake_pending = False

    def take(
        self, max_chunks: int = 64, lanes: int = 0
    ) -> tuple[list[Chunk], list[tuple[Producer | None, Sequence[Event]]]]:
        """Remove up to ``max_chunks`` chunks and all control events (by producer). The chunks stay
        in the budget until each of ``lanes`` lanes has let go of them (``release``); with
        ``lanes=0`` (taken to be counted lost, or no lane) their room is free at once."""
        with self._lock:
            chunks = [self._chunks.popleft() for _ in range(min(max_chunks, len(self._chunks)))]
            freed = sum(c.nbytes for c in chunks)
            self._queued_bytes -= freed
            if lanes:
                for chunk in chunks:
                    chunk.holders = lanes
                self._downstream_bytes += freed
            else:
                for chunk in chunks:
                    self._gone(chunk)
            self.events_out += sum(c.count for c in chunks)
            self.bytes_out += freed
            control, self._control = self._control, []
            self._control_events = 0
            if not self._chunks and not self._control:
                self._wake_pending = False
            if chunks:
                self._space.notify_all()
            return chunks, control

    def release(self, chunk: Chunk) -> None:
        """The last lane let go of ``chunk`` (``SinkLane``): room for blocked emitters (for one of a
        group, once the whole group is gone)."""
        with self._lock:
            self._downstream_bytes -= chunk.nbytes
            self._gone(chunk)
            self._space.notify_all()

    def _gone(self, chunk: Chunk, counted: bool = True) -> None:
        """``chunk`` left the pipeline, with the lock held; ``counted``: it had been let in. One of
        a group goes back into its block's count, which the group's last chunk gives up."""
        group = chunk.group
        if group is None:
            return
        if counted:
            self._blocks_bytes += chunk.nbytes
        group.members -= 1
        if group.members == 0 and group.charged:
            self._blocks_bytes -= group.nbytes

    def close(self) -> None:
        """Refuse further chunks (counted as lost) and release blocked emitters."""
        with self._lock:
            self._closed = True
            self._space.notify_all()

    def holds_through(self, seq: int) -> bool:
        """Whether a chunk numbered ``seq`` or lower is still queued here (the queue is in order)."""
        with self._lock:
            return bool(self._chunks) and 0 < self._chunks[0].seq <= seq

    @property
    def queued_bytes(self) -> int:
        """Bytes queued here, not yet taken by the distributor."""
        return self._queued_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes the budget holds: queued here, and in the lanes (queued, or in a batch being written)."""
        return self._queued_bytes + self._downstream_bytes + self._blocks_bytes

    def pop_losses(self) -> Counter[tuple[str, str, str]]:
        with self._lock:
            losses, self.losses = self.losses, Counter()
            return losses


class _ProducerEmitter(Emitter):
    def __init__(self, intake: Intake, producer: Producer) -> None:
        self._intake = intake
        self._producer = producer

    def emit_chunk(self, chunk: Chunk) -> None:
        chunk.producer = self._producer
        self._intake.emit_chunk(chunk)

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        self._intake.report_loss(stage, reason, count, unit)

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        self._intake.report_error(origin, message, severity, result_code, self._producer)
