"""Kafka sink: ships each pipeline batch as one or more Kafka messages, at least once.

Pieces, one job each:

- ``kafka_config``: the YAML keys and the kafka-python settings they map to;
- ``kafka_route``: batch -> messages (topic and key templates, headers, size cuts), no re-encoding;
- ``kafka_delivery``: the producer thread that tracks every message until acked, retries with
  backoff and jitter, and bounds the bytes held in memory;
- ``kafka_spool``: the on-disk FIFO used by ``on_unavailable: spool``.

- ``kafka_handshake``: our own bounded check of a broker (TCP, TLS, SASL) before kafka-python
  gets it, which tells a refusal (permanent) from an outage (transient).

Coming up (``connect``) happens in the background after the program started: until then ``write``
holds batches in memory (``max_in_flight_bytes``) and then blocks or spools (``on_unavailable``), as
for a broker that went away. Every wait of ``connect`` ends by ``connect_timeout``: our check is
bounded step by step, and the kafka-python calls that are not (``KafkaProducer()``'s bootstrap,
topic metadata) run in daemon threads that are abandoned at the deadline
(``cuptistream.delivery.abandonable``). A refused login, an untrusted certificate or a topic the client may
not write stop the sink (``PermanentSinkError``): what it held is counted lost with that reason.

Guarantees (see ``docs/kafka.md``): at-least-once per message; order per key kept except where a
message is re-sent after kafka-python's own delivery timeout. ``write`` returns once the batch is
held (memory or spool), not once it is acked. A message that cannot be delivered is never raised
to the pipeline after the fact; it is counted in ``stats()`` (``dropped_events``, and at close
``undelivered_events``) and ``delivery_losses()`` (by reason, which the pipeline turns into
``Loss`` events and self-stats), and logged once per cause.
"""

from __future__ import annotations

import math
import ssl
import threading
import time
from typing import Any

import trio

from cuptistream.delivery.abandonable import call_by
from cuptistream.errors import PermanentSinkError, SinkUnavailableError
from cuptistream.plugin import OutgoingBatch, Sink

from .config import KafkaSinkConfig, producer_settings
from .delivery import COUNTERS, Delivery, calm_sender, close_producer
from .handshake import Sasl, check_brokers
from .route import Router
from .spool import Spool

__all__ = ["KafkaSink", "KafkaSinkConfig"]

_OWN_MARGIN_S = 0.2  # connect()'s own deadline comes this long before connect_timeout
_CONNECT_THREAD = "cuptistream-kafka-connect"  # KafkaProducer() in a thread abandoned at the deadline


class KafkaSink(Sink):
    config_type = KafkaSinkConfig
    retries_itself = True  # kafka-python retries; unacked data is spooled or counted lost
    writes_while_connecting = True  # held in memory, then blocked or spooled, until the broker is up

    def __init__(self, config: KafkaSinkConfig) -> None:
        super().__init__(config)
        self.config: KafkaSinkConfig = config
        self._router: Router | None = None
        self._delivery: Delivery | None = None
        self._settings: dict[str, Any] = {}
        self._tls: ssl.SSLContext | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._changed = trio.Event()
        self._refused = ""  # the reason of a PermanentSinkError from connect(): nothing more is sent

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Check the config and prepare, without the network (that is ``connect``'s).

        Raises ``ConfigError`` for a bad topic or key template or a secret's environment variable
        that is not set; ``SinkUnavailableError`` for a compression codec that is not installed, a
        certificate or key file that cannot be loaded, or an unusable spool directory.
        """
        config = self.config
        self._router = Router(
            config.name or "kafka",
            config.topic,
            config.key,
            config.value_format,
            int(config.max_message_bytes),
            config.headers,
        )
        self._settings = settings = producer_settings(config)
        if config.security_protocol.endswith("SSL"):
            self._tls = _tls_context(settings, self.where())
        spool = None
        if config.on_unavailable == "spool":
            spool = Spool(
                config.spool_directory,
                int(config.spool_max_bytes),
                int(config.spool_segment_bytes),
                config.spool_fsync,
                config.name,
            )
            await trio.to_thread.run_sync(spool.open)
        self._token = trio.lowlevel.current_trio_token()

        def make_producer() -> Any:  # after a broken producer, on the delivery thread
            deadline = time.monotonic() + float(config.connect_timeout)
            return call_by(self._new_producer, deadline, name=_CONNECT_THREAD, late=_close_quietly)

        self._delivery = Delivery(
            make_producer,
            max_in_flight_bytes=int(config.max_in_flight_bytes),
            retry=config.retry,
            expire=config.on_unavailable == "block",
            spool=spool,
            on_change=self._poke,
            where=self.where(),
        )

    async def connect(self) -> None:
        """Reach a broker, make the producer and check fixed topics, all by ``connect_timeout``;
        then delivery begins.

        Raises ``SinkUnavailableError`` (transient: no broker reachable, no answer, a timeout at any
        step) or ``PermanentSinkError`` (a certificate that does not verify, a SASL mechanism or login
        refused, a topic this client may not write), each one line naming the fix. Cancelling it
        abandons the worker thread, which ends by the same deadline and closes what it made.
        """
        assert self._delivery is not None, "open() first"
        # Our own waits end a little before the pipeline cancels this at connect_timeout, so the
        # failure names its step (TCP connect, TLS handshake, SASL exchange) rather than a timeout.
        timeout = float(self.config.connect_timeout)
        deadline = time.monotonic() + max(timeout / 2, timeout - _OWN_MARGIN_S)
        abandoned = threading.Event()
        try:
            producer = await trio.to_thread.run_sync(
                self._connect, deadline, abandoned, abandon_on_cancel=True
            )
        except PermanentSinkError as error:
            self._refused = error.reason
            raise
        except BaseException:
            abandoned.set()
            raise
        self._delivery.start(producer)

    async def write(self, batch: OutgoingBatch) -> None:
        """Hold the batch for delivery. Waits while ``max_in_flight_bytes`` are held: in ``block``
        mode until there is room (backpressure), in ``spool`` mode up to ``spool_after``, then
        writes the batch to the spool instead."""
        assert self._router is not None and self._delivery is not None, "open() first"
        delivery = self._delivery
        messages = await trio.to_thread.run_sync(self._router.route, batch.data)
        spool = self.config.on_unavailable == "spool"
        with trio.move_on_after(self.config.spool_after if spool else math.inf):
            while True:
                changed = self._changed
                state = delivery.try_enqueue(messages)
                if state == "queued":
                    return
                if state == "spool":
                    break
                await changed.wait()
        await trio.to_thread.run_sync(delivery.spool_messages, messages)

    async def close(self) -> None:
        """Deliver what is held: for up to ``retry.max_elapsed``, or until cancelled (the pipeline's
        shutdown deadline). Whatever is still unacked then goes to the spool (spool mode, replayed by
        the next run) or is counted in ``undelivered_events``, ``dropped_events`` and ``delivery_losses()``
        (reason ``shutdown``; a refused sink: the refusal's reason, nothing spooled). The final step
        waits at most about 0.1 s for a delivery thread stuck in kafka-python.
        """
        delivery = self._delivery
        if delivery is None:
            return
        try:
            if not self._refused:
                await trio.to_thread.run_sync(
                    delivery.wait_idle, float(self.config.retry.max_elapsed), abandon_on_cancel=True
                )
        finally:
            with trio.CancelScope(shield=True):  # quick: stop, then spool or count the rest
                await trio.to_thread.run_sync(delivery.close, 0.0, self._refused)

    def stats(self) -> dict[str, int]:
        if self._delivery is None:
            return dict.fromkeys(COUNTERS, 0)
        stats = dict(self._delivery.counters)
        stats["in_flight_bytes"] = self._delivery.held_bytes
        spool = self._delivery.spool
        stats["spool_bytes"] = spool.bytes if spool is not None else 0
        return stats

    def acknowledged_events(self) -> int:
        """This run's events the broker acked (replays of an earlier run's spool not included)."""
        return self._delivery.acked_this_run if self._delivery is not None else 0

    def spooled_events(self) -> int:
        """This run's events waiting in the spool (``on_unavailable: spool``), not acked by a broker."""
        return self._delivery.in_spool if self._delivery is not None else 0

    def delivery_losses(self) -> dict[str, int]:
        """Events accepted by ``write`` and then given up, by reason: ``rejected`` (an error no retry
        fixes), ``retries_exhausted`` (block mode: unacked ``retry.max_elapsed`` after the first send),
        ``spool_full``, ``spool_error``, ``shutdown`` (unacked when ``close`` gave up)."""
        return dict(self._delivery.lost) if self._delivery is not None else {}

    # --- helpers -----------------------------------------------------------------------------

    def _poke(self) -> None:
        """Called from the delivery thread when room may have freed up; wakes a waiting write."""
        token = self._token
        if token is None:
            return
        try:
            token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            pass

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _new_producer(self) -> Any:
        from kafka import KafkaProducer

        producer = KafkaProducer(**self._settings)
        calm_sender(producer)  # False where kafka-python's private names moved (a test says so)
        return producer

    def _connect(self, deadline: float, abandoned: threading.Event) -> Any:
        """``connect``'s blocking part (a worker thread): check, make the producer, check topics."""
        from kafka.errors import AuthorizationError, KafkaConfigurationError, KafkaError

        config = self.config
        where = self.where()
        servers = ",".join(config.servers)
        sasl = None
        if config.sasl_mechanism:
            env = config.sasl_password_env
            secret = f" and the password in ${env}" if env else ""
            sasl = Sasl(
                config.sasl_mechanism, config.sasl_username, self._settings.get("sasl_plain_password", ""),
                f"check sasl_mechanism, sasl_username{secret}",
            )  # fmt: skip
        down = check_brokers(config.servers, deadline, self._tls, sasl, where)
        if down is not None:
            raise SinkUnavailableError(
                f"{where}: no broker reachable at {servers}: {down.problem}; check bootstrap_servers, "
                "security_protocol and that a broker is up"
            )
        try:
            producer = call_by(self._new_producer, deadline, name=_CONNECT_THREAD, late=_close_quietly)
        except TimeoutError:
            raise SinkUnavailableError(
                f"{where}: {servers} took the connection but kafka-python did not finish connecting within "
                f"connect_timeout ({config.connect_timeout:g}s); check that it is a Kafka broker speaking "
                f"{config.security_protocol}"
            ) from None
        except KafkaConfigurationError as error:
            message = f"{where}: kafka-python rejects these settings: {error}"
            raise PermanentSinkError(message, "bad_settings") from None
        except KafkaError as error:
            raise SinkUnavailableError(
                f"{where}: the broker at {servers} passed our check but kafka-python could not connect "
                f"({type(error).__name__}: {error})"
            ) from None
        try:
            topics = self._router.fixed_topics() if self._router else []
            found = call_by(
                lambda: [(t, producer.partitions_for(t)) for t in topics], deadline,
                name="cuptistream-kafka-metadata", late=None,
            )  # fmt: skip
            for topic, partitions in found:
                if not partitions:
                    raise SinkUnavailableError(f"{where}.topic: topic {topic!r} has no partitions yet")
        except AuthorizationError as error:
            _close_quietly(producer)
            raise PermanentSinkError(
                f"{where}.topic: the broker at {servers} does not let this client write to the topic "
                f"({type(error).__name__}); grant it or choose another topic",
                "topic_not_allowed",
            ) from None
        except (TimeoutError, KafkaError) as error:
            _close_quietly(producer)
            raise SinkUnavailableError(
                f"{where}.topic: no topic metadata from {servers} within connect_timeout "
                f"({type(error).__name__}); check that the topic exists (or auto-creation is on)"
            ) from None
        except SinkUnavailableError:
            _close_quietly(producer)
            raise
        if abandoned.is_set():  # connect() stopped waiting: nobody will use this producer
            _close_quietly(producer)
        return producer


def _close_quietly(producer: Any) -> None:
    try:
        close_producer(producer)
    except Exception:  # a producer nobody uses; closing it is a courtesy
        pass


def _tls_context(settings: dict[str, Any], where: str) -> ssl.SSLContext:
    """The TLS context ``connect``'s check uses, built as kafka-python builds its own. Raises
    ``SinkUnavailableError`` for a CA, certificate or key file that cannot be loaded."""
    try:
        context = ssl.create_default_context(cafile=settings.get("ssl_cafile"))
        context.check_hostname = bool(settings.get("ssl_check_hostname", True))
        if settings.get("ssl_certfile"):
            context.load_cert_chain(
                settings["ssl_certfile"], settings.get("ssl_keyfile"), settings.get("ssl_password")
            )
    except (OSError, ssl.SSLError) as error:
        raise SinkUnavailableError(
            f"{where}: cannot load a certificate or key ({error}); "
            "check ssl_cafile, ssl_certfile and ssl_keyfile"
        ) from None
    return context
