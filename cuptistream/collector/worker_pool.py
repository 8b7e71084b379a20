"""The collector's side of the decode workers (``collector.workers``): start them, assign probe
connections to them, and one ``Link`` per connection that sends a request and waits for its reply.

Workers start lazily, one per probe connection that opens an activity stream, up to
``pipeline.decode_workers``; past that a connection goes to the worker with the fewest
connections. Under ``auto`` the first connection (one at a time) decodes on its own thread instead:
with GPU-sized buffers a worker round trip costs more CPU per record, which a single probe, the
common case, need not pay (see docs/performance.md). Under ``auto`` too, the worker count follows
the load rather than the probe count: each worker takes ``AUTO_CONNECTIONS_PER_WORKER``
connections before the next one starts (fewer, busier workers cost less CPU per record), and a
worker that uses more than ``SPLIT_LOAD`` cores gets a new worker beside it, to which about half
its connections move, state and all (``balance``, ``handover``; many probes decoding flat out need
several workers). A worker that died
is replaced by a fresh one at the next assignment. A worker whose last connection closed stops
(``_released``; not the last one), the rest at ``Collector.finish``. A ``Link``
never hangs its connection: it waits for a reply in steps of ``_POLL_S`` while the worker lives,
and kills a worker that has not answered one request within ``REQUEST_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from cuptistream.channel import sockets
from cuptistream.channel.shm import SlotPool
from cuptistream.collector import blas_threads, memory
from cuptistream.collector import worker_protocol as wp
from cuptistream.collector.reply_maps import ReplyMaps
from cuptistream.collector.reply_slots import Arena, ReplySlots
from cuptistream.collector.thread_cpu import cpu_seconds

_POLL_S = 1.0
# Under ``auto``: a worker busier than this many cores splits (``WorkerPool.balance``), looked at
# this often. Below it a worker keeps up with its probes, and fewer workers cost less per record.
SPLIT_LOAD = 0.75
BALANCE_S = 1.0
# Under ``auto``: connections a worker takes before the next worker starts (more start as the load
# needs them: ``SPLIT_LOAD``). Fewer, busier workers cost less per record on a host whose cores
# the GPU programs keep busy.
AUTO_CONNECTIONS_PER_WORKER = 8
REQUEST_TIMEOUT_S = 60.0  # one buffer decodes in milliseconds; a minute is a stuck worker
_STOP_S = 5.0
_PACKAGE = Path(__file__).resolve().parent.parent  # this cuptistream, for the worker to import
_PACKAGE_ROOT = str(_PACKAGE.parent)
_PROBE_BOOT = str(_PACKAGE / "probe" / "boot")
# A probe's first reply slot is asked for this many times the buffer's valid bytes, later ones for
# 1.25x what its last reply packed into (at most this): W3's kernel records pack into 2.2x their
# bytes, the torch capture's API-heavy buffers into 3.9x (what does not fit goes over the socket).
REPLY_EXPANSION = 4


def _environment() -> dict[str, str]:
    """The worker's: it must find this cuptistream, and must not start a probe of its own (a
    collector that runs inside a probed program inherits the probe's variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_")}
    env[blas_threads.VARIABLE] = "1"  # no BLAS thread per core spinning at numpy's load
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _PROBE_BOOT]
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *paths])
    return env


class Worker:
    """One decode worker process."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cuptistream.collector.workers", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=_environment(), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # stderr stays: a worker's traceback is worth seeing
            )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.control = ours
        self.pid = self.process.pid
        self.cpu_s = 0.0  # its CPU time, read when it stops
        self.rss_anon_kib = 0  # its own heap when it stopped
        self.mapped_slots: set[int] = set()  # reply slots whose memfd it has been sent
        self.links: list[Link] = []  # the connections assigned now, their links (under the pool's lock)
        self._ready = False
        self._cpu_seen: tuple[float, float] | None = None  # (monotonic time, its CPU-s) then

    def load(self, now: float) -> float | None:
        """Cores it used since the last call (None: the first call, or its CPU cannot be read)."""
        cpu = cpu_seconds(f"/proc/{self.pid}/stat")
        if cpu is None:
            return None
        seen, self._cpu_seen = self._cpu_seen, (now, cpu)
        if seen is None or now <= seen[0]:
            return None
        return (cpu - seen[1]) / (now - seen[0])

    @property
    def connections(self) -> int:
        return len(self.links)

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        """Whether it has started up (imported everything) and can answer at once: a connection
        moved to a worker still starting would leave its probe's buffers undrained meanwhile."""
        if not self._ready:
            with contextlib.suppress(OSError):
                if sockets.ready_for(self.control, 0):
                    self._ready = self.control.recv(1) == wp.WORKER_READY
        return self._ready

    def connect(self) -> socket.socket:
        """A new socket pair for one probe connection; the worker gets its end. Raises OSError."""
        ours, theirs = wp.pair()
        try:
            socket.send_fds(self.control, [b"c"], [theirs.fileno()], socket.MSG_NOSIGNAL)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        return ours

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()

    def hang_up(self) -> None:
        """Read its CPU time and heap, then close its socket: the worker exits."""
        self.cpu_s = _cpu_s(self.pid)
        reading = memory.read(self.pid)
        self.rss_anon_kib = reading.anon_kib if reading is not None else 0
        with contextlib.suppress(OSError):
            self.control.close()

    def reap(self, until: float) -> None:
        """Wait for it to exit until ``until`` (``time.monotonic()``), then kill it."""
        try:
            self.process.wait(max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()


def _heavier_half(links: list[Link]) -> list[Link]:
    """About half of ``links`` by the bytes each asked for lately (``Link.recent``; by count where
    they asked for none): the heaviest first, each to the lighter side. The side without the
    heaviest moves."""
    sides: tuple[list[Link], list[Link]] = ([], [])
    totals = [0, 0]
    for link in sorted(links, key=lambda k: k.recent, reverse=True):
        side = 0 if totals[0] <= totals[1] else 1
        sides[side].append(link)
        totals[side] += link.recent + 1
    return sides[1]


def worker_pids(collector_pid: int) -> list[int]:
    """The decode worker processes of the collector ``collector_pid`` (its children running
    ``collector.workers``), from ``/proc``: for benchmarks and tests watching it from outside."""
    found = []
    for children in Path(f"/proc/{collector_pid}/task").glob("*/children"):
        for child in children.read_text().split():
            try:
                if b"cuptistream.collector.workers" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:
                continue
    return found


def _cpu_s(pid: int) -> float:
    return cpu_seconds(f"/proc/{pid}/stat") or 0.0


class WorkerPool:
    """Up to ``size`` decode workers, shared by the probe connections."""

    def __init__(
        self,
        size: int,
        in_thread: int = 0,
        reply_maps: ReplyMaps | None = None,
        reply_slots: ReplySlots | None = None,
        per_worker: int = 1,
        split_load: float | None = None,
    ) -> None:
        """``in_thread``: how many connections at a time decode on their own threads while no
        worker runs (the first one moves to a worker when another comes: ``from_thread``);
        ``per_worker``: a new worker starts only when every running one has this many connections
        (below ``size``); ``reply_maps``: replies land in these mappings
        (``pipeline.worker_replies: mapped``), else in the heap; ``reply_slots``: workers pack a
        buffer's events into these (``worker_replies: shared``); ``split_load``: move half of a
        worker's connections to a new worker when it uses more cores than this (``balance``)."""
        self.size = size
        self.split_load = split_load
        self._next_balance = 0.0
        self.moves = 0  # connections moved to another worker, or from their thread to one
        # A connection decodes on its own thread only while it is alone: once another comes, it
        # moves to a worker too (``from_thread``), or the collector's one GIL caps the node.
        self.threads_should_move = False
        self.in_thread = in_thread
        self.per_worker = per_worker
        self.reply_maps = reply_maps
        self.reply_slots = reply_slots
        self._in_thread_now = 0
        self._workers: list[Worker] = []
        self._retired: list[Worker] = []  # died, or stopped: their CPU time counts
        self._let_go_cpu_s = 0.0  # of workers stopped when their last connection left (``_released``)
        self._exiting: list[Worker] = []  # ... those not yet waited for
        self._lock = threading.Lock()
        self.started = 0
        self.died = 0
        self._stopped = False

    def assign(self) -> Link | None:
        """A link to the worker with the fewest connections (a new one while fewer than ``size``
        run and each has ``per_worker``), or None: decode on the connection's own thread (one of
        ``in_thread`` while no worker runs; give the place back with ``leave_thread``). Raises OSError (or
        ``SubprocessError``) when no worker can be reached."""
        with self._lock:
            if self._stopped:
                raise OSError("the decode workers have stopped")
            if self._in_thread_now < self.in_thread and not self._workers:
                self._in_thread_now += 1
                return None
            self.threads_should_move = self._in_thread_now > 0
            return self._place()

    def from_thread(self) -> Link | None:
        """For a connection that decodes on its own thread (``assign`` gave None), now that others
        came: a link to a worker to move its streams to (its place on a thread is given back), or
        None: stay, and ask again at the next buffer (no worker has started up yet, or none can be
        reached)."""
        with self._lock:
            ready = [w for w in self._workers if w.alive() and w.ready()]
            if self._stopped or self._in_thread_now <= 0 or not ready:
                return None  # none started up yet: stay, and ask again at the next buffer
            try:
                link = self._link(min(ready, key=lambda w: w.connections))
            except OSError:
                return None
            self._in_thread_now -= 1
            self.threads_should_move = self._in_thread_now > 0
            self.moves += 1
            return link

    def _place(self) -> Link:
        """A link to the worker with the fewest connections, or to a new one (under the lock)."""
        for worker in [w for w in self._workers if not w.alive()]:
            self._workers.remove(worker)
            self._retired.append(worker)
            self.died += 1
        busy = all(w.connections >= self.per_worker for w in self._workers)
        if len(self._workers) < self.size and busy:
            worker = Worker()
            self._workers.append(worker)
            self.started += 1
        else:
            worker = min(self._workers, key=lambda w: w.connections)
        return self._link(worker)

    def _link(self, worker: Worker) -> Link:
        """A new link to ``worker`` (under the lock). Raises OSError."""
        link = Link(self, worker, worker.connect())
        worker.links.append(link)
        return link

    def balance(self) -> None:
        """Under ``split_load``, at most every ``BALANCE_S``: a worker that used more than that
        many cores since the last look gets a new worker beside it (while fewer than ``size``
        run), and about half its connections, by the bytes they asked it to decode, are told to
        move there (``Link.move_to``; the connection moves at its next request: ``moved``). Called
        by the connection threads; cheap when there is nothing to do."""
        now = time.monotonic()
        if self.split_load is None or now < self._next_balance:
            return
        with self._lock:
            if self._stopped or now < self._next_balance:
                return
            self._next_balance = now + BALANCE_S
            for worker in list(self._workers):
                # From its first look after it started up: the imports are not the probes' load
                load = worker.load(now) if worker.ready() else None
                for link in worker.links:
                    link.recent, link.requested = link.requested, 0
                staying = [link for link in worker.links if link.move_to is None and not link.broken]
                if load is None or load < self.split_load or len(self._workers) >= self.size:
                    continue
                if len(staying) < 2 or len(staying) < len(worker.links) or not worker.alive():
                    continue  # (its last split has not moved yet: its load is still theirs)
                fresh = Worker()
                self._workers.append(fresh)
                self.started += 1
                for link in _heavier_half(staying):
                    link.move_to = fresh

    def moved(self, link: Link) -> Link | None:
        """The link that replaces ``link`` on the worker it was told to move to (``balance``); the
        connection maps its pools there, hands its streams over, and closes ``link``. None: stay
        (for now while that worker starts up; for good when it is gone)."""
        with self._lock:
            target = link.move_to
            if target is not None and target.alive() and not target.ready():
                return None  # still starting up: move at a later request
            link.move_to = None
            if target is None or self._stopped or target not in self._workers or not target.alive():
                return None
            try:
                fresh = self._link(target)
            except OSError:
                return None
            self.moves += 1
            return fresh

    def leave_thread(self) -> None:
        """A connection that decoded on its own thread (``assign`` gave None) has finished."""
        with self._lock:
            self._in_thread_now -= 1
            self.threads_should_move = self.threads_should_move and self._in_thread_now > 0

    def _released(self, link: Link) -> None:
        """``link`` closed. A worker left with no connection stops, unless it is the only one (the
        next probe's) or connections are moving to it: a node collector outlives its jobs, and
        each idle worker would keep its heap (~46 MiB, 128-136 MiB after GPU-sized buffers)."""
        with self._lock:
            worker = link.worker
            worker.links.remove(link)
            self._exiting = [w for w in self._exiting if w.process.poll() is None]  # no zombies
            if worker.links or self._stopped or worker not in self._workers or not worker.alive():
                return  # (a dead one is counted as died at the next assignment, or at ``stop``)
            others = [w for w in self._workers if w is not worker and w.alive()]
            coming = any(k.move_to is worker for w in others for k in w.links)
            if not others or coming:
                return
            self._workers.remove(worker)
            worker.hang_up()
            self._let_go_cpu_s += worker.cpu_s
            self._exiting.append(worker)

    def stop(self) -> None:
        """Stop every worker (after the connections finished)."""
        with self._lock:
            self._stopped = True
            workers, self._workers = self._workers, []
        for worker in workers:
            self.died += not worker.alive()
            worker.hang_up()
        until = time.monotonic() + _STOP_S  # one wait for all of them
        for worker in workers:
            worker.reap(until)
        for worker in self._exiting:
            worker.reap(until)
        self._retired.extend(workers)
        if self.reply_maps is not None:
            self.reply_maps.close()
        if self.reply_slots is not None:
            self.reply_slots.close()

    @property
    def cpu_s(self) -> float:
        return round(sum(w.cpu_s for w in self._retired) + self._let_go_cpu_s, 3)

    @property
    def rss_anon_kib(self) -> int:
        return sum(w.rss_anon_kib for w in self._retired)


class Link:
    """One probe connection's channel to its worker: one request in flight at a time.

    ``request`` returns the reply, or None once the link is broken: the worker died, hung, or
    could not serve a request (``reason`` and ``problem`` then say which and why; the connection
    decodes in its own thread from then on). ``sent``: whether the last request reached the worker
    (a request that did not was not served, and nothing of it is lost)."""

    def __init__(self, pool: WorkerPool, worker: Worker, sock: socket.socket) -> None:
        self._pool = pool
        self.worker = worker
        self.sock: socket.socket | None = sock
        # Once, not per reply (each ``settimeout`` is an ioctl): ``_wait`` polls for the reply, then
        # reads it with this bound for its further fragments.
        sock.settimeout(REQUEST_TIMEOUT_S)
        self.broken = False
        self.reason = ""  # the loss reason for a buffer the worker had: decode_worker_died / _failed
        self.problem = ""  # one line for the Error event
        self.told = False  # the Error event was emitted (once per link)
        self.sent = False
        self._expansion: float = REPLY_EXPANSION  # reply bytes per buffer byte to ask a slot for
        self._arena = Arena(pool.reply_slots) if pool.reply_slots is not None else None
        self.move_to: Worker | None = None  # where the pool wants this connection (``balance``)
        self.requested = 0  # buffer bytes asked to decode since the pool's last look
        self.recent = 0  # ... and in the period before (what ``balance`` weighs)

    def request(self, request: wp.Request, fds: list[int] | None = None) -> wp.Reply | None:
        if self.broken or self.sock is None:
            return None
        try:
            wp.send_request(self.sock, request, fds)
        except OSError as error:  # it never had this request: the caller may serve it itself
            self._break("decode_worker_died", f"it is gone ({error})")
            self.sent = False
            return None
        self.sent = True
        try:
            reply = self._wait(self.sock)
        except (OSError, ValueError) as error:  # ValueError: a reply msgspec cannot decode
            # A worker that died with our request unread resets the socket (ECONNRESET)
            status = self._exit_status()
            problem = f"it died{status}" if status else f"its socket failed ({error})"
            self._break("decode_worker_died", problem)
            return None
        if reply is None:
            self._break("decode_worker_died", "it died" + self._exit_status())
        elif reply.problem is not None:
            self._break("decode_worker_failed", f"it failed a request: {reply.problem}")
            return None
        return reply

    def decode(self, request: wp.Decode, replay: Callable[[wp.Reply], None]) -> wp.Reply | None:
        """``request`` (and ``replay`` of its reply), its events packed into this link's reply slot
        when the pool has one (``pipeline.worker_replies: shared``); None as for ``request``."""
        self.requested += request.total_valid
        arena = self._arena
        place = arena.place(int(request.total_valid * self._expansion)) if arena is not None else None
        if arena is None or place is None:
            return self._replayed(self.request(request), replay)
        taken, offset = place
        fresh = taken.slot not in self.worker.mapped_slots
        named = msgspec.structs.replace(
            request, reply_slot=taken.slot, reply_slot_size=taken.size, reply_offset=offset
        )
        reply = self.request(named, [taken.fd] if fresh else None)
        if fresh and self.sent:
            self.worker.mapped_slots.add(taken.slot)
        if reply is not None:
            slotted = [c for c in reply.calls if isinstance(c, wp.EmitSlotChunk)]
            if request.total_valid:
                # Ask for what this probe's buffers pack into, with a margin, next time: the rest of
                # a slot too small for it goes unused.
                packed = sum(c.size for c in slotted)
                packed += sum(len(c.payload) for c in reply.calls if isinstance(c, wp.EmitChunk))
                self._expansion = min(REPLY_EXPANSION, max(1.0, 1.25 * packed / request.total_valid))
            end = max((c.offset + c.size for c in slotted), default=offset)
            arena.packed(end, int(request.total_valid * self._expansion))  # the next much like this one
        return self._replayed(reply, replay)

    def rest(self) -> None:
        """The connection has nothing to decode for now: let this link's reply slot go, so that an
        idle probe holds none (the slot's pages can then be given back)."""
        if self._arena is not None:
            self._arena.release()

    def _replayed(self, reply: wp.Reply | None, replay: Callable[[wp.Reply], None]) -> wp.Reply | None:
        if reply is None:
            return None
        try:
            replay(reply)
        except ValueError as error:  # a reply naming bytes outside its slot: nothing was replayed
            self._break("decode_worker_failed", f"it sent a reply that does not fit ({error})")
            return None
        return reply

    def slot_view(self, slot: int, offset: int, size: int) -> memoryview:
        """The bytes of a reply's ``EmitSlotChunk``. Raises ValueError outside the slot."""
        if self._pool.reply_slots is None:
            raise ValueError("a reply named a reply slot, and this collector has none")
        return self._pool.reply_slots.view(slot, offset, size)

    def _wait(self, sock: socket.socket) -> wp.Reply | None:
        began = time.monotonic()
        while not sockets.ready_for(sock, _POLL_S):
            if not self.worker.alive():
                return None  # its end is closed too by now; read what is left, if anything
            if time.monotonic() - began > REQUEST_TIMEOUT_S:
                self.worker.kill()  # its other connections fall back too: it serves none of them
                raise OSError(f"no reply within {REQUEST_TIMEOUT_S:.0f}s; killed it")
        return wp.receive_reply(sock, self._pool.reply_maps)  # the rest follows at once

    def _exit_status(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.worker.process.wait(_POLL_S)
            return f" (signal {-code})" if code < 0 else f" (exit status {code})"
        return ""

    def _break(self, reason: str, problem: str) -> None:
        self.broken = True
        self.reason = reason
        self.problem = f"decode worker {self.worker.pid}: {problem}"
        self.close()

    def map_pool(self, index: int, pool: SlotPool) -> None:
        self.request(wp.MapPool(index, pool.slot_size, pool.slots), [pool.fd])

    def close(self) -> None:
        """Hang up; the worker drops this connection's pools and streams."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        self.rest()  # its slot is idle once the sinks let go of its replies
        with contextlib.suppress(OSError):
            sock.close()
        self._pool._released(self)
