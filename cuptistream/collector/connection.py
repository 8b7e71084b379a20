"""One probe connection in the collector: receive messages, drain published slots, decode.

Runs on its own thread. A ``Ready`` message wakes it; it then drains every READY slot of that pool
in publication order. The socket is also polled, so a lost wake-up costs at most ``_POLL_S``. At
the end of the connection (goodbye, exit, crash or SIGKILL of the program) every slot the probe
published is still drained: the shared memory outlives the process while it is mapped here.

With decode workers (``pipeline.decode_workers``), a probe's streams are ``RemoteStream``s: this
thread still drains the slots in order and decides to shed or not, and for each buffer (or run of
consecutive small buffers of one stream, decoded as one: ``JOIN_BYTES``) asks the probe's worker to
decode it, replays the reply on the emitter, and only then releases the slots.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from typing import Protocol

import msgspec

from cuptistream.channel import messages, sockets
from cuptistream.channel.shm import ACTIVITY, CHUNK, CHUNK_PREFIX, SlotPool
from cuptistream.collector import handover, shedding
from cuptistream.collector.decoding import Buffer, DecodeStream, has_stack_events, join
from cuptistream.collector.names import ProcessNames
from cuptistream.collector.pm_samples import SampleBoard, device_key, for_process
from cuptistream.collector.pm_stats import PmStatsJoin
from cuptistream.collector.remote_stream import RemoteStream
from cuptistream.collector.samplers import SamplerGrants
from cuptistream.collector.windows import SpanBook, WindowRequests
from cuptistream.collector.worker_pool import Link, WorkerPool
from cuptistream.events import ClockSync, Error, PmSamples
from cuptistream.pipeline.core import Pipeline
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk
from cuptistream.recording.producers import Producer

_POLL_S = 0.5
# Consecutive buffers of a stream up to this many bytes are decoded as one; a GPU's buffers (4 MiB
# under load) go alone. The replayed captures' 4-167 KB buffers decoded 2.2-2.8x cheaper per record
# joined (2-core VM).
JOIN_BYTES = 1024 * 1024
Stream = DecodeStream | RemoteStream  # decoding in this thread, or in a decode worker


class Host(Protocol):
    """What a connection needs from the collector that accepted it (``collector.Collector``), which
    imports this module: a protocol here, not an import back, keeps the two out of an import loop."""

    pipeline: Pipeline
    front_door: shedding.FrontDoor
    windows: WindowRequests
    workers: WorkerPool | None  # None: decode on the connection threads
    pm_samples: SampleBoard  # PM samples for every stream's kernel attribution
    samplers: SamplerGrants  # which probe samples each device's counters

    def probe_said_hello(self, hello: messages.Hello) -> Producer: ...

    def clock_reading(self, producer: Producer, clock: ClockSync) -> None: ...

    def probe_left(self, connection: ProbeConnection) -> None: ...


class ProbeConnection:
    def __init__(self, sock: socket.socket, collector: Host) -> None:
        self.sock = sock
        self.collector = collector
        self.intake = collector.pipeline.intake
        self.emitter: Emitter = self.intake  # the producer's, once the probe said hello
        self.producer: Producer | None = None
        self.pid = 0
        self.uuids: dict[int, str] = {}  # the probe's CUDA ordinal -> device UUID
        self.ordinals: dict[str, int] = {}  # ... and back
        self.pools: dict[int, SlotPool] = {}
        self.streams: dict[int, Stream] = {}
        self.link: Link | None = None  # to this probe's decode worker, once it opened a stream
        self._assigned = False
        self._decodes_here = False  # given a place to decode on this thread by the worker pool
        self._stays_on_thread = False  # ... and keeps it however many probes come (``_leave_thread``)
        self.said_goodbye = False
        self.spans = SpanBook()
        self.replies_dropped = 0  # WindowRecords not sent: the probe was not reading
        self._joins_stacks = collector.pipeline.config.statistics.enabled
        statistics = collector.pipeline.config.statistics
        board = collector.pm_samples
        self._pm_stats = (
            PmStatsJoin(statistics.interval_ns, self.emitter, self.origin, self._published)
            if statistics.enabled
            else None
        )
        self._samples = board.subscribe() if statistics.enabled else None  # PM samples for the streams
        self._latest_samples: dict[str, bytes] = {}  # per device (key), for streams opened later

    @property
    def rank(self) -> int | None:
        return self.producer.resource.rank if self.producer is not None else None

    def send(self, message: messages.Message) -> bool:
        """Send ``message`` to the probe (collector -> probe: ``OpenWindow``, ``WindowRecords``), from
        any thread. False: the probe is gone, or its socket stayed full for ``_POLL_S``."""
        try:
            sockets.send(self.sock, message)
        except OSError:
            return False
        return True

    @property
    def origin(self) -> str:
        return f"collector:probe:{self.pid}"

    def run(self) -> None:
        self.sock.settimeout(_POLL_S)
        try:
            while True:
                try:
                    received = sockets.receive(self.sock)
                except TimeoutError:
                    self._drain_all()
                    if self.link is not None:
                        self.link.rest()  # a probe quiet for _POLL_S holds no reply slot
                    continue
                if received is None:
                    break
                message, fds = received
                self._handle(message, fds)
        except ConnectionResetError as error:
            if not self.said_goodbye:  # after Goodbye it lost nothing: everything before was read
                self.intake.report_error(self.origin, f"probe connection failed: {error}")
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as error:
            self.intake.report_error(self.origin, f"probe connection failed: {error}")
        finally:
            self._finish()

    def _handle(self, message: messages.AnyMessage, fds: list[int]) -> None:
        if isinstance(message, messages.Ready):
            self._drain(message.pool)
        elif isinstance(message, messages.Hello):
            self.pid = message.resource.pid
            self.uuids = {device.device_id: device.uuid for device in message.devices}
            self.ordinals = {uuid: ordinal for ordinal, uuid in self.uuids.items()}
            for spec, fd in zip(message.pools, fds, strict=False):
                self._map(spec, fd)
            self.producer = self.collector.probe_said_hello(message)
            self.emitter = self.intake.for_producer(self.producer)
        elif isinstance(message, messages.OpenPool):
            if fds:
                self._map(message.spec, fds[0])
                pool = self.pools.get(message.spec.pool)
                if self.link is not None and pool is not None:
                    self.link.map_pool(message.spec.pool, pool)
        elif isinstance(message, messages.OpenStream):
            statistics = self.collector.pipeline.config.statistics
            columns = self.collector.pipeline.accepts_columns
            link = self._worker()
            if link is not None:
                self.streams[message.stream] = RemoteStream(
                    link, message, self.pid, self.emitter, self._saw_devices, statistics, columns
                )
            else:
                self.streams[message.stream] = DecodeStream(
                    message, self.pid, self.emitter, self._saw_devices, statistics, columns=columns
                )
            for payload in self._latest_samples.values():
                self.streams[message.stream].pm_samples(payload)
        elif isinstance(message, messages.LossReport):
            self.intake.report_loss(message.stage, message.reason, message.count, message.unit)
        elif isinstance(message, messages.ErrorReport):
            event = Error(
                severity=message.severity, origin=message.origin, message=message.message,
                timestamp=message.timestamp, result_code=message.result_code,
            )  # fmt: skip
            self.intake.emit_control([event], self.producer)
        elif isinstance(message, messages.ClockReading) and self.producer is not None:
            self.collector.clock_reading(self.producer, message.clock)
        elif isinstance(message, messages.TraceSpan | messages.WindowAnswer):
            self._window(message)
        elif isinstance(message, messages.SamplerAsk):
            self.collector.samplers.ask(self, message)
        elif isinstance(message, messages.Goodbye):
            self.said_goodbye = True
            # Nothing more goes to the probe: it waits for this shutdown before closing its end
            # (``probe.link.await_hangup``), so it never closes with a reply unread.
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
            self._drain_all()

    def _worker(self) -> Link | None:
        """This probe's link to a decode worker, assigned at its first stream, with its pools mapped
        there too; None: decode in this thread (no workers configured, or none could start)."""
        workers = self.collector.workers
        if self._assigned or workers is None:
            return self.link
        self._assigned = True
        try:
            self.link = workers.assign()
        except (OSError, subprocess.SubprocessError) as error:
            self.intake.report_error(self.origin, f"no decode worker ({error}); decoding in the collector")
            return None
        if self.link is None:  # this thread decodes (``WorkerPool.in_thread``)
            self._decodes_here = True
            return None
        self._map_pools(self.link)
        return self.link

    def _map_pools(self, link: Link) -> None:
        """Map every pool of this probe on ``link``'s worker (a new link: its first requests)."""
        for index, pool in self.pools.items():
            link.map_pool(index, pool)

    def _move_if_asked(self) -> None:
        """Between two requests (so the probe's buffers stay in order): where the worker pool
        wants this connection on another worker (``WorkerPool.balance``), map the pools there and
        hand every stream over (``RemoteStream.move``), then let the old link go."""
        link, workers = self.link, self.collector.workers
        if link is None or workers is None:
            return
        workers.balance()
        if link.move_to is None:
            return
        remote = [s for s in self.streams.values() if isinstance(s, RemoteStream)]
        if not all(stream.movable for stream in remote):
            link.move_to = None
            return
        fresh = workers.moved(link)
        if fresh is None:
            return
        self._map_pools(fresh)
        for stream in remote:
            stream.move(fresh)
        self.link = fresh
        link.close()

    def _leave_thread(self) -> None:
        """This connection decodes on its own thread, and others came: move its streams, state
        and all, to a worker (``WorkerPool.from_thread``), so the collector's GIL does not do one
        probe's decoding while workers wait. A stream that captures its buffers keeps them all
        here, as does one whose state cannot be handed over (an Error event says so)."""
        workers = self.collector.workers
        local = [s for s in self.streams.values() if isinstance(s, DecodeStream)]
        if workers is None or not all(handover.movable(stream) for stream in local):
            self._stays_on_thread = True
            return
        try:
            states = [handover.dump(stream) for stream in local]
        except Exception as error:  # a bug: decoding goes on here, as before
            self._stays_on_thread = True
            self.intake.report_error(self.origin, f"cannot move its decoding to a worker: {error!r}")
            return
        link = workers.from_thread()
        if link is None:
            return  # no worker has started up yet: at the next buffer
        self._decodes_here = False
        self.link = link
        self._map_pools(link)
        statistics = self.collector.pipeline.config.statistics
        columns = self.collector.pipeline.accepts_columns  # as the stream was opened with
        for stream, state in zip(local, states, strict=True):
            if isinstance(stream.names, ProcessNames):
                stream.names.close()
            self.streams[stream.info.stream] = RemoteStream(
                link, stream.info, self.pid, self.emitter, self._saw_devices, statistics, columns, state,
                stream.open_spans,
            )  # fmt: skip

    def _window(self, message: messages.TraceSpan | messages.WindowAnswer) -> None:
        """A window opened or closed (``TraceSpan``), or the answer to ``OpenWindow``. A closed
        window's ``TraceWindow`` event follows the events of its buffers, and its mark (the intake's
        number after them) lets ``cuptistream trace`` wait until the sinks have them."""
        windows = self.collector.windows
        if isinstance(message, messages.WindowAnswer):
            windows.answered(self, message)
            return
        stream = self.streams.get(message.stream)
        if message.closing:  # not a close yet: the statistics end its kernels by then
            if stream is not None:
                stream.trace_span(message)
            return
        if message.end:  # a buffer whose ``Ready`` could not be sent (a full socket) is still the window's
            self._drain_all()
        records = stream.records if stream is not None else 0
        # The statistics' coverage; a closed window's record count goes back to price the next one.
        reply = stream.trace_span(message) if stream is not None else None
        if reply is not None:
            self._tell_probe(reply)
        if not message.end:
            self.spans.opened(message, records)
            windows.span(self, message, 0, 0)
            return
        event = self.spans.closed(message, stream.info.source if stream is not None else "", records)
        self.emitter.emit([event])
        windows.span(self, message, event.records, self.intake.last_seq)

    def _tell_probe(self, message: messages.Message) -> None:
        """Send without waiting: a probe that does not read its socket (older probes ignore these
        messages) must not stall decoding. What cannot be sent now is counted and dropped."""
        try:
            if sockets.ready_for(self.sock, 0, write=True):
                sockets.send(self.sock, message)
                return
        except OSError:
            pass
        self.replies_dropped += 1

    def _map(self, spec: messages.PoolSpec, fd: int) -> None:
        try:
            self.pools[spec.pool] = SlotPool(fd, spec.slot_size, spec.slots, owner=False)
        except Exception as error:
            os.close(fd)
            self.intake.report_error(self.origin, f"cannot map pool {spec.pool}: {error}")

    def _drain_all(self) -> None:
        for index in list(self.pools):
            self._drain(index)

    def _drain(self, index: int) -> None:
        """Every READY slot of pool ``index``, in publication order. Consecutive activity buffers of
        one stream are decoded together, up to ``JOIN_BYTES`` (``DecodeStream.decode_many``): under
        load slots queue up, and a small buffer costs nearly what a large one does."""
        self._hand_samples()
        pool = self.pools.get(index)
        if pool is None:
            return
        held: list[tuple[int, Buffer]] = []  # the group being gathered: slot, buffer
        stream: Stream | None = None  # the group's
        try:
            for slot in pool.ready():
                header = pool.headers[slot]
                kind, valid = int(header["kind"]), int(header["valid"])
                found = self.streams.get(int(header["stream"])) if kind == ACTIVITY else None
                joins = found is not None and found is stream and found.joins
                if held and not (joins and sum(b[1] for _, b in held) + valid <= JOIN_BYTES):
                    self._decode_held(index, pool, stream, held)
                if found is not None:
                    stream = found
                    held.append((slot, (pool.view(slot, valid), valid, int(header["dropped"]))))
                    continue
                try:
                    view = pool.view(slot, valid)
                    if kind == ACTIVITY:
                        self.intake.report_loss(self.origin, "unknown_stream", 1, unit="buffers")
                    elif kind == CHUNK:
                        self._emit_chunks(view)
                    else:
                        self.intake.report_loss(self.origin, "unknown_slot_kind", 1, unit="buffers")
                    del view
                finally:
                    pool.release(slot)
            if held:
                self._decode_held(index, pool, stream, held)
        finally:
            for slot, _ in held:  # only where something raised: a decode never does
                pool.release(slot)
            held.clear()

    def _decode_held(
        self, index: int, pool: SlotPool, stream: Stream | None, held: list[tuple[int, Buffer]]
    ) -> None:
        """Decode (or shed) the gathered group, then release its slots and empty ``held``. Where
        something raises, ``_drain`` releases what is still held."""
        assert stream is not None
        if isinstance(stream, RemoteStream):
            self._move_if_asked()
        elif self._decodes_here and self.collector.workers is not None and not self._stays_on_thread:
            if self.collector.workers.threads_should_move:
                self._leave_thread()
            stream = self.streams[stream.info.stream]
        self._decode_or_shed(stream, index, held)
        for slot, _ in held:
            pool.release(slot)
        held.clear()

    def _decode_or_shed(self, stream: Stream, pool: int, slots: list[tuple[int, Buffer]]) -> None:
        """Decode the buffers (here, or in the stream's worker), unless the pipeline has no room for
        their events: then count their records as shed, undecoded (``shedding``)."""
        front_door = self.collector.front_door
        remote = isinstance(stream, RemoteStream)
        buffers = [buffer for _, buffer in slots]
        valid, dropped = sum(b[1] for b in buffers), sum(b[2] for b in buffers)
        joined = None
        if len(buffers) == 1:
            joined = buffers[0][0]
        elif not remote:  # decoded here, joined anyway
            joined = join(buffers)
        # One buffer decoded in the collector's threads at a time: the GIL runs one anyway, and each
        # decode holds its buffer's events (~14 MiB for a GPU's 4 MiB buffer) until they are encoded.
        with contextlib.nullcontext() if remote else front_door.decode_turn:
            data = joined if joined is not None else lambda: join(buffers)
            if not front_door.admit(data, valid, dropped, stream.layouts, self.emitter):
                return
            try:
                if isinstance(stream, RemoteStream):
                    stream.decode_slots(pool, slots)
                else:
                    stream.decode_many(buffers, joined)
            finally:
                front_door.decoded(valid)

    def _emit_chunks(self, view: memoryview) -> None:
        offset = 0
        while offset + CHUNK_PREFIX.size <= len(view):
            nbytes, count = CHUNK_PREFIX.unpack_from(view, offset)
            offset += CHUNK_PREFIX.size
            if offset + nbytes > len(view):
                self.intake.report_loss(self.origin, "torn_chunk", count)
                return
            payload = bytes(view[offset : offset + nbytes])
            self.intake.emit_chunk(Chunk(payload, count, self.producer))
            if self._pm_stats is not None:  # PM sampling statistics
                self._pm_stats.chunk(payload, count, self.emitter, self.origin)
            if self._joins_stacks and has_stack_events(payload):  # the statistics' stack join
                for stream in self.streams.values():
                    stream.stack_events(payload, count)
            offset += nbytes

    def _hand_samples(self) -> None:
        """The PM samples published since the last call, to every stream (before its next buffers)."""
        if self._samples is None:
            return
        for key, published in self._samples.take():
            payload = for_process(key, published, self.ordinals)
            if payload is None:  # a GPU this process does not see
                continue
            self._latest_samples[key] = payload
            for stream in self.streams.values():
                stream.pm_samples(payload)

    def _published(self, samples: PmSamples) -> None:
        """The probe's PM samples: to every stream's attribution, and their end to the grants."""
        self.collector.pm_samples.publish(samples, device_key(samples, self.uuids))
        if samples.ends and (uuid := self.uuids.get(samples.device_id)):
            self.collector.samplers.sampled(self, uuid, samples.ends[-1])

    def _saw_devices(self, ordinals: set[int]) -> None:
        if self.producer is not None:
            self.producer.saw_devices(ordinals)

    def _finish(self) -> None:
        self._drain_all()
        self._hand_samples()  # those the last chunks published
        self.collector.samplers.left(self)  # after the drain: its last samples date the hand-over
        if self._samples is not None:
            self.collector.pm_samples.unsubscribe(self._samples)
        if self._pm_stats is not None:
            self._pm_stats.close()
        for stream in self.streams.values():
            try:
                stream.close()
            except Exception as error:
                self.intake.report_error(self.origin, f"closing a decode stream failed: {error}")
        if self.link is not None:
            self.link.close()
        if self._decodes_here and self.collector.workers is not None:
            self.collector.workers.leave_thread()
        for pool in self.pools.values():
            pool.close()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.collector.windows.failed(self, "the probe hung up before its window closed")
        self.collector.probe_left(self)
