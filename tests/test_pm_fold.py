"""PM sampling statistics (``cuptistream.statistics.pm_fold``) on synthetic sample columns."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuptistream.events import PmSamples
from cuptistream.statistics.accumulator import LATENESS_NS
from cuptistream.statistics.pm_fold import PmFold

S = 1_000_000_000
MS = 1_000_000
METRICS = ["sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "pcie__read_bytes.sum.per_second"]


def _samples(
    start_ns: int, count: int, step_ns: int, columns: list[list[float]], device: int = 0
) -> PmSamples:
    starts = [start_ns + i * step_ns for i in range(count)]
    return PmSamples(
        device_id=device,
        chip="GH100",
        metrics=METRICS[: len(columns)],
        starts=starts,
        ends=[s + step_ns for s in starts],
        values=columns,
    )


def test_mean_and_percentiles_per_interval_and_metric() -> None:
    fold = PmFold(1 * S)
    # 100 samples of 10 ms ending in [0 s, 1 s): 0..99 % and a constant 5 GB/s.
    active = [float(i) for i in range(100)]
    first = _samples(-10 * MS, 100, 10 * MS, [active, [5e9] * 100])
    assert fold.add(first) == []  # the interval is open until a sample ends well past it
    later = _samples(1 * S + LATENESS_NS, 1, 10 * MS, [[50.0], [0.0]])
    [stats] = fold.add(later)
    assert (stats.interval_start, stats.interval_end, stats.device_id, stats.samples) == (0, S, 0, 100)
    assert stats.metrics == METRICS
    assert stats.mean == pytest.approx([49.5, 5e9])
    assert stats.p50 == pytest.approx([np.percentile(active, 50), 5e9])
    assert stats.p5 == pytest.approx([np.percentile(active, 5), 5e9])
    assert stats.p95 == pytest.approx([np.percentile(active, 95), 5e9])
    [rest] = fold.close()
    assert rest.samples == 1 and rest.interval_start == (1 * S + LATENESS_NS) // S * S


def test_samples_split_across_intervals_by_their_end() -> None:
    fold = PmFold(S)
    # 30 samples of 100 ms from 0.05 s: ends 0.15 .. 3.05 s -> 9, 10, 10, 1 per interval.
    out = fold.add(_samples(50 * MS, 30, 100 * MS, [[1.0] * 30]))
    out += fold.close()
    assert [(s.interval_start // S, s.samples) for s in out] == [(0, 9), (1, 10), (2, 10), (3, 1)]


def test_devices_are_folded_apart_and_a_new_metric_list_closes_the_old() -> None:
    fold = PmFold(S)
    fold.add(_samples(0, 10, 10 * MS, [[10.0] * 10], device=0))
    fold.add(_samples(0, 10, 10 * MS, [[90.0] * 10], device=1))
    changed = fold.add(_samples(200 * MS, 5, 10 * MS, [[1.0] * 5, [2.0] * 5], device=0))
    assert [(s.device_id, s.metrics, s.mean) for s in changed] == [(0, METRICS[:1], [10.0])]
    closed = {(s.device_id, len(s.metrics)): s.mean for s in fold.close()}
    assert closed == {(0, 2): [1.0, 2.0], (1, 1): [90.0]}


def test_nan_values_are_left_out() -> None:
    fold = PmFold(S)
    fold.add(_samples(0, 4, 10 * MS, [[1.0, math.nan, 3.0, math.nan], [math.nan] * 4]))
    [stats] = fold.close()
    assert stats.mean[0] == pytest.approx(2.0) and stats.samples == 4
    assert stats.mean[1] is None and stats.p50[1] is None  # JSON's null: no value to average


def test_unequal_columns_are_refused() -> None:
    bad = PmSamples(
        device_id=0, chip="GH100", metrics=METRICS, starts=[0, 1], ends=[1, 2], values=[[1.0, 2.0], [1.0]]
    )
    with pytest.raises(ValueError, match="unequal length"):
        PmFold(S).add(bad)
    empty = PmSamples(device_id=0, chip="GH100", metrics=METRICS, starts=[], ends=[], values=[[], []])
    assert PmFold(S).add(empty) == []


def test_a_long_run_holds_only_open_intervals() -> None:
    fold = PmFold(S)
    emitted = 0
    for second in range(20):
        emitted += len(fold.add(_samples(second * S - 20 * MS, 50, 20 * MS, [[50.0] * 50])))
    still_open = sum(len(v.intervals) for v in fold._devices.values())
    assert emitted + still_open == 20 and still_open <= LATENESS_NS // S + 2


def test_the_collector_folds_the_samples_it_finds_in_a_probe_chunk() -> None:
    from cuptistream.collector.pm_stats import PmStatsJoin
    from cuptistream.events import Kernel, PmStats
    from cuptistream.plugin import encode_chunk
    from tests.test_sass_window import RecordingEmitter

    emitter = RecordingEmitter()
    join = PmStatsJoin(S, emitter, "collector:probe:1")
    other = Kernel(start=0, end=1, name="k", device_id=0, context_id=1, stream_id=7, correlation_id=1)
    join.chunk(encode_chunk([other]).payload, 1, emitter, "collector:probe:1")  # no samples: not decoded
    chunk = encode_chunk([other, _samples(0, 300, 10 * MS, [[20.0] * 300])])
    join.chunk(chunk.payload, 2, emitter, "collector:probe:1")
    join.close()
    stats = [e for e in emitter.events if isinstance(e, PmStats)]
    assert [(s.interval_start // S, s.samples, s.mean) for s in stats] == [
        (0, 99, [20.0]),
        (1, 100, [20.0]),
        (2, 100, [20.0]),
        (3, 1, [20.0]),
    ]
    assert emitter.errors == []
