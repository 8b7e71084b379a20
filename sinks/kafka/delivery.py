"""Delivery tracking for the Kafka sink: every message is held until acked or permanently failed.

One ``Delivery`` owns one kafka-python producer and one thread, ``cuptistream-kafka``, which sends in
this order, never skipping ahead (nothing until ``start`` hands it the first producer: until then
messages are held, within ``max_in_flight_bytes``, and spooled past it):

1. messages due for a retry (ours, after kafka-python's own retries gave up), oldest first;
2. messages handed over by the pipeline;
3. messages replayed from the spool.

While a retry waits for its backoff nothing newer is sent, so order per key holds across outages.
The waits follow the sink's shared ``retry`` settings (``cuptistream.delivery.retry.Backoff``, one per
message). With ``expire`` (block mode) a message still unacked ``retry.max_elapsed`` after its first
send is given up: counted in ``lost`` as ``retries_exhausted``. In spool mode nothing expires.
Delivery callbacks run on kafka-python's sender thread; they only append to a deque and notify.

Memory: ``held_bytes`` counts every message we hold (handed over, in kafka-python, or waiting to be
retried). ``try_enqueue`` refuses a batch that would take it past ``max_in_flight_bytes`` (unless
nothing is held), and the spool is read only while there is room, so memory stays bounded however
long the broker is away.
"""

from __future__ import annotations

import functools
import heapq
import importlib.metadata
import itertools
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Literal

from cuptistream.config import RetryConfig
from cuptistream.delivery.abandonable import call_by
from cuptistream.delivery.retry import Backoff

from .route import Message, split_message
from .spool import Spool, SpoolReader

log = logging.getLogger("cuptistream.sinks.kafka")


@functools.cache
def _error_kinds() -> tuple[tuple[type[BaseException], ...], ...]:
    """kafka-python's errors by what we do about them: (too large, permanent, producer state).
    Imported on first use, on the delivery thread: kafka-python takes about 0.15 s to import, which
    would otherwise delay the program's start."""
    import kafka.errors as kerrors

    # The broker refused the message as too big: cut it in two and try again.
    too_large = (kerrors.MessageSizeTooLargeError, kerrors.RecordListTooLargeError)
    # Retrying cannot help: the message is dropped and counted.
    permanent = (
        kerrors.InvalidTopicError,
        kerrors.AuthorizationError,
        kerrors.CorruptRecordError,
        kerrors.InvalidRecordError,
        kerrors.UnsupportedCompressionTypeError,
        kerrors.InvalidRequiredAcksError,
    )
    # The producer's idempotence state is broken (e.g. a restarted broker lost it), or kafka-python
    # gave up after delivery_timeout (a producer that lived through a broker restart can stay stuck,
    # seen with tansu): make a new producer, then retry.
    producer_state = (
        kerrors.KafkaTimeoutError,
        kerrors.OutOfOrderSequenceNumberError,
        kerrors.UnknownProducerIdError,
        kerrors.InvalidProducerEpochError,
        kerrors.ProducerFencedError,
        kerrors.IllegalStateError,
    )
    return too_large, permanent, producer_state


COUNTERS = (
    "acked_messages",
    "acked_events",
    "retried_messages",
    "split_messages",
    "spooled_messages",
    "spooled_events",
    "replayed_messages",
    "replayed_events",
    "dropped_messages",
    "dropped_events",
    "undelivered_events",
    "producer_restarts",
)


# At close, how long to wait for the delivery thread and for kafka-python's close when either is stuck
# (a send waiting max_block_ms on a frozen broker): they are left, what they hold is counted.
_STUCK_S = 0.05

# Why events were lost after the sink accepted them (``Delivery.lost``; Loss events' reasons).
LOSS_REASONS = ("rejected", "retries_exhausted", "spool_full", "spool_error", "shutdown")
# ... and, when the sink was refused for good (``close(lost_as=...)``), the refusal's reason:
# ``sasl_login_refused``, ``tls_certificate_rejected``, ``topic_not_allowed``.


def close_producer(producer: Any, timeout: float = 0.0) -> None:
    """Close a kafka-python producer after at most ``timeout`` seconds of flushing, without waiting
    on a broker that does not answer.

    kafka-python 3.0.12's ``close`` flushes first and, on a frozen broker, raises
    ``KafkaTimeoutError`` before it stops its sender thread: that thread then keeps polling (about
    40 % of a CPU, measured) and the producer's ``__del__`` blocks a second or more later, at exit
    too, with a traceback. So the sender is force-closed first (``_sender.force_close``, private,
    looked up with getattr), then ``close(0)`` finishes. What was not acked fails in kafka-python;
    the caller counts it. Raises what ``close`` raises."""
    try:
        if timeout > 0:
            producer.flush(timeout)
    except Exception:  # unacked: counted by the caller
        pass
    sender = getattr(producer, "_sender", None)
    if sender is not None and callable(getattr(sender, "force_close", None)):
        sender.force_close()
        sender.join(_STUCK_S)
    producer.close(timeout=0)


# How long kafka-python's sender may wait on a node whose connection exists but cannot take a
# request: still connecting (TCP, TLS, the version handshake) or paused at
# max_in_flight_requests_per_connection (ms, as the sender reads it). The wait is a select on the
# connections' sockets, so what makes the node ready (a handshake step, a response) ends it at once:
# this bounds only a wake-up nothing else would cause.
_NOT_READY_NODE_WAIT_MS = 100.0


# kafka-python releases whose client answers ``connection_delay`` in seconds to a sender that reads
# milliseconds (3.0.12 read). Converting in a release that fixed it would make the sender wait a
# thousand times the backoff, so others are left as they are; the spin test
# (tests/test_kafka_sender_spin.py, a killed broker) fails for a release that still needs it.
_ANSWERS_SECONDS = ("3.0.",)


@functools.cache
def _answers_seconds() -> bool:
    try:
        release = importlib.metadata.version("kafka-python")
    except importlib.metadata.PackageNotFoundError:
        return False
    return release.startswith(_ANSWERS_SECONDS)


def calm_sender(producer: Any) -> bool:
    """Keep kafka-python's sender thread from spinning on a broker that stopped answering.

    kafka-python 3.0.12's sender asks ``connection_delay(node)`` how long to wait for a node that
    is not ready. Without a reconnect backoff the answer is 0, also for a connection that is still
    being set up or is paused with its requests unanswered. A broker that stopped answering (its
    kernel still accepts connections) leaves one of those for as long as it is silent, and the
    sender polls in a busy loop holding the GIL: 1.1 cores of the collector with a SIGSTOPped
    broker, against 0.05 with a healthy one, and the sink's close delayed by up to a second. For
    such a node this client answers at least ``_NOT_READY_NODE_WAIT_MS``. The client answers in
    seconds, which the sender reads as milliseconds: with the broker down (connections refused) it
    polled ~700 times a second through the reconnect backoff (0.07 cores against 0.02); in the
    releases read to have that mismatch (``_ANSWERS_SECONDS``) the answer is converted. Private
    names, looked up with getattr: returns False, and changes nothing, where they are missing."""
    client = getattr(getattr(producer, "_sender", None), "_client", None)
    original = getattr(client, "connection_delay", None)
    conns = getattr(getattr(client, "_manager", None), "_conns", None)
    if client is None or original is None or not isinstance(conns, dict):
        return False
    to_ms = 1000.0 if _answers_seconds() else 1.0

    def connection_delay(node_id: Any) -> Any:
        delay_ms = original(node_id) * to_ms
        conn = conns.get(node_id)
        if conn is None or (getattr(conn, "connected", False) and not getattr(conn, "paused", None)):
            return delay_ms  # no connection now (the sender makes one next, or after the backoff), or ready
        return max(delay_ms, _NOT_READY_NODE_WAIT_MS)

    client.connection_delay = connection_delay
    return True


class _Item:
    __slots__ = ("attempts", "backoff", "message", "nbytes", "order", "reader")

    def __init__(self, message: Message, order: int, reader: SpoolReader | None = None) -> None:
        self.message = message
        self.nbytes = message.nbytes
        self.order = order
        self.attempts = 0
        self.reader = reader
        self.backoff: Backoff | None = None  # made at the first send


class Delivery:
    def __init__(
        self,
        make_producer: Callable[[], Any],
        *,
        max_in_flight_bytes: int,
        retry: RetryConfig,
        expire: bool,
        spool: Spool | None,
        on_change: Callable[[], None],
        where: str = "kafka",
    ) -> None:
        self._where = where  # how its log lines start: "sinks[<name>]"
        self._make_producer = make_producer  # a new producer after a broken one; raises when it cannot
        self._producer: Any = None  # ``start`` hands over the first
        self.max_bytes = max_in_flight_bytes
        self._retry_config = retry
        self._expire = expire  # give a message up retry.max_elapsed after its first send
        self.spool = spool
        self._on_change = on_change  # called from our threads whenever room may have freed up
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        # Heap of (order, tie-break, due, item): always retried oldest first, each after its backoff.
        self._retry: list[tuple[int, int, float, _Item]] = []
        self._sent: dict[int, _Item] = {}  # id(item) -> item, in kafka-python's hands
        self._done: deque[tuple[_Item, BaseException | None]] = deque()
        self._reader: SpoolReader | None = None
        self._readers: list[SpoolReader] = []  # segments with replayed messages not yet settled
        self._order = itertools.count()
        self._reset_producer = False
        self._stopping = False
        self._warned: set[str] = set()
        self.held_bytes = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.lost: Counter[str] = Counter()  # events, by reason (LOSS_REASONS); all in dropped_events
        # This run's events as a receiver sees them: acked (replays of an earlier run's spool left
        # out), and waiting in the spool now. Neither of the spooled ones is delivered yet.
        self.acked_this_run = 0
        self.in_spool = 0
        self._thread = threading.Thread(target=self._run, name="cuptistream-kafka", daemon=True)
        self._thread.start()

    # --- the pipeline's side -----------------------------------------------------------------

    def start(self, producer: Any) -> None:
        """Begin sending with ``producer`` (the sink is up)."""
        with self._cond:
            self._producer = producer
            self._cond.notify_all()

    def try_enqueue(self, messages: list[Message]) -> Literal["queued", "full", "spool"]:
        """Hand over one batch's messages without blocking.

        ``spool``: the spool holds older messages, so these must go behind them (``spool_messages``).
        ``full``: no room now; wait for ``on_change`` and try again (or spool them).
        """
        nbytes = sum(m.nbytes for m in messages)
        with self._cond:
            if self.spool is not None and (self._reader is not None or self.spool.has_data()):
                return "spool"
            if self.held_bytes and self.held_bytes + nbytes > self.max_bytes:
                return "full"
            for message in messages:
                self._queue.append(_Item(message, next(self._order)))
            self.held_bytes += nbytes
            self._cond.notify_all()
        return "queued"

    def spool_messages(self, messages: list[Message]) -> None:
        """Write messages to the spool (blocking file I/O: call from a worker thread)."""
        assert self.spool is not None
        reason = "spool_full"
        try:
            refused = self.spool.append(messages)
        except OSError as error:
            written = 0  # the spool stops at the first failing message
            refused = messages[written:]
            reason = "spool_error"
            self._warn_once("spool-oserror", f"kafka spool: cannot write ({error.strerror}); dropping")
        else:
            if refused:
                cap = self.spool.max_bytes
                self._warn_once("spool-full", f"kafka spool: over spool_max_bytes ({cap}); dropping newest")
        with self._cond:
            spooled = messages[: len(messages) - len(refused)]
            self.counters["spooled_messages"] += len(spooled)
            events = sum(m.events for m in spooled)
            self.counters["spooled_events"] += events
            self.in_spool += events
            self._lose(refused, reason)
            self._cond.notify_all()

    def idle(self) -> bool:
        """Nothing held in memory and nothing waiting in the spool."""
        with self._cond:
            return self._idle_locked()

    def wait_idle(self, timeout: float) -> bool:
        """Block until everything is delivered (True), ``timeout`` passes or ``close`` begins."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._idle_locked():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    return False
                self._cond.wait(min(remaining, 0.5))
            return True

    def close(self, timeout: float, lost_as: str = "") -> None:
        """Deliver what is held within ``timeout`` seconds, then stop.

        What is still unacked is written to the spool (spool mode, for the next run) or counted in
        ``undelivered_events`` and ``dropped_events`` (reason ``shutdown``). ``lost_as``: the sink was
        refused for good; nothing more is sent or spooled, what is held is lost with this reason.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not lost_as and self._producer is not None and not self._idle_locked():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.5))
            self._stopping = True
            self._cond.notify_all()
        # Short: a thread stuck in kafka-python (a send waiting max_block_ms for metadata) is left;
        # what it holds is counted below.
        self._thread.join(timeout=max(_STUCK_S, deadline - time.monotonic()))
        try:
            if self._producer is not None:  # abandoned if kafka-python still finds a way to wait
                producer, wait = self._producer, max(0.0, deadline - time.monotonic())
                ends = time.monotonic() + wait + 2 * _STUCK_S
                call_by(lambda: close_producer(producer, wait), ends, name="cuptistream-kafka-close")
        except Exception as error:  # closing must finish whatever kafka-python thinks
            # e.g. a frozen broker; what was unacked is counted below, in one line
            log.debug("%s: producer close failed: %s: %s", self._where, type(error).__name__, error)
        with self._cond:
            self._settle(final=True)
            left = sorted(
                [*(entry[3] for entry in self._retry), *self._sent.values(), *self._queue],
                key=lambda item: item.order,
            )
            self._retry.clear()
            self._sent.clear()
            self._queue.clear()
            self.held_bytes = 0
        if self.spool is not None:
            # Replayed messages are still in their segment, which stays on disk; spool the rest.
            left = [item for item in left if item.reader is None]
        if left and self.spool is not None and not lost_as:
            events = sum(item.message.events for item in left)
            log.warning("%s: %d events unacked at close; spooled for the next run", self._where, events)
            self.spool_messages([item.message for item in left])
        elif left:
            events = sum(item.message.events for item in left)
            self.counters["undelivered_events"] += events
            with self._cond:
                self._lose([item.message for item in left], lost_as or "shutdown")
            if not lost_as:
                log.warning("%s: %d events unacked at close; counted as lost", self._where, events)
        if self.spool is not None:
            self.spool.close()

    # --- the delivery thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._settle()
                if self._stopping:
                    return
                restart = self._reset_producer and not self._sent
                if self._reset_producer and self._sent:
                    self._cond.wait(0.5)  # let the old producer settle what it holds first
                    continue
                if self._producer is None:  # not up yet: hold what comes
                    self._cond.wait(0.5)
                    continue
                if not restart:
                    item, wait = self._next_item()
                    if item is None:
                        self._cond.wait(wait)
                        continue
                    # Held as sent before the lock is let go: wait_idle must not see a moment
                    # where the item is in no collection and report idle.
                    self._sent[id(item)] = item
                    producer = self._producer
            if restart:
                self._restart_producer()
            elif item is not None:
                self._send(producer, item)

    def _next_item(self) -> tuple[_Item | None, float]:
        """The next item to send (and ``held_bytes`` updated), or None and how long to wait."""
        if self._retry:
            due = self._retry[0][2] - time.monotonic()
            if due > 0:
                return None, due  # nothing newer may overtake a retry
            return heapq.heappop(self._retry)[3], 0.0
        if self._queue:
            return self._queue.popleft(), 0.0
        if self.spool is None or (self.held_bytes and self.held_bytes >= self.max_bytes):
            return None, 0.5
        while True:
            if self._reader is None:
                self._reader = self.spool.take()
                if self._reader is None:
                    return None, 0.5
                self._readers.append(self._reader)
            message = self._reader.next()
            if message is not None:
                item = _Item(message, next(self._order), self._reader)
                self.held_bytes += item.nbytes
                return item, 0.0
            self._reader = None
            self._release_readers()

    def _send(self, producer: Any, item: _Item) -> None:
        """Hand ``item`` (already in ``_sent``) to kafka-python; its outcome arrives in ``_completed``."""
        message = item.message
        if item.backoff is None:  # only this thread touches an item's backoff before it settles
            window = float(self._retry_config.max_elapsed) if self._expire else math.inf
            item.backoff = Backoff(self._retry_config, time.monotonic() + window)
        try:
            future = producer.send(
                message.topic, value=message.value, key=message.key, headers=message.headers
            )
        except Exception as error:  # e.g. metadata timeout while the broker is away
            self._completed(item, error)
            return
        future.add_callback(lambda _metadata: self._completed(item, None))
        future.add_errback(lambda error: self._completed(item, error))

    def _completed(self, item: _Item, error: BaseException | None) -> None:
        """Runs on kafka-python's sender thread (or ours): record the outcome, settle later."""
        with self._cond:
            self._done.append((item, error))
            self._cond.notify_all()

    def _settle(self, final: bool = False) -> None:
        """Apply delivery outcomes. Called with the lock held."""
        changed = False
        while self._done:
            item, error = self._done.popleft()
            if self._sent.pop(id(item), None) is None:
                continue
            changed = True
            if error is None:
                self._acked(item)
            elif final:
                self._sent[id(item)] = item  # left for close() to spool or count
            else:
                self._failed(item, error)
        if changed:
            self._release_readers()
            self._cond.notify_all()
            self._on_change()

    def _acked(self, item: _Item) -> None:
        self.held_bytes -= item.nbytes
        self.counters["acked_messages"] += 1
        self.counters["acked_events"] += item.message.events
        if item.reader is None or not item.reader.earlier_run:
            self.acked_this_run += item.message.events
        if item.reader is not None:
            self._replay_settled(item)
            self.counters["replayed_messages"] += 1
            self.counters["replayed_events"] += item.message.events

    def _failed(self, item: _Item, error: BaseException) -> None:
        too_large, permanent_errors, producer_state = _error_kinds()
        if isinstance(error, too_large) and item.message.events > 1:
            self.counters["split_messages"] += 1
            halves = [_Item(m, item.order, item.reader) for m in split_message(item.message)]
            if item.reader is not None:
                item.reader.outstanding += len(halves) - 1
            self.held_bytes += sum(h.nbytes for h in halves) - item.nbytes
            for half in halves:
                half.backoff = item.backoff  # the same deadline
                heapq.heappush(self._retry, (item.order, next(self._order), 0.0, half))
            return
        if isinstance(error, producer_state):
            self._reset_producer = True
        permanent = isinstance(error, permanent_errors + too_large)
        assert item.backoff is not None, "failed before it was sent"
        delay = None if permanent else item.backoff.wait(time.monotonic())
        if delay is None:
            self.held_bytes -= item.nbytes
            self._lose([item.message], "rejected" if permanent else "retries_exhausted")
            if item.reader is not None:
                self._replay_settled(item)
            topic = item.message.topic
            why = str(error) if permanent else f"{type(error).__name__}, {item.backoff.give_up_reason()}"
            self._warn_once(type(error).__name__, f"{self._where}: dropping messages to {topic}: {why}")
            return
        item.attempts += 1
        self.counters["retried_messages"] += 1
        heapq.heappush(self._retry, (item.order, next(self._order), time.monotonic() + delay, item))
        # One line per kind of failure, not one per message: many in flight fail together.
        self._warn_once(
            f"retry:{type(error).__name__}",
            f"{self._where}: the broker did not ack a message to {item.message.topic} "
            f"({type(error).__name__}); retrying with backoff",
        )

    def _replay_settled(self, item: _Item) -> None:
        """A message replayed from the spool was acked or given up: its segment waits on one message
        fewer, and, if this run spooled it, this run's spooled events are fewer by its events."""
        assert item.reader is not None
        item.reader.outstanding -= 1
        if not item.reader.earlier_run:
            self.in_spool = max(0, self.in_spool - item.message.events)

    def _release_readers(self) -> None:
        assert self.spool is not None or not self._readers
        for reader in list(self._readers):
            if reader.exhausted and reader.outstanding == 0 and reader is not self._reader:
                self._readers.remove(reader)
                self.spool.release(reader)  # type: ignore[union-attr]

    def _restart_producer(self) -> None:
        log.warning("%s: the producer lost its idempotence state; starting a new one", self._where)
        try:
            close_producer(self._producer)
        except Exception as error:  # the old producer is being thrown away either way
            log.debug("kafka: closing the old producer failed: %s", error)
        while True:
            try:
                producer = self._make_producer()
                break
            except Exception as error:
                log.warning("kafka: cannot start a new producer yet: %s", error)
                with self._cond:
                    if self._stopping:
                        return
                    self._cond.wait(float(self._retry_config.max_backoff) / 4)
        with self._cond:
            self._producer = producer
            self._reset_producer = False
            self.counters["producer_restarts"] += 1

    def _idle_locked(self) -> bool:
        spool_empty = self.spool is None or (self._reader is None and not self.spool.has_data())
        return not (self._queue or self._retry or self._sent or self._done) and spool_empty

    def _lose(self, messages: list[Message], reason: str) -> None:
        """Count ``messages`` as lost for good. Called with the lock held (or before the thread runs)."""
        events = sum(m.events for m in messages)
        self.counters["dropped_messages"] += len(messages)
        self.counters["dropped_events"] += events
        if events:
            self.lost[reason] += events

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)
