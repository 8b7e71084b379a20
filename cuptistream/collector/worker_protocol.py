"""What a probe connection and its decode worker say to each other (``collector.workers``).

One ``SOCK_SEQPACKET`` socket pair per probe connection: the connection sends one request and
waits for its reply, so a probe's buffers are decoded, and their events come back, in order. File
descriptors (a slot pool's memfd, the program's ``/proc/PID/mem``) travel with their request
(SCM_RIGHTS). A reply can be megabytes of encoded events, more than one datagram of a Unix socket
holds (``wmem_max`` is 208 KiB on many hosts), so a message goes as fragments, each led by one byte
that says whether more follow; the first also says the message's length and its header's. The
header is the msgspec-encoded message; a reply's chunk payloads follow it raw, in call order, sent
from where they lie (scatter-gather) rather than copied into one encoding. The receiver reads the
fragments straight into one buffer (the kernel copies them, with the GIL released) and the payloads
become views into it: neither side copies the events in Python (under many probes, joining
fragments and copying payloads out of replies would hold the collector's GIL much of the time, and
encoding the reply would be a fair part of a worker's).

Under ``pipeline.worker_replies: shared`` most of that never crosses the socket: a ``Decode``
names a reply slot (``collector.reply_slots``) and the worker packs the events into it, naming
each such chunk by where it lies (``EmitSlotChunk``).

A reply carries what the worker's ``DecodeStream`` did to its emitter, in call order (``Calls``),
and its cumulative counters; the connection replays the calls on the real emitter.
"""

from __future__ import annotations

import socket
import struct

import msgspec

from cuptistream.channel.messages import OpenStream, TraceSpan, WindowRecords
from cuptistream.collector.reply_maps import ReplyMaps


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
    columns: bool = False  # the hot kinds as ``events.Columns`` elements (``DecodeStream``)
    max_stacks: int = 200


class Decode(msgspec.Struct, tag="decode", frozen=True):
    """Decode the activity buffer in slot ``slot`` of pool ``pool``; the connection releases it.
    ``more``: the (slot, valid, dropped) of further buffers of the pool that follow it in the
    stream, decoded with it as one (``DecodeStream.decode_many``). ``reply_slot`` (not -1): pack
    the events into that reply slot (``collector.reply_slots``) of ``reply_slot_size`` bytes, from
    ``reply_offset`` on (what lies before is earlier replies'), whose memfd comes with the request
    the first time it is named."""

    stream: int
    pool: int
    slot: int
    valid: int
    dropped: int
    reply_slot: int = -1
    reply_slot_size: int = 0
    reply_offset: int = 0
    more: tuple[tuple[int, int, int], ...] = ()

    @property
    def total_valid(self) -> int:
        """The valid bytes of every buffer the request names."""
        return self.valid + sum(valid for _, valid, _ in self.more)


class Span(msgspec.Struct, tag="span", frozen=True):
    span: TraceSpan


class Stacks(msgspec.Struct, tag="stacks", frozen=True):
    """A chunk of the probe's events that holds stack events, for stream ``stream``'s statistics
    (``DecodeStream.stack_events``): ``count`` events encoded as the probe sent them."""

    stream: int
    payload: bytes
    count: int


class Samples(msgspec.Struct, tag="pm_samples", frozen=True):
    """An encoded ``PmSamples`` event, for stream ``stream``'s kernel attribution
    (``DecodeStream.pm_samples``)."""

    stream: int
    payload: bytes


class Close(msgspec.Struct, tag="close", frozen=True):
    stream: int


class Export(msgspec.Struct, tag="export", frozen=True):
    """Hand stream ``stream`` over: the reply's ``state`` is all of it (``handover.dump``), and the
    worker forgets it. The connection then ``Adopt``s it on another worker."""

    stream: int


class Adopt(msgspec.Struct, tag="adopt", frozen=True):
    """Take over the stream another worker handed over (``Export``) as ``stream``. With
    ``names_fd``, the program's ``/proc/PID/mem`` comes with the request, as for ``Open``."""

    stream: int
    state: bytes
    names_fd: bool = False
    names_failure: str | None = None


Request = MapPool | Open | Decode | Span | Stacks | Samples | Close | Export | Adopt


# --- what the worker's stream did, replayed on the connection's emitter --------------------------


class EmitChunk(msgspec.Struct, tag="chunk", frozen=True, array_like=True):
    payload: memoryview  # on the wire: empty, its bytes after the header (``Reply.payload_sizes``)
    count: int
    elements: int  # msgpack elements in the payload (``codec.Chunk.elements``)


class EmitSlotChunk(msgspec.Struct, tag="slot_chunk", frozen=True, array_like=True):
    """A chunk whose payload the worker packed into reply slot ``slot``: ``size`` bytes at
    ``offset``, which only the request's reply slot may hold."""

    slot: int
    offset: int
    size: int
    count: int
    elements: int


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


Call = EmitChunk | EmitSlotChunk | ReportLoss | ReportError | SawDevices


class Reply(msgspec.Struct, frozen=True):
    """``problem``: the request could not be served (a pool not mapped, an unknown stream); the
    connection decodes in its own thread from then on. Counters are the stream's, cumulative."""

    calls: list[Call] = []
    problem: str | None = None
    buffers: int = 0
    decodes: int = 0
    records: int = 0
    records_withheld: int = 0
    events: int = 0
    window: WindowRecords | None = None
    sizes: dict[int, int] | None = None  # record sizes, when the worker learned new ones
    state: bytes | None = None  # the stream, handed over (``Export``)
    payload_sizes: list[int] = []  # on the wire: each EmitChunk's payload length, in call order


WORKER_READY = b"r"  # a worker's first datagram on its control socket: it has imported everything
_FRAGMENT = 128 * 1024  # fits one datagram under the smallest usual wmem_max (212,992 bytes)
_MORE, _LAST = b"\x01", b"\x00"
_LENGTHS = struct.Struct("<QQ")  # the whole message's length and its header's, after the first flag
_FIRST = 1 + _LENGTHS.size
_EMPTY = memoryview(b"")
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


def _send(sock: socket.socket, parts: list[bytes | memoryview], fds: list[int]) -> None:
    """``parts[0]`` is the header; the rest follow it raw. Each fragment is slices of the parts as
    they lie (``sendmsg`` gathers them), so nothing is joined."""
    views = [memoryview(part).cast("B") for part in parts]
    total = sum(len(view) for view in views)
    fragments: list[list[memoryview]] = [[]]
    room = _FRAGMENT
    for view in views:
        while view:
            if not room:
                fragments.append([])
                room = _FRAGMENT
            piece, view = view[:room], view[room:]
            fragments[-1].append(piece)
            room -= len(piece)
    for index, pieces in enumerate(fragments):
        flag = _LAST if index == len(fragments) - 1 else _MORE
        lead = flag + _LENGTHS.pack(total, len(views[0])) if index == 0 else flag
        if index == 0 and fds:
            socket.send_fds(sock, [lead, *pieces], fds, socket.MSG_NOSIGNAL)
        else:
            sock.sendmsg([lead, *pieces], [], socket.MSG_NOSIGNAL)


def _close(fds: list[int]) -> None:
    """Close file descriptors that arrived with a message nobody will use."""
    for fd in fds:
        socket.close(fd)


def _receive(sock: socket.socket, maps: ReplyMaps | None = None) -> tuple[memoryview, int, list[int]] | None:
    """One whole message, its header's length and its fds; None at end of stream. Raises OSError
    (a timeout too, and a message whose fragments do not add up to its length). ``maps``: a
    message of several fragments lands in a private anonymous mapping from them (``ReplyMaps``),
    rather than in the heap, whose pages glibc keeps after a reply of megabytes is freed
    (``pipeline.worker_replies``)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _FIRST + _FRAGMENT, MAX_FDS)
    if not data:
        _close(fds)
        return None
    length, header = _LENGTHS.unpack_from(data, 1)
    part = memoryview(data)[_FIRST:]
    if data[:1] == _LAST:
        return part, header, fds
    into = maps.take(length) if maps is not None else memoryview(bytearray(length))
    into[: len(part)] = part
    flag, at = bytearray(_MORE), len(part)
    while flag != _LAST:
        got, _ancillary, _flags, _addr = sock.recvmsg_into([flag, into[at : at + _FRAGMENT]])
        if not got:
            _close(fds)
            return None
        at += got - 1
    if at != length:
        _close(fds)
        raise OSError(f"decode worker message of {length} bytes arrived with {at}")
    return into, header, fds


def send_request(sock: socket.socket, request: Request, fds: list[int] | None = None) -> None:
    _send(sock, [_encoder.encode(request)], fds or [])


def receive_request(sock: socket.socket) -> tuple[Request, list[int]] | None:
    got = _receive(sock)
    if got is None:
        return None
    message, header, fds = got
    return _requests.decode(message[:header]), fds


def send_reply(sock: socket.socket, reply: Reply) -> None:
    """The reply with its chunks' payloads emptied as the header, then the payloads themselves."""
    payloads = [call.payload for call in reply.calls if isinstance(call, EmitChunk)]
    calls = [
        msgspec.structs.replace(call, payload=_EMPTY) if isinstance(call, EmitChunk) else call
        for call in reply.calls
    ]
    header = msgspec.structs.replace(reply, calls=calls, payload_sizes=[len(p) for p in payloads])
    _send(sock, [_encoder.encode(header), *payloads], [])


def receive_reply(sock: socket.socket, maps: ReplyMaps | None = None) -> Reply | None:
    """The next reply; ``maps`` as for ``_receive``."""
    got = _receive(sock, maps)
    if got is None:
        return None
    message, header, fds = got
    _close(fds)  # replies carry none; never leak one
    reply = _replies.decode(message[:header])
    if not reply.payload_sizes:
        return reply
    if len(reply.payload_sizes) != sum(isinstance(call, EmitChunk) for call in reply.calls):
        raise OSError("decode worker reply: its payload sizes do not match its chunks")
    sizes, at, calls = iter(reply.payload_sizes), header, []
    for call in reply.calls:
        if isinstance(call, EmitChunk):
            size = next(sizes)
            call = EmitChunk(message[at : at + size], call.count, call.elements)
            at += size
        calls.append(call)
    if at != len(message):
        raise OSError(f"decode worker reply: payloads end at {at} of {len(message)} bytes")
    return msgspec.structs.replace(reply, calls=calls, payload_sizes=[])
