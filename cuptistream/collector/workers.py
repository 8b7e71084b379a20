"""A decode worker: a process of its own that decodes the activity buffers of the probes assigned to
it, so that several probes' decoding runs on several cores (``docs/architecture.md``).

``python -m cuptistream.collector.workers FD``: FD is a ``SOCK_SEQPACKET`` socket to the collector,
which sends one ``Adopt``-style datagram per probe connection assigned here, with that connection's
end of a socket pair (``worker_protocol``). Per connection the worker maps the probe's slot pools
(their memfds come with ``MapPool``) and owns its ``DecodeStream``s: the same code that decodes in
the collector's connection threads when ``pipeline.decode_workers`` is 0, emitting into a
``Recorder`` whose calls go back as the reply.

One thread, one request at a time: a connection has one request in flight, so a probe's buffers
are decoded in order. The worker exits when the collector's socket reaches end of stream, or when
its parent changes (the collector died and the worker was re-parented). ``PR_SET_PDEATHSIG`` is not
used: it fires when the *thread* that started the worker ends, and connection threads start them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import selectors
import signal
import socket
import sys

import msgspec

from cuptistream.channel.messages import WindowRecords
from cuptistream.channel.shm import SlotPool
from cuptistream.collector import handover, memory
from cuptistream.collector import worker_protocol as wp
from cuptistream.collector.decoding import DecodeStream
from cuptistream.collector.names import ProcessNames
from cuptistream.collector.reply_slots import SlotWriter
from cuptistream.config.model import Duration, StatisticsConfig
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk

_PARENT_CHECK_S = 1.0


class Recorder(Emitter):
    """Records what a stream emits, in order, for one reply. ``writer``: the reply slot the
    request named, whose chunks are named by where they lie rather than sent."""

    def __init__(self) -> None:
        self.calls: list[wp.Call] = []
        self.writer: SlotWriter | None = None

    def emit_chunk(self, chunk: Chunk) -> None:
        writer = self.writer
        offset = writer.locate(chunk.payload) if writer is not None else None
        if writer is not None and offset is not None:
            self.calls.append(
                wp.EmitSlotChunk(writer.slot, offset, len(chunk.payload), chunk.count, chunk.elements)
            )
        else:
            self.calls.append(wp.EmitChunk(memoryview(chunk.payload), chunk.count, chunk.elements))

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        self.calls.append(wp.ReportLoss(stage, reason, count, unit))

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        self.calls.append(wp.ReportError(origin, message, severity, result_code))

    def saw_devices(self, ordinals: set[int]) -> None:
        self.calls.append(wp.SawDevices(sorted(ordinals)))

    def take(self) -> list[wp.Call]:
        calls, self.calls = self.calls, []
        return calls


class Session:
    """One probe connection's pools and streams in this worker. ``reply_slots``: the collector's
    reply slots this worker mapped, shared by its sessions."""

    def __init__(self, sock: socket.socket, reply_slots: dict[int, mmap.mmap] | None = None) -> None:
        self.sock = sock
        self.reply_slots = reply_slots if reply_slots is not None else {}
        self.recorder = Recorder()
        self.pools: dict[int, SlotPool] = {}
        self.streams: dict[int, DecodeStream] = {}
        self._sizes: dict[int, int] = {}  # record sizes the connection was last told, per stream

    def serve(self, request: wp.Request, fds: list[int]) -> wp.Reply:
        try:
            return self._serve(request, fds)
        except Exception as error:  # a bug here must not take the other probes' decoding down
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.recorder.take()
            return wp.Reply(problem=f"{type(request).__name__.lower()}: {error!r}")

    def _serve(self, request: wp.Request, fds: list[int]) -> wp.Reply:
        if isinstance(request, wp.Decode):
            writer = self._writer(request, fds)  # first: the collector now counts the slot as mapped here
            stream = self.streams[request.stream]
            pool = self.pools[request.pool]
            buffers = [(pool.view(slot, valid), valid, dropped) for slot, valid, dropped in
                       ((request.slot, request.valid, request.dropped), *request.more)]  # fmt: skip
            stream.decoder.allocate = writer.allocate if writer is not None else None
            self.recorder.writer = writer
            try:
                stream.decode_many(buffers)
                return self._reply(request.stream)
            finally:
                del buffers
                stream.decoder.allocate = None
                self.recorder.writer = None
                if writer is not None:
                    writer.release()
        if isinstance(request, wp.Span):
            window = self.streams[request.span.stream].trace_span(request.span)
            return self._reply(request.span.stream, window)
        if isinstance(request, wp.Stacks):
            self.streams[request.stream].stack_events(request.payload, request.count)
            return self._reply(request.stream)
        if isinstance(request, wp.Samples):
            self.streams[request.stream].pm_samples(request.payload)
            return self._reply(request.stream)
        if isinstance(request, wp.MapPool):
            (fd,) = fds
            self.pools[request.pool] = SlotPool(fd, request.slot_size, request.slots, owner=False)
            return wp.Reply()
        if isinstance(request, wp.Open):
            self._open(request, fds)
            return self._reply(request.info.stream)
        if isinstance(request, wp.Export):
            stream = self.streams[request.stream]
            state = handover.dump(stream)
            self._forget(request.stream)
            return msgspec.structs.replace(self._reply(request.stream, counters_of=stream), state=state)
        if isinstance(request, wp.Adopt):
            opened = (fds[0] if fds else None, request.names_failure) if request.names_fd else None
            stream = handover.load(request.state, self.recorder, self.recorder.saw_devices, opened)
            self.streams[request.stream] = stream  # its first reply says every size it knows
            return self._reply(request.stream)
        stream = self.streams.pop(request.stream)  # Close
        stream.close()
        return self._reply(request.stream, counters_of=stream)

    def _writer(self, request: wp.Decode, fds: list[int]) -> SlotWriter | None:
        """The reply slot the request names, mapped here the first time (its memfd comes with it);
        None when there is none, or it cannot be mapped: the events then go over the socket."""
        if request.reply_slot < 0:
            return None
        mapping = self.reply_slots.get(request.reply_slot)
        if fds:  # slot numbers are never reused: a slot's memfd comes once per worker
            (fd,) = fds
            try:
                size, access = request.reply_slot_size, mmap.PROT_READ | mmap.PROT_WRITE
                mapping = self.reply_slots[request.reply_slot] = mmap.mmap(fd, size, mmap.MAP_SHARED, access)
            except (OSError, ValueError):
                return None
            finally:
                os.close(fd)
        if mapping is None or not 0 <= request.reply_offset <= len(mapping):
            return None
        return SlotWriter(request.reply_slot, mapping, request.reply_offset)

    def _open(self, request: wp.Open, fds: list[int]) -> None:
        names = None
        if request.names_fd or request.names_failure is not None:
            names = ProcessNames(request.pid, (fds[0] if fds else None, request.names_failure))
        statistics = None
        if request.statistics:
            interval = Duration(request.interval_ns / 1e9)
            statistics = StatisticsConfig(
                interval=interval, max_names=request.max_names, max_stacks=request.max_stacks
            )
        stream = DecodeStream(
            request.info, request.pid, self.recorder, self.recorder.saw_devices, statistics, names,
            request.columns,
        )  # fmt: skip
        self.streams[request.info.stream] = stream
        self._sizes[request.info.stream] = len(stream.layouts.sizes)

    def _reply(
        self, stream_id: int, window: WindowRecords | None = None, counters_of: DecodeStream | None = None
    ) -> wp.Reply:
        stream = counters_of or self.streams[stream_id]
        sizes = stream.layouts.sizes
        learned = len(sizes) != self._sizes.get(stream_id)
        self._sizes[stream_id] = len(sizes)
        return wp.Reply(
            calls=self.recorder.take(), buffers=stream.buffers, decodes=stream.decodes,
            records=stream.records, records_withheld=stream.records_withheld, events=stream.events,
            window=window,
            sizes=dict(sizes) if learned else None,
        )  # fmt: skip

    def _forget(self, stream_id: int) -> None:
        """Drop a stream unclosed (handed over, or its connection is gone)."""
        stream = self.streams.pop(stream_id)
        self._sizes.pop(stream_id, None)
        if isinstance(stream.names, ProcessNames):
            stream.names.close()

    def close(self) -> None:
        """The connection is gone (it finished, or decodes in its own thread now): drop its state.
        Streams it did not close are dropped unclosed: the connection counted their losses."""
        for stream_id in list(self.streams):
            self._forget(stream_id)
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        with contextlib.suppress(OSError):
            self.sock.close()


def serve(control: socket.socket) -> None:
    """Until the collector hangs up: take connections from ``control``, answer their requests."""
    parent = os.getppid()
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, None)
    reply_slots: dict[int, mmap.mmap] = {}  # the collector's, mapped as requests name them
    while True:
        ready = selector.select(_PARENT_CHECK_S)
        if os.getppid() != parent:
            return  # the collector died; its sockets may still be held by no one we can see
        for key, _ in ready:
            session: Session | None = key.data
            if session is None:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(control, 16, 1)
                except OSError:  # a reset: the collector closed with our WORKER_READY unread
                    return
                if not data:
                    return
                sock = socket.socket(fileno=fds[0])
                selector.register(sock, selectors.EVENT_READ, Session(sock, reply_slots))
                continue
            try:
                received = wp.receive_request(session.sock)
                if received is not None:
                    wp.send_reply(session.sock, session.serve(*received))
                    continue
            except OSError:
                pass
            selector.unregister(session.sock)
            session.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(args[0]))
    # A Ctrl-C or a SIGTERM to the process group is the collector's to handle: it drains its probes
    # (through this worker) and then hangs up, which ends the worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    memory.keep_freed_heap()
    with contextlib.suppress(OSError):  # imported: a connection moved here now waits for nothing
        control.send(wp.WORKER_READY)
    serve(control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
