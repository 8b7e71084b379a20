"""SASS metrics source (type ``sass``): per-instruction metrics in short, periodic windows.

Uses CUPTI's SASS Metrics API (``cupti_sass_metrics.h``, guide §2.11). Patched kernels run much
slower (two orders of magnitude for a tight loop), so collection is duty-cycled: every
``period`` a worker thread opens a window on the configured device's context —

    SetConfig (once) → Enable → wait ``window`` → GetDataProperties → FlushData → Disable → decode

— and emits one ``SassMetricBatch`` per window. Records CUPTI drops at Disable become Loss events.
On CUPTI 13.0 a window records only where Enable was made while the program had no launch under
way (none in flight from another thread, and not from inside a launch callback); windows that keep
coming back empty are reported once (``_tell_if_nothing_is_patched``).
SetConfig works once per process on CUPTI 13.0, so the config stays set while CUPTI stays attached
and a later session reuses it (``_kept_configs``).

Metric names are checked against ``cuptiSassMetricsGetMetrics`` for the chip at start; an unknown
name fails the source with a one-line error listing close matches. A CUPTI call that does not return
within ``watchdog_timeout`` (a wedged flush has been reported under PyTorch) disables the source
with an Error event.
"""

from __future__ import annotations

import difflib
import threading
import time
from typing import Any, Literal

import msgspec

from cuptistream.config import Duration, SourceConfig, require_at_least, require_positive
from cuptistream.cupti import sass_api as sass
from cuptistream.cupti.contexts import (
    CONTEXT_CREATED,
    CONTEXT_DESTROY_STARTING,
    active_primary_contexts,
    context_ids,
    current_context,
    make_current,
)
from cuptistream.cupti.library import CuptiError
from cuptistream.cupti.sampling_decode import LiveMemory, decode_sass_records
from cuptistream.errors import ConfigError, UserError
from cuptistream.events import SassMetricBatch
from cuptistream.overhead import CLAIM_RETRY_S, SASS_KERNEL_SLOWDOWN, Governor, Throttle, WindowCost

from .cupti_worker import CuptiWorkerSource

STAGE = "sass"
EVENT_RECORDS = 200  # instruction records per sass_metrics event (see window())

# device -> the (metric id, granularity) list set there and still set (see stop()).
_kept_configs: dict[int, list[tuple[int, int]]] = {}

# Under a budget, a window is charged per window, not per second open: its cost is the kernels it
# patches, whatever its length. On CUPTI 13.0 a torch transformer's SASS window alone patches almost
# nothing (well under a second of Enable/Flush/Disable); with PC sampling enabled on the same context
# every window patches tens of thousands of instructions and the program loses seconds, most of it in
# FlushData while the launch queue's patched kernels drain (docs/performance.md, row "PC sampling and
# SASS together"). The prior is the worst window measured, so a first window does not overspend.
_PRIOR_WINDOW_COST_S = 15.0
# Kernels launched before Disable still run patched after it: there, a PC sampling window that opened
# right after a SASS window loses about a second more than one alone. No other source's window opens sooner.
_SETTLE_S = 5.0
_EMPTY_WINDOWS_TOLD = 3  # windows in a row without a record before the source says so


class SassConfig(SourceConfig):
    metrics: list[str] = msgspec.field(default_factory=lambda: ["smsp__sass_inst_executed"])
    granularity: Literal["gpu", "sm", "smsp"] = "gpu"
    lazy_patching: bool = True  # patch a kernel at its first launch in a window, not the whole module
    device: int = 0
    window: Duration = Duration(0.25)  # how long kernels stay patched
    period: Duration = Duration(60.0)  # a window opens this often
    initial_delay: Duration = Duration(10.0)  # first window after this long (skips start-up)
    windows: int = 0  # stop after this many windows; 0 = no limit
    watchdog_timeout: Duration = Duration(30.0)

    def __post_init__(self) -> None:
        require_at_least("device", self.device, 0)
        require_at_least("windows", self.windows, 0)
        for key in ("period", "watchdog_timeout"):  # window 0: flush right after enabling
            require_positive(key, getattr(self, key))


def resolve_metrics(wanted: list[str], available: dict[str, tuple[int, str]], chip: str) -> dict[int, str]:
    """Metric id → name for ``wanted``; raises ConfigError for an unknown name, listing close matches."""
    if not wanted:
        raise ConfigError("sass.metrics: list at least one metric, e.g. smsp__sass_inst_executed")
    chosen: dict[int, str] = {}
    for name in wanted:
        if name not in available:
            close = difflib.get_close_matches(name, list(available), n=5, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else f"; {len(available)} metrics exist"
            raise ConfigError(f"sass.metrics: {name!r} is not a SASS metric on {chip}{hint}")
        chosen[available[name][0]] = name
    return chosen


class SassMetricsSource(CuptiWorkerSource):
    config_type = SassConfig
    config: SassConfig
    label = "SASS metrics"
    _governor: Governor | None = None

    def use_governor(self, governor: Governor) -> None:
        self._governor = governor

    def start(self) -> None:
        from cuptistream.cupti import driver

        driver.require_gpu()
        if driver.detached_once:
            # On CUPTI 13.0 a SASS session after an earlier session's cuptiFinalize (PC sampling had
            # run) can crash the process. Refuse rather than risk it.
            raise UserError(
                "SASS metrics cannot start after CUPTI was detached earlier in this process "
                "(CUPTI 13.0 can crash); start the sass source before anything detaches CUPTI"
            )
        cfg = self.config
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # one window at a time; stop() waits for it
        self._ctx = 0
        self._configured = False
        self.windows_done = 0
        self._empty_windows = 0
        # Counters, and seconds spent in Enable, GetDataProperties+FlushData, Disable and decoding.
        self.stats: dict[str, float] = {
            "windows": 0, "records": 0, "dropped": 0, "enable_s": 0.0, "flush_s": 0.0, "disable_s": 0.0,
            "decode_s": 0.0,
        }  # fmt: skip
        self._throttle: Throttle | None = None
        if self._governor is not None and cfg.window > 0:
            # The configured window is the longest the governor uses; the period its starting point.
            self._throttle = Throttle(
                self._governor,
                self.name,
                window_s=float(cfg.window), pause_s=max(0.0, float(cfg.period) - float(cfg.window)),
                prior_unit_cost=_PRIOR_WINDOW_COST_S, per_window=True, timestamp=self._now,
            )  # fmt: skip
        self._hold_cupti(float(cfg.watchdog_timeout))
        try:
            sass.profiler_initialize()
            self.chip = sass.chip_name(cfg.device)
            self.metric_names = resolve_metrics(cfg.metrics, sass.metrics(self.chip), self.chip)
            self._register_resource_callbacks(
                [
                    (CONTEXT_CREATED, self._on_context_created),
                    (CONTEXT_DESTROY_STARTING, self._on_context_destroy),
                ]
            )
            for ctx in (current_context(), *active_primary_contexts()):
                if ctx and self._adopt(ctx):
                    break
        except BaseException:
            self._release()
            raise
        self._start_worker(self._run)

    def stop(self) -> None:
        from cuptistream.cupti import driver

        self._stopping.set()
        self._thread.join(timeout=float(self.config.window) + float(self.config.watchdog_timeout))
        if (
            self._configured
            and not driver.held_by_others(self.name)
            and not self._watchdog.wedged.is_set()
            and self._lock.acquire(timeout=1.0)
        ):
            # CUPTI detaches after us: unset first. While it stays attached the config is kept for
            # the process's next SASS session, because CUPTI 13.0 fails a SetConfig after an
            # UnsetConfig with OUT_OF_MEMORY.
            try:
                self._call("cuptiSassMetricsUnsetConfig", sass.unset_config, self.config.device)
                _kept_configs.pop(self.config.device, None)
            except CuptiError as error:
                self.emitter.report_error(
                    self._origin, str(error), severity="warning", result_code=error.code
                )
            finally:
                self._lock.release()
        self._configured = False
        self._release()

    # --- contexts -----------------------------------------------------------------------------

    def _adopt(self, ctx: int) -> bool:
        if self._ctx:
            return False
        try:
            device_id, _ = context_ids(ctx)
        except CuptiError:
            return False
        if device_id != self.config.device:
            return False
        self._ctx = ctx
        return True

    def _on_context_created(self, domain: int, cbid: int, data: Any) -> None:
        self._adopt(int(data.context))

    def _on_context_destroy(self, domain: int, cbid: int, data: Any) -> None:
        if int(data.context) == self._ctx:
            # A window in flight finishes (or times out) before the context goes.
            with self._lock:
                self._ctx = 0

    # --- windows ------------------------------------------------------------------------------

    def _run(self) -> None:
        cfg = self.config
        next_window = time.monotonic() + float(cfg.initial_delay)
        if self._throttle is not None:
            self._throttle.first()
            next_window += self._throttle.first_delay()
        while not self._stopping.wait(max(0.0, next_window - time.monotonic())):
            if self._watchdog.wedged.is_set() or (cfg.windows and self.windows_done >= cfg.windows):
                return
            next_window = time.monotonic() + float(cfg.period)
            if not self._ctx:
                continue
            try:
                if self._throttle is None:
                    self.window()
                else:
                    next_window = time.monotonic() + self._governed_window(self._throttle)
            except CuptiError as error:
                self.emitter.report_error(
                    self._origin, f"SASS window failed: {error}", result_code=error.code
                )
                next_window = time.monotonic() + max(float(cfg.period), 10.0)
            except Exception as error:  # never die silently: say so and stop opening windows
                self.emitter.report_error(
                    self._origin, f"SASS windows stopped: {type(error).__name__}: {error}"
                )
                return

    def _governed_window(self, throttle: Throttle) -> float:
        """One window as long as the governor plans, told what it cost; returns the pause after it.
        Waits while another source's window is open (``Governor.claim``)."""
        governor = throttle.governor
        while not governor.claim(self.name):
            if self._stopping.wait(CLAIM_RETRY_S):
                return 0.0
        try:
            before = self._host_seconds()
            began = time.monotonic()
            self.window(throttle.plan.window_s)
            elapsed = time.monotonic() - began
        finally:
            governor.release(self.name, settle_s=_SETTLE_S)
        host = self._host_seconds() - before
        window_s = min(elapsed, throttle.plan.window_s)  # patched kernels run slowly only while enabled
        cost = WindowCost(
            open_s=window_s, host_s=host, gpu_s=window_s * SASS_KERNEL_SLOWDOWN, elapsed_s=elapsed
        )
        return throttle.window_done(cost).pause_s

    def _host_seconds(self) -> float:
        """Seconds in Enable, GetDataProperties+FlushData, Disable and decoding, so far."""
        return sum(self.stats[key] for key in ("enable_s", "flush_s", "disable_s", "decode_s"))

    def window(self, seconds: float | None = None) -> None:
        """One collection window on the adopted context, ``seconds`` long (the configured window by
        default); also callable directly, e.g. by tests."""
        cfg = self.config
        with self._lock:
            ctx = self._ctx
            if not ctx:
                return
            _, context_id = context_ids(ctx)
            make_current(ctx)  # this worker thread has no context of its own
            if not self._configured:
                self._set_config()
            self._enable(ctx)
            self._stopping.wait(float(cfg.window) if seconds is None else seconds)
            buffer, instances = self._close(ctx)
            out = []
            if buffer is not None:
                decoding = time.perf_counter()
                # A fresh name cache per flush: CUPTI mallocs each record's name and we free them
                # below, so a pointer seen in an earlier flush may now hold another function's name.
                out = decode_sass_records(
                    LiveMemory(), buffer.address, buffer.records, instances, self.metric_names, {}
                )
                sass.free_function_names(buffer)
                self.stats["decode_s"] += time.perf_counter() - decoding
            self.windows_done += 1
            self.stats["windows"] += 1
            self.stats["records"] += len(out)
            self._tell_if_nothing_is_patched(bool(out))
            if out:
                # EVENT_RECORDS per event: a window's thousands of records would outgrow one event
                # buffer to the collector.
                timestamp = self._now()
                self.emitter.emit(
                    [
                        SassMetricBatch(
                            timestamp=timestamp,
                            device_id=cfg.device,
                            context_id=context_id,
                            records=out[i : i + EVENT_RECORDS],
                        )
                        for i in range(0, len(out), EVENT_RECORDS)
                    ]
                )

    def _tell_if_nothing_is_patched(self, recorded: bool) -> None:
        """Say once when windows keep getting nothing, rather than collect nothing in silence."""
        self._empty_windows = 0 if recorded else self._empty_windows + 1
        if self._empty_windows == _EMPTY_WINDOWS_TOLD:
            self.emitter.report_error(
                self._origin,
                f"{_EMPTY_WINDOWS_TOLD} SASS windows in a row got no record: either no kernel ran on "
                "the device, or CUPTI patched none (on CUPTI 13.0 a window records only if it opens "
                "while the program has no launch under way; see the sass source in docs/config.md)",
                severity="warning",
            )

    def _enable(self, ctx: int) -> None:
        began = time.perf_counter()
        self._call("cuptiSassMetricsEnable", sass.enable, ctx, self.config.lazy_patching)
        self.stats["enable_s"] += time.perf_counter() - began

    def _close(self, ctx: int) -> tuple[sass.FlushBuffer | None, int]:
        """GetDataProperties, FlushData and Disable: the window's buffer (None: no records) and the
        hardware instances per record."""
        buffer = None
        flushing = time.perf_counter()
        try:
            records, instances = self._call("cuptiSassMetricsGetDataProperties", sass.data_properties, ctx)
            if records and instances:
                buffer = sass.FlushBuffer(sass.flush_capacity(records, instances), instances)
                self._call("cuptiSassMetricsFlushData", sass.flush, ctx, buffer)
            self.stats["flush_s"] += time.perf_counter() - flushing
        finally:
            # Disable at once: kernels stay patched (slow) until then, and what they record after
            # FlushData is dropped. Decoding waits until after.
            self._disable(ctx)
        return buffer, instances

    def _disable(self, ctx: int) -> None:
        disabling = time.perf_counter()
        dropped = int(self._call("cuptiSassMetricsDisable", sass.disable, ctx))
        self.stats["disable_s"] += time.perf_counter() - disabling
        if dropped:  # records of kernels that ran after FlushData (all of them if it failed)
            self.stats["dropped"] += dropped
            self.emitter.report_loss(STAGE, "dropped_at_disable", dropped, unit="records")

    def _set_config(self) -> None:
        """SetConfig once per process and device, unless an earlier session left this very config."""
        cfg = self.config
        configs = [(metric_id, sass.GRANULARITY[cfg.granularity]) for metric_id in self.metric_names]
        kept = _kept_configs.get(cfg.device)
        if kept != configs:
            if kept is not None:
                self._call("cuptiSassMetricsUnsetConfig", sass.unset_config, cfg.device)
                del _kept_configs[cfg.device]
            self._call("cuptiSassMetricsSetConfig", sass.set_config, cfg.device, configs)
            _kept_configs[cfg.device] = configs
        self._configured = True

    def _call(self, name: str, fn: Any, *args: Any) -> Any:
        if self._watchdog.wedged.is_set():
            raise CuptiError(name, -1, "skipped: an earlier CUPTI call wedged")
        return self._watched(name, fn, *args)
