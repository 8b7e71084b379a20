"""What a probe connection and its decode worker say to each other (``collector.workers``).

One ``SOCK_SEQPACKET`` socket pair per probe connection: the connection sends one request and
waits for its reply, so a probe's buffers are decoded, and their events come back, in order. File
descriptors (a slot pool's memfd, the program's ``/proc/PID/mem``) travel with their request
(SCM_RIGHTS). A reply can be megabytes of encoded events, more than one datagram of a Unix socket
holds (``wmem_max`` is 208 KiB on many hosts), so it goes as fragments, each led by one byte that
says whether more follow; the first also says the message's length. The receiver reads the
fragments straight into one buffer (the kernel copies them, with the GIL released) and a reply's
chunk payloads are views into it: the collector holds the GIL for neither a join nor a copy of the
events (at 16 probes those two held it ~40 % of the time; docs/benchmarks.md, issue 30).

A reply carries what the worker's ``DecodeStream`` did to its emitter, in call order (``Calls``),
and its cumulative counters; the connection replays the calls on the real emitter.
"""

from __future__ import annotations

import socket
import struct

import msgspec

from cuptistream.channel.messages import OpenStream, TraceSpan, WindowRecords


class MapPool(msgspec.Struct, tag="map_pool", frozen=True):
    """Map the probe's slot pool ``pool`` (its memfd comes with the request)."""

    pool: int
    slot_size: int
    slots: int


class Open(msgspec.Struct, tag="open", frozen=True):
    """A decode stream. With ``names_fd``, the program's ``/proc/PID/mem`` comes with the request
    (opened by the collector, which may read it where the worker may not: it is not the program's
    parent); ``names_failure`` is why the collector could not open it."""

    info: OpenStream
    pid: int
    statistics: bool
    interval_ns: int = 0
    max_names: int = 0
    names_fd: bool = False
    names_failure: str | None = None


class Decode(msgspec.Struct, tag="decode", frozen=True):
    """Decode the activity buffer in slot ``slot`` of pool ``pool``; the connection releases it."""

    stream: int
    pool: int
    slot: int
    valid: int
    dropped: int


class Span(msgspec.Struct, tag="span", frozen=True):
    span: TraceSpan


class Close(msgspec.Struct, tag="close", frozen=True):
    stream: int


Request = MapPool | Open | Decode | Span | Close


# --- what the worker's stream did, replayed on the connection's emitter --------------------------


class EmitChunk(msgspec.Struct, tag="chunk", frozen=True, array_like=True):
    payload: memoryview  # decoded as a view into the received reply: no copy
    count: int


class ReportLoss(msgspec.Struct, tag="loss", frozen=True, array_like=True):
    stage: str
    reason: str
    count: int
    unit: str


class ReportError(msgspec.Struct, tag="error", frozen=True, array_like=True):
    origin: str
    message: str
    severity: str
    result_code: int


class SawDevices(msgspec.Struct, tag="devices", frozen=True, array_like=True):
    ordinals: list[int]


Call = EmitChunk | ReportLoss | ReportError | SawDevices


class Reply(msgspec.Struct, frozen=True):
    """``problem``: the request could not be served (a pool not mapped, an unknown stream); the
    connection decodes in its own thread from then on. Counters are the stream's, cumulative."""

    calls: list[Call] = []
    problem: str | None = None
    buffers: int = 0
    records: int = 0
    records_withheld: int = 0
    events: int = 0
    window: WindowRecords | None = None
    sizes: dict[int, int] | None = None  # record sizes, when the worker learned new ones


_FRAGMENT = 128 * 1024  # fits one datagram under the smallest usual wmem_max (212,992 bytes)
_MORE, _LAST = b"\x01", b"\x00"
_LENGTH = struct.Struct("<Q")  # the whole message's length, after the first fragment's flag
_FIRST = 1 + _LENGTH.size
MAX_FDS = 2

_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(Request)
_replies = msgspec.msgpack.Decoder(Reply)


def pair() -> tuple[socket.socket, socket.socket]:
    """(the connection's end, the worker's end); neither is inherited by other children."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    return ours, theirs


def _send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    view = memoryview(data)
    first = True
    while first or view:
        part, view = view[:_FRAGMENT], view[_FRAGMENT:]
        flag = _MORE if view else _LAST
        lead = flag + _LENGTH.pack(len(data)) if first else flag
        if first and fds:
            socket.send_fds(sock, [lead, part], fds, socket.MSG_NOSIGNAL)
        else:
            sock.sendmsg([lead, part], [], socket.MSG_NOSIGNAL)
        first = False


def _receive(sock: socket.socket) -> tuple[bytes | bytearray | memoryview, list[int]] | None:
    """One whole message and its fds; None at end of stream. Raises OSError (a timeout too, and a
    message whose fragments do not add up to its length)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _FIRST + _FRAGMENT, MAX_FDS)
    if not data:
        for fd in fds:
            socket.close(fd)
        return None
    (length,) = _LENGTH.unpack_from(data, 1)
    part = memoryview(data)[_FIRST:]
    if data[:1] == _LAST:
        return part, fds
    message = bytearray(length)
    message[: len(part)] = part
    into, flag, at = memoryview(message), bytearray(_MORE), len(part)
    while flag != _LAST:
        got, _ancillary, _flags, _addr = sock.recvmsg_into([flag, into[at : at + _FRAGMENT]])
        if not got:
            for fd in fds:
                socket.close(fd)
            return None
        at += got - 1
    if at != length:
        for fd in fds:
            socket.close(fd)
        raise OSError(f"decode worker message of {length} bytes arrived with {at}")
    return message, fds


def send_request(sock: socket.socket, request: Request, fds: list[int] | None = None) -> None:
    _send(sock, _encoder.encode(request), fds or [])


def receive_request(sock: socket.socket) -> tuple[Request, list[int]] | None:
    got = _receive(sock)
    if got is None:
        return None
    return _requests.decode(got[0]), got[1]


def send_reply(sock: socket.socket, reply: Reply) -> None:
    _send(sock, _encoder.encode(reply), [])


def receive_reply(sock: socket.socket) -> Reply | None:
    got = _receive(sock)
    if got is None:
        return None
    for fd in got[1]:  # replies carry none; never leak one
        socket.close(fd)
    return _replies.decode(got[0])
