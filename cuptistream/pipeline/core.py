"""The trio pipeline: intake → distributor → one lane per sink, plus loss and self-stats reporting.

It runs in its own thread (``PipelineThread``) so the observed program keeps its main thread.
Shutdown order: the session stops its sources, then calls ``stop()``; the distributor drains the
intake into the lanes, the final loss and self-stats events go to every lane, the lanes deliver what
they hold and close their sinks, all within ``shutdown_deadline``. What could not be delivered by
then is counted in the returned ``ShutdownReport``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
import trio

from cuptistream.config import Config
from cuptistream.delivery.health import HealthReport
from cuptistream.events import (
    SCHEMA_VERSION,
    ClockSync,
    EncodedBatch,
    Event,
    Loss,
    Resource,
    SelfStats,
    StageStats,
)
from cuptistream.pipeline.connect import require_healthy, serve_lane
from cuptistream.pipeline.intake import Intake
from cuptistream.pipeline.lane import SinkLane
from cuptistream.plugin import Sink
from cuptistream.recording.codec import Chunk, encode_chunk
from cuptistream.recording.producers import Producer

# The last part of ``shutdown_deadline`` (this long, at most a quarter of it) is kept for closing
# the sinks (seal the file, release clients and threads, count what they held) when draining does
# not finish; a close that takes longer is abandoned.
CLOSE_AFTER_DEADLINE_S = 0.5

T = TypeVar("T")


@dataclass
class ShutdownReport:
    """Totals for the whole session, complete once the pipeline has stopped."""

    events_in: int = 0
    intake_dropped: int = 0
    sinks: dict[str, StageStats] = field(default_factory=dict)
    losses: dict[str, int] = field(default_factory=dict)  # "stage/reason" -> count, all units
    # ... of which counted after the final accounting chunk was built, so in no recording's ``Loss``
    # events: a lane that could not deliver that chunk, what sinks lost while closing
    unrecorded_losses: dict[str, int] = field(default_factory=dict)
    undelivered: dict[str, int] = field(default_factory=dict)  # sink -> events left at the deadline
    health: dict[str, HealthReport] = field(default_factory=dict)  # sink -> its state at the end
    deadline_hit: bool = False
    # Filled in by the collector:
    probes: int = 0  # probe connections served
    activity_buffers: int = 0  # raw CUPTI buffers decoded
    activity_decodes: int = 0  # decodes of them: consecutive buffers that queued up decode as one
    activity_records: int = 0  # records in them
    # ... of which decoded for the statistics only, by design (``activity.records: on_demand``):
    # not stored, not lost
    activity_records_withheld: int = 0
    collector_cpu_s: float = 0.0  # the collector process's CPU time (user + system)
    collector_max_rss_kib: int = 0  # ru_maxrss: its heap and the probes' pools it maps, together
    # The same split (``cuptistream.collector.memory``): its own heap, which ``memory_budget`` is
    # about, apart from the probes' shared slot pools; at the end and the sampled peak.
    collector_rss_anon_kib: int = 0
    collector_rss_shmem_kib: int = 0
    collector_peak_rss_anon_kib: int = 0
    collector_peak_rss_shmem_kib: int = 0
    # CPU seconds by thread name (``collector.thread_cpu``), and its busiest single thread: the one
    # that limits a collector that cannot keep up, long before its process uses all its cores.
    collector_threads_cpu_s: dict[str, float] = field(default_factory=dict)
    collector_busiest_thread: str = ""
    collector_busiest_thread_cpu_s: float = 0.0
    # Decode worker processes (``pipeline.decode_workers``): how many started, died, probe
    # connections moved to a new worker (``auto``: a busy worker splits), their CPU time (not in
    # ``collector_cpu_s``; with those stopped when their last connection left) and the heaps of
    # those still running at the end.
    decode_workers: int = 0
    decode_workers_died: int = 0
    decode_worker_moves: int = 0
    decode_workers_cpu_s: float = 0.0
    decode_workers_rss_anon_kib: int = 0
    # ``worker_replies: shared``: replies whose events were packed into a reply slot, slot takes
    # that found none idle (those replies' events came over the socket), and the slots made.
    reply_slot_replies: int = 0
    reply_slot_full: int = 0
    reply_slots: int = 0

    def summary(self) -> str:
        parts = [f"{self.events_in} events in"]
        for name, stats in self.sinks.items():
            health = self.health.get(name)
            state = f" ({health.state}: {health.problem})" if health and health.state != "ok" else ""
            spooled = f", {stats.events_spooled} spooled" if stats.events_spooled else ""
            delivered = f"{stats.events_delivered} delivered{spooled}"
            parts.append(f"{name}: {delivered}, {stats.events_dropped} dropped{state}")
        if self.intake_dropped:
            parts.append(f"intake dropped {self.intake_dropped}")
        if self.deadline_hit:
            parts.append(f"shutdown deadline hit, undelivered {self.undelivered}")
        if self.unrecorded_losses:  # a reader of the recording sees fewer losses than these
            parts.append(
                f"losses in no recording (counted after the final accounting) {self.unrecorded_losses}"
            )
        return "; ".join(parts)


class Pipeline:
    def __init__(
        self,
        config: Config,
        sinks: list[Sink],
        session_id: str,
        resource: Resource,
        clock_sync: Callable[[], ClockSync],
        *,
        require_healthy: bool = False,
    ) -> None:
        self.config = config
        # --require-healthy: every sink up (``Sink.connect``) before ``started``; else in the background
        self.require_healthy = require_healthy
        self._clock_sync = clock_sync
        self.intake = Intake(config.pipeline.memory_budget, config.pipeline.full_policy, self._event_ns)
        self.resource = resource  # the collector's own; observed processes' come with their chunks
        self._session_id = session_id
        self._attributes = dict(config.session.attributes)
        self.lanes = [
            SinkLane(
                sink,
                sink.config.queue,
                sink.config.batch or config.pipeline.batch,
                self._header,
                self._lane_error,
                self.intake.release,  # one memory budget: the intake's counts what the lanes hold
            )
            for sink in sinks
        ]
        self._lane_errors: list[tuple[str, str]] = []
        self._loss_window_start = time.time_ns()
        self._all_losses: Counter[tuple[str, str, str]] = Counter()
        # drops the final accounting chunk counts before they happen (stopped lanes dropping it)
        self._counted_ahead: Counter[tuple[str, str, str]] = Counter()
        self._unrecorded: Counter[tuple[str, str, str]] = Counter()  # counted after the final accounting
        # Errors said after the distributor stopped (a sink recovering while the lanes drain): sent
        # with the final accounting instead of left in the intake.
        self._late_control: list[tuple[Producer | None, Sequence[Event]]] = []
        self._started = time.time_ns()
        # ``time.monotonic()`` by which draining must end; None: ``shutdown_deadline`` from stop().
        self.drain_until: float | None = None
        self._in_hand: Chunk | None = None  # the data chunk the distributor is handing to the lanes

    @property
    def accepts_columns(self) -> bool:
        """Every sink takes the hot kinds as ``events.Columns`` elements (``Sink.accepts_columns``),
        so decoding may write them that way: about half the collector's CPU per record."""
        return all(lane.sink.accepts_columns for lane in self.lanes)

    def _event_ns(self) -> int:
        return self._clock_sync().cupti_ns

    def _header(self, seq: int, producer: Producer | None) -> EncodedBatch:
        """The envelope of a batch of ``producer``'s events (None: the collector's own)."""
        clock = producer.clock_sync() if producer is not None else None
        return EncodedBatch(
            schema_version=SCHEMA_VERSION,
            session_id=self._session_id,
            seq=seq,
            resource=producer.resource if producer is not None else self.resource,
            attributes=self._attributes,
            clock=clock or self._clock_sync(),
            events=msgspec.Raw(b"\x90"),
        )

    def _lane_error(self, origin: str, message: str, severity: str = "error") -> None:
        self.intake.report_error(origin, message, severity)

    # --- accounting ---------------------------------------------------------------------------

    def _collect_losses(self) -> list[Event]:
        now = time.time_ns()
        losses = self.intake.pop_losses()
        for lane in self.lanes:
            losses.update(lane.take_losses())
        self._all_losses.update(losses)
        events: list[Event] = [
            Loss(stage=stage, reason=reason, count=count, since=self._loss_window_start, until=now, unit=unit)
            for (stage, reason, unit), count in sorted(losses.items())
            if count
        ]
        self._loss_window_start = now
        return events

    def _self_stats(self) -> SelfStats:
        intake = self.intake
        stages = {
            "intake": StageStats(
                events_in=intake.events_in,
                events_out=intake.events_out,
                events_dropped=sum(n for (stage, _, unit), n in self._all_losses.items()
                                   if stage == "intake" and unit == "events"),
                bytes_in=intake.bytes_in,
                bytes_out=intake.bytes_out,
                queued_bytes=intake.queued_bytes,
            )
        }  # fmt: skip
        for lane in self.lanes:
            stages[lane.stage] = lane.snapshot()
        return SelfStats(timestamp=time.time_ns(), stages=stages)

    def _accounting_chunk(self) -> Chunk:
        events = self._collect_losses()
        events.append(self._self_stats())
        return encode_chunk(events)

    def _final_accounting_chunk(self, late: Sequence[Event] = (), late_chunks: Sequence[Chunk] = ()) -> Chunk:
        """The last accounting, sent to every lane, after ``late``: the collector's errors said
        since the distributor stopped (``late_chunks``: the probes', offered just before it). A
        stopped lane will drop this chunk and ``late_chunks``: those drops are counted in it, so the
        recording's ``Loss`` events add up to the report's."""
        events = [*late, *self._collect_losses()]
        events.append(self._self_stats())
        stopped = [lane for lane in self.lanes if lane.stopped]
        losses = {(e.stage, e.reason): e for e in events if isinstance(e, Loss) and e.unit == "events"}
        total = len(events) + len({(lane.stage, lane.stopped) for lane in stopped} - losses.keys())
        total += sum(c.count for c in late_chunks)
        now = time.time_ns()
        for lane in stopped:
            key = (lane.stage, lane.stopped)
            if key not in losses:
                losses[key] = Loss(stage=key[0], reason=key[1], count=0, since=now, until=now, unit="events")
                events.insert(-1, losses[key])
            losses[key].count += total
            self._counted_ahead[key[0], key[1], "events"] += total  # the lane drops it when offered
        return encode_chunk(events)

    def _late_control_events(self) -> tuple[list[Event], list[Chunk]]:
        """The errors said since the distributor stopped: the collector's own (a sink recovering
        while the lanes drained), and one chunk per probe for the rest."""
        _, control = self.intake.take(max_chunks=0)
        late, self._late_control = self._late_control + control, []
        own: list[Event] = []
        chunks = []
        for producer, events in late:
            if producer is None:
                own += events
                continue
            chunks.append(encode_chunk(list(events)))
            chunks[-1].producer = producer
        return own, chunks

    def _count_left_in_intake(self) -> None:
        """What never reached a lane is lost for every sink; its errors go out with the final accounting."""
        left, control = self.intake.take(max_chunks=1 << 30)
        self._late_control += control
        if left:
            self.intake.report_loss("intake", "shutdown_deadline", sum(c.count for c in left))

    async def _close_sink(self, lane: SinkLane) -> None:
        """Close ``lane``'s sink; a sink failing at close is an error event, never the end of the
        pipeline (the report must still be made)."""
        try:
            await lane.sink.close()
        except Exception as error:
            self._lane_error(lane.stage, f"sink failed at close: {type(error).__name__}: {error}")

    # --- tasks --------------------------------------------------------------------------------

    async def _distribute(self, stopping: trio.Event) -> None:
        token = trio.lowlevel.current_trio_token()
        ready = trio.Event()

        def wake() -> None:  # runs in the trio thread; must not raise
            ready.set()

        def waker() -> None:
            try:
                token.run_sync_soon(wake)
            except trio.RunFinishedError:
                pass

        self.intake.set_waker(waker)
        while True:
            ready = trio.Event()
            chunks, control = self.intake.take(lanes=len(self.lanes))
            data_chunks = len(chunks)
            for producer, events in control:
                chunks.append(encode_chunk(events))
                chunks[-1].producer = producer
            for index, chunk in enumerate(chunks):
                offered = 0  # lanes that have this chunk
                # The first data chunk in hand has the lowest number of those not in every lane yet.
                self._in_hand = chunk if index < data_chunks else None
                try:
                    for lane in self.lanes:  # control chunks (errors) are never dropped by a full lane
                        await lane.offer(chunk, bypass_bound=index >= data_chunks)
                        offered += 1
                    await trio.lowlevel.checkpoint()  # let the lanes deliver before their queues fill
                except trio.Cancelled:  # the deadline: what is in hand is lost, and counted
                    self._write_off(chunks[index:], offered)
                    raise
            self._in_hand = None
            if chunks:
                continue
            if stopping.is_set():
                return
            with trio.move_on_after(0.25):  # re-check ``stopping`` even when nothing arrives
                await ready.wait()

    def holding_through(self, seq: int) -> list[str]:
        """The stages still holding a chunk the intake numbered ``seq`` or lower (``Intake.last_seq``
        read after events were handed over): ``intake``, ``distributor``, ``sink:<name>``. Empty:
        every sink has delivered those events, or counted them lost. Call it in the pipeline's trio
        thread (``PipelineThread.run_sync``), where the stages cannot move while it looks."""
        holding = ["intake"] if self.intake.holds_through(seq) else []
        in_hand = self._in_hand
        if in_hand is not None and 0 < in_hand.seq <= seq:
            holding.append("distributor")
        holding += [lane.stage for lane in self.lanes if lane.holds_through(seq)]
        return holding

    def dropped_by_sinks(self) -> dict[str, int]:
        """Events each sink's lane has counted lost so far (cumulative; trio thread)."""
        return {lane.stage: lane.counters.events_dropped for lane in self.lanes}

    def _write_off(self, chunks: list[Chunk], offered: int) -> None:
        """Count ``chunks`` lost in every lane that does not have them: the first was handed to the
        first ``offered`` lanes, and the lane after those was waiting in ``offer()`` for room."""
        first, *rest = chunks
        for position, lane in enumerate(self.lanes[offered:], start=offered):
            lane.write_off(first, "shutdown_deadline", offered=position == offered)
        for chunk in rest:
            for lane in self.lanes:
                lane.write_off(chunk, "shutdown_deadline", offered=False)

    async def _report_periodically(self) -> None:
        while True:
            await trio.sleep(self.config.pipeline.stats_interval)
            chunk = self._accounting_chunk()
            for lane in self.lanes:
                await lane.offer(chunk, bypass_bound=True)

    async def run(
        self, started: Callable[[BaseException | None], None], stop_requested: trio.Event
    ) -> ShutdownReport:
        report = ShutdownReport()
        try:
            for lane in self.lanes:  # local checks only: the network is ``connect``'s
                await lane.sink.open()
            if self.require_healthy:
                await require_healthy([lane.sink for lane in self.lanes])
        except BaseException as error:
            started(error)
            raise
        started(None)
        distributor_done = trio.Event()
        lanes_done = [trio.Event() for _ in self.lanes]
        reporter = trio.CancelScope()
        deadline_s = float(self.config.pipeline.shutdown_deadline)
        close_s = min(CLOSE_AFTER_DEADLINE_S, deadline_s / 4)

        closing_until = math.inf  # set at shutdown: when closing the sinks must end

        async def run_lane(lane: SinkLane, done: trio.Event) -> None:
            closing = False

            async def close() -> None:  # after the lane drained; the sink may still be connecting
                nonlocal closing
                closing = True
                await self._close_sink(lane)

            try:
                await serve_lane(lane, lane.health, close, connected=self.require_healthy)
            except trio.Cancelled:
                if not closing:  # the deadline passed while delivering: still close, briefly
                    with trio.CancelScope(shield=True) as scope:
                        finite = closing_until < math.inf
                        scope.deadline = closing_until if finite else trio.current_time() + close_s
                        await self._close_sink(lane)
                raise
            done.set()

        async def report_loop() -> None:
            with reporter:
                await self._report_periodically()

        distributor = trio.CancelScope()  # cancelled when draining runs out of time
        distributor_exited = trio.Event()

        async def distribute() -> None:
            try:
                with distributor:
                    await self._distribute(stop_requested)
                    distributor_done.set()
            finally:
                distributor_exited.set()

        async with trio.open_nursery() as nursery:
            for lane, done in zip(self.lanes, lanes_done, strict=True):
                nursery.start_soon(run_lane, lane, done)
            nursery.start_soon(report_loop)
            nursery.start_soon(distribute)
            await stop_requested.wait()
            self.intake.close()
            budget = deadline_s
            if self.drain_until is not None:  # the deadline began earlier (the signal, the program's exit)
                budget = min(budget, self.drain_until - time.monotonic())
            # Draining until ``ends``; then the final accounting and closing the sinks share close_s:
            # the first half for the final accounting to reach every lane (of which a quarter, where
            # draining ran out of time, for busy lanes to finish their batch), the rest (``hard_end``)
            # for closing what is still open.
            ends = trio.current_time() + max(0.0, budget - close_s)
            hard_end = ends + close_s
            for lane in self.lanes:  # no more waiting for fuller batches
                lane.flush()
            with trio.move_on_at(ends) as draining:
                await distributor_done.wait()
                for lane in self.lanes:
                    await lane.drained()
            if draining.cancelled_caught:  # count what is left now, so the final accounting has it
                report.deadline_hit = True
                distributor.cancel()  # what it holds is written off in the lanes
                await distributor_exited.wait()
                self._count_left_in_intake()
                with trio.move_on_at(ends + close_s / 4):  # lanes that are moving go on a moment
                    for lane in self.lanes:
                        await lane.drained()
                now = time.monotonic()
                for lane in self.lanes:
                    report.undelivered[lane.sink.name] = 0
                    if lane.stopped or (lane.idle and _takes_writes(lane)):
                        continue
                    if _takes_writes(lane) and lane.writing_for(now) < close_s / 4:  # moving: its
                        # batch goes on, and its control chunks (accounting, errors: small) stay queued
                        left = lane.abandon("shutdown_deadline", writing_too=False, data_only=True)
                    else:  # a stuck write, a sink failing or not up: stopped, its write cancelled
                        left = lane.stop("shutdown_deadline")
                    report.undelivered[lane.sink.name] = left
                with trio.move_on_at(ends + close_s * 3 / 4):  # cancelled writes unwind (at once,
                    for lane in self.lanes:  # unless in a thread): what a sink counts lost as they do
                        await lane.drained()  # belongs in the final accounting
            for lane in self.lanes:  # a sink failing now would lose the final accounting after it:
                if not lane.stopped and not _takes_writes(lane):  # count it in it instead
                    lane.stop("sink_failing")
            reporter.cancel()
            own, late = self._late_control_events()
            final = self._final_accounting_chunk(own, late)
            with trio.move_on_at(max(ends + close_s / 2, trio.current_time() + close_s / 4)) as closing:
                for lane in self.lanes:
                    for chunk in late:  # a stopped lane drops them, as counted in ``final``
                        await lane.offer(chunk, bypass_bound=True)
                    await lane.offer(final, bypass_bound=True)
                    lane.close()
                for done in lanes_done:
                    await done.wait()
            if closing.cancelled_caught:
                report.deadline_hit = True
                for lane in self.lanes:
                    left = lane.abandon("shutdown_deadline")
                    report.undelivered[lane.sink.name] = report.undelivered.get(lane.sink.name, 0) + left
            closing_until = hard_end
            nursery.cancel_scope.cancel()
        self._count_left_in_intake()
        self._unrecorded.subtract(self._counted_ahead)
        self.count_late_losses(report)
        for lane in self.lanes:
            report.sinks[lane.sink.name] = lane.snapshot()
            report.health[lane.sink.name] = lane.health.report()
        return report

    def count_late_losses(self, report: ShutdownReport) -> None:
        """Put the losses counted since the final accounting into ``report``: in its totals, and
        in ``unrecorded_losses`` (no recording has them). ``run`` does at its end; the collector
        does again for what its probe connections counted after that (a chunk handed to the
        closed intake by a connection still draining at the deadline)."""
        late = self.intake.pop_losses()
        for lane in self.lanes:
            late.update(lane.take_losses())
        self._all_losses.update(late)
        self._unrecorded.update(late)
        report.unrecorded_losses = {
            f"{s}/{r}": n for (s, r, _), n in sorted(self._unrecorded.items()) if n > 0
        }
        report.events_in = self.intake.events_in
        report.intake_dropped = sum(
            n for (s, _, u), n in self._all_losses.items() if s == "intake" and u == "events"
        )
        report.losses = {f"{s}/{r}": n for (s, r, _), n in sorted(self._all_losses.items()) if n}


def _takes_writes(lane: SinkLane) -> bool:
    """Whether ``lane``'s sink can still take a batch at shutdown: it is ok, or it holds or spools
    what it gets while failing (``writes_while_connecting``, such as Kafka)."""
    return lane.health.state == "ok" or lane.sink.writes_while_connecting


class PipelineThread:
    """Runs a Pipeline under ``trio.run`` in a daemon thread; start() waits until sinks are open.
    ``at_exit`` runs last on that thread (the collector takes the thread's final CPU reading)."""

    def __init__(self, pipeline: Pipeline, at_exit: Callable[[], None] | None = None) -> None:
        self.pipeline = pipeline
        self._at_exit = at_exit
        self._thread = threading.Thread(target=self._main, name="cuptistream-pipeline", daemon=True)
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self.report: ShutdownReport | None = None
        self.crash: BaseException | None = None

    def _main(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self.report = await self.pipeline.run(self._on_started, self._stop)

        try:
            trio.run(main)
        except BaseException as error:  # reported to the session; the program goes on
            if self._started.is_set():
                self.crash = error
        finally:
            self._started.set()
            if self._at_exit is not None:
                self._at_exit()

    def _on_started(self, error: BaseException | None) -> None:
        self._start_error = error
        self._started.set()

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    def run_sync(self, function: Callable[..., T], *args: object) -> T:
        """Call ``function(*args)`` in the pipeline's trio thread, from another thread, and return its
        result. Raises ``trio.RunFinishedError`` when the pipeline is not running."""
        token = self._token
        if token is None or not self._thread.is_alive():
            raise trio.RunFinishedError("the pipeline is not running")
        return trio.from_thread.run_sync(function, *args, trio_token=token)

    def stop(self, timeout: float, drain_until: float | None = None) -> ShutdownReport | None:
        """Ask the pipeline to drain (by ``drain_until``, a ``time.monotonic()``; None:
        ``shutdown_deadline`` from now) and wait for it (at most ``timeout`` seconds)."""
        self.pipeline.drain_until = drain_until
        if self._token is not None and self._stop is not None and self._thread.is_alive():
            stop = self._stop
            try:
                self._token.run_sync_soon(stop.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout)
        return self.report
