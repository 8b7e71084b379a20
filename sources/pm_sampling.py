"""PM sampling source (type ``pm_sampling``): one device's hardware counters, sampled always.

CUPTI's PM sampling API (``cupti_pmsampling.h``) has the GPU write a sample of the configured
counters every ``interval`` of GPU time into a hardware buffer in device memory. A worker thread of
the source waits for a CUDA context on ``device`` (PM sampling needs one), then

    Enable → SetConfig (once) → Start → every ``decode_period``: DecodeData + evaluate → Stop → Disable

and emits one ``PmSamples`` event per decode. With ``backend: nvml`` (what ``auto``, the default,
picks on a GPU with GPM) NVML's GPM answers the same steps (``cuptistream.nvml.gpm``).

Under a probe, one process per GPU on the node samples it:
after the context, the worker asks the collector for the device (by UUID, ``probe.samplers``) and
enables nothing until granted; it is granted when the sampler before it stopped or left, and then
reports the samples missing over the hand-over (a Loss and an ``info`` Error). Driven without a
collector, the source samples as soon as it finds the context. The metric list is the default set for the chip
(``cuptistream.cupti.pm_metrics``) or the configured one, checked before anything is enabled.

Losses: a hardware buffer that filled up between decodes (``overflow``) is a Loss of the samples that
did not fit (estimated from the time they would have covered); a decode stopped for another reason
than the end of the records is an Error. Counters held by another tool (one owner per device: DCGM,
Nsight) are one warning naming the holder and the fix; the source then stands by, keeping its grant,
and tries again (``standby``, ``pm_standby``) until they free up, reported as a Loss of the samples
missed and an ``info`` Error. Counters not ours to read (the driver's admin-only default) are one
Error naming the driver option, and the source ends: that does not change while the process runs.
The rest of the session runs on in both cases. A metrics window of this process
(``cuptistream trace --metrics``) borrows the counters (``counter_loans``): sampling stops and
disables for the window's length, and the samples missed are a Loss (``counters_lent``). A CUPTI
call that does not return within ``watchdog_timeout`` stops the source with an Error event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from cuptistream.channel.messages import GpmAsk
from cuptistream.config import Duration, SourceConfig, require_at_least, require_positive
from cuptistream.cupti import counter_holders, counter_loans
from cuptistream.cupti.pm_metrics import choose_metrics
from cuptistream.cupti.pm_sampling_api import (
    CountersHeld,
    CountersUnavailable,
    Decoded,
    NoCounterPermission,
    PmSamplingSession,
)
from cuptistream.errors import ConfigError, UserError
from cuptistream.events import PmSamples, nan_as_none
from cuptistream.nvml.gpm import (
    MIN_INTERVAL_NS,
    GpmSession,
    GpmUnavailable,
    gpm_supported,
    resolve_gpm_metrics,
)

from .cupti_worker import CuptiWorkerSource
from .pm_lending import Lending
from .pm_standby import CounterRetryConfig, Standby

if TYPE_CHECKING:
    from cuptistream.channel.messages import SamplerGrant
    from cuptistream.plugin import DeviceGrants

STAGE = "pm_sampling"
_NVML_INSTEAD = (
    "on Hopper and later GPUs, pm_sampling.backend: nvml (or auto) reads the same fields through NVML"
)
_CONTEXT_POLL_S = 0.5  # how often the worker looks for the device's context before it has one
_MAX_DECODES_IN_A_ROW = 16  # a counter data image that keeps filling up: decode again at most this often
# A sampler that was killed: the driver frees its counters as the process ends, about when its
# connection ends and the device is handed on. The next one retries Enable this long.
_TAKEOVER_S = 5.0


class PmSamplingConfig(SourceConfig):
    # cupti: CUPTI's PM sampling, in the probe; nvml: NVML's GPM (Hopper and later), device-level;
    # auto: nvml where the device has GPM, unless the interval or the metrics ask for CUPTI.
    backend: Literal["auto", "cupti", "nvml"] = "auto"
    # The counters; None: the default set for the chip (docs/config.md lists it per chip).
    metrics: list[str] | None = None
    device: int = 0
    interval: Duration | None = None  # time between samples; None: 20 ms (cupti), 100 ms (nvml)
    decode_period: Duration = Duration(1.0)  # how often the hardware buffer is decoded
    hardware_buffer: int = 64 << 20  # bytes of device memory for samples between decodes
    watchdog_timeout: Duration = Duration(30.0)
    # While another tool holds the counters: try Enable again after these waits.
    standby: CounterRetryConfig = msgspec.field(default_factory=CounterRetryConfig)

    def __post_init__(self) -> None:
        require_at_least("device", self.device, 0)
        for key in ("interval", "decode_period", "watchdog_timeout"):
            if getattr(self, key) is not None:
                require_positive(key, getattr(self, key))
        if self.interval_ns < 10_000:  # in whole ns: 10us parses as 9.999...e-06 s
            raise ValueError(f"interval must be at least 10us, got {self.interval_s * 1e6:g}us")
        if self.backend == "nvml" and self.interval_ns < MIN_INTERVAL_NS:
            raise ValueError(
                f"interval must be at least {MIN_INTERVAL_NS // 1_000_000}ms with backend: nvml (GPM's "
                f"counters change about every 100 ms; closer samples read zeros), "
                f"got {self.interval_s * 1e3:g}ms"
            )
        if self.backend == "cupti" and self._names_gpm:
            raise ValueError("metrics: gpm__ names are NVML's GPM metrics; use backend: nvml (or auto)")
        if self.metrics is not None and (self.backend == "nvml" or self._names_gpm):
            try:  # names CUPTI's catalog does not hold: checked here, not once sampling begins
                resolve_gpm_metrics(self.metrics)
            except ConfigError as error:
                raise ValueError(str(error)) from None
        if self.backend == "auto" and self._names_gpm and self.interval_ns < MIN_INTERVAL_NS:
            raise ValueError(
                f"interval must be at least {MIN_INTERVAL_NS // 1_000_000}ms for GPM metrics (gpm__...), "
                f"got {self.interval_s * 1e3:g}ms"
            )
        if float(self.decode_period) < self.interval_s:
            raise ValueError("decode_period must be at least interval")
        require_at_least("hardware_buffer", self.hardware_buffer, 1 << 20)

    @property
    def _names_gpm(self) -> bool:
        """``metrics`` names NVML's GPM metrics (``gpm__...``): only ``nvml`` samples them."""
        return bool(self.metrics) and any(name.startswith("gpm__") for name in self.metrics or ())

    def for_device(self, has_gpm: bool) -> PmSamplingConfig:
        """This config with ``backend: auto`` decided for a device: ``nvml`` where it has GPM and
        nothing asks for CUPTI (an interval under GPM's 100 ms, CUPTI metric names), else ``cupti``.
        On an H100 with CUPTI 13.0, GPM read the loads right where CUPTI's PM sampling returned no
        sample (docs/performance.md)."""
        if self.backend != "auto":
            return self
        wants_cupti = (self.interval is not None and self.interval_ns < MIN_INTERVAL_NS) or (
            self.metrics is not None and not self._names_gpm
        )
        nvml = self._names_gpm or (has_gpm and not wants_cupti)
        return msgspec.structs.replace(self, backend="nvml" if nvml else "cupti")

    @property
    def interval_s(self) -> float:
        if self.interval is not None:
            return float(self.interval)
        gpm = self.backend == "nvml" or (self.backend == "auto" and self._names_gpm)
        return MIN_INTERVAL_NS / 1e9 if gpm else 0.02

    @property
    def interval_ns(self) -> int:
        return round(self.interval_s * 1e9)

    @property
    def samples_per_decode(self) -> int:
        """Room for two decode periods of samples in one counter data image (a late decode)."""
        return max(16, 2 * round(float(self.decode_period) / self.interval_s))


class PmSamplingSource(CuptiWorkerSource):
    config_type = PmSamplingConfig
    config: PmSamplingConfig
    label = "PM sampling"
    # CUPTI's side; tests without a GPU hand in a stand-in that behaves as CUPTI does.
    session_factory: Callable[[int], Any] = PmSamplingSession
    find_context: Callable[[int], int] | None = None  # device -> a context on it (0: none yet)
    grants: DeviceGrants | None = None  # who samples the device: the collector decides (None: alone)
    # NVML's side (``backend: nvml``): device UUID and clock -> a GPM session; a stand-in in tests.
    gpm_factory: Callable[[str, Callable[[], int]], Any] = GpmSession

    def use_grants(self, grants: DeviceGrants) -> None:
        """Sample only once the collector grants this process the device (``probe.samplers``)."""
        self.grants = grants

    def start(self) -> None:
        if self.session_factory is PmSamplingSession:
            from cuptistream.cupti import driver

            driver.require_gpu()
        self._stopping = threading.Event()
        self._wake = threading.Event()  # set by stop() and by a metrics window's loan
        self.chip = ""
        self.metrics: list[str] = []
        self._left_out_said = False  # the default metrics CUPTI does not sample, named once
        self._failure_said = ""  # the last reason given for failed GPM samples
        self.stats: dict[str, float] = {
            "decodes": 0, "samples": 0, "lost_samples": 0, "decode_s": 0.0, "granted": 0, "grant_wait_s": 0.0,
            "standby_s": 0.0, "standbys": 0, "in_collector": 0,
        }  # fmt: skip
        self._handover: SamplerGrant | None = None  # taken over: the gap is reported at the first samples
        self._granted_at = 0
        self._last_end = 0
        self._hold_cupti(float(self.config.watchdog_timeout))
        self._start_worker(self._run)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=float(self.config.decode_period) + float(self.config.watchdog_timeout))
        self._release()

    # --- the worker -------------------------------------------------------------------------

    def _run(self) -> None:
        cfg = self.config
        session = None
        uuid = ""
        try:
            if not self._wait_for_context():
                return
            uuid = self.grants.uuid_of(cfg.device) if self.grants is not None else ""
            # Made (``auto`` decided) before the ask, which says how it would sample; named ``session``
            # only once granted, so that a stop while waiting disables nothing never enabled.
            prepared = self._new_session(uuid)
            if uuid and not self._wait_for_grant(uuid):
                return
            session = prepared
            if not self._begin_or_stand_by(session):
                return
            self._last_decode = time.monotonic()
            lending = Lending(self._wake)
            counter_loans.register(cfg.device, lending)
            try:
                if not self._sample(session, lending):
                    return
            finally:
                counter_loans.unregister(cfg.device, lending)
            self._call("Stop", session.stop)
            self._decode(session)  # what the buffer held at Stop
        except GpmUnavailable as error:
            self.emitter.report_error(self._origin, f"{error}; use pm_sampling.backend: cupti")
        except NoCounterPermission as error:
            self.emitter.report_error(self._origin, f"{error}; {_PERMISSION_FIX}", result_code=error.code)
        except CountersUnavailable as error:  # held, and retrying is off
            message = f"{self._held_message(error)}; pm_sampling.standby.enabled is false: no sampling here"
            self.emitter.report_error(self._origin, message, "warning", error.code)
        except (ConfigError, UserError) as error:
            self.emitter.report_error(self._origin, str(error))
        except ValueError as error:  # SetConfig refused
            self.emitter.report_error(
                self._origin, f"{error}; change pm_sampling.metrics or pm_sampling.interval"
            )
        except Exception as error:  # never die silently
            message = f"PM sampling stopped: {type(error).__name__}: {error}"
            if self.config.backend == "cupti":  # e.g. CUPTI_ERROR_UNKNOWN from DecodeData (seen on an H100)
                message += f"; {_NVML_INSTEAD}"
            self.emitter.report_error(self._origin, message)
        finally:
            if session is not None and not self._watchdog.wedged.is_set():
                try:
                    self._call("Disable", session.disable)
                except Exception as error:
                    self.emitter.report_error(
                        self._origin, f"disabling PM sampling failed: {error}", "warning"
                    )
            # After Disable, the next sampler can enable (a wedged call may still hold the counters:
            # then the device is handed on when this process leaves).
            if uuid and self.grants is not None and not self._watchdog.wedged.is_set():
                self.grants.release(uuid, self.name, self._last_end)

    def _new_session(self, uuid: str) -> Any:
        """The device side: ``session_factory``'s, or with ``backend: nvml`` ``gpm_factory``'s.
        Decides ``backend: auto`` first (``PmSamplingConfig.for_device``)."""
        if self.config.backend != "cupti":
            gpm = self.gpm_factory(uuid or _uuid_of(self.config.device), self._now)
            if self.config.backend == "auto":
                self.config = self.config.for_device(gpm_supported(gpm))
            if self.config.backend == "nvml":
                return gpm
        return self.session_factory(self.config.device)

    def _sample(self, session: Any, lending: Lending) -> bool:
        """Decode every ``decode_period`` until stopped (True); lend the counters when a metrics
        window asks. False: a CUPTI call wedged, or the source stopped while they were lent."""
        period = float(self.config.decode_period)
        due = time.monotonic() + period
        while True:
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()  # the flags below say why it woke
            if self._stopping.is_set():
                return True
            if self._watchdog.wedged.is_set():
                return False
            if lending.asked.is_set():
                if not self._lend(session, lending):
                    return False
                due = time.monotonic() + period
            elif time.monotonic() >= due:
                self._decode(session)
                due = time.monotonic() + period

    def _lend(self, session: Any, lending: Lending) -> bool:
        """Stop and disable for a metrics window, until every loan is over, then sample again. The
        samples missed meanwhile are a Loss (``counters_lent``). False: stopped first."""
        self._call("Stop", session.stop)
        self._decode(session)  # what the buffer held at Stop
        self._call("Disable", session.disable)
        began = time.monotonic()
        lending.let_go()
        while lending.asked.is_set() and not self._stopping.is_set():
            self._wake.wait(_CONTEXT_POLL_S)
            self._wake.clear()
        lending.taken_up()
        missed = round((time.monotonic() - began) / self.config.interval_s)
        if missed:
            self.stats["lost_samples"] += missed
            self.emitter.report_loss(STAGE, "counters_lent", missed, unit="samples")
        if self._stopping.is_set():
            return False
        self._last_decode = time.monotonic()
        return self._begin_or_stand_by(session)

    def _wait_for_grant(self, uuid: str) -> bool:
        """Ask the collector for the device and wait; while the collector samples it itself (NVML's
        GPM), wait on. False: stopped first."""
        assert self.grants is not None
        cfg = self.config
        gpm = None
        if cfg.backend == "nvml":
            decode_ns = round(float(cfg.decode_period) * 1e9)
            gpm = GpmAsk(
                interval_ns=cfg.interval_ns,
                metrics=resolve_gpm_metrics(cfg.metrics),
                decode_period_ns=decode_ns,
            )
        began = time.monotonic()
        grant = self.grants.wait(uuid, self.name, self._stopping, gpm)
        while grant is not None and grant.collector:
            if not self.stats["in_collector"]:
                self.emitter.report_error(
                    self._origin,
                    f"PM sampling of device {cfg.device} ({uuid}) runs in the collector (NVML's GPM): "
                    "this process samples nothing while it does",
                    severity="info",
                )
            self.stats["in_collector"] = 1
            grant = self.grants.wait(uuid, self.name, self._stopping, gpm, ask=False)
        self.stats["grant_wait_s"] = time.monotonic() - began
        if grant is None:
            return False
        self.stats["granted"] = 1
        self._granted_at = self._now()
        self._handover = grant if grant.previous else None
        return True

    def _begin_or_stand_by(self, session: Any) -> bool:
        """Enable, SetConfig and Start; while another tool holds the counters, stand by and try
        again. False: stopped while standing by."""
        standby: Standby | None = None
        begun = False
        try:
            while True:
                try:
                    self._begin(session)
                    begun = True
                    return True
                except CountersHeld as error:
                    self._call("Disable", session.disable)  # the next try starts clean
                    if not self.config.standby.enabled:
                        raise
                    if standby is None:
                        standby = self._stand_by(error)
                    if self._stopping.wait(standby.next_wait()):
                        return False
        finally:
            if standby is not None:  # resumed, stopped, or failed otherwise once free
                self._end_standby(standby, resumed=begun)

    def _begin(self, session: Any) -> None:
        cfg = self.config
        self.chip = self._enable(session)
        if cfg.backend == "nvml":
            self.metrics = resolve_gpm_metrics(cfg.metrics)
        else:
            self.metrics = choose_metrics(cfg.metrics, self.chip).metrics
        taken: list[str] = self._call(
            "SetConfig", session.configure, self.metrics, cfg.interval_ns, cfg.hardware_buffer
        )
        if taken != self.metrics:
            left_out = ", ".join(m for m in self.metrics if m not in taken)
            if cfg.metrics is not None:
                raise ValueError(f"CUPTI's PM sampling on {self.chip} does not sample {left_out}")
            if not self._left_out_said:  # said once, not again each time sampling begins after a loan
                self._left_out_said = True
                self.emitter.report_error(
                    self._origin,
                    f"PM sampling on {self.chip}: CUPTI does not sample {left_out}; the other {len(taken)} "
                    "default metrics are sampled",
                    severity="info",
                )
            self.metrics = taken
        self._call("Start", session.start)

    def _enable(self, session: Any) -> str:
        """Enable; after a hand-over, retried while the previous sampler's counters are still held."""
        deadline = time.monotonic() + (_TAKEOVER_S if self._handover is not None else 0.0)
        while True:
            try:
                chip: str = self._call("Enable", session.enable)
                return chip
            except CountersHeld:
                if time.monotonic() >= deadline or self._stopping.wait(_CONTEXT_POLL_S):
                    raise

    def _stand_by(self, error: CountersHeld) -> Standby:
        """The one warning; the grant is kept (another probe would find the counters held too)."""
        standby = Standby(self.config.standby)
        if self._handover is not None:  # the hand-over's gap ends here; the standby's begins
            self._report_gap(self._handover, self._now())
        self.stats["standbys"] += 1
        self.emitter.report_error(
            self._origin,
            f"{self._held_message(error)}; standing by: Enable retried {standby.schedule()}, sampling "
            "resumes once they are free",
            "warning",
            error.code,
        )
        return standby

    def _held_message(self, error: CountersUnavailable) -> str:
        return f"{error}, likely {counter_holders.describe()}"

    def _end_standby(self, standby: Standby, resumed: bool) -> None:
        """The samples missed while standing by (a Loss), and, sampling again, one info line."""
        seconds = standby.seconds()
        missed = standby.missed(self.config.interval_s)
        self.stats["standby_s"] += seconds
        if missed:
            self.stats["lost_samples"] += missed
            self.emitter.report_loss(STAGE, "counters_held", missed, unit="samples")
        if resumed:
            self.emitter.report_error(
                self._origin,
                f"PM sampling of device {self.config.device} resumed: the counters were free again after "
                f"{seconds:.1f}s standing by ({standby.attempts} tries, {missed} samples missed)",
                severity="info",
            )

    def _wait_for_context(self) -> bool:
        """Until a CUDA context exists on the device (made current on this thread); False: stopped."""
        find = self.find_context or _primary_context
        while True:
            ctx = find(self.config.device)
            if ctx:
                if self.find_context is None:
                    from cuptistream.cupti.contexts import make_current

                    make_current(ctx)
                return True
            if self._stopping.wait(_CONTEXT_POLL_S):
                return False

    def _decode(self, session: Any) -> None:
        """Decode until the hardware buffer is empty; emit the samples, the losses and the errors."""
        began = time.perf_counter()
        now = time.monotonic()
        since, self._last_decode = self._last_decode, now
        starts: list[int] = []
        ends: list[int] = []
        columns: list[list[float]] = [[] for _ in self.metrics]
        overflow = False
        failed = 0
        for _ in range(_MAX_DECODES_IN_A_ROW):
            got: Decoded = self._call("DecodeData", session.decode, self.config.samples_per_decode)
            starts += got.starts
            ends += got.ends
            for column, values in zip(columns, got.values, strict=True):
                column += values
            overflow = overflow or got.overflow
            failed += got.failed
            if got.stop_reason != "counter_data_full":
                if got.stop_reason == "other":
                    self.emitter.report_error(
                        self._origin,
                        "PM sampling decode stopped early (CUPTI's reason: other)",
                        severity="warning",
                    )
                break
        self.stats["decodes"] += 1
        self.stats["samples"] += len(ends)
        if failed:
            self._report_failed(failed, got.failure)
        if overflow:
            # Oldest kept: the samples past a full buffer were never written. Estimate them from the
            # time since the last decode.
            expected = round((now - since) / self.config.interval_s)
            lost = max(1, expected - len(ends))
            self.stats["lost_samples"] += lost
            self.emitter.report_loss(STAGE, "hardware_buffer_full", lost, unit="samples")
        self.stats["decode_s"] += time.perf_counter() - began
        if ends:
            if self._handover is not None:
                self._report_gap(self._handover, starts[0])
            self._last_end = ends[-1]
            self.emitter.emit(
                [
                    PmSamples(
                        device_id=self.config.device,
                        chip=self.chip,
                        metrics=list(self.metrics),
                        starts=starts,
                        ends=ends,
                        values=[nan_as_none(column) for column in columns],
                    )
                ]
            )

    def _report_failed(self, failed: int, failure: str) -> None:
        """Samples the device did not give (NVML's GPM): a loss each decode, and a warning each time
        the reason changes, not every second while it lasts."""
        self.stats["lost_samples"] += failed
        self.emitter.report_loss(STAGE, "sample_failed", failed, unit="samples")
        if failure != self._failure_said:
            self._failure_said = failure
            self.emitter.report_error(
                self._origin,
                f"{failed} GPM samples of device {self.config.device} failed ({failure}); the intervals "
                "on either side of each are missing, and sampling goes on",
                severity="warning",
            )

    def _report_gap(self, grant: SamplerGrant, first: int) -> None:
        """The samples missing between the previous sampler's last and this one's first."""
        self._handover = None
        since = grant.since or self._granted_at  # unknown: samples are missing from the grant on, at least
        missing = max(0, first - since) // self.config.interval_ns
        if missing:
            self.stats["lost_samples"] += missing
            self.emitter.report_loss(STAGE, "sampler_handover", missing, unit="samples")
        known = "" if grant.since else "; at least: the previous sampler left before its last samples came"
        self.emitter.report_error(
            self._origin,
            f"PM sampling of device {grant.uuid} taken over from pid {grant.previous}: samples are missing "
            f"between {since} and {first} (CUPTI clock ns{known})",
            severity="info",
        )

    def _call(self, step: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn`` under the watchdog, named as the backend's call for ``step`` (Enable, SetConfig,
        Start, DecodeData, Stop, Disable)."""
        name = f"NVML GPM {step}" if self.config.backend == "nvml" else f"cuptiPmSampling{step}"
        if self._watchdog.wedged.is_set():
            raise RuntimeError(f"{name} skipped: an earlier CUPTI call wedged")
        return self._watched(name, fn, *args)


_PERMISSION_FIX = (
    "allow it with the driver option NVreg_RestrictProfilingToAdminUsers=0 (in /etc/modprobe.d, then "
    "reload the driver or reboot), or give the sampling program CAP_SYS_ADMIN (it samples in its own "
    "process, not in the collector); not retried: this does not change while the program runs"
)


def _uuid_of(device: int) -> str:
    """The UUID of CUDA device ``device`` as NVML names it; "" where it is not visible."""
    from cuptistream.cupti.gpus import visible_devices

    return next((d.uuid for d in visible_devices() if d.device_id == device), "")


def _primary_context(device: int) -> int:
    """An active primary context on ``device``, or 0."""
    from cuptistream.cupti.contexts import active_primary_contexts, context_ids

    for ctx in active_primary_contexts():
        try:
            if context_ids(ctx)[0] == device:
                return ctx
        except Exception:
            continue
    return 0
