"""The probe's end of the channel: the socket, the shared-memory pools, and what could not be sent.

Posting never waits: a message that cannot be sent at once is dropped and counted (or, for loss
counts, kept and sent later). When the collector goes away, the probe keeps running: its pools fill,
CUPTI drops records and counts them, and ``reconnect`` hands the pools (with every buffer still
unread in them) and the counts to a collector that comes back at the same address.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

from cuptistream.channel import messages, sockets
from cuptistream.channel.shm import ChannelError, SlotPool
from cuptistream.cupti.libc import libc
from cuptistream.events import ClockSync, DeviceInfo, Resource

_PR_SET_PTRACER = 0x59616D61
_CONTROL_WAIT_S = 2.0  # pool and stream announcements: rare, and the collector needs them
_HANGUP_WAIT_S = 1.0  # after Goodbye, how long to wait for the collector to have read everything
_GOODBYE_WAIT_S = 2.0  # room in the channel for the Goodbye
_LAST_WORD_S = 0.1  # each of those two, at least, with the shutdown deadline spent


def allow_reading_by(pid: int) -> None:
    """Let ``pid`` read this process's memory (Yama ptrace scope 1): the collector reads the kernel
    names that activity records point to. A no-op where Yama is absent."""
    with contextlib.suppress(Exception):
        libc().prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)


class ProbeLink:
    def __init__(
        self, address: str, session_id: str, resource: Resource, devices: list[DeviceInfo] | None = None
    ) -> None:
        self.address = address
        self.session_id = session_id
        self.resource = resource
        self.devices = devices or []
        self.pools: list[SlotPool] = []
        self.streams: list[messages.OpenStream] = []
        # What a new collector must hear after the streams (standing requests), asked at each connect.
        self.standing: list[Callable[[], list[messages.Message]]] = []
        self.collector_pid = 0
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._losses: Counter[tuple[str, str, str]] = Counter()  # not yet sent
        self.messages_dropped = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def current_socket(self) -> socket.socket | None:
        """The socket to the collector now (None: none); the control reader reads from it."""
        return self._sock

    def connect(self, clock: ClockSync | None = None, timeout: float = 5.0) -> None:
        """Say hello, with every pool's fd and every stream. Raises ``ChannelError``."""
        sock = sockets.connect(self.address, timeout)
        with self._lock:
            specs = [
                messages.PoolSpec(pool=i, slot_size=p.slot_size, slots=p.slots)
                for i, p in enumerate(self.pools)
            ]
            hello = messages.Hello(
                protocol=messages.PROTOCOL, session_id=self.session_id, resource=self.resource,
                pools=specs, clock=clock, devices=self.devices,
            )  # fmt: skip
            try:
                sock.setblocking(True)
                sockets.send(sock, hello, [p.fd for p in self.pools])
                for stream in self.streams:
                    sockets.send(sock, stream)
                for standing in self.standing:
                    for message in standing():
                        sockets.send(sock, message)
                sock.setblocking(False)
            except OSError as error:
                sock.close()
                raise ChannelError(f"the collector at {self.address} hung up ({error.strerror})") from None
            self._sock = sock
            self.collector_pid = sockets.peer_pid(sock)
        allow_reading_by(self.collector_pid)
        self.send_losses()

    def reconnect(self, clock: ClockSync | None = None) -> bool:
        if self._sock is not None:
            return True
        try:
            self.connect(clock, timeout=0.5)
        except ChannelError:
            return False
        return True

    def add_pool(self, name: str, slot_size: int, slots: int) -> tuple[int, SlotPool]:
        pool = SlotPool.create(name, slot_size, slots)
        with self._lock:
            self.pools.append(pool)
            index = len(self.pools) - 1
        spec = messages.PoolSpec(pool=index, slot_size=pool.slot_size, slots=slots)
        self.post(messages.OpenPool(spec=spec), fds=[pool.fd], wait=_CONTROL_WAIT_S)
        return index, pool

    def add_stream(self, stream: messages.OpenStream) -> int:
        with self._lock:
            stream.stream = len(self.streams)
            self.streams.append(stream)
        self.post(stream, wait=_CONTROL_WAIT_S)
        return stream.stream

    def post(self, message: messages.Message, fds: list[int] | None = None, wait: float = 0.0) -> bool:
        """Send, waiting at most ``wait`` seconds for room (0: never wait, as on CUPTI's threads).
        False: not sent (no collector, or its socket buffer stayed full)."""
        sock = self._sock
        if sock is None:
            return False
        deadline = time.monotonic() + wait
        while True:
            try:
                sockets.send(sock, message, fds)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.001)
            except OSError:
                self._disconnected(sock)
                return False

    def alive(self) -> bool:
        """Whether the collector is still there. ``connected`` only learns of a dead collector when
        a send fails; a thread that waits for the collector to free slots sends nothing, so it asks
        the socket itself (a non-blocking peek: end of file means the collector is gone)."""
        sock = self._sock
        if sock is None:
            return False
        try:
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                self._disconnected(sock)
                return False
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._disconnected(sock)
            return False
        return True

    def count_lost(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        if count > 0:
            with self._lock:
                self._losses[stage, reason, unit] += count

    def send_losses(self) -> None:
        with self._lock:
            pending, self._losses = self._losses, Counter()
        for (stage, reason, unit), count in pending.items():
            if not self.post(messages.LossReport(stage=stage, reason=reason, count=count, unit=unit)):
                self.count_lost(stage, reason, count, unit)

    def unsent_losses(self) -> dict[str, int]:
        with self._lock:
            return {f"{stage}/{reason}": n for (stage, reason, _), n in self._losses.items() if n}

    def _disconnected(self, sock: socket.socket) -> None:
        with self._lock:
            if self._sock is sock:
                self._sock = None
        with contextlib.suppress(OSError):
            sock.close()

    def close(self, stats: dict[str, int] | None = None, until: float | None = None) -> None:
        """Say goodbye and hang up; the pools stay mapped in the collector until it has drained them.
        ``until`` (a ``time.monotonic()``): the shutdown deadline's, which the Goodbye and the wait for
        the collector's hang-up keep to (``_LAST_WORD_S`` at least); a collector that cannot read
        now (its intake full under ``block``) would otherwise hold the program past it."""

        def within(seconds: float) -> float:
            return seconds if until is None else min(seconds, max(_LAST_WORD_S, until - time.monotonic()))

        self.send_losses()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setblocking(True)
                sock.settimeout(within(_GOODBYE_WAIT_S))
                sockets.send(sock, messages.Goodbye(stats=stats or {}))
                await_hangup(sock, within(_HANGUP_WAIT_S))
            self._disconnected(sock)
        for pool in self.pools:
            pool.close()


def await_hangup(sock: socket.socket, seconds: float) -> None:
    """Read and drop what the collector still sends until it shuts its side (it does on Goodbye,
    once it has read everything before it), for ``seconds`` at most. A socket closed with messages
    unread resets the connection, and the collector's next read fails before the messages still
    queued for it (Goodbye among them) are read: many programs exiting at once would leave some
    connections "reset by peer". The collector only answers the probe (a window's record count),
    so nothing arrives after its shutdown."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not sockets.ready_for(sock, left):
                return
            if not sock.recv(messages.MAX_MESSAGE):
                return  # the collector shut its side
    except (OSError, ValueError):  # ValueError: the control thread saw the hang-up and closed it
        return
