"""One sink's lane in the pipeline: its own byte-bounded queue, its batching, and its delivery loop.

Each sink has a lane, so a slow sink only fills its own queue; the queue's full policy then decides
whether the distributor waits (``block``: backpressure reaches the intake and its policy) or the lane
drops (``drop_newest`` / ``drop_oldest``, counted per sink).

The lane is also where a sink's own accounting joins the pipeline's: ``take_losses()`` and ``snapshot()``
read ``Sink.delivery_losses()`` (events lost after ``write`` accepted them) and ``Sink.stats()`` each time, so
those losses become ``Loss`` events, ``SelfStats`` and the shutdown report like the lane's own drops.

And it keeps the sink's health (``SinkLane.health``, ``cuptistream.delivery.health``): a ``write`` that
fails marks it failing, one that succeeds ok, a ``PermanentSinkError`` stops it; each change is said
once (an ``Error`` event and a line on stderr), not once per batch or retry.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

import trio

from cuptistream.config import BatchConfig, QueueConfig
from cuptistream.delivery import health as sink_health
from cuptistream.delivery.retry import call_with_retry
from cuptistream.errors import PermanentSinkError, RetriesExhausted, RetryableError
from cuptistream.events import EncodedBatch, StageStats
from cuptistream.plugin import DeliveryError, OutgoingBatch, Sink
from cuptistream.recording.codec import Chunk, encode_batch_parts
from cuptistream.recording.producers import Producer

# How many chunks of other producers a batch looks past for more of its own producer's.
_SCAN_LIMIT = 4096


class ReportError(Protocol):
    """Emit an ``Error`` event from ``origin`` (the pipeline's ``_lane_error``)."""

    def __call__(self, origin: str, message: str, severity: str = "error") -> None: ...


class SinkLane:
    def __init__(
        self,
        sink: Sink,
        queue: QueueConfig,
        batching: BatchConfig,
        make_header: Callable[[int, Producer | None], EncodedBatch],
        report_error: ReportError,
        release: Callable[[Chunk], None] | None = None,
    ) -> None:
        """``release(chunk)``: this lane was the last to let go of a budgeted chunk (its holders
        count, ``Intake.take``), so its bytes leave the pipeline's memory budget."""
        self.sink = sink
        self.stage = f"sink:{sink.name}"
        self._max_bytes = queue.max_bytes
        self._policy = queue.full_policy
        self._batching = batching
        self._make_header = make_header
        self._report_error = report_error
        self._release = release
        self.health = sink_health.SinkHealth(
            sink.where(), lambda severity, message: report_error(self.stage, message, severity)
        )
        self._queue: deque[tuple[Chunk, int]] = deque()  # (chunk, monotonic ns when queued)
        self._queued_bytes = 0
        self._queued_events = 0
        self._changed = trio.Event()  # set when data arrives, space frees, or the lane closes
        self._closing = False
        self._flushing = False  # shutdown: deliver without waiting for max_latency
        self._write_scope = trio.CancelScope()  # the write under way; ``stop`` cancels it
        self._write_began = 0.0  # time.monotonic() when it began
        self._seq = 0
        self.counters = StageStats()
        self._losses: Counter[tuple[str, str, str]] = Counter()
        self._sink_lost: dict[str, int] = {}  # Sink.delivery_losses() as last read
        self._sink_failed = False  # stats() or delivery_losses() raised: said once
        self._writing = 0  # events of the batch inside sink.write
        self._writing_seq = 0  # ... and the lowest intake number of its chunks (0: none)
        self._written_off = 0  # ... counted lost by abandon() while its write was still running
        self._abandon_reason = ""
        self._stopped = ""  # the reason the sink stopped for good (``stop``); "" while it runs
        # False while the sink is connecting (``cuptistream.pipeline.connect``): a ``write`` that returns
        # then (a sink that holds data until it is up) does not mean the sink is healthy.
        self.up = True

    # --- the distributor's side --------------------------------------------------------------

    async def offer(self, chunk: Chunk, bypass_bound: bool = False) -> None:
        self.counters.events_in += chunk.count
        self.counters.bytes_in += chunk.nbytes
        if not bypass_bound and not await self._make_room(chunk):
            self._drop(chunk.count, "queue_full")
            self._let_go(chunk)
            return
        if self._stopped:  # the sink stopped for good (before or while this waited for room)
            self._drop(chunk.count, self._stopped)
            self._let_go(chunk)
            return
        self._queue.append((chunk, time.monotonic_ns()))
        self._queued_bytes += chunk.nbytes
        self._queued_events += chunk.count
        self._notify()

    async def _make_room(self, chunk: Chunk) -> bool:
        while self._queue and self._queued_bytes + chunk.nbytes > self._max_bytes:
            if self._policy == "drop_newest":
                return False
            if self._policy == "drop_oldest":
                old, _ = self._pop()
                self._drop(old.count, "queue_full")
                self._let_go(old)
                continue
            changed = self._changed
            await changed.wait()
        return True

    def close(self) -> None:
        self._closing = True
        self._notify()

    def flush(self) -> None:
        """Deliver what is queued now, without waiting for ``batch.max_latency`` (shutdown)."""
        self._flushing = True
        self._notify()

    async def drained(self) -> None:
        """Return once nothing is queued and no write is under way."""
        while not self.idle:
            await self._wait_change()

    def writing_for(self, now: float) -> float:
        """Seconds the write under way has taken by ``now`` (``time.monotonic()``); 0 if none."""
        return now - self._write_began if self._writing else 0.0

    @property
    def idle(self) -> bool:
        """Nothing queued and no write under way."""
        return not self._queue and not self._writing

    def saturated(self, coming: int = 0) -> bool:
        """Full to within a sixteenth of ``queue.max_bytes``, counting ``coming`` bytes on their way
        here (the intake's backlog), under a dropping policy: what is offered now would be dropped
        (``drop_newest``) or evict older events (``drop_oldest``). The
        collector's front door sheds whole buffers before decoding while every lane is
        (``cuptistream.collector.shedding``). Read from other threads without a lock: a stale value
        moves one buffer's loss between the front door and the lane, never loses its count."""
        room = self._max_bytes - (self._max_bytes >> 4)
        return self._policy != "block" and self._queued_bytes + coming >= room

    def holds_through(self, seq: int) -> bool:
        """Whether a chunk numbered ``seq`` or lower by the intake is queued here or being written:
        not yet delivered, nor counted lost. (A scan of the queue: for barriers, not per chunk.)"""
        if 0 < self._writing_seq <= seq:
            return True
        return any(0 < chunk.seq <= seq for chunk, _ in self._queue)

    @property
    def stopped(self) -> str:
        """Why the lane drops everything offered to it (``stop``), or "" while it delivers."""
        return self._stopped

    # --- the lane's own task -----------------------------------------------------------------

    async def run(self) -> None:
        """Deliver batches until closed and drained."""
        sink_health.bind(self.health)  # the retry loop inside ``write`` reports to this sink's health
        latency_ns = int(self._batching.max_latency * 1e9)
        while True:
            if not self._queue:
                if self._closing:
                    return
                await self._wait_change()
                continue
            full = (
                self._queued_events >= self._batching.max_events
                or self._queued_bytes >= self._batching.max_bytes
                or 2 * self._queued_bytes >= self._max_bytes  # deliver early before the queue fills
            )
            age_ns = time.monotonic_ns() - self._queue[0][1]
            if not (full or self._closing or self._flushing or age_ns >= latency_ns):
                with trio.move_on_after((latency_ns - age_ns) / 1e9):
                    await self._wait_change()
                continue
            await self._deliver(self._take_batch())

    def _take_batch(self) -> tuple[list[Chunk], int]:
        """The oldest chunk and the queued chunks of the same producer after it, up to the batch
        limits. Chunks of other producers keep their places (a batch has one producer)."""
        chunks: list[Chunk] = []
        events = nbytes = 0
        first_ns = self._queue[0][1]
        producer = self._queue[0][0].producer
        skipped: list[tuple[Chunk, int]] = []
        while self._queue and len(skipped) < _SCAN_LIMIT:
            chunk = self._queue[0][0]
            if chunk.producer is not producer:
                skipped.append(self._queue.popleft())
                continue
            if chunks and (
                events + chunk.count > self._batching.max_events
                or nbytes + chunk.nbytes > self._batching.max_bytes
            ):
                break
            self._pop()
            chunks.append(chunk)
            events += chunk.count
            nbytes += chunk.nbytes
        self._queue.extendleft(reversed(skipped))
        return chunks, first_ns

    async def _deliver(self, taken: tuple[list[Chunk], int]) -> None:
        chunks, first_ns = taken
        count = sum(c.count for c in chunks)
        header = self._make_header(self._seq, chunks[0].producer)
        batch = OutgoingBatch(
            parts=encode_batch_parts(header, chunks), seq=self._seq, event_count=count,
            first_chunk_ns=first_ns, resource=header.resource,
        )  # fmt: skip
        self._seq += 1
        self._writing = count
        self._writing_seq = min((c.seq for c in chunks if c.seq), default=0)
        self._write_began = time.monotonic()
        self._write_scope = scope = trio.CancelScope()
        try:
            with scope:
                await self._write(batch)
            if scope.cancelled_caught:  # ``stop`` ended it, and counted the batch
                return
        except trio.Cancelled:
            raise  # only the shutdown deadline cancels a lane, and abandon() counted this batch
        except PermanentSinkError as error:  # nothing it would send can arrive: stop the sink
            if not self._written_off:
                self.stop(error.reason)
            problem = _without_where(str(error), self.sink.where())
            self.health.stopped(f"{problem} (its data is counted lost as {error.reason})")
        except DeliveryError as error:
            lost = error.lost if error.lost is not None else {"delivery_failed": count}
            self._failed(count, lost, batch.nbytes)
            not_delivered = f"{sum(lost.values())} of {count}" if error.lost is not None else f"all {count}"
            self._report_error(
                self.stage, f"batch {batch.seq}: {not_delivered} events not delivered: {error}"
            )
            self.health.failing(_without_where(str(error), self.sink.where()))
        except Exception as error:  # a sink bug must not take the pipeline down
            self._failed(count, {"sink_error": count}, batch.nbytes)
            problem = f"sink failed on batch {batch.seq}: {type(error).__name__}: {error}"
            self._report_error(self.stage, problem)
            self.health.failing(problem)
        else:
            if self._written_off:  # abandoned at the deadline, yet the write finished (a sink thread)
                self._undrop(self._written_off, self._abandon_reason)
            self.counters.events_out += count
            self.counters.bytes_out += batch.nbytes
            if self.up:
                self.health.ok()
        finally:
            self._writing = self._written_off = self._writing_seq = 0
            for chunk in chunks:  # the batch's bytes were held until now
                self._let_go(chunk)
            self._notify()  # ``drained`` waits for this

    async def _write(self, batch: OutgoingBatch) -> None:
        """``sink.write`` under the sink's ``retry`` and ``timeout`` keys (unless it applies them
        itself): every attempt is cancelled after ``timeout``, and a ``RetryableError`` or a timeout
        is retried with the shared backoff until ``retry.max_elapsed``; then ``DeliveryError``.
        A write that runs in a thread cannot be stopped by the timeout: its attempt is abandoned."""
        sink = self.sink
        if sink.retries_itself:
            await sink.write(batch)
            return
        config = sink.config

        async def attempt(limit: float) -> None:
            with trio.move_on_after(limit) as timed:
                await sink.write(batch)
            if timed.cancelled_caught:
                raise RetryableError(f"timeout after {limit:g}s")

        deadline = trio.current_time() + config.retry.max_elapsed
        try:
            await call_with_retry(attempt, config.retry, config.request_timeout, deadline)
        except RetriesExhausted as error:
            raise DeliveryError(f"{sink.where()}: batch {batch.seq} not delivered: {error}") from None

    def _failed(self, count: int, lost: dict[str, int], nbytes: int) -> None:
        """``lost`` (reason -> events) of the batch's ``count`` events were not delivered; the rest were."""
        if self._written_off:  # abandon() already counted the whole batch, as a deadline loss
            return
        dropped = 0
        for reason, n in lost.items():
            n = max(0, min(n, count - dropped))
            if n:
                self._drop(n, reason)
                dropped += n
        if dropped < count:
            self.counters.events_out += count - dropped
            self.counters.bytes_out += nbytes

    # --- helpers -----------------------------------------------------------------------------

    def _pop(self) -> tuple[Chunk, int]:
        chunk, queued_ns = self._queue.popleft()
        self._queued_bytes -= chunk.nbytes
        self._queued_events -= chunk.count
        self._notify()
        return chunk, queued_ns

    def _let_go(self, chunk: Chunk) -> None:
        """This lane is done with ``chunk`` (delivered, dropped or written off)."""
        if chunk.holders:
            chunk.holders -= 1
            if not chunk.holders and self._release is not None:
                self._release(chunk)

    def _drop(self, count: int, reason: str) -> None:
        self.counters.events_dropped += count
        self._losses[self.stage, reason, "events"] += count

    def take_losses(self) -> Counter[tuple[str, str, str]]:
        """(stage, reason, unit) -> count of drops since the last call: the lane's own and what the
        sink lost after accepting (``Sink.delivery_losses()``)."""
        self._poll_sink()
        taken, self._losses = self._losses, Counter()
        return taken

    def _poll_sink(self) -> None:
        """Fold the growth of ``Sink.delivery_losses()`` into the lane's drops: accepted, then lost, so out of
        ``events_out`` and into ``events_dropped`` and a ``Loss`` with the sink's reason."""
        lost = self._ask_sink(self.sink.delivery_losses)
        for reason, total in lost.items():
            grown = total - self._sink_lost.get(reason, 0)
            if grown > 0:
                self._sink_lost[reason] = total
                self._drop(grown, reason)
                self.counters.events_out = max(0, self.counters.events_out - grown)

    def _ask_sink(self, method: Callable[[], dict[str, int]]) -> dict[str, int]:
        """A sink's counters, never an exception: a sink bug must not stop the accounting."""
        try:
            values = method()
            return {str(k): int(v) for k, v in values.items()}
        except Exception as error:
            self._sink_broke(f"{method.__name__}()", error)
            return {}

    def _sink_broke(self, where: str, error: Exception) -> None:
        """Say once per lane that the sink raised while the accounting read it."""
        if not self._sink_failed:
            self._sink_failed = True
            self._report_error(self.stage, f"sink failed in {where}: {type(error).__name__}: {error}")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def _undrop(self, count: int, reason: str) -> None:
        self.counters.events_dropped -= count
        self._losses[self.stage, reason, "events"] -= count

    def write_off(self, chunk: Chunk, reason: str, offered: bool) -> None:
        """Count ``chunk`` lost in this lane without queueing it: the distributor was cancelled
        holding it. ``offered``: ``offer()`` had already counted it in (it was waiting for room)."""
        if not offered:
            self.counters.events_in += chunk.count
            self.counters.bytes_in += chunk.nbytes
        self._drop(chunk.count, reason)
        self._let_go(chunk)

    def abandon(self, reason: str, *, writing_too: bool = True, data_only: bool = False) -> int:
        """Drop whatever is still queued, and (``writing_too``) the batch being written (shutdown
        deadline passed; the lane is cancelled next). ``data_only``: control chunks (accounting and
        errors, which no full queue drops either) stay queued. Returns the events dropped. A write
        that still finishes (one a sink runs in a thread cannot be cancelled) is then counted
        delivered, not lost; the returned count is not revised."""
        writing = 0 if self._written_off or not writing_too else self._writing  # else: ``stop`` did
        if writing:
            self._written_off, self._abandon_reason = writing, reason
        kept: deque[tuple[Chunk, int]] = deque()
        for item in self._queue:
            if data_only and item[0].seq == 0:
                kept.append(item)
            else:
                self._let_go(item[0])
        dropped = self._queued_events - sum(chunk.count for chunk, _ in kept) + writing
        if dropped:
            self._drop(dropped, reason)
        self._queue = kept
        self._queued_bytes = sum(chunk.nbytes for chunk, _ in kept)
        self._queued_events = sum(chunk.count for chunk, _ in kept)
        return dropped

    def stop(self, reason: str) -> int:
        """The sink stopped for good (a permanent error): what is queued, the batch being written and
        every later offer are counted lost under ``reason``; the lane's ``run`` then only waits to be
        closed. Returns the events dropped now."""
        self._stopped = reason
        dropped = self.abandon(reason)
        self._write_scope.cancel()  # a write still under way ends (one in a thread: when it returns)
        self._notify()  # an offer waiting for room under ``block`` finds the lane stopped
        return dropped

    def snapshot(self) -> StageStats:
        """The lane's counters now, the sink's own (``Sink.stats()``) and its losses included."""
        self._poll_sink()
        stats = StageStats(**{f: getattr(self.counters, f) for f in StageStats.__struct_fields__})
        stats.queued_bytes = self._queued_bytes
        stats.counters = self._ask_sink(self.sink.stats)
        stats.events_spooled, stats.events_delivered = self._receipts(stats.events_out)
        return stats

    def _receipts(self, events_out: int) -> tuple[int, int]:
        """(spooled, delivered) of the ``events_out`` the sink accepted, never an exception."""
        try:
            spooled = max(0, int(self.sink.spooled_events()))
            acked = self.sink.acknowledged_events()
        except Exception as error:  # a sink bug must not stop the accounting
            self._sink_broke("its receipts", error)
            return 0, 0
        if acked is None:  # ``write`` returned once delivered
            return spooled, max(0, events_out - spooled)
        return spooled, max(0, int(acked))


def _without_where(message: str, where: str) -> str:
    """A sink's error message without its leading ``sinks[<name>]: `` (the health line adds it)."""
    return message[len(where) + 2 :] if message.startswith(where + ": ") else message
