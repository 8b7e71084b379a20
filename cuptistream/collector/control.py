"""The collector's control socket: ``cuptistream trace`` asks a running collector for on-demand windows.

A second Unix SOCK_SEQPACKET socket next to the probes' one (``<socket>.control``, mode 0600), so
the probes' protocol and the collector's accounting of probes stay as they are. One request per
connection: the client sends a ``TraceRequest``, the collector answers one ``TraceReply`` when the
windows were delivered (or could not be), then hangs up. Each client gets its own thread; a client
that goes away early costs nothing but that thread's wait.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Union

import msgspec

from cuptistream.channel import sockets
from cuptistream.channel.shm import ChannelError

SUFFIX = ".control"
_MAX_MESSAGE = 1 << 20


class TraceRequest(msgspec.Struct, tag="trace", kw_only=True):
    seconds: float  # the window's length
    pids: list[int] = []  # the probes to trace: these pids and ranks (both empty: every probe)
    ranks: list[int] = []
    timeout: float = 30.0  # how long past the window to wait for its closes and its delivery
    metrics: str = ""  # --metrics: a set or metric names to measure each kernel of the window with


class ProbeResult(msgspec.Struct, kw_only=True):
    pid: int
    rank: int | None = None
    windows: int = 0  # windows the probe opened (one per activity stream)
    sources: list[str] = []  # the sources that opened them
    refused: dict[str, str] = {}  # sources that would not open one: name -> why
    start: int = 0  # CUPTI clock ns, the first open; 0 when none opened
    end: int = 0  # ... the last close
    start_unix_ns: int = 0  # the same on the Unix clock (from the probe's clock reading)
    end_unix_ns: int = 0
    records: int = 0  # activity records decoded from the windows' buffers, all delivered
    problem: str = ""  # why this probe's window was not delivered; "" when it was


class TraceReply(msgspec.Struct, tag="trace_reply", kw_only=True):
    request: int = 0  # the collector's request number (``OpenWindow.request``, ``TraceWindow.request``)
    probes: list[ProbeResult] = []
    error: str = ""  # the whole request failed: one line
    waiting_for: list[str] = []  # stages still holding the windows' events when time ran out
    dropped: dict[str, int] = {}  # events sinks counted lost while the windows were delivered


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Union[TraceRequest, TraceReply])  # noqa: UP007


def control_path(socket_path: str) -> str:
    return socket_path + SUFFIX


class ControlServer:
    """Accepts ``cuptistream trace`` clients at ``path``; ``handle`` turns a request into the reply
    (it runs on the client's thread and may take the window's length and more). Raises
    ``ChannelError`` when it cannot listen."""

    def __init__(self, path: str, handle: Callable[[TraceRequest], TraceReply]) -> None:
        self.path = path
        self._handle = handle
        self._listener: socket.socket | None = sockets.listen(path)
        threading.Thread(target=self._accept_loop, name="cuptistream-control", daemon=True).start()

    def _accept_loop(self) -> None:
        while (listener := self._listener) is not None:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            name = "cuptistream-trace"
            threading.Thread(target=self._serve, args=(client,), name=name, daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            try:
                client.settimeout(5.0)  # the request follows the connect at once
                data = client.recv(_MAX_MESSAGE)
                request = _decoder.decode(data)
                if not isinstance(request, TraceRequest):
                    raise msgspec.ValidationError("expected a trace request")
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                return
            try:
                reply = self._handle(request)
            except Exception as error:  # a bug here must not take the collector down
                reply = TraceReply(error=f"the collector failed: {type(error).__name__}: {error}")
            with contextlib.suppress(OSError):
                client.send(_encoder.encode(reply), socket.MSG_NOSIGNAL)

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            sockets.stop_listening(listener)
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def ask(path: str, request: TraceRequest, timeout: float) -> TraceReply:
    """Send ``request`` to the collector whose control socket is ``path`` and wait up to ``timeout``
    for the reply. Raises ``ChannelError`` (one line) when it cannot be reached or does not answer."""
    client = sockets.connect(path, timeout=5.0)
    with client:
        try:
            client.setblocking(True)
            client.settimeout(timeout)
            client.send(_encoder.encode(request), socket.MSG_NOSIGNAL)
            data = client.recv(_MAX_MESSAGE)
        except TimeoutError:
            raise ChannelError(f"the collector did not answer within {timeout:.0f}s") from None
        except OSError as error:
            raise ChannelError(f"the collector hung up ({error.strerror or error})") from None
    if not data:
        raise ChannelError("the collector hung up without an answer (it may be stopping)")
    try:
        reply = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ChannelError(f"the collector's answer is not understood ({error})") from None
    if not isinstance(reply, TraceReply):
        raise ChannelError("the collector's answer is not a trace reply")
    return reply
