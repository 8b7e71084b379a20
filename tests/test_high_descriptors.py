"""Sockets past descriptor 1023: a node collector holds a socket, a pool and reply slots per probe
connection, and a large training job holds many descriptors of its own. ``select`` raises
ValueError for those; the channel waits with ``poll`` (``sockets.ready_for``). Real socket pairs,
moved to a descriptor past 1023."""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import cuptistream
from cuptistream.channel import messages, sockets
from cuptistream.collector.collector import Collector
from cuptistream.collector.connection import ProbeConnection
from cuptistream.probe.link import await_hangup

HIGH = 1500


@pytest.fixture
def high_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A SEQPACKET pair whose first end is descriptor ``HIGH``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH:
        pytest.skip(f"the descriptor limit ({hard}) stops short of {HIGH}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 1), hard))
    low, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    os.dup2(low.fileno(), HIGH)
    low.close()
    high = socket.socket(fileno=HIGH)
    try:
        yield high, peer
    finally:
        high.close()
        peer.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ready_for_waits_on_a_descriptor_past_1023(high_pair: tuple[socket.socket, socket.socket]) -> None:
    high, peer = high_pair
    assert high.fileno() >= 1024
    assert not sockets.ready_for(high, 0)
    assert sockets.ready_for(high, 0, write=True)
    peer.send(b"x")
    assert sockets.ready_for(high, 1.0)


def test_the_collector_answers_a_probe_on_a_descriptor_past_1023(
    high_pair: tuple[socket.socket, socket.socket],
) -> None:
    collector_end, probe = high_pair
    host = Collector(cuptistream.load_config({"sources": [], "sinks": [{"type": "null"}]}))
    connection = ProbeConnection(collector_end, host)
    connection._tell_probe(messages.WindowRecords(stream=0, window=3))
    assert connection.replies_dropped == 0
    received = sockets.receive(probe)
    assert received is not None and received[0] == messages.WindowRecords(stream=0, window=3)


def test_await_hangup_waits_for_the_collector_on_a_descriptor_past_1023(
    high_pair: tuple[socket.socket, socket.socket],
) -> None:
    """With ``select`` it returned at once (ValueError), closing with a reply unread: the reset
    that loses the messages still queued for the collector."""
    probe, collector_end = high_pair

    def collector() -> None:
        time.sleep(0.3)
        sockets.send(collector_end, messages.WindowRecords(stream=0, window=1))
        collector_end.shutdown(socket.SHUT_WR)

    answering = threading.Thread(target=collector)
    answering.start()
    began = time.monotonic()
    await_hangup(probe, 5.0)
    waited = time.monotonic() - began
    answering.join()
    assert 0.25 <= waited < 4.0
    assert not sockets.ready_for(probe, 0) or probe.recv(16) == b""  # nothing unread is left
