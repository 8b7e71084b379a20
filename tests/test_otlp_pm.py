"""PM sampling's interval statistics (``PmStats``) through the OTLP sink to a real receiver: per
interval, device and metric a gauge under the hardware conventions' names (``hw.gpu.utilization`` with
``hw.gpu.task``) or ``cuda.device.*`` (docs/otlp.md). The expected means come from the generated H100
samples with plain numpy, grouped by the interval their end falls in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cuptistream.cupti.pm_metrics import default_metrics
from cuptistream.sinks.otlp.pm import LINKS, TASKS
from tests.helpers.fixture_recording import batches
from tests.helpers.pm_recording import CLOCK, HOSTS, PERIOD, STATS_INTERVAL, pm_processes, samples_of
from tests.otlp_receiver import OtlpReceiver
from tests.test_otlp import attrs, deliver, sink_for
from tests.test_otlp_stats import metrics_of, points


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:  # checks the semantic conventions on exit
        assert deliver(sink_for(r.endpoint, signals=["metrics"]), *batches(pm_processes(), 7)) == []
        yield r


def interval_means(host: str) -> dict[tuple[str, int], float]:
    """(metric, interval end in epoch ns) -> the mean of the samples that ended in the interval."""
    metrics, starts, values = samples_of(host, seed=list(HOSTS).index(host))
    interval = (starts + PERIOD) // STATS_INTERVAL * STATS_INTERVAL
    return {
        (metric, int(i) + STATS_INTERVAL + CLOCK.offset_ns): float(values[m][interval == i].mean())
        for m, metric in enumerate(metrics)
        for i in np.unique(interval)
    }


def by_host(receiver: OtlpReceiver, name: str) -> dict[tuple[str, str, int], Any]:
    out = {}
    for point in points(receiver, name):
        a = attrs(point)
        host = a["hw.id"].removeprefix("GPU-h100-")
        key = (host, a["cuda.pm.metric"], point.time_unix_nano)
        assert key not in out  # one point per interval, device and metric
        out[key] = point
    return out


def test_activity_is_hw_gpu_utilization_per_task(receiver: OtlpReceiver) -> None:
    got = by_host(receiver, "hw.gpu.utilization")
    for host in HOSTS:
        for (metric, end), mean in interval_means(host).items():
            point = got.get((host, metric, end))
            if not metric.endswith("pct_of_peak_sustained_elapsed") or "warps_active" in metric:
                assert point is None
                continue
            a = attrs(point)
            assert a["hw.gpu.task"] in TASKS.values() and a["cuda.device.id"] == 0
            assert (a["hw.vendor"], a["hw.model"]) == ("NVIDIA", "NVIDIA H100 80GB HBM3")
            assert point.as_double == pytest.approx(mean / 100, rel=1e-9, abs=1e-12)
            assert point.start_time_unix_nano == 0  # a gauge
    sm = {k: p.as_double for k, p in got.items() if attrs(p)["hw.gpu.task"] == "sm" and k[0] == "h100-a"}
    tensor = {k[2]: p.as_double for k, p in got.items() if attrs(p)["hw.gpu.task"] == "tensor"}
    assert len(sm) == 4 and max(sm.values()) > 0.85 and min(sm.values()) < 0.5  # work and the idle edges
    assert 0.4 < max(tensor.values()) < 0.6
    (unit,) = {m.unit for m in metrics_of(receiver) if m.name == "hw.gpu.utilization"}
    assert unit == "1"


def test_occupancy_and_links_are_cuda_device_metrics(receiver: OtlpReceiver) -> None:
    occupancy = by_host(receiver, "cuda.device.sm.occupancy")
    links = {
        **by_host(receiver, "cuda.device.pcie.throughput"),
        **by_host(receiver, "cuda.device.nvlink.throughput"),
    }
    fields = {metric: field for field, metric in default_metrics("GH100").fields.items()}
    for host in HOSTS:
        for (metric, end), mean in interval_means(host).items():
            field = fields[metric]
            if field == "sm_occupancy":
                assert occupancy[(host, metric, end)].as_double == pytest.approx(mean / 100, rel=1e-9)
            elif field in LINKS:
                point = links[(host, metric, end)]
                assert attrs(point)["cuda.link.direction"] == LINKS[field][1]
                assert point.as_double == pytest.approx(mean, rel=1e-9, abs=1e-6)
    units = {m.name: m.unit for m in metrics_of(receiver)}
    assert units["cuda.device.pcie.throughput"] == units["cuda.device.nvlink.throughput"] == "By/s"
    assert max(p.as_double for k, p in links.items() if "pcie__read" in k[1]) > 2e9
