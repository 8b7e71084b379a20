"""``Collector``: the pipeline and its sinks, serving the probes that connect to it.

Lifecycle: ``start()`` opens the sinks (raising ``ConfigError``, ``SinkUnavailableError`` for a
local problem before any program runs; they connect in the background, or first with
``require_healthy``), ``listen(path)`` accepts probes on a Unix socket (and ``cuptistream trace`` on
``<path>.control``; ``collector.registry`` lets it find them), ``finish()`` waits for the probes to
hang up (each connection drains what its probe published, also after a crash), stops the decode
workers (``workers``: started as probes come, ``pipeline.decode_workers``), then drains the
pipeline within ``shutdown_deadline`` and returns the ``ShutdownReport``.
"""

from __future__ import annotations

import contextlib
import os
import resource as rusage
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from cuptistream.channel import messages, sockets
from cuptistream.channel.messages import GpmAsk
from cuptistream.channel.shm import ChannelError
from cuptistream.collector import ondemand, registry, shedding
from cuptistream.collector.connection import ProbeConnection
from cuptistream.collector.control import ControlServer, control_path
from cuptistream.collector.gpm_sampler import CollectorSampler
from cuptistream.collector.memory import MemoryWatch
from cuptistream.collector.pm_samples import SampleBoard
from cuptistream.collector.reply_maps import ReplyMaps
from cuptistream.collector.reply_slots import ReplySlots
from cuptistream.collector.samplers import SamplerGrants
from cuptistream.collector.thread_cpu import ThreadCpu
from cuptistream.collector.windows import WindowRequests
from cuptistream.collector.worker_pool import AUTO_CONNECTIONS_PER_WORKER, SPLIT_LOAD, WorkerPool
from cuptistream.config import Config
from cuptistream.events import ClockSync
from cuptistream.nvml.gpm import GpmSession
from cuptistream.pipeline.core import CLOSE_AFTER_DEADLINE_S, Pipeline, PipelineThread, ShutdownReport
from cuptistream.pipeline.resource import current_resource
from cuptistream.plugin import Sink
from cuptistream.recording.producers import Producer

_SHUTDOWN_GRACE_S = 5.0
_LATE_DRAIN_S = 1.0  # after the pipeline stopped, for a probe connection still draining

T = TypeVar("T")


class Collector:
    # NVML's side of the collector's own PM sampling: device UUID and clock -> a GPM session (a
    # stand-in in tests without a GPU).
    gpm_factory: Callable[[str, Callable[[], int]], Any] = GpmSession

    def __init__(
        self,
        config: Config,
        *,
        sinks: list[Sink] | None = None,
        session_id: str | None = None,
        require_healthy: bool = False,
        in_program: bool = False,
    ) -> None:
        """``in_program``: this collector runs as threads of the observed program (no decode worker
        processes under ``pipeline.decode_workers: auto``)."""
        self.config = config
        self.session_id = session_id or uuid.uuid4().hex[:16]
        if sinks is None:
            sinks = [sink_class(s) for s, sink_class in config.enabled_sinks()]
        session = config.session
        own = current_resource(session.job_env, command_line=session.command_line)
        self.pipeline = Pipeline(
            config, sinks, self.session_id, own, self.clock_sync, require_healthy=require_healthy
        )
        self._pipeline_thread = PipelineThread(
            self.pipeline, at_exit=lambda: self.thread_cpu.sample_this_thread()
        )
        self.front_door = shedding.FrontDoor(self.pipeline)  # sheds buffers undecoded under overload
        workers = config.pipeline.decode_worker_count(in_program=in_program)
        auto = config.pipeline.decode_workers == "auto"  # the first probe decodes in a thread
        self.workers: WorkerPool | None = None  # started as probes come
        if workers:
            # Replies land in mappings kept for reuse (and under "shared", their events in reply
            # slots): idle ones up to an eighth of the memory budget each.
            replies, budget = config.pipeline.worker_replies, config.pipeline.memory_budget
            maps = ReplyMaps(budget // 8) if replies != "heap" else None
            slots = ReplySlots(max_bytes=budget, idle_bytes=budget // 8) if replies == "shared" else None
            per_worker = AUTO_CONNECTIONS_PER_WORKER if auto else 1
            split = SPLIT_LOAD if auto else None  # auto: more workers only where the load needs them
            self.workers = WorkerPool(workers, int(auto), maps, slots, per_worker, split)
        self._clock_offset: int | None = None
        self._changed = threading.Condition()
        self._connections: set[ProbeConnection] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self.windows = WindowRequests()  # on-demand windows (``cuptistream trace``) in flight
        self.pm_samples = SampleBoard()  # from the sampling probe to every stream's attribution
        self.samplers = SamplerGrants(own=self._own_sampler)  # one PM sampler per device: here, or a probe
        self.control: ControlServer | None = None
        self.control_problem = ""  # why ``trace`` cannot reach this collector, if it cannot
        self._registered: Path | None = None
        self.served = 0
        self.buffers = 0
        self.decodes = 0
        self.records = 0
        self.records_withheld = 0
        self.report: ShutdownReport | None = None
        # Own heap apart from the probes' pools (report, status line); freed heap pages go back to
        # the kernel while it is over the memory budget.
        trim_above = int(config.pipeline.memory_budget) // 1024 if config.pipeline.heap_trim else 0
        self.memory = MemoryWatch(trim_above_kib=trim_above)
        # Sampled every second in a collector of its own; in the observed program (whose threads
        # it would read too) only at the end.
        self.thread_cpu = ThreadCpu()
        self._in_program = in_program

    def start(self) -> Collector:
        self.memory.start()
        if not self._in_program:
            self.thread_cpu.start()
        self._pipeline_thread.start()
        return self

    # --- probes -------------------------------------------------------------------------------

    def listen(self, path: str, *, role: str = "collector", label: str = "", mode: int = 0o600) -> str:
        """Accept probes at ``path`` from now on (a thread), and ``cuptistream trace`` requests at
        ``<path>.control``, registered under ``role`` and ``label`` (``collector.registry``).
        Raises ``ChannelError`` for the probes' socket; without the control socket (a path too
        long, say) probes are still served and ``control_problem`` says why ``trace`` cannot come.
        ``mode``: the probes' socket's (the control socket stays 0600)."""
        self._listener = sockets.listen(path, mode)
        self._accepting = threading.Thread(target=self._accept_loop, name="cuptistream-accept", daemon=True)
        self._accepting.start()
        try:
            self.control = ControlServer(control_path(path), lambda ask: ondemand.trace(self, ask))
        except ChannelError as error:
            self.control_problem = str(error)
            return path
        entry = registry.Entry(
            pid=os.getpid(), socket=os.path.abspath(path), control=os.path.abspath(self.control.path),
            role=role, label=label, session_id=self.session_id, started=time.time(),
        )  # fmt: skip
        self._registered = registry.register(entry)
        return path

    def _accept_loop(self) -> None:
        listener = self._listener
        while listener is not None:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            self.attach(sock)

    def attach(self, sock: socket.socket) -> None:
        connection = ProbeConnection(sock, self)
        with self._changed:
            self._connections.add(connection)
            self.served += 1
        thread = threading.Thread(target=connection.run, name="cuptistream-probe-conn", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()]  # a node collector runs for days
        self._threads.append(thread)
        thread.start()

    def probe_said_hello(self, hello: messages.Hello) -> Producer:
        """The producer that the probe's events and batches are attributed to."""
        producer = Producer(hello.resource, hello.devices)
        if hello.clock is not None:
            self.clock_reading(producer, hello.clock)
        return producer

    def probe_left(self, connection: ProbeConnection) -> None:
        with self._changed:
            self._connections.discard(connection)
            for stream in connection.streams.values():
                self.buffers += stream.buffers
                self.decodes += stream.decodes
                self.records += stream.records
                self.records_withheld += stream.records_withheld
            self._changed.notify_all()

    def probe_connections(self) -> list[ProbeConnection]:
        """The probes connected now that said hello and not goodbye (``cuptistream trace``'s choice)."""
        with self._changed:
            return [c for c in self._connections if c.producer is not None and not c.said_goodbye]

    def in_pipeline(self, function: Callable[..., T], *args: object) -> T:
        """``function(*args)`` run in the pipeline's trio thread. Raises ``trio.RunFinishedError``
        once the pipeline has stopped."""
        return self._pipeline_thread.run_sync(function, *args)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until at least one probe came and every probe has left."""
        with self._changed:
            return self._changed.wait_for(lambda: self.served > 0 and not self._connections, timeout)

    def _own_sampler(self, uuid: str, ask: GpmAsk) -> CollectorSampler:
        """The collector's own GPM sampling of ``uuid`` (``samplers``), stamped on the probes' clock."""
        statistics = self.config.statistics
        return CollectorSampler(
            uuid, ask, lambda: self.clock_sync().cupti_ns, self.pm_samples,
            statistics.interval_ns if statistics.enabled else 0, type(self).gpm_factory,
        )  # fmt: skip

    # --- clock --------------------------------------------------------------------------------

    def clock_reading(self, producer: Producer, clock: ClockSync) -> None:
        producer.clock_reading(clock)
        self._clock_offset = clock.offset_ns  # the collector's own events: the latest probe's clock

    def clock_sync(self) -> ClockSync:
        """The event clock (CUPTI's, from the probes' readings) next to the Unix clock."""
        now = time.time_ns()
        if self._clock_offset is None:
            return ClockSync(cupti_ns=time.monotonic_ns(), unix_ns=now)
        return ClockSync(cupti_ns=now - self._clock_offset, unix_ns=now)

    # --- shutdown -----------------------------------------------------------------------------

    def finish(self, probe_timeout: float | None = None, began: float | None = None) -> ShutdownReport | None:
        """Stop accepting, let connected probes hang up (up to ``probe_timeout`` and half the
        time left, then cut them off: what they published is still drained), then drain the
        pipeline. All of it within one ``shutdown_deadline`` from ``began`` (a
        ``time.monotonic()``: the signal, the program's exit; None: now); past it, what is left is
        counted undelivered. The pipeline keeps the deadline's last ``CLOSE_AFTER_DEADLINE_S`` for
        closing the sinks."""
        self.thread_cpu.sample()  # the pipeline's and the connections' threads, before they end
        if self._listener is not None:
            sockets.stop_listening(self._listener)
            self._listener = None
        if self._accepting is not None:  # a probe it took in just now is among the connections
            self._accepting.join(1.0)
        if self.control is not None:
            self.control.close()
        self.samplers.close()
        registry.unregister(self._registered)
        self._registered = None
        ends = (time.monotonic() if began is None else began) + float(self.config.pipeline.shutdown_deadline)

        def left() -> float:
            return max(0.0, ends - time.monotonic())

        with self._changed:  # probes still connected get half the time left; draining, the rest
            wait = left() / 2 if probe_timeout is None else min(probe_timeout, left() / 2)
            self._changed.wait_for(lambda: not self._connections, wait)
            remaining = list(self._connections)
        for connection in remaining:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:  # one still blocked (a full intake under ``block``) is let go
            thread.join(left())  # by the pipeline's stop, its events counted lost
        if self.workers is not None:
            self.workers.stop()
        self.report = self._pipeline_thread.stop(
            left() + CLOSE_AFTER_DEADLINE_S + _SHUTDOWN_GRACE_S, drain_until=ends
        )
        if self.report is not None:
            late_end = time.monotonic() + _LATE_DRAIN_S
            for thread in self._threads:  # cut off at the deadline while draining: what it hands to
                thread.join(max(0.0, late_end - time.monotonic()))  # the closed intake is lost, reported
            self.pipeline.count_late_losses(self.report)
            usage = rusage.getrusage(rusage.RUSAGE_SELF)
            self.report.probes = self.served
            self.report.activity_buffers = self.buffers
            self.report.activity_decodes = self.decodes
            self.report.activity_records = self.records
            self.report.activity_records_withheld = self.records_withheld
            self.report.collector_cpu_s = round(usage.ru_utime + usage.ru_stime, 3)
            self.report.collector_max_rss_kib = usage.ru_maxrss
            end = self.memory.stop()
            self.report.collector_rss_anon_kib = end.anon_kib
            self.report.collector_rss_shmem_kib = end.shmem_kib
            self.report.collector_peak_rss_anon_kib = self.memory.peak.anon_kib
            self.report.collector_peak_rss_shmem_kib = self.memory.peak.shmem_kib
            self.report.collector_threads_cpu_s = self.thread_cpu.stop()
            busiest, busiest_cpu = self.thread_cpu.busiest()
            self.report.collector_busiest_thread = busiest
            self.report.collector_busiest_thread_cpu_s = busiest_cpu
            if self.workers is not None:
                self.report.decode_workers = self.workers.started
                self.report.decode_workers_died = self.workers.died
                self.report.decode_worker_moves = self.workers.moves
                self.report.decode_workers_cpu_s = self.workers.cpu_s
                self.report.decode_workers_rss_anon_kib = self.workers.rss_anon_kib
                if (slots := self.workers.reply_slots) is not None:
                    self.report.reply_slot_replies = slots.replies
                    self.report.reply_slot_full = slots.full
                    self.report.reply_slots = slots.created
        return self.report

    def conclude(
        self, *, report_json: str | None = None, summary: str | None = None, began: float | None = None
    ) -> ShutdownReport | None:
        """``finish`` (the deadline counted from ``began``), then the report written as JSON
        (``report_json``) and one line on stderr: ``summary`` followed by the report's summary
        (None: no line), or that the pipeline did not drain."""
        report = self.finish(began=began)
        if report is None:
            print(f"cuptistream: the pipeline did not drain within {self.stop_timeout:.0f}s; "
                  "undelivered data is lost", file=sys.stderr)  # fmt: skip
            return None
        if report_json:
            Path(report_json).write_bytes(msgspec.json.encode(report))
        if summary is not None:
            print(f"cuptistream: {summary} {self.session_id} drained: {report.summary()}", file=sys.stderr)
        return report

    @property
    def stop_timeout(self) -> float:
        return float(self.config.pipeline.shutdown_deadline) + _SHUTDOWN_GRACE_S
