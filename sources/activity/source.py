"""The activity source: CUPTI activity buffers, handed whole to the collector.

It runs in the observed process (the probe) and does per-buffer work only:

- CUPTI (its worker or the application's thread) calls the buffer callbacks
  (``cuptistream.cupti.buffers``): ``requested`` hands CUPTI a shared-memory slot, ``completed``
  publishes it to the collector with its valid bytes and CUPTI's dropped count. No record is read
  here; the collector decodes (``cuptistream.collector.decoding``).
- One flush thread calls ``cuptiActivityFlushAll(0)`` every ``flush_interval`` so events arrive
  within about that long, even from a process that launches little.

Per-cbid API filters (``runtime_api``/``driver_api``) are applied *after*
``cuptiActivityEnable(RUNTIME/DRIVER)``: enabling a kind resets its filter, so filters set before
are lost (with filters set first, every API call is recorded).

``stop()`` disables the kinds, forces a flush (every buffer is handed over), waits briefly for the
collector to read them (record names point into CUPTI's memory), and then, where no other CUPTI
user remains and ``detach`` is set, calls ``cuptiFinalize``.

``activity.mode: budget`` traces the kinds only in windows that the overhead governor sizes
(``windows``); the kinds in ``continuous`` and the resource kinds (device, context, stream) stay on
between them. With ``between_windows: detach`` CUPTI is detached after each window once the
collector has read its buffers (``driver.park``) and attached again at the next: attached with
nothing traced, CUPTI still costs every kernel launch (docs/performance.md, the always-on rows),
and only ``cuptiFinalize`` takes that off. The resource kinds are then dumped at each window's
start instead. Detaching while the process has a CUDA graph makes its replays fail
(``cudaErrorLaunchFailure``), so the source detaches only where it started before any CUDA context
(it has seen every graph) and stops for good at the first graph (a resource callback on graph
creation and instantiation), with one warning event. Where CUPTI
stays attached after a window, the copy and memset kinds stay on from then on (``KEPT_ON_KINDS``).

In either mode ``open_window`` traces an on-demand window (``cuptistream trace``). Every span in
which kinds were traced is announced to the collector (``TraceSpan``): the statistics
use the spans as their coverage.

``pause()`` and ``resume()`` let another tool (torch.profiler) have CUPTI for a while
(``cuptistream.probe.coexist``): pause hands everything over as stop does but keeps the shared-memory
outlet open; resume registers the buffer callbacks and enables the kinds again. A source that was
ever paused never finalizes CUPTI: the other tool may still use it.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from typing import Any

import msgspec

from cuptistream.channel.messages import OpenStream, TraceSpan, WindowRecords
from cuptistream.config import SourceConfig, StacksConfig
from cuptistream.cupti import api_functions, driver, gpus, kinds, library, subscriber
from cuptistream.cupti.buffers import BufferCallbacks
from cuptistream.cupti.external_correlation import activate as activate_correlation
from cuptistream.cupti.external_correlation import deactivate as deactivate_correlation
from cuptistream.errors import UserError
from cuptistream.events import ClockSync
from cuptistream.overhead import Governor, Throttle
from cuptistream.plugin import Emitter, Source
from cuptistream.stacks import StackSampler

from .config import ATTRIBUTES, STACK_JOIN_KINDS, ActivitySourceConfig, attribute_values
from .kernel_profile import KernelProfile
from .schedule import schedule_for
from .windows import PRIOR_UNIT_COST, Windows

_CONSUMED_WAIT_S = 10.0
_DRAIN_S = 0.1  # after a window's kinds are off, before its forced flush: the GPU finishes its work
_SPAN_WAIT_S = 0.5  # the window thread waits this long for room in the channel rather than lose a span
# Kinds whose records describe resources that may predate CUPTI: enabled with a dump of the existing ones.
DUMPED_KINDS = frozenset({"device", "context", "stream"})
# CUPTI_CBID_RESOURCE_GRAPH_CREATED, _GRAPH_CLONED, _GRAPHEXEC_CREATED (cupti_callbacks.h).
GRAPH_CBIDS = (9, 11, 18)
# The kinds of GPU work: what the collector's statistics are computed from.
GPU_WORK_KINDS = frozenset({"concurrent_kernel", "kernel", "memcpy", "memcpy2", "memset"})
# Kinds never disabled while CUPTI stays attached: once a window enabled them they stay on (a span
# says so) until CUPTI detaches or the source stops. Toggling them per window crashes a CUPTI thread
# under DDP on CUPTI 13.0 (a SIGSEGV within a minute at a few windows a second), while toggling only
# the kernel kinds does not. Copies and memsets are few next to kernels.
KEPT_ON_KINDS = frozenset({"memcpy", "memcpy2", "memset"})


class ActivitySource(Source):
    config_type = ActivitySourceConfig
    config: ActivitySourceConfig
    needs_subscriber = False  # activity buffers need no callback subscriber (probe.coexist)

    def __init__(self, config: SourceConfig, emitter: Emitter) -> None:
        super().__init__(config, emitter)
        self._enabled: list[int] = []
        self._started = False
        self._paused = False
        self._shared = False  # paused at least once: another tool has used CUPTI in this process
        self._flusher: threading.Thread | None = None
        self._stopping = threading.Event()
        self.outlet: Any = None
        self.callbacks: BufferCallbacks | None = None
        self.stats: dict[str, int] = {"dropped": 0}
        self._lock = threading.RLock()  # the window thread, coexistence and stop change what is enabled
        self._window_ids = itertools.count(1)
        self._spans: dict[int, TraceSpan] = {}  # open spans by window number
        self._window_extra: dict[int, list[str]] = {}  # kinds each open window enabled
        self._kept_on: list[str] = []  # KEPT_ON_KINDS left on after a window, CUPTI attached
        self._kept_span: int | None = None  # the open span announcing them
        self._governor: Governor | None = None
        self.windows: Windows | None = None
        self._attached = False  # CUPTI attached by us (budget mode with detach: only in windows)
        self.detached = 0  # times CUPTI was detached between windows
        self.stayed_attached: dict[str, int] = {}  # windows after which it could not be, by reason
        self._correlating = False  # external_correlation is traced
        self._may_detach = False  # between_windows: detach, and no CUDA graph (nor any context) before us
        self._graph_watch: list[subscriber.Registration] = []
        self._correlation_on = False
        self._stacks_config: StacksConfig | None = None
        self.stacks: StackSampler | None = None

    def use_governor(self, governor: Governor) -> None:
        """The session's governor (before ``start``): budget mode's windows are its to size."""
        self._governor = governor

    def use_stacks(self, config: StacksConfig) -> None:
        """The session's ``stacks`` config (before ``start``): sampled while this source traces, in
        the modes it names (budget mode: in windows only), where its API records can be joined."""
        cfg = self.config  # (config.load refused modes asked for where it does not join)
        self._stacks_config = config if cfg.mode in config.modes and cfg.joins_stacks else None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.config
        driver.require_gpu()
        with driver.translate_errors():
            driver.acquire("activity")
            try:
                self._start(cfg)
            except BaseException:
                self._undo()
                raise
        # cuptistream.correlate() pushes ids only while a source records them.
        self._correlating = "external_correlation" in cfg.kinds
        self._correlate(True)  # budget mode's first detach follows its first window: every source has started
        if cfg.detaches_between_windows:
            self._watch_for_graphs()
        if self._stacks_config is not None:
            stacks = self._stacks_config
            self.stacks = StackSampler(stacks, self.emitter.emit, driver.timestamp, self._stacks_lost)
            self.stacks.start(active=cfg.mode == "full")
        throttle = self._throttle(cfg)
        schedule = schedule_for(throttle, float(cfg.window), cfg.align) if throttle is not None else None
        self.windows = Windows(self, throttle, schedule)
        self.windows.start()

    def _watch_for_graphs(self) -> None:
        """Detach between windows only while the process has no CUDA graph that we may not have seen."""
        if gpus.any_context_active():
            self._no_detach("CUDA was in use before the source started (a CUDA graph may exist)")
            return
        resource = subscriber.Domain.RESOURCE
        try:
            for cbid in GRAPH_CBIDS:
                self._graph_watch.append(subscriber.register(resource, self._on_graph, cbid))
        except Exception as error:  # the subscriber is another tool's, or CUPTI refused
            self._unwatch_graphs()
            self._no_detach(f"no resource callbacks to watch for CUDA graphs ({error})")
            return
        self._may_detach = True

    def _on_graph(self, domain: int, cbid: int, data: Any) -> None:
        # CUPTI's thread or the program's, inside the CUDA call: a flag and, once, a queued event.
        if self._may_detach:
            self._may_detach = False
            self._no_detach("the process made a CUDA graph (a detach makes graph replays fail)")

    def _no_detach(self, why: str) -> None:
        self.emitter.report_error(
            f"source:{self.name}", f"between_windows: detach is off for this process: {why}; CUPTI stays "
            "attached between windows", severity="warning",
        )  # fmt: skip

    def _correlate(self, on: bool) -> None:
        """Let ``cuptistream.correlate()`` push ids (only while CUPTI is attached: a push attaches it)."""
        if self._correlating and on != self._correlation_on:
            (activate_correlation if on else deactivate_correlation)()
            self._correlation_on = on

    def _throttle(self, cfg: ActivitySourceConfig) -> Throttle | None:
        if cfg.mode != "budget":
            return None
        governor = self._governor or Governor(None, lambda decision: self.emitter.emit([decision]))
        return Throttle(
            governor, self.name, window_s=float(cfg.window), pause_s=float(cfg.pause),
            prior_unit_cost=PRIOR_UNIT_COST, min_window_s=float(cfg.min_window),
            max_pause_s=float(cfg.max_pause), timestamp=driver.timestamp,
        )  # fmt: skip

    def _start(self, cfg: ActivitySourceConfig) -> None:
        if "marker" in cfg.kinds:  # NVTX ranges reach CUPTI only through NVTX's injection hook
            driver.enable_nvtx_injection()
        self.device = gpus.device_name(0)
        self.cupti_version = driver.cupti_version()
        self._set_attributes(cfg)
        # Every kind's size, not only those enabled: CUPTI adds records of its own (overhead, ...).
        sizes = {spec.kind: size for spec in kinds.KINDS.values() if (size := driver.struct_size(spec.kind))}
        stream = OpenStream(
            stream=0, source=self.name, device=self.device, cupti_version=self.cupti_version,
            struct_sizes=sizes, demangle=cfg.demangle, capture=cfg.capture, records=cfg.records,
            stacks=self._stacks_config is not None,
            clock=ClockSync(cupti_ns=driver.timestamp(), unix_ns=time.time_ns()),
        )  # fmt: skip
        self.outlet = self.emitter.open_activity_stream(stream, int(cfg.buffer_size), cfg.buffer_pool_limit)
        self.callbacks = BufferCallbacks(self.outlet, self._report_dropped)
        self._take_cupti(cfg)

    def _take_cupti(self, cfg: ActivitySourceConfig) -> None:
        """Register the buffer callbacks, enable the kinds (in budget mode those traced between
        windows), then their API filters, start flushing."""
        self._attach(self._base_kinds(cfg))
        self.clock = driver.timestamp
        self._started = True
        if cfg.mode == "full":
            self._open_span(cfg.kinds, on_demand=False, request=0)
        else:  # the continuous kinds, or none: the collector learns that the process is there
            self._open_span(cfg.continuous, on_demand=False, request=0)
        if cfg.flush_interval > 0 and (cfg.mode == "full" or cfg.continuous):
            self._stopping = threading.Event()
            self._flusher = threading.Thread(
                target=self._flush_loop,
                args=(self._stopping,),
                name=f"cuptistream-{self.name}-flush",
                daemon=True,
            )
            self._flusher.start()

    def _attach(self, names: list[str]) -> None:
        """Register the buffer callbacks and enable ``names``: CUPTI attaches on the first call."""
        assert self.callbacks is not None
        self.callbacks.register()
        self._enable(names)
        if self.config.flush_period > 0:
            library.call("cuptiActivityFlushPeriod", max(int(self.config.flush_period * 1000), 1))
        self._attached = True

    def _base_kinds(self, cfg: ActivitySourceConfig) -> list[str]:
        if cfg.mode == "full":
            return list(cfg.kinds)
        if cfg.detaches_between_windows:  # nothing stays on: the resource kinds are dumped per window
            return list(self._kept_on)
        return [k for k in cfg.kinds if k in DUMPED_KINDS or k in cfg.continuous or k in self._kept_on]

    def _window_kinds(self, on_demand: bool) -> list[str]:
        """What a window adds to what is always on: every configured kind for an on-demand window,
        ``window_kinds`` (by default the GPU-work kinds) for a budget window."""
        cfg = self.config
        if cfg.mode == "full":
            return []
        gpu_work = [k for k in cfg.kinds if k in GPU_WORK_KINDS]
        wanted = cfg.kinds if on_demand else (cfg.window_kinds or gpu_work)
        if self.stacks is not None:  # the launches' API records join GPU work to the stacks
            wanted = [*wanted, *(k for k in cfg.kinds if k in STACK_JOIN_KINDS)]
        if cfg.detaches_between_windows:
            wanted = [*(k for k in cfg.kinds if k in DUMPED_KINDS), *wanted]
        return [k for k in dict.fromkeys(wanted) if k not in self._base_kinds(cfg)]

    def _enable(self, names: list[str]) -> None:
        """Enable ``names`` (then the API filters, which enabling resets). Raises ``UserError``."""
        for spec in (kinds.KINDS[name] for name in dict.fromkeys(names)):
            try:
                # Device records are made at CUDA's initialization and context/stream records at
                # creation: CUPTI attached later (the usual case) gets them only by a dump.
                enable = "cuptiActivityEnableAndDump" if spec.name in DUMPED_KINDS else "cuptiActivityEnable"
                library.call(enable, spec.kind)
            except library.CuptiError as error:
                if error.code in (
                    library.ERROR_NOT_COMPATIBLE,
                    library.ERROR_NOT_SUPPORTED,
                    library.ERROR_INVALID_KIND,
                ):
                    raise driver.unsupported(spec.name, self.device, error) from None
                raise UserError(
                    f"cannot enable activity kind {spec.name!r} on {self.device}: {error}"
                ) from None
            self._enabled.append(spec.kind)
        self._apply_api_filters(self.config, names)  # after enabling: cuptiActivityEnable resets them

    # --- windows (``windows.Tracer``) --------------------------------------------------------

    def begin_window(self, on_demand: bool, request: int) -> int | None:
        """Trace every configured kind from now; the window's number, or None while CUPTI is not ours."""
        with self._lock:
            if not self._started or self._paused:
                return None
            extra = self._window_kinds(on_demand)
            fresh = not self._attached
            start = driver.timestamp()  # before enabling: what launches meanwhile is recorded
            with driver.translate_errors():
                if fresh:
                    self._set_attributes(self.config)  # cuptiFinalize reset them
                    self._attach(extra)
                    self._correlate(True)
                else:
                    self._enable(extra)
            traced = [k for k in self.config.kinds if k in extra or k in self._base_kinds(self.config)]
            window = self._open_span(traced, on_demand, request, start, fresh)
            self._window_extra[window] = extra
            if self.stacks is not None:
                self.stacks.set_active(True)
            return window

    def helper_cpu_s(self) -> float:
        """The stack sampler's CPU seconds so far (``windows.Tracer``); 0 without stacks."""
        return self.stacks.cpu_s() if self.stacks is not None else 0.0

    def end_window(self, window: int) -> None:
        """Disable what the window added (but ``KEPT_ON_KINDS`` where CUPTI stays attached), hand its
        records over, then say that it closed."""
        lib = library.libcupti()
        with self._lock:
            if window not in self._spans:  # a pause or stop closed it already
                return
            detaches = self.config.detaches_between_windows and self._may_detach and not self._shared
            kept: list[str] = []
            for spec in (kinds.KINDS[name] for name in self._window_extra.pop(window, [])):
                if not detaches and spec.name in KEPT_ON_KINDS:
                    kept.append(spec.name)
                elif spec.kind in self._enabled:
                    lib.cuptiActivityDisable(spec.kind)
                    self._enabled.remove(spec.kind)
            end = driver.timestamp()
            self._keep_on(kept, end)
            if self.stacks is not None and self.config.mode == "budget":
                self.stacks.set_active(False)
            span = msgspec.structs.replace(self._spans[window], end=end, closing=True)
            self.outlet.send_trace_span(span, wait=_SPAN_WAIT_S)
        # Work launched in the window may still be queued on the GPU: a forced flush now would hand
        # over its records incomplete (no end time) and the window would undercount the kernels of a
        # launch-bound program. Our thread waits; the program does not.
        time.sleep(_DRAIN_S)
        with self._lock:
            if window not in self._spans:
                return
            lib.cuptiActivityFlushAll(driver.FLAG_FLUSH_FORCED)
            self._close_span(window, end)
        if self.config.detaches_between_windows:
            self._park()

    def _keep_on(self, names: list[str], start: int) -> None:
        """Announce ``names`` as traced from ``start`` on, with those already kept on: one open span."""
        added = [name for name in names if name not in self._kept_on]
        if not added:
            return
        if self._kept_span is not None:  # one span names them all: the old one ends where it starts
            self._close_span(self._kept_span, start)
        self._kept_on.extend(added)
        self._kept_span = self._open_span(list(self._kept_on), on_demand=False, request=0, start=start)

    def _park(self) -> None:
        """Detach CUPTI until the next window, once the collector has read the window's buffers
        (their names point into CUPTI's memory). Stays attached while CUPTI is shared: another tool
        has used it in this process, or another source of ours holds it."""
        consumed = self.outlet.wait_consumed(_CONSUMED_WAIT_S)
        with self._lock:
            if not (self._may_detach and self._started and self._attached) or self._paused or self._shared:
                return  # the reason was said once when it arose (a graph, another tool, a stop)
            if not consumed:
                self._stayed_attached(f"the collector had not read its buffers in {_CONSUMED_WAIT_S:g} s")
                return
            self._correlate(False)  # a pushed id would attach CUPTI again
            try:
                # A CUDA graph made while the detach waits for a call's exit calls it off.
                why, severity = driver.park("activity", still_wanted=lambda: self._may_detach), "info"
            except library.CuptiError as error:
                why, severity = f"cuptiFinalize failed: {error}", "warning"
            if why is not None:
                self._stayed_attached(why, severity)
                self._correlate(True)
                return
            self._attached = False
            self._enabled.clear()
            self.outlet.reclaim()  # the empty buffers CUPTI held die with it, never completed
            self.detached += 1

    def _stayed_attached(self, why: str, severity: str = "info") -> None:
        """Count a window after which CUPTI stayed attached; say why once per reason (an operator
        reading the recording learns why the between-windows cost did not drop)."""
        self.stayed_attached[why] = self.stayed_attached.get(why, 0) + 1
        if self.stayed_attached[why] == 1:
            self.emitter.report_error(
                f"source:{self.name}", f"CUPTI stayed attached after a window: {why}", severity=severity
            )

    def open_window(self, seconds: float, request: int, metrics: str = "") -> int:
        """An on-demand window of ``seconds`` (``cuptistream trace --for``, ``plugin.OnDemand``),
        charged to no budget; it opens on the window thread at once (after a budget window that is
        open now closes). ``metrics`` (``--metrics``): also measure each kernel launched in it with
        the range profiler (``kernel_profile``). Raises ``RuntimeError`` while CUPTI is another
        tool's or the source stopped, and what ``KernelProfile.open`` raises."""
        if self.windows is None or not self._started:
            raise RuntimeError("not tracing now (stopped, or another tool has CUPTI)")
        profile = KernelProfile.open(metrics, self.emitter, f"source:{self.name}") if metrics else None
        self.windows.request(seconds, request, profile)
        return 1

    def window_records(self, records: WindowRecords) -> None:
        """The collector's count of a closed window's records: prices the next budget window."""
        if self.windows is not None and records.stream == getattr(self.outlet, "stream", records.stream):
            self.windows.priced(records)

    def _open_span(
        self, names: list[str], on_demand: bool, request: int, start: int = 0, fresh: bool = False
    ) -> int:
        window = next(self._window_ids)
        span = TraceSpan(
            stream=0, window=window, start=start or driver.timestamp(), kinds=list(names),
            on_demand=on_demand, request=request, fresh=fresh,
        )  # fmt: skip
        self._spans[window] = span
        self.outlet.send_trace_span(span, wait=_SPAN_WAIT_S)
        return window

    def _close_span(self, window: int, end: int) -> None:
        span = self._spans.pop(window)
        self.outlet.send_trace_span(msgspec.structs.replace(span, end=end), wait=_SPAN_WAIT_S)

    def _set_attributes(self, cfg: ActivitySourceConfig) -> None:
        for key, value in attribute_values(cfg).items():
            attr, ctype = ATTRIBUTES[key]
            data = ctype(value)
            size = ctypes.c_size_t(ctypes.sizeof(data))
            try:
                library.call("cuptiActivitySetAttribute", attr, ctypes.byref(size), ctypes.byref(data))
            except library.CuptiError as error:
                raise UserError(f"cannot set CUPTI activity attribute {key}={value}: {error}") from None

    def _apply_api_filters(self, cfg: ActivitySourceConfig, enabled: list[str]) -> None:
        lib = library.libcupti()
        for domain, patterns, fn in (
            ("runtime", cfg.runtime_api, lib.cuptiActivityEnableRuntimeApi),
            ("driver", cfg.driver_api, lib.cuptiActivityEnableDriverApi),
        ):
            if domain not in enabled:
                continue
            everything = patterns == ["*"]
            selected = set() if everything else set(api_functions.select_cbids(domain, patterns))
            for cbid in api_functions.api_names(domain):
                fn(cbid, 1 if everything or cbid in selected else 0)

    def flush(self) -> None:
        """Hand over what CUPTI holds now (completed buffers go to the collector)."""
        if self._started:
            library.libcupti().cuptiActivityFlushAll(0)

    def pause(self) -> None:
        """Hand over everything CUPTI holds and let it go: kinds off, a forced flush, no flush thread.
        The buffer callbacks stay registered until the other tool registers its own."""
        with self._lock:
            if not self._started:
                return
            self._hand_over()
            if self.stacks is not None:
                self.stacks.set_active(False)
            self._paused = self._shared = True  # shared CUPTI is never detached again
            self._may_detach = False
            self._unwatch_graphs()  # no callback of ours stays registered

    def resume(self) -> None:
        """Take CUPTI back after ``pause()``."""
        if not self._paused:
            return
        cfg = self.config
        with self._lock, driver.translate_errors():
            try:
                self._set_attributes(cfg)  # the other tool may have changed them
                self._take_cupti(cfg)
            except BaseException:
                self._disable_kinds()
                raise
            self._paused = False
            if self.stacks is not None:
                self.stacks.set_active(cfg.mode == "full")

    def _disable_kinds(self) -> None:
        lib = library.libcupti()
        for kind in self._enabled:
            lib.cuptiActivityDisable(kind)
        self._enabled.clear()

    def _hand_over(self) -> None:
        self._started = False
        self._disable_kinds()
        self._stopping.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        end = driver.timestamp()
        library.libcupti().cuptiActivityFlushAll(driver.FLAG_FLUSH_FORCED)
        for window in list(self._spans):  # after the flush: the collector has their records
            self._close_span(window, end)
        self._window_extra.clear()  # _disable_kinds turned their kinds off
        self._kept_on.clear()  # their span closed with the others
        self._kept_span = None
        dropped = self._read_dropped()
        if dropped:
            self._report_dropped(dropped)

    def stop(self) -> None:
        if self.windows is not None:
            self.windows.stop()  # closes an open window, its records handed over
        if self.stacks is not None:
            self.stacks.stop()
        if self._paused:  # CUPTI is the other tool's now: no CUPTI call
            self._paused = False
        elif not self._started:
            return
        else:
            with self._lock:
                self._hand_over()
        if self.callbacks is not None and self.callbacks.refused:
            self.emitter.report_error(
                f"source:{self.name}",
                f"CUPTI asked for a buffer {self.callbacks.refused} times while all "
                f"{self.config.buffer_pool_limit} were in use (records dropped and counted); "
                "raise buffer_pool_limit or buffer_size",
                severity="warning",
            )
        # Names in the records point into CUPTI's memory: let the collector read them before detaching.
        self.outlet.wait_consumed(_CONSUMED_WAIT_S)
        self.outlet.close()
        self._release()

    def _undo(self) -> None:
        self._disable_kinds()
        self._release()

    def _unwatch_graphs(self) -> None:
        for registration in self._graph_watch:
            registration.remove()
        self._graph_watch = []

    def _release(self) -> None:
        self._unwatch_graphs()
        self._correlate(False)
        self._correlating = False
        try:
            driver.release("activity", finalize=self.config.detach and not self._shared)
        except library.CuptiError as error:
            self.emitter.report_error(f"source:{self.name}", f"detach failed: {error}", severity="warning")

    # --- the flush thread --------------------------------------------------------------------

    def _flush_loop(self, stopping: threading.Event) -> None:
        lib = library.libcupti()
        while not stopping.wait(self.config.flush_interval):
            lib.cuptiActivityFlushAll(0)

    # --- loss accounting ----------------------------------------------------------------------

    def _stacks_lost(self, samples: int) -> None:
        self.emitter.report_loss("stacks", "table_full", samples, unit="samples")

    def _read_dropped(self) -> int:
        dropped = ctypes.c_size_t(0)
        library.libcupti().cuptiActivityGetNumDroppedRecords(None, 0, ctypes.byref(dropped))
        return dropped.value

    def _report_dropped(self, count: int) -> None:
        self.stats["dropped"] += count
        self.emitter.report_loss("cupti", "cupti_buffer_dropped", count, unit="records")
