"""The probe's hang-up: after Goodbye the collector shuts its side, and the probe closes only then
(``probe.link.await_hangup``), so it never closes with a reply unread. Closed with one unread, a
Unix SEQPACKET socket resets, and its peer's next read fails before the messages still queued for it
are read (with many programs exiting at once, some connections end "reset by peer"). Real
socket pairs, a real collector's probe connection (the collector itself not started)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import cuptistream
from cuptistream.channel import messages, sockets
from cuptistream.collector.collector import Collector
from cuptistream.collector.connection import ProbeConnection
from cuptistream.probe.link import await_hangup


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _collector() -> Collector:
    config = cuptistream.load_config({"sources": [], "sinks": [{"type": "null"}]})
    return Collector(config)


def test_a_socket_closed_with_a_message_unread_loses_its_peers_queued_ones() -> None:
    """Why the probe waits: the premise, on this kernel."""
    probe, collector = _pair()
    sockets.send(probe, messages.Goodbye())
    collector.send(b"a reply the probe never reads")
    probe.close()
    with pytest.raises(ConnectionResetError):
        sockets.receive(collector)  # the Goodbye queued before the reset is not read


def test_the_collector_reads_goodbye_shuts_its_side_and_reports_no_error() -> None:
    probe, theirs = _pair()
    host = _collector()
    connection = ProbeConnection(theirs, host)
    runner = threading.Thread(target=connection.run)
    runner.start()
    reply = messages.WindowRecords(stream=0, window=1)
    connection._tell_probe(reply)  # a window's count, sent before the probe says goodbye
    sockets.send(probe, messages.Goodbye())
    began = time.monotonic()
    await_hangup(probe, 5.0)
    waited = time.monotonic() - began
    probe.close()
    runner.join(5)
    assert not runner.is_alive()
    assert connection.said_goodbye
    assert waited < 2.0, "the collector shut its side as soon as it read Goodbye"
    assert host.pipeline.intake.errors_reported == 0


def test_await_hangup_drops_what_arrives_and_is_bounded() -> None:
    probe, collector = _pair()
    collector.send(b"x")
    collector.send(b"y")
    began = time.monotonic()
    await_hangup(probe, 0.3)  # the collector never hangs up: it gives up after 0.3 s
    assert 0.3 <= time.monotonic() - began < 2.0
    probe.setblocking(False)
    with pytest.raises(BlockingIOError):
        probe.recv(16)  # both were read and dropped
    collector.shutdown(socket.SHUT_WR)
    began = time.monotonic()
    await_hangup(probe, 5.0)
    assert time.monotonic() - began < 1.0, "a hang-up ends the wait at once"


def test_await_hangup_returns_when_another_thread_closed_the_socket() -> None:
    """The probe's control thread reads the same socket, sees the collector's shutdown and closes
    it: the wait ends quietly (it ran at exit, where nothing may raise)."""
    probe, _collector_end = _pair()
    probe.close()
    await_hangup(probe, 5.0)


def test_a_probe_hangs_up_by_its_shutdown_deadline_when_the_collector_cannot_read() -> None:
    """A collector whose intake is full under ``block`` reads nothing: the probe's Goodbye and its
    wait for the hang-up keep to the shutdown deadline (``ProbeLink.close(until=...)``), so the
    program is not held past it (before: up to 1 s of hang-up wait after it, besides the Goodbye)."""
    from cuptistream.events import Resource
    from cuptistream.probe.link import ProbeLink

    probe, collector = _pair()
    link = ProbeLink("unused", "s", Resource(host="h", pid=1, process_name="p", command_line=[]))
    link._sock = probe  # connected; the collector's end is never read
    began = time.monotonic()
    link.close(until=began + 0.2)
    assert time.monotonic() - began < 0.8, "the probe waited past its deadline"
    received = sockets.receive(collector)  # the Goodbye was still sent
    assert received is not None and isinstance(received[0], messages.Goodbye)
    collector.close()
