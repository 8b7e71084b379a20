"""The Python call stacks of the threads that launch GPU work, sampled for the activity source
(``stacks`` in the config).

A kernel's activity record names the API call that launched it (its correlation id), and that
call's record names the thread and the time. The sampler reads every Python thread's stack each
``interval`` and sends, per thread, the moments its stack changed (``StackChanges``); the analysis
joins each launch to the stack its thread was at then (``cuptistream.stacks.index``).

Why sampling rather than a callback on every launch: a Python callback costs microseconds per
launch, which a launch-bound program pays in full, while a sample costs the same whatever the launch
rate, and a training loop's stacks change far less often than it launches. A launch made less than
one interval after its thread's stack changed can land on the stack before (see
``docs/stacks.md``).

Frames and stacks are interned: each reaches the collector once per process (``StackTable``); the
changes carry stack ids. The table is bounded in bytes: past the bound, new stacks map to
``[stack table full]`` and each sample that needed one is counted as lost.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Protocol, runtime_checkable

from cuptistream.config.model import StacksConfig
from cuptistream.events import Event, StackChanges, StackTable

SYNTHETIC_FILE = "<cuptistream>"
TRUNCATED = "[truncated]"
BACKWARD = "[autograd backward]"
TABLE_FULL = "[stack table full]"
NO_PYTHON = 0  # the stack id of a thread that runs no Python (or ended)
OWN_THREAD_PREFIX = "cuptistream"  # the names of cuptistream's threads in the observed process
THREAD_ID_MASK = 0xFFFFFFFF  # CUPTI's API records keep the low 32 bits of pthread_self()
_FLUSH_S = 1.0
# One event's bounds, well inside the probe's smallest event slot (probe.event_buffer_size, 64 KiB up).
_EVENT_CHANGES = 1024  # about 25 bytes each
_EVENT_TABLE_BYTES = 32 * 1024
_WALK_LIMIT = 4096  # frames walked per stack (a runaway recursion stops here)
_FRAME_CACHE_LIMIT = 200_000  # (code, instruction) -> frame id entries before the cache starts over
_FRAME_BYTES = 24  # a frame's ids and line in the table, beside its strings
_STACK_BYTES = 16  # a stack's id and list header, beside 8 bytes per frame

_LIBRARY, _USER, _BACKWARD = 0, 1, 2
# Where autograd's engine runs a backward pass: the kernels then come from its own C++ threads.
_BACKWARD_FUNCTIONS = {"backward", "grad", "_engine_run_backward"}


def _library_roots() -> tuple[str, ...]:
    """Folders whose code is not the program's: the standard library, installed packages and
    cuptistream itself."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update(getattr(site, "getsitepackages", list)())
    for package in ("cuptistream", "cuptistream.sources", "cuptistream.sinks"):  # three folders in a checkout
        spec = importlib.util.find_spec(package)  # found, not imported
        roots.update((spec.submodule_search_locations or []) if spec else [])
    return tuple(sorted(os.path.join(os.path.realpath(root), "") for root in roots if root))


@runtime_checkable
class Stacked(Protocol):
    """A source that samples the launching threads' stacks: the probe hands it the ``stacks``
    config before ``start()``."""

    def use_stacks(self, config: StacksConfig) -> None: ...


class StackSampler:
    """Samples the process's Python threads while ``active``; ``emit`` gets the tables and changes
    about once a second and at ``stop()``. ``clock`` is CUPTI's (the API records' times);
    ``report_lost`` gets the samples whose new stack found the table full. Thread-safe."""

    def __init__(
        self,
        config: StacksConfig,
        emit: Callable[[list[Event]], None],
        clock: Callable[[], int],
        report_lost: Callable[[int], None],
    ) -> None:
        self.config = config
        self.interval_s = float(config.interval)
        self._emit = emit
        self._clock = clock
        self._report_lost = report_lost
        self._pid = os.getpid()
        self._all_frames = config.frames == "all"
        self._roots = _library_roots()
        self._kinds: dict[CodeType, int] = {}
        self._frame_cache: dict[tuple[CodeType, int], int] = {}
        self._frame_ids: dict[tuple[str, str, int], int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}
        self._last: dict[int, tuple[FrameType, int, int]] = {}  # ident -> (top frame, its lasti, stack)
        self._table = StackTable(process_id=self._pid)
        self._changes = StackChanges(process_id=self._pid, interval_ns=round(self.interval_s * 1e9))
        self._sampled_at = 0  # the last sample's time (0: none since sampling began)
        self._ready: list[Event] = []  # tables and changes sealed, to send at the next flush
        self._known: set[int] = set()  # the thread ids seen at the last learning (``_learn_threads``)
        self._own: set[int] = set()  # ... those of cuptistream's threads
        self._table_event_bytes = 0
        self.table_bytes = 0
        self.samples = 0
        self.lost = 0
        self._lock = threading.Lock()
        self._active = threading.Event()
        self._stopping = threading.Event()
        self._wake = threading.Event()  # set_active(True) and stop: the idle thread stops waiting
        self._thread: threading.Thread | None = None
        self._cpu_s = 0.0  # the sampling thread's CPU seconds, as it last noted them
        self._synthetic = {
            name: self._intern_frame(SYNTHETIC_FILE, name, 0) for name in (TRUNCATED, BACKWARD, TABLE_FULL)
        }
        self._table_full_stack = self._intern_stack((self._synthetic[TABLE_FULL],))

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, active: bool = True) -> None:
        if active:
            self.set_active(True)
        self._thread = threading.Thread(target=self._run, name=f"{OWN_THREAD_PREFIX}-stacks", daemon=True)
        self._thread.start()

    def set_active(self, active: bool) -> None:
        """Sample from now on (a budget window opened), or not (it closed: every thread's stack
        ends now, and no frame of the program is held meanwhile)."""
        with self._lock:
            if active:
                if not self._active.is_set():
                    self._sampled_at = self._clock()  # threads seen first from here on were there since
                    self._active.set()
                    self._wake.set()
                    # A first look now: the sampling thread may wait for the GIL for a switch interval
                    # (5 ms) while the program launches, and a short window's launches before its
                    # first sample would have no stack.
                    self._sample()
                return
            self._active.clear()
            # A last look, so that a launch since the latest sample is not split off to "ended".
            self._sample()
            self._end_threads(set(self._last))
            self._sampled_at = 0

    def stop(self) -> None:
        """Stop sampling and send what is pending. Idempotent."""
        self._stopping.set()
        self._active.clear()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with self._lock:
            self._end_threads(set(self._last))
        self.flush()

    def flush(self) -> None:
        with self._lock:
            self._seal()
            events, self._ready = self._ready, []
            lost, self.lost = self.lost, 0
        for event in events:  # one chunk each: a chunk must fit one of the probe's event slots
            self._emit([event])
        if lost:
            self._report_lost(lost)

    def _seal(self) -> None:
        """Close the table and changes being filled (the table first: the changes use its stacks)."""
        if self._table.frame_ids or self._table.stack_ids:
            self._ready.append(self._table)
            self._table = StackTable(process_id=self._pid)
            self._table_event_bytes = 0
        if self._changes.times:
            self._ready.append(self._changes)
            self._changes = StackChanges(process_id=self._pid, interval_ns=self._changes.interval_ns)

    def cpu_s(self) -> float:
        """CPU seconds the sampling thread has used so far, as it last noted (0 before it ran). It
        holds the GIL while it samples, so the program's Python threads wait about that long: the
        budget charges a window what this grew by while the window was open."""
        return self._cpu_s

    def _run(self) -> None:
        flushed = time.monotonic()
        while not self._stopping.is_set():
            if self._active.is_set():
                if self._stopping.wait(self.interval_s):
                    break
                with self._lock:
                    if self._active.is_set():  # under the lock: no sample lands after set_active(False)
                        self._sample()
            else:  # between budget windows: no wake-up (and no GIL taken) until one opens or a flush is due
                self._wake.wait(max(0.0, flushed + _FLUSH_S - time.monotonic()))
                self._wake.clear()
            if time.monotonic() - flushed >= _FLUSH_S:
                flushed = time.monotonic()
                self.flush()
            self._cpu_s = time.thread_time()  # its own clock: read here, never from another thread

    # --- sampling -----------------------------------------------------------------------------

    def sample(self) -> None:
        """One look at every Python thread but this one; a change of stack is recorded."""
        with self._lock:
            self._sample()

    def _sample(self) -> None:
        frames = sys._current_frames()
        at = self._clock()
        self.samples += 1
        if not self._known.issuperset(frames):
            self._learn_threads(frames)
        for ident, top in frames.items():
            if ident in self._own:
                continue
            last = self._last.get(ident)
            lasti = top.f_lasti
            if last is not None and last[0] is top and last[1] == lasti:
                continue  # the same frame at the same instruction: the same stack
            stack = self._stack_of(top)
            self._last[ident] = (top, lasti, stack)
            if last is None or last[2] != stack:
                self._record(ident, at, stack)
        gone = self._last.keys() - frames.keys()
        if gone:
            self._end_threads(gone, at)
        self._sampled_at = at
        del frames

    def _learn_threads(self, frames: dict[int, FrameType]) -> None:
        """Which threads are cuptistream's own (named ``cuptistream-...``, this one among them): they
        launch no GPU work, so they are not sampled. Learned again whenever a thread is new, since an
        ended thread's id can come back on another."""
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        me = threading.get_ident()
        self._known = set(frames)
        self._own = {
            ident for ident in frames if ident == me or names.get(ident, "").startswith(OWN_THREAD_PREFIX)
        }

    def _end_threads(self, idents: set[int], at: int | None = None) -> None:
        at = self._clock() if at is None else at
        for ident in idents:
            del self._last[ident]
            self._record(ident, at, NO_PYTHON)

    def _record(self, ident: int, at: int, stack: int) -> None:
        changes = self._changes
        changes.thread_ids.append(ident & THREAD_ID_MASK)
        changes.times.append(at)
        changes.previous.append(self._sampled_at)
        changes.stack_ids.append(stack)
        if len(changes.times) >= _EVENT_CHANGES:
            self._seal()

    def _stack_of(self, top: FrameType) -> int:
        kept: list[int] = []  # innermost first
        library: list[FrameType] = []  # interned only for a thread with no frame of the program
        backward = False
        frame: FrameType | None = top
        for _ in range(_WALK_LIMIT):
            if frame is None:
                break
            code = frame.f_code
            kind = self._kinds.get(code)
            if kind is None:
                kind = self._kinds[code] = self._classify(code)
            if kind == _BACKWARD:
                backward = True
            if kind == _USER or self._all_frames:
                kept.append(self._frame_id(frame, code))
            elif not kept:
                library.append(frame)
            frame = frame.f_back
        if not kept:
            kept = [self._frame_id(f, f.f_code) for f in library]
        if backward:
            kept.insert(0, self._synthetic[BACKWARD])
        depth = int(self.config.max_depth)
        if len(kept) > depth:
            kept = [*kept[: depth - 1], self._synthetic[TRUNCATED]] if depth > 1 else kept[:1]
        key = tuple(reversed(kept))
        stack = self._stack_ids.get(key)
        if stack is None:
            stack = self._intern_stack(key)
        return stack

    def _classify(self, code: CodeType) -> int:
        file = code.co_filename
        if code.co_name in _BACKWARD_FUNCTIONS and f"torch{os.sep}autograd{os.sep}" in file:
            return _BACKWARD
        if file.startswith("<"):
            return _LIBRARY if file.startswith("<frozen") else _USER  # "<string>", "<stdin>": the program's
        return _LIBRARY if os.path.realpath(file).startswith(self._roots) else _USER

    def _frame_id(self, frame: FrameType, code: CodeType) -> int:
        key = (code, frame.f_lasti)
        fid = self._frame_cache.get(key)
        if fid is None:
            if len(self._frame_cache) >= _FRAME_CACHE_LIMIT:
                self._frame_cache.clear()
            name = getattr(code, "co_qualname", code.co_name)
            fid = self._frame_cache[key] = self._intern_frame(code.co_filename, name, frame.f_lineno or 0)
        return fid

    # --- the table ----------------------------------------------------------------------------

    def _intern_frame(self, file: str, function: str, line: int) -> int:
        key = (file, function, line)
        fid = self._frame_ids.get(key)
        if fid is None:
            size = len(file) + len(function) + _FRAME_BYTES
            if self._stack_ids and self.table_bytes + size > self.config.max_table_bytes:
                return self._synthetic[TABLE_FULL]  # its stack will not fit either
            fid = self._frame_ids[key] = len(self._frame_ids) + 1
            self.table_bytes += size
            self._table_event_bytes += size
            table = self._table
            table.frame_ids.append(fid)
            table.files.append(file)
            table.functions.append(function)
            table.lines.append(line)
        return fid

    def _intern_stack(self, frames: tuple[int, ...]) -> int:
        size = _STACK_BYTES + 8 * len(frames)
        if self._stack_ids and self.table_bytes + size > self.config.max_table_bytes:
            self.lost += 1
            return self._table_full_stack
        stack = self._stack_ids[frames] = len(self._stack_ids) + 1
        self.table_bytes += size
        self._table_event_bytes += size
        self._table.stack_ids.append(stack)
        self._table.stacks.append(list(frames))
        if self._table_event_bytes >= _EVENT_TABLE_BYTES:
            self._seal()
        return stack
