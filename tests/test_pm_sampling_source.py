"""The pm_sampling source's worker without a GPU: the device side is a stand-in that answers as
CUPTI's PM sampling does (samples per decode, an overflowed hardware buffer, counters held by
another profiler, a refused config); the metric choice is the real host library's for GH100."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cuptistream.config import convert
from cuptistream.cupti import driver
from cuptistream.cupti.pm_metrics import default_metrics
from cuptistream.cupti.pm_sampling_api import Decoded, unavailable
from cuptistream.events import PmSamples
from cuptistream.sources.pm_sampling import PmSamplingConfig, PmSamplingSource
from tests.test_sass_window import RecordingEmitter

MS = 1_000_000


class StandInSession:
    """Behaves as ``PmSamplingSession`` does on a GPU: ``decode`` hands out the samples of the time
    since the last decode, on a fake CUPTI clock; ``overflow_at`` decodes report a full buffer."""

    def __init__(
        self, device: int, fail_enable: Exception | None = None, fail_config: Exception | None = None
    ):
        self.device, self.fail_enable, self.fail_config = device, fail_enable, fail_config
        # CUPTI result codes the next Enables fail with, one per call (as PmSamplingSession raises them)
        self.enable_results: list[int] = []
        self.calls: list[str] = []
        self.metrics: list[str] = []
        self.clock = 1_000 * MS
        self.overflow_at: set[int] = set()
        self.refused: set[str] = set()  # metrics CUPTI's PM sampling does not sample
        self.decodes = 0

    def enable(self) -> str:
        self.calls.append("enable")
        if self.fail_enable is not None:
            raise self.fail_enable
        if self.enable_results:
            error = unavailable(self.device, self.enable_results.pop(0))
            assert error is not None
            raise error
        return "GH100"

    def configure(self, metrics: list[str], interval_ns: int, hardware_buffer_bytes: int) -> list[str]:
        self.calls.append("configure")
        if self.fail_config is not None:
            raise self.fail_config
        # As PmSamplingSession: the metrics CUPTI's PM sampling does not take are left out
        self.metrics, self.interval_ns = [m for m in metrics if m not in self.refused], interval_ns
        return self.metrics

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def decode(self, max_samples: int) -> Decoded:
        self.decodes += 1
        count = 5
        starts = [self.clock + i * self.interval_ns for i in range(count)]
        self.clock += count * self.interval_ns
        values = [[float(m * 10 + i) for i in range(count)] for m in range(len(self.metrics))]
        return Decoded(starts, [s + self.interval_ns for s in starts], values, self.decodes in self.overflow_at,
                       "end_of_records")  # fmt: skip

    def disable(self) -> None:
        self.calls.append("disable")


@pytest.fixture(autouse=True)
def _cupti_stays_attached() -> Iterator[None]:
    driver.acquire("test")  # so the source's release does not finalize a CUPTI that has no driver here
    yield
    driver.release("test", finalize=False)


def _source(session: StandInSession, **config: Any) -> tuple[PmSamplingSource, RecordingEmitter]:
    cfg = convert(
        {"type": "pm_sampling", "interval": "10ms", "decode_period": "50ms", **config}, PmSamplingConfig
    )
    emitter = RecordingEmitter()
    source = PmSamplingSource(cfg, emitter)
    source.session_factory = lambda device: session
    source.find_context = lambda device: 0xC0
    return source, emitter


def _run(source: PmSamplingSource, seconds: float) -> None:
    source.start()
    time.sleep(seconds)
    source.stop()


def test_samples_come_as_columns_with_the_default_metrics() -> None:
    session = StandInSession(0)
    source, emitter = _run_and_get(session, 0.3)
    batches = [e for e in emitter.events if isinstance(e, PmSamples)]
    assert session.calls[:3] == ["enable", "configure", "start"] and session.calls[-2:] == ["stop", "disable"]
    assert session.interval_ns == 10 * MS
    assert batches and all(
        b.metrics == default_metrics("GH100").metrics and b.chip == "GH100" for b in batches
    )
    ends = [end for b in batches for end in b.ends]
    assert ends == sorted(ends) and len(ends) == 5 * session.decodes
    assert all(len(col) == len(b.ends) for b in batches for col in b.values)
    assert emitter.errors == [] and emitter.losses == []
    assert source.stats["samples"] == len(ends)


def _run_and_get(
    session: StandInSession, seconds: float, **config: Any
) -> tuple[PmSamplingSource, RecordingEmitter]:
    source, emitter = _source(session, **config)
    _run(source, seconds)
    return source, emitter


def test_an_overflowed_hardware_buffer_is_a_loss_of_samples() -> None:
    session = StandInSession(0)
    session.overflow_at = {2}
    _, emitter = _run_and_get(session, 0.3)
    [(stage, reason, count, unit)] = emitter.losses
    assert (stage, reason, unit) == ("pm_sampling", "hardware_buffer_full", "samples") and count >= 1


def test_an_unknown_metric_is_one_error_with_close_matches() -> None:
    session = StandInSession(0)
    _, emitter = _run_and_get(session, 0.2, metrics=["sm__cycles_activ.avg"])
    [(_, message, _, _)] = emitter.errors
    assert "not a metric on GH100" in message and "sm__cycles_active.avg" in message
    assert "start" not in session.calls


def test_a_refused_config_names_the_keys_to_change() -> None:
    session = StandInSession(0, fail_config=ValueError("CUPTI refused the PM sampling config on GH100"))
    _, emitter = _run_and_get(session, 0.2)
    [(_, message, _, _)] = emitter.errors
    assert "refused" in message and "pm_sampling.interval" in message


class FailingDecode(StandInSession):
    """Decodes fail as CUPTI 13.0's did on an H100 (``CUPTI_ERROR_UNKNOWN``); a stand-in: no GPU here."""

    def decode(self, max_samples: int) -> Decoded:
        raise RuntimeError("ERROR_UNKNOWN (999)")


def test_a_failing_cupti_session_is_one_error_that_names_the_nvml_backend() -> None:
    session = FailingDecode(0)
    _, emitter = _run_and_get(session, 0.3, backend="cupti")
    [(_, message, _, _)] = emitter.errors
    assert message.startswith("PM sampling stopped: RuntimeError: ERROR_UNKNOWN (999)")
    assert "pm_sampling.backend: nvml" in message and "\n" not in message
    assert session.calls[-1] == "disable"


def test_it_waits_for_a_context_and_stops_while_waiting() -> None:
    session = StandInSession(0)
    source, emitter = _source(session)
    source.find_context = lambda device: 0
    source.start()
    time.sleep(0.1)
    began = time.monotonic()
    source.stop()
    assert time.monotonic() - began < 2 and session.calls == [] and emitter.errors == []
    assert not any(t.name == "cuptistream-pm_sampling" for t in threading.enumerate())


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"interval": "0s"}, "interval must be more than 0"),
        ({"interval": "1us"}, "interval must be at least 10us"),
        ({"decode_period": "1ms"}, "decode_period must be at least interval"),
        ({"hardware_buffer": 1000}, "hardware_buffer"),
    ],
)
def test_bad_config_values_are_one_line(config: dict[str, Any], fragment: str) -> None:
    with pytest.raises(Exception) as caught:
        convert({"type": "pm_sampling", **config}, PmSamplingConfig)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_shortest_interval_is_taken() -> None:
    assert convert({"type": "pm_sampling", "interval": "10us"}, PmSamplingConfig).interval_ns == 10_000


def test_a_default_metric_cupti_does_not_sample_is_left_out_with_one_info_line() -> None:
    session = StandInSession(0)
    refused = default_metrics("GH100").metrics[4]
    session.refused = {refused}
    _, emitter = _run_and_get(session, 0.2)
    batches = [e for e in emitter.events if isinstance(e, PmSamples)]
    assert batches and all(
        b.metrics == [m for m in default_metrics("GH100").metrics if m != refused] for b in batches
    )
    assert all(len(b.values) == len(b.metrics) for b in batches)
    ((_, message, severity, _),) = emitter.errors
    assert severity == "info" and message.startswith(
        f"PM sampling on GH100: CUPTI does not sample {refused};"
    )


def test_a_configured_metric_cupti_does_not_sample_is_one_error() -> None:
    session = StandInSession(0)
    session.refused = {"dram__cycles_active.avg.pct_of_peak_sustained_elapsed"}
    _, emitter = _run_and_get(
        session, 0.2, metrics=["sm__cycles_active.avg.pct_of_peak_sustained_elapsed", *session.refused]
    )
    assert not [e for e in emitter.events if isinstance(e, PmSamples)]
    ((_, message, severity, _),) = emitter.errors
    assert severity == "error" and message == (
        "CUPTI's PM sampling on GH100 does not sample dram__cycles_active.avg.pct_of_peak_sustained_elapsed; "
        "change pm_sampling.metrics or pm_sampling.interval"
    )
