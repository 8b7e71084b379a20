"""kafka-python's sender thread and a broker that stopped answering or is gone (``delivery.calm_sender``).

A real tansu broker, stopped while the producer has data for it:

- SIGSTOPped, its kernel still accepts connections, so the producer's connection is left set up
  but never ready. kafka-python 3.0.12's sender then polled with a zero timeout in a loop (tens of
  thousands of polls a second, a core of CPU).
- Killed, its connections are refused and the client backs off between attempts; the sender read
  the backoff, given in seconds, as milliseconds and polled that often (0.07 cores against 0.02).

The test counts the sender's polls, not time: with ``calm_sender`` it waits on the sockets.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture

from cuptistream.sinks.kafka.delivery import calm_sender, close_producer

kafka = pytest.importorskip("kafka")


def _producer(broker: TansuBroker) -> Any:
    return kafka.KafkaProducer(
        bootstrap_servers=broker.bootstrap, acks=-1, enable_idempotence=True, linger_ms=5,
        request_timeout_ms=1000, delivery_timeout_ms=30000, retry_backoff_ms=200,
    )  # fmt: skip


def _polls_in_outage(broker: TansuBroker, how: signal.Signals) -> tuple[int, int]:
    """The calmed sender's polls before the outage's last 1.5 s (so the counting is seen to work),
    and over those 1.5 s, with data waiting for a broker stopped by ``how`` (SIGSTOP or SIGKILL)
    2 s before."""
    producer = _producer(broker)
    try:
        assert calm_sender(producer)
        client = producer._sender._client
        polls = 0
        poll = client.poll

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal polls
            polls += 1
            return poll(*args, **kwargs)

        client.poll = counted
        for _ in range(100):
            producer.send("gpu", b"x" * 1000)
        producer.flush(10)
        assert broker.process is not None
        os.kill(broker.process.pid, how)
        try:
            for _ in range(300):  # more than its in-flight requests take: the rest waits
                producer.send("gpu", b"y" * 10_000)
            time.sleep(2.0)
            before = polls
            time.sleep(1.5)
            return before, polls - before
        finally:
            broker.resume()  # a killed broker is left as it is
    finally:
        closing = threading.Thread(target=close_producer, args=(producer,), daemon=True)
        closing.start()
        closing.join(5)


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["frozen", "down"])
def test_the_sender_waits_on_a_broker_that_is_frozen_or_down(
    kafka_broker: TansuBroker, how: signal.Signals
) -> None:
    before, polls = _polls_in_outage(kafka_broker, how)
    # The same 1.5 s on the 2-CPU test machine held 30,000-70,000 polls frozen without calm_sender,
    # and 1,015 down while it passed the backoff on in seconds; now 0-19, one per wait or backoff
    # (down, the reconnect backoff grows past 1.5 s within a few seconds: no poll at all is calm).
    assert before > 0 and polls < 100, (before, polls)


def test_calm_sender_changes_nothing_without_kafka_pythons_private_names() -> None:
    class Elsewhere:
        pass

    assert calm_sender(Elsewhere()) is False
