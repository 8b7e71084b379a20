"""NVML's GPU Performance Monitoring (GPM): device-level counters on Hopper and later, read through
``nvidia-ml-py`` (``pynvml``, NVIDIA's binding), with no CUDA context and no CUPTI.

A GPM sample is a snapshot of the device's counters; a metric is computed between two samples
(``nvmlGpmMetricsGet``). ``GpmSession`` takes a sample every interval on a thread of its own and
keeps the metrics of each consecutive pair, stamped with the clock it is given (CUPTI's in a probe,
so that samples line up with kernel records), until ``decode``. It answers the ``pm_sampling``
source as ``PmSamplingSession`` does (enable, configure, start, decode, stop, disable).

What a sample reads changes about every 100 ms: two samples closer together read zeros (on an
H100, 20 ms pairs read 0 for every metric under a GEMM loop that 100 ms pairs read at 93 % tensor
active), so intervals below ``MIN_INTERVAL_NS`` are refused. The counters are the device's, whoever
uses it: one sampler per device, as with CUPTI's PM sampling.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from cuptistream.cupti.pm_sampling_api import Decoded
from cuptistream.errors import ConfigError

MIN_INTERVAL_NS = 100_000_000
_MIB = float(1 << 20)
_PCT = ".pct_of_peak_sustained_elapsed"
_BYTES_PER_S = ".sum.per_second"
_MAX_PENDING = 100_000  # pairs held between decodes (about 3 hours at 100 ms): past it the oldest go

# DCGM profiling field -> (NVML_GPM_METRIC_* id, factor to the metric's unit). Percentages as NVML
# gives them; PCIe and NVLink in MiB/s there (nvml.h), bytes per second here.
GPM_FIELDS: dict[str, tuple[int, float]] = {
    "gr_engine_active": (1, 1.0),  # GRAPHICS_UTIL
    "sm_active": (2, 1.0),  # SM_UTIL
    "sm_occupancy": (3, 1.0),  # SM_OCCUPANCY
    "tensor_active": (5, 1.0),  # ANY_TENSOR_UTIL
    "tensor_hmma_active": (7, 1.0),  # HMMA_TENSOR_UTIL
    "tensor_imma_active": (9, 1.0),  # IMMA_TENSOR_UTIL
    "tensor_dmma_active": (8, 1.0),  # DMMA_TENSOR_UTIL
    "fp64_active": (11, 1.0),  # FP64_UTIL
    "fp32_active": (12, 1.0),  # FP32_UTIL
    "fp16_active": (13, 1.0),  # FP16_UTIL
    "dram_active": (10, 1.0),  # DRAM_BW_UTIL
    "pcie_rx_bytes": (21, _MIB),  # PCIE_RX_PER_SEC
    "pcie_tx_bytes": (20, _MIB),  # PCIE_TX_PER_SEC
    "nvlink_rx_bytes": (60, _MIB),  # NVLINK_TOTAL_RX_PER_SEC
    "nvlink_tx_bytes": (61, _MIB),  # NVLINK_TOTAL_TX_PER_SEC
}


def metric_name(field: str) -> str:
    """The name a GPM field's metric goes by in events: ``gpm__<field>`` with the unit's suffix."""
    return f"gpm__{field}{_BYTES_PER_S if field.endswith('_bytes') else _PCT}"


GPM_METRICS: dict[str, str] = {metric_name(field): field for field in GPM_FIELDS}  # metric -> field


def resolve_gpm_metrics(wanted: list[str] | None) -> list[str]:
    """The configured GPM metrics, or every one; ConfigError names an unknown one and the known."""
    if wanted is None:
        return list(GPM_METRICS)
    if not wanted:
        raise ConfigError("pm_sampling.metrics: list at least one metric, or leave it out for all of them")
    for name in wanted:
        if name not in GPM_METRICS:
            raise ConfigError(
                f"pm_sampling.metrics: {name!r} is not a GPM metric (backend: nvml); "
                f"known: {', '.join(GPM_METRICS)}"
            )
    return list(wanted)


class GpmUnavailable(ValueError):
    """NVML or GPM is not there for this device (no driver library, a chip before Hopper, a MIG
    instance): the line says which."""


def gpm_supported(session: GpmSession) -> bool:
    """Whether NVML's GPM can sample the device of ``session`` (enabled, then disabled again); False
    without a driver, on a chip before Hopper, on a MIG instance, or for a device NVML does not know."""
    try:
        session.enable()
    except GpmUnavailable:
        return False
    session.disable()
    return True


class GpmSession:
    """GPM sampling of one device, found by ``uuid`` (CUDA's ordinals and NVML's indexes differ where
    ``CUDA_VISIBLE_DEVICES`` is set). ``clock`` stamps the samples; ``nvml`` is the ``pynvml`` module
    (tests without a driver hand in a stand-in). Failure modes: ``GpmUnavailable`` from ``enable``;
    ``configure`` raises ValueError for an interval below ``MIN_INTERVAL_NS``; ``start`` raises
    ``GpmUnavailable`` where the first sample fails; a sample that fails while sampling loses the
    pairs it belonged to, sampling goes on, and ``decode`` says how many failed and why. A pair whose
    metrics NVML cannot compute reads NaN."""

    def __init__(self, uuid: str, clock: Callable[[], int], nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self.uuid = uuid
        self._clock = clock
        self._handle: Any = None
        self._metrics: list[tuple[int, float]] = []
        self._interval_s = 0.0
        self._pending: list[tuple[int, int, list[float]]] = []
        self._dropped = False
        self._failed = 0  # samples NVML failed since the last decode
        self._failure = ""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._initialized = False

    def enable(self) -> str:
        """Initialize NVML and check GPM on the device; returns the device's name."""
        nv = self._nvml
        try:
            nv.nvmlInit()
            self._initialized = True
            self._handle = nv.nvmlDeviceGetHandleByUUID(self.uuid)
            supported = nv.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice
            name = nv.nvmlDeviceGetName(self._handle)
        except nv.NVMLError as error:
            self.disable()
            raise GpmUnavailable(f"NVML cannot sample GPU {self.uuid}: {error}") from None
        except OSError as error:  # no libnvidia-ml.so: no driver on this host
            self.disable()
            raise GpmUnavailable(f"NVML is not installed here ({error})") from None
        if not supported:
            self.disable()
            raise GpmUnavailable(f"{name} ({self.uuid}) has no GPM (Hopper and later only)")
        return str(name.decode() if isinstance(name, bytes) else name)

    def configure(self, metrics: list[str], interval_ns: int, hardware_buffer_bytes: int) -> list[str]:
        """Sample ``metrics`` (``GPM_METRICS`` names) every ``interval_ns``; the buffer is not used."""
        if interval_ns < MIN_INTERVAL_NS:
            raise ValueError(
                f"GPM refreshes its counters about every {MIN_INTERVAL_NS // 1_000_000} ms: an interval of "
                f"{interval_ns / 1e6:g} ms would read zeros"
            )
        self._metrics = [GPM_FIELDS[GPM_METRICS[name]] for name in metrics]
        self._interval_s = interval_ns / 1e9
        return list(metrics)

    def start(self) -> None:
        """Allocate the two samples, take the first, and start the thread. An ``NVMLError`` from the
        allocation is raised here, to the caller, not lost on the thread; a first sample that fails
        (no permission, the GPU lost) raises ``GpmUnavailable`` naming NVML's error."""
        nv = self._nvml
        samples = [nv.nvmlGpmSampleAlloc()]
        try:
            samples.append(nv.nvmlGpmSampleAlloc())
        except nv.NVMLError:
            nv.nvmlGpmSampleFree(samples[0])
            raise
        try:
            nv.nvmlGpmSampleGet(self._handle, samples[0])
        except nv.NVMLError as error:
            for sample in samples:
                nv.nvmlGpmSampleFree(sample)
            raise GpmUnavailable(f"NVML takes no GPM sample of GPU {self.uuid}: {error}") from None
        first = self._clock()
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, args=(samples, first), name="cuptistream-gpm", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def decode(self, max_samples: int = 0) -> Decoded:
        """The pairs sampled since the last decode; ``overflow`` where some were dropped meanwhile."""
        with self._lock:
            pending, self._pending = self._pending, []
            dropped, self._dropped = self._dropped, False
            failed, self._failed = self._failed, 0
            failure = self._failure
        values = [[row[m] for _, _, row in pending] for m in range(len(self._metrics))]
        starts, ends = [s for s, _, _ in pending], [e for _, e, _ in pending]
        return Decoded(starts, ends, values, dropped, "end_of_records", failed=failed, failure=failure)

    def disable(self) -> None:
        self.stop()
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # NVML gone with the driver: nothing left to free
                pass

    # --- the sampling thread --------------------------------------------------------------------

    def _run(self, samples: list[Any], first: int) -> None:
        nv = self._nvml
        try:
            before: int | None = first
            while not self._stopping.wait(self._interval_s):
                after = self._take(samples[1])
                if before is not None and after is not None:
                    self._keep(before, after, self._read(samples[0], samples[1]))
                samples.reverse()
                before = after
        finally:
            for sample in samples:
                nv.nvmlGpmSampleFree(sample)

    def _take(self, sample: Any) -> int | None:
        """The clock after a sample of the device; None where NVML failed it (counted for ``decode``:
        the pairs on either side of it are lost)."""
        try:
            self._nvml.nvmlGpmSampleGet(self._handle, sample)
        except self._nvml.NVMLError as error:
            with self._lock:
                self._failed += 1
                self._failure = str(error)
            return None
        return self._clock()

    def _read(self, first: Any, second: Any) -> list[float]:
        nv = self._nvml
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._metrics)
        request.sample1, request.sample2 = first, second
        for slot, (metric_id, _) in zip(request.metrics, self._metrics, strict=False):
            slot.metricId = metric_id
        try:
            nv.nvmlGpmMetricsGet(request)
        except nv.NVMLError:
            return [math.nan] * len(self._metrics)
        return [
            float(slot.value) * factor if slot.nvmlReturn == 0 else math.nan
            for slot, (_, factor) in zip(request.metrics, self._metrics, strict=False)
        ]

    def _keep(self, start: int, end: int, values: list[float]) -> None:
        with self._lock:
            if len(self._pending) >= _MAX_PENDING:
                del self._pending[0]
                self._dropped = True
            self._pending.append((start, end, values))
