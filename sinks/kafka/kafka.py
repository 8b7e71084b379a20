"""Kafka sink: ships each pipeline batch as one or more Kafka messages, at least once.

Pieces, one job each:

- ``kafka_config``: the YAML keys and the kafka-python settings they map to;
- ``kafka_route``: batch -> messages (topic and key templates, headers, size cuts), no re-encoding;
- ``kafka_delivery``: the producer thread that tracks every message until acked, retries with
  backoff and jitter, and bounds the bytes held in memory;
- ``kafka_spool``: the on-disk FIFO used by ``on_unavailable: spool``.

Guarantees (see ``docs/kafka.md``): at-least-once per message; order per key kept except where a
message is re-sent after kafka-python's own delivery timeout. ``write`` returns once the batch is
held (memory or spool), not once it is acked. A message that cannot be delivered is never raised
to the pipeline after the fact; it is counted in ``stats()`` (``dropped_events``, and at close
``undelivered_events``) and ``delivery_losses()`` (by reason, which the pipeline turns into
``Loss`` events and self-stats), and logged once per cause.
"""

from __future__ import annotations

import math
import socket
import ssl
import time
from typing import Any

import trio

from cuptistream.component import OutgoingBatch, Sink
from cuptistream.errors import SinkUnavailableError

from .kafka_config import KafkaSinkConfig, producer_settings
from .kafka_delivery import COUNTERS, Delivery
from .kafka_route import Router
from .kafka_spool import Spool

__all__ = ["KafkaSink", "KafkaSinkConfig"]


class KafkaSink(Sink):
    config_type = KafkaSinkConfig

    def __init__(self, config: KafkaSinkConfig) -> None:
        super().__init__(config)
        self.config: KafkaSinkConfig = config
        self._router: Router | None = None
        self._delivery: Delivery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._changed = trio.Event()

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Check the config, reach the broker and start the delivery thread.

        Raises ``SinkUnavailableError`` (one line) when no broker answers within ``connect_timeout``,
        authentication fails or a fixed topic cannot be used; ``ConfigError`` for a bad topic or key
        template, or a secret's environment variable that is not set.
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
        settings = producer_settings(config)
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
        producer = await trio.to_thread.run_sync(self._connect, settings)
        first = [producer]

        def make_producer() -> Any:
            from kafka import KafkaProducer

            return first.pop() if first else KafkaProducer(**settings)

        self._delivery = Delivery(
            make_producer,
            max_in_flight_bytes=int(config.max_in_flight_bytes),
            retry=config.retry,
            expire=config.on_unavailable == "block",
            spool=spool,
            on_change=self._poke,
        )

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
        (reason ``shutdown``).
        """
        delivery = self._delivery
        if delivery is None:
            return
        try:
            await trio.to_thread.run_sync(
                delivery.wait_idle, float(self.config.retry.max_elapsed), abandon_on_cancel=True
            )
        finally:
            with trio.CancelScope(shield=True):  # quick: stop, then spool or count the rest
                await trio.to_thread.run_sync(delivery.close, 0.0)

    def stats(self) -> dict[str, int]:
        if self._delivery is None:
            return dict.fromkeys(COUNTERS, 0)
        stats = dict(self._delivery.counters)
        stats["in_flight_bytes"] = self._delivery.held_bytes
        spool = self._delivery.spool
        stats["spool_bytes"] = spool.bytes if spool is not None else 0
        return stats

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

    def _connect(self, settings: dict[str, Any]) -> Any:
        """Create the producer and check fixed topics (blocking; runs in a worker thread)."""
        from kafka import KafkaProducer
        from kafka.errors import KafkaConfigurationError, KafkaError

        config = self.config
        where = self.where()
        servers = ",".join(config.servers)
        timeout = config.connect_timeout
        if not _any_reachable(config.servers, timeout):
            raise SinkUnavailableError(
                f"{where}: no broker reachable at {servers} within {timeout:g}s; check bootstrap_servers"
            )
        try:
            producer = KafkaProducer(**settings)
        except KafkaConfigurationError as error:
            raise SinkUnavailableError(f"{where}: kafka-python rejects these settings: {error}") from None
        except KafkaError as error:
            tls = config.security_protocol.endswith("SSL")
            problem = _tls_problem(config.servers, settings) if tls else ""
            if problem:
                raise SinkUnavailableError(
                    f"{where}: TLS handshake with the broker at {servers} failed: {problem}; "
                    "check ssl_cafile (the CA that signs the brokers' certificates) and ssl_check_hostname"
                ) from None
            if config.sasl_mechanism:
                env = config.sasl_password_env
                secret = f" and the password in ${env}" if env else ""
                who = f"{config.sasl_mechanism} login as {config.sasl_username!r}"
                raise SinkUnavailableError(
                    f"{where}: SASL {who} at {servers} failed ({type(error).__name__}); "
                    f"check sasl_mechanism, sasl_username{secret}"
                ) from None
            raise SinkUnavailableError(
                f"{where}: the broker at {servers} accepted a connection but the Kafka handshake failed "
                f"within {timeout:g}s ({type(error).__name__}); check security_protocol (SASL or SSL needed?)"
            ) from None
        try:
            for topic in self._router.fixed_topics() if self._router else []:
                if not producer.partitions_for(topic):
                    raise SinkUnavailableError(f"{where}.topic: topic {topic!r} has no partitions")
        except KafkaError as error:
            producer.close(timeout=0)
            raise SinkUnavailableError(
                f"{where}.topic: cannot use the topic at {servers}: {type(error).__name__}: {error}; "
                "check that it exists (or auto-creation is on) and that this client may write to it"
            ) from None
        return producer


def _tls_problem(servers: list[str], settings: dict[str, Any], timeout: float = 1.0) -> str:
    """Why a TLS handshake with the first reachable server fails (e.g. "certificate verify failed:
    unable to get local issuer certificate"), or "" if it succeeds or none answers: after a failed
    connect only, so the error names the certificate instead of a timeout."""
    try:
        context = ssl.create_default_context(cafile=settings.get("ssl_cafile"))
        context.check_hostname = bool(settings.get("ssl_check_hostname", True))
        if settings.get("ssl_certfile"):
            context.load_cert_chain(
                settings["ssl_certfile"], settings.get("ssl_keyfile"), settings.get("ssl_password")
            )
    except (OSError, ssl.SSLError) as error:
        return f"cannot load a certificate or key ({error})"
    for server in servers:
        host, _, port = server.rpartition(":")
        host = host.strip("[]") or "localhost"
        try:
            with socket.create_connection((host, int(port or 9092)), timeout) as sock:
                sock.settimeout(timeout)
                context.wrap_socket(sock, server_hostname=host).close()
            return ""
        except ssl.SSLCertVerificationError as error:
            return f"certificate verify failed: {error.verify_message}"
        except ssl.SSLError as error:
            return str(error.reason or error)
        except (OSError, ValueError):
            continue
    return ""


def _any_reachable(servers: list[str], timeout: float) -> bool:
    """Whether a TCP connection to any bootstrap server opens within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for server in servers:
            host, _, port = server.rpartition(":")
            try:
                socket.create_connection((host.strip("[]") or "localhost", int(port or 9092)), 1.0).close()
                return True
            except (OSError, ValueError):
                continue
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
