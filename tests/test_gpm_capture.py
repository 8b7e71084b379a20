"""NVML's GPM answers captured on a GPU (``tests/fixtures/gpm/``, see the README there) replayed
through the ``pm_sampling`` source's NVML backend, then folded into statistics and attributed to the
kernels CUPTI recorded in the same run. NVML needs the NVIDIA driver, which this machine lacks:
``ReplayedNvml`` gives back what the driver answered on the GPU, call for call; the session, the
source, the fold and the attribution are the real ones."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pynvml
import pytest

from cuptistream.cupti import driver
from cuptistream.cupti.names import TableNames
from cuptistream.events import PmKernelStats, PmSamples
from cuptistream.nvml.gpm import metric_name
from cuptistream.statistics import Accumulator
from cuptistream.statistics.pm_fold import PmFold
from tests.test_gpm import StandInNvml, gpm_source
from tests.test_pm_attribution import _check, _expected, _full_traced
from tests.test_statistics import arrays_of

FIXTURE = Path(__file__).parent / "fixtures" / "gpm"
S = 1_000_000_000


@pytest.fixture(scope="module")
def captured() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURE / "gpm_alternating.json").read_text())
    return loaded


class ReplayedNvml(StandInNvml):
    """``pynvml``'s GPM calls answered as the driver answered them on the GPU; sampling fails once
    every captured sample has been taken, so the session keeps no pair past the capture."""

    def __init__(self, device: str, answers: list[list[list[float]]]) -> None:
        super().__init__()
        self.device, self.answers = device, list(answers)
        self.read = 0

    def nvmlDeviceGetName(self, handle: str) -> str:
        return self.device

    def nvmlGpmSampleGet(self, handle: str, sample: Any) -> Any:
        if self.samples_taken > len(self.answers):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super().nvmlGpmSampleGet(handle, sample)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        answer = self.answers[self.read]
        self.read += 1
        for slot, (metric_id, value, result) in zip(
            request.metrics[: request.numMetrics], answer, strict=True
        ):
            assert slot.metricId == metric_id, "the session asked for other metrics than on the GPU"
            slot.value, slot.nvmlReturn = value, int(result)
        return request


def _replayed_batches(captured: dict[str, Any]) -> list[PmSamples]:
    """The source's ``pm_samples`` events with NVML's captured answers behind its GPM session."""
    nvml = ReplayedNvml(captured["device"], captured["answers"])
    source, emitter = gpm_source(nvml, iter(captured["stamps"]), metrics=captured["metrics"])
    driver.acquire("test")  # so the source's release does not finalize a CUPTI that has no driver here
    try:
        source.start()
        deadline = time.monotonic() + 30
        while nvml.read < len(nvml.answers) and time.monotonic() < deadline:
            time.sleep(0.05)
        source.stop()
    finally:
        driver.release("test", finalize=False)
    assert emitter.errors == [] and nvml.read == len(nvml.answers)
    return [e for e in emitter.events if isinstance(e, PmSamples)]


@pytest.fixture(scope="module")
def batches(captured: dict[str, Any]) -> list[PmSamples]:
    return _replayed_batches(captured)


def test_the_replayed_answers_decode_to_what_the_session_decoded_on_the_gpu(
    captured: dict[str, Any], batches: list[PmSamples]
) -> None:
    live = captured["decoded"]
    assert [s for b in batches for s in b.starts] == live["starts"]
    assert [e for b in batches for e in b.ends] == live["ends"]
    assert all(b.chip == captured["device"] and b.metrics == captured["metrics"] for b in batches)
    for m, column in enumerate(live["values"]):
        replayed = [v for b in batches for v in b.values[m]]
        # NaN on the GPU (a metric the device does not count) travels as None in events.
        assert replayed == [None if math.isnan(v) else pytest.approx(v, rel=1e-12) for v in column]


def test_the_fold_counts_every_sample_once_per_interval(batches: list[PmSamples]) -> None:
    fold = PmFold(S)
    stats = [s for b in batches for s in fold.add(b)] + fold.close()
    assert sum(s.samples for s in stats) == sum(len(b.ends) for b in batches) >= 25
    tensor = batches[0].metrics.index(metric_name("tensor_active"))
    assert max(s.mean[tensor] or 0.0 for s in stats) >= 50  # the GEMM second
    assert min(s.mean[tensor] or 0.0 for s in stats) < 2  # idle, or the elementwise loop


def _kernels() -> tuple[list[np.ndarray], TableNames]:
    arrays, names = arrays_of(FIXTURE / "gpm_alternating.cupti")
    return [r for e, r in arrays if e == "kernel"], names


def _attributed(
    batches: list[PmSamples], arrays: list[np.ndarray], names: TableNames, interval_ns: int
) -> list[PmKernelStats]:
    acc = Accumulator(interval_ns, 500, names)
    for batch in batches:
        acc.pm_samples(batch)
    for records in arrays:
        acc.add("kernel", records)
        acc.buffer_done()
    return [e for e in acc.close() if isinstance(e, PmKernelStats)]


def test_the_attribution_of_the_captured_run_is_its_definition(batches: list[PmSamples]) -> None:
    """Over one interval that holds the whole run, every name's figures recomputed kernel by kernel
    and sample by sample (``tests.test_pm_attribution``'s reference) from the same inputs."""
    arrays, names = _kernels()
    rows = _attributed(batches, arrays, names, 3600 * S)
    samples = [
        (start, end, [math.nan if b.values[m][i] is None else b.values[m][i] for m in range(len(b.metrics))])
        for b in batches
        for i, (start, end) in enumerate(zip(b.starts, b.ends, strict=True))
    ]
    kernels = [
        (int(s), int(e), names(int(p)))
        for r in arrays
        for s, e, p in zip(r["start"], r["end"], r["name"], strict=True)
    ]
    assert len(rows) >= 2
    _check(rows, _expected(samples, kernels, _full_traced(kernels)), batches[0].metrics)


def test_the_gemm_and_the_elementwise_kernels_read_what_they_did(batches: list[PmSamples]) -> None:
    arrays, names = _kernels()
    rows = _attributed(batches, arrays, names, S)

    def reading(fragment: tuple[str, ...], field: str) -> float:
        mine = [r for r in rows if any(f in r.name.lower() for f in fragment)]
        assert mine, sorted({r.name for r in rows})
        index = mine[0].metrics.index(metric_name(field))
        weight = sum(r.covered_ns for r in mine)
        return sum((r.mean[index] or 0.0) * r.covered_ns for r in mine) / weight

    gemm, elementwise = ("gemm", "nvjet", "xmma", "cutlass"), ("elementwise",)
    assert reading(gemm, "tensor_active") >= 50 and reading(gemm, "sm_active") >= 80
    assert reading(elementwise, "dram_active") >= 50
    # The sample where one loop gave way to the other holds both: the elementwise kernels in it get
    # the GEMM's tensor activity too, so theirs is low, not zero.
    assert reading(gemm, "tensor_active") - reading(elementwise, "tensor_active") >= 40
    assert all(0 < r.covered_share <= 1 for r in rows)
