"""The probe's ear: what the collector sends it (``OpenWindow``, ``WindowRecords``), read on the
probe's own socket by one thread and handed to the probe's handlers.

A thread, not the emitter's once-a-second housekeeping: a window asked for by ``cuptistream trace``
then opens at once rather than up to a second later, and a thread asleep in ``poll`` costs the
program nothing (no GIL held, no wake-up while the collector is silent but one every ``_RECHECK_S``
to follow a reconnect). Nobody waits on it: the socket stays non-blocking for CUPTI's threads and
the program, and the handlers run here. A malformed or unknown message is counted and skipped.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from cuptistream.channel import messages
from cuptistream.probe.link import ProbeLink

_RECHECK_S = 1.0  # how long a poll sleeps before it looks whether the link changed sockets

Handler = Callable[[Any], None]


class ControlReader:
    """Reads collector -> probe messages until ``stop``. ``handlers`` maps a message type to the
    function that takes it; they run on the reader thread and must return quickly. A handler that
    raises is counted (``failures``), never fatal."""

    def __init__(self, link: ProbeLink, handlers: dict[type[messages.Message], Handler]) -> None:
        self.link = link
        self.handlers = handlers
        self.received = 0
        self.skipped = 0  # undecodable, or a type without a handler
        self.failures = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cuptistream-probe-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (the thread ends at its next wake-up; nothing waits for it)."""
        self._stopping.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            sock = self.link.current_socket
            if sock is None:  # no collector now: housekeeping reconnects, and we follow
                self._stopping.wait(_RECHECK_S)
                continue
            data = self._receive(sock)
            if data:
                self._dispatch(data)

    def _receive(self, sock: socket.socket) -> bytes | None:
        """The next message on ``sock``, or None (nothing within ``_RECHECK_S``, or the socket ended)."""
        try:
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            if not poller.poll(_RECHECK_S * 1000):
                return None
            data = sock.recv(messages.MAX_MESSAGE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except (OSError, ValueError):  # closed under us (a reconnect, the probe stopping)
            self.link.alive()
            self._stopping.wait(0.05)
            return None
        if not data:  # end of stream: the collector is gone; ``alive`` marks the link disconnected
            self.link.alive()
            return None
        return data

    def _dispatch(self, data: bytes) -> None:
        try:
            message = messages.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.skipped += 1
            return
        handler = self.handlers.get(type(message))
        if handler is None:
            self.skipped += 1
            return
        self.received += 1
        try:
            handler(message)
        except Exception:
            self.failures += 1
