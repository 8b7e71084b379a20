"""Unix SOCK_SEQPACKET sockets for the channel: message boundaries kept, fds passed alongside.

``connect`` never blocks the probe for long (a short timeout); after it, the probe's socket is
non-blocking so a CUPTI thread posting a ``Ready`` returns at once even if the collector stalls.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import tempfile
from pathlib import Path

from cuptistream.channel import messages
from cuptistream.channel.shm import ChannelError

ENV_COLLECTOR = "CUPTISTREAM_COLLECTOR"  # the collector's socket path, for probes to find it


def listen(path: str | Path, mode: int = 0o600) -> socket.socket:
    """A listening socket at ``path`` (replacing a stale one), ``mode`` 0600 unless a node collector
    serves other users' processes."""
    path = str(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if os.path.exists(path):
            os.unlink(path)
        server.bind(path)
        os.chmod(path, mode)
        server.listen(64)
    except OSError as error:
        server.close()
        raise ChannelError(
            f"cannot listen on {path} ({error.strerror}); choose a writable --socket path"
        ) from None
    return server


def stop_listening(listener: socket.socket) -> None:
    """Close a listening socket such that its ``accept`` loop ends now. ``close`` alone does not:
    Linux keeps the socket open under a thread blocked in ``accept``, which goes on accepting (a
    probe reconnecting to a collector that was shutting down got in, and what it handed over was
    counted after the shutdown report). ``shutdown`` wakes that thread (EINVAL)."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        listener.close()


def private_socket_path() -> str:
    """A socket path in a fresh 0700 temporary directory."""
    return os.path.join(tempfile.mkdtemp(prefix="cuptistream-"), "collector.sock")


def connect(path: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as error:
        sock.close()
        reason = error.strerror or type(error).__name__
        raise ChannelError(f"cannot reach the collector at {path} ({reason})") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    sock.setblocking(False)
    return sock


def peer_pid(sock: socket.socket) -> int:
    """The pid at the other end (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def send(sock: socket.socket, message: messages.Message, fds: list[int] | None = None) -> None:
    """Send one message. Raises OSError (BlockingIOError when the socket buffer is full)."""
    data = messages.encode(message)
    if fds:
        socket.send_fds(sock, [data], fds, socket.MSG_NOSIGNAL)
    else:
        sock.send(data, socket.MSG_NOSIGNAL)  # EPIPE as an error, never SIGPIPE


def receive(sock: socket.socket) -> tuple[messages.AnyMessage, list[int]] | None:
    """The next message and its fds (blocking); None at end of stream."""
    data, fds, _flags, _addr = socket.recv_fds(sock, messages.MAX_MESSAGE, 16)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return messages.decode(data), list(fds)


def ready_for(sock: socket.socket, seconds: float, *, write: bool = False) -> bool:
    """Whether ``sock`` can be read (``write``: written) within ``seconds``; a hang-up or an error
    counts as ready (the next call says which). ``poll``, not ``select``: ``select`` raises
    ValueError for a descriptor past 1023, which a node collector's sockets or a large job's can be."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(max(0.0, seconds) * 1000))
