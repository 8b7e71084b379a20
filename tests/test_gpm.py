"""The ``pm_sampling`` source's NVML GPM backend (``backend: nvml``) without a GPU. NVML needs the
NVIDIA driver's ``libnvidia-ml``, which this machine lacks: ``StandInNvml`` answers as ``pynvml``
does (the real binding's ctypes structures and error class, values made up per metric), so what is
tested is the session's sampling, pairing, units and failure paths, and the source's config."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from cuptistream.config import convert
from cuptistream.cupti import driver
from cuptistream.cupti.pm_metrics import field_of, unit_of
from cuptistream.events import PmSamples
from cuptistream.nvml.gpm import GPM_FIELDS, GPM_METRICS, GpmSession, GpmUnavailable, metric_name
from cuptistream.sources.pm_sampling import PmSamplingConfig, PmSamplingSource
from cuptistream.statistics.pm_fold import PmFold
from tests.test_pm_sampling_source import StandInSession
from tests.test_sass_window import RecordingEmitter

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
MS = 1_000_000


class StandInNvml:
    """``pynvml``'s GPM calls as a driver answers them. Metric ``m`` reads ``m`` (MiB/s for the
    links); NVLink reads NOT_SUPPORTED, as on a GPU without NVLink."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(
        self, gpm: bool = True, driver: bool = True, samples: int = 2, failing: frozenset[int] = frozenset()
    ) -> None:
        self.gpm, self.driver = gpm, driver
        self.samples_left = samples  # allocations that succeed before NVML answers out of memory
        self.failing = failing  # which sample gets (1: the first) NVML refuses
        self.samples_taken = 0
        self.freed = 0
        self.shut_down = False

    def nvmlInit(self) -> None:
        if not self.driver:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlGpmQueryDeviceSupport(self, handle: str) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(self.gpm)
        return support

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA H100 80GB HBM3" if self.gpm else "Tesla V100-SXM2-16GB"

    def nvmlGpmSampleAlloc(self) -> Any:
        if self.samples_left == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_MEMORY)
        self.samples_left -= 1
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed += 1

    def nvmlGpmSampleGet(self, handle: str, sample: Any) -> Any:
        self.samples_taken += 1
        if self.samples_taken in self.failing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        for slot in request.metrics[: request.numMetrics]:
            links = slot.metricId in (60, 61)
            slot.nvmlReturn = NOT_SUPPORTED if links else 0
            slot.value = float(slot.metricId)
        return request

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def _no_cupti(device: int) -> Any:
    raise AssertionError("backend: nvml made a CUPTI session")


def _clock() -> Iterator[int]:
    return itertools.count(1_000 * MS, 100 * MS)


def test_a_session_pairs_consecutive_samples_in_the_metrics_units() -> None:
    nvml = StandInNvml()
    ticks = _clock()
    session = GpmSession("GPU-1", lambda: next(ticks), nvml=nvml)
    assert session.enable() == "NVIDIA H100 80GB HBM3"
    metrics = list(GPM_METRICS)
    assert session.configure(metrics, 100 * MS, 0) == metrics
    session.start()
    time.sleep(0.45)
    session.stop()
    got = session.decode()
    session.disable()
    assert len(got.ends) >= 2 and not got.overflow
    assert got.starts[1:] == got.ends[:-1] and all(
        e - s == 100 * MS for s, e in zip(got.starts, got.ends, strict=True)
    )
    values = dict(zip(metrics, got.values, strict=True))
    assert values[metric_name("sm_active")][0] == 2.0  # SM_UTIL, a percentage as NVML gives it
    assert values[metric_name("pcie_rx_bytes")][0] == 21 * 2**20  # PCIE_RX_PER_SEC: MiB/s -> B/s
    assert all(math.isnan(v) for v in values[metric_name("nvlink_rx_bytes")])
    assert nvml.freed == 2 and nvml.shut_down
    assert session.decode().ends == []  # decoded once


def test_a_sample_nvml_cannot_allocate_fails_start_and_frees_the_other() -> None:
    nvml = StandInNvml(samples=1)
    session = GpmSession("GPU-1", lambda: 0, nvml=nvml)
    session.enable()
    session.configure(list(GPM_METRICS), 100 * MS, 0)
    with pytest.raises(pynvml.NVMLError):
        session.start()
    session.disable()
    assert nvml.freed == 1 and nvml.samples_taken == 0 and nvml.shut_down


def test_a_first_sample_nvml_refuses_fails_start_naming_nvmls_reason() -> None:
    nvml = StandInNvml(failing=frozenset({1}))
    session = GpmSession("GPU-1", lambda: 0, nvml=nvml)
    session.enable()
    session.configure(list(GPM_METRICS), 100 * MS, 0)
    with pytest.raises(
        GpmUnavailable, match="NVML takes no GPM sample of GPU GPU-1: Insufficient Permissions"
    ):
        session.start()
    session.disable()
    assert nvml.freed == 2 and nvml.shut_down


def test_gpm_metric_names_carry_their_field_and_unit() -> None:
    for name, field in GPM_METRICS.items():
        assert field_of(name) == field and field in GPM_FIELDS
        assert unit_of(name) == ("B/s" if field.endswith("_bytes") else "%")


def test_an_interval_below_what_gpm_refreshes_is_refused() -> None:
    session = GpmSession("GPU-1", lambda: 0, nvml=StandInNvml())
    session.enable()
    with pytest.raises(ValueError, match="read zeros"):
        session.configure(list(GPM_METRICS), 20 * MS, 0)
    session.disable()


@pytest.mark.parametrize(
    ("nvml", "fragment"),
    [
        (StandInNvml(gpm=False), "has no GPM (Hopper and later only)"),
        (StandInNvml(driver=False), "NVML cannot"),
    ],
)
def test_no_gpm_or_no_driver_is_one_line(nvml: StandInNvml, fragment: str) -> None:
    with pytest.raises(GpmUnavailable) as caught:
        GpmSession("GPU-1", lambda: 0, nvml=nvml).enable()
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"interval": "20ms"}, "interval must be at least 100ms with backend: nvml"),
        ({"metrics": ["sm__cycles_active.avg.pct_of_peak_sustained_elapsed"]}, "is not a GPM metric"),
        ({"metrics": []}, "list at least one metric"),
        ({"backend": "dcgm"}, "backend"),
        ({"backend": "cupti", "metrics": [metric_name("sm_active")]}, "use backend: nvml (or auto)"),
    ],
)
def test_bad_nvml_config_values_are_one_line(config: dict[str, Any], fragment: str) -> None:
    with pytest.raises(Exception) as caught:
        convert({"type": "pm_sampling", "backend": "nvml", **config}, PmSamplingConfig)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_nvml_backend_samples_every_100ms_by_default() -> None:
    config = convert({"type": "pm_sampling", "backend": "nvml"}, PmSamplingConfig)
    assert config.interval_ns == 100 * MS
    assert convert({"type": "pm_sampling"}, PmSamplingConfig).interval_ns == 20 * MS


@pytest.fixture
def _cupti_stays_attached() -> Iterator[None]:
    driver.acquire("test")  # so the source's release does not finalize a CUPTI that has no driver here
    yield
    driver.release("test", finalize=False)


def gpm_source(
    nvml: StandInNvml, stamps: Iterator[int] | None = None, **config: Any
) -> tuple[PmSamplingSource, RecordingEmitter]:
    """A ``backend: nvml`` source (decoding every 200 ms unless ``config`` says) whose GPM session
    talks to ``nvml`` and reads its clock from ``stamps`` (100 ms apart by default); CUPTI is never
    asked for a session, and the context is a stand-in."""
    cfg = convert(
        {"type": "pm_sampling", "backend": "nvml", "decode_period": "200ms", **config}, PmSamplingConfig
    )
    emitter = RecordingEmitter()
    source = PmSamplingSource(cfg, emitter)
    ticks = stamps if stamps is not None else _clock()
    source.session_factory = _no_cupti
    source.gpm_factory = lambda uuid, clock: GpmSession("GPU-1", lambda: next(ticks), nvml=nvml)
    source.find_context = lambda device: 0xC0
    return source, emitter


@pytest.mark.usefixtures("_cupti_stays_attached")
def test_the_source_emits_gpm_samples_that_the_statistics_fold() -> None:
    source, emitter = gpm_source(StandInNvml())
    source.start()
    time.sleep(0.7)
    source.stop()
    batches = [e for e in emitter.events if isinstance(e, PmSamples)]
    assert batches and emitter.errors == []
    assert all(b.chip == "NVIDIA H100 80GB HBM3" and b.metrics == list(GPM_METRICS) for b in batches)
    fold = PmFold(1_000_000_000)
    stats = [s for b in batches for s in fold.add(b)] + fold.close()
    assert sum(s.samples for s in stats) == sum(len(b.ends) for b in batches) >= 4
    sm = list(GPM_METRICS).index(metric_name("sm_active"))
    assert all(s.mean[sm] == 2.0 for s in stats)


@pytest.mark.usefixtures("_cupti_stays_attached")
def test_a_device_without_gpm_is_one_error_naming_the_other_backend() -> None:
    source, emitter = gpm_source(StandInNvml(gpm=False))
    source.start()
    time.sleep(0.2)
    source.stop()
    ((_, message, severity, _),) = emitter.errors
    assert severity == "error" and message.endswith(
        "has no GPM (Hopper and later only); use pm_sampling.backend: cupti"
    )


@pytest.mark.parametrize(
    ("config", "has_gpm", "backend", "interval_ms"),
    [
        ({}, True, "nvml", 100),  # a Hopper GPU: GPM, at GPM's default interval
        ({}, False, "cupti", 20),  # before Hopper, a MIG instance, no driver
        ({"interval": "20ms"}, True, "cupti", 20),  # faster than GPM refreshes
        ({"interval": "200ms"}, True, "nvml", 200),
        ({"metrics": ["dram__cycles_active.avg.pct_of_peak_sustained_elapsed"]}, True, "cupti", 20),
        ({"metrics": [metric_name("dram_active")]}, True, "nvml", 100),
        ({"backend": "cupti"}, True, "cupti", 20),
        ({"backend": "nvml"}, False, "nvml", 100),  # said by the session: no GPM on this device
    ],
)
def test_auto_picks_gpm_where_the_device_has_it_and_nothing_asks_for_cupti(
    config: dict[str, Any], has_gpm: bool, backend: str, interval_ms: int
) -> None:
    decided = convert({"type": "pm_sampling", **config}, PmSamplingConfig).for_device(has_gpm)
    assert (decided.backend, decided.interval_ns) == (backend, interval_ms * MS)


def test_gpm_metrics_faster_than_gpm_refreshes_are_refused_under_auto() -> None:
    with pytest.raises(Exception, match="at least 100ms for GPM metrics") as caught:
        convert(
            {"type": "pm_sampling", "metrics": [metric_name("sm_active")], "interval": "50ms"},
            PmSamplingConfig,
        )
    assert "\n" not in str(caught.value)


@pytest.mark.usefixtures("_cupti_stays_attached")
@pytest.mark.parametrize("gpm", [True, False])
def test_the_default_backend_samples_gpm_where_nvml_offers_it(gpm: bool) -> None:
    """The source's own ``auto`` decision: NVML is the stand-in, and CUPTI's side is
    ``test_pm_sampling_source.StandInSession`` (neither a driver nor a GPU here)."""
    cfg = convert({"type": "pm_sampling", "decode_period": "200ms"}, PmSamplingConfig)
    emitter = RecordingEmitter()
    source = PmSamplingSource(cfg, emitter)
    ticks = _clock()
    source.session_factory = StandInSession
    source.gpm_factory = lambda uuid, clock: GpmSession(uuid, lambda: next(ticks), nvml=StandInNvml(gpm=gpm))
    source.find_context = lambda device: 0xC0
    source.start()
    time.sleep(0.5)
    source.stop()
    assert source.config.backend == ("nvml" if gpm else "cupti")
    batches = [e for e in emitter.events if isinstance(e, PmSamples)]
    assert batches and emitter.errors == []
    assert batches[0].metrics[0].startswith("gpm__" if gpm else "gr__")


@pytest.mark.usefixtures("_cupti_stays_attached")
def test_a_device_that_gives_no_gpm_sample_is_one_error_naming_nvmls_reason() -> None:
    source, emitter = gpm_source(StandInNvml(failing=frozenset(range(1, 100))))
    source.start()
    time.sleep(0.3)
    source.stop()
    ((_, message, severity, _),) = emitter.errors
    assert (
        severity == "error" and "NVML takes no GPM sample of GPU GPU-1: Insufficient Permissions" in message
    )
    assert not [e for e in emitter.events if isinstance(e, PmSamples)]


@pytest.mark.usefixtures("_cupti_stays_attached")
def test_samples_nvml_fails_while_sampling_are_lost_counted_and_said_once() -> None:
    nvml = StandInNvml(failing=frozenset({3, 4, 7}))  # the 3rd, 4th and 7th gets: 5 pairs lose a side
    source, emitter = gpm_source(nvml)
    source.start()
    time.sleep(1.5)
    source.stop()
    failed = [
        count for _, reason, count, unit in emitter.losses if reason == "sample_failed" and unit == "samples"
    ]
    assert sum(failed) == 3
    warnings = [m for _, m, severity, _ in emitter.errors if severity == "warning"]
    assert len(warnings) == 1 and "failed (Insufficient Permissions)" in warnings[0], emitter.errors
    pairs = sum(len(e.ends) for e in emitter.events if isinstance(e, PmSamples))
    assert pairs == nvml.samples_taken - 1 - 5  # every pair of two good samples, no other
