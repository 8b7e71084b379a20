"""The collector's statistics (ActivityStats, GpuStats) through the OTLP sink to a real receiver.

The statistics are built here from the raw records of the replayed captures (sources/captures), each
duration put in its bucket with plain math (``ceil(log2(v) * 2**scale) - 1``, corrected at exact
powers). What the receiver decodes with opentelemetry-proto is then checked against the raw records
by a second route: exact integer comparisons with the bucket bounds (``base**i < v <= base**(i+1)``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream import events as ev
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURE_DIR  # shipped real-GPU captures
from tests.otlp_batches import OFFSET, UUID, make_batch
from tests.otlp_grpc_receiver import OtlpGrpcReceiver
from tests.otlp_receiver import Answer, OtlpReceiver, nested
from tests.test_otlp import attrs, deliver, sink_for
from tests.test_otlp_fixtures import replayed_events

SECOND = 1_000_000_000
INTERVAL = SECOND
CLOCK = ev.ClockSync(cupti_ns=5_000, unix_ns=OFFSET + 5_000)  # epoch = CUPTI + OFFSET
DELTA = 1  # AGGREGATION_TEMPORALITY_DELTA


@pytest.fixture
def receiver() -> Any:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def raw() -> list[ev.Event]:
    return replayed_events()


# --- expected values, from the raw records ------------------------------------------------------


def log_bucket(value: int, scale: int) -> int:
    """OTLP's bucket of ``value`` > 0 by plain math: the i with base**i < value <= base**(i+1),
    base = 2**2**-scale. A power of 2 closes a bucket, where rounding in log2 must not push it over."""
    if value & (value - 1) == 0:  # 2**k: exactly k * 2**scale bucket widths
        k = value.bit_length() - 1
        return k * 2**scale - 1 if scale >= 0 else math.ceil(k / 2**-scale) - 1
    return math.ceil(math.log2(value) * 2.0**scale) - 1


def exact_bucket(value: int, scale: int) -> int:
    """The same index in integers only: the largest i with 2**i < value**(2**scale) (scale >= 0),
    or with 2**(i * 2**-scale) < value (scale < 0)."""
    if scale >= 0:
        return (value ** (2**scale) - 1).bit_length() - 1
    return -(-(value - 1).bit_length() // 2**-scale) - 1


def histogram(durations: Sequence[int], scale: int) -> ev.Histogram:
    counts = Counter(log_bucket(d, scale) for d in durations if d > 0)
    low = min(counts, default=0)
    size = max(counts, default=-1) - low + 1
    return ev.Histogram(
        scale=scale,
        offset=low,
        counts=[counts.get(low + k, 0) for k in range(size)],
        zero_count=sum(1 for d in durations if d == 0),
        min=min(durations, default=0),
        max=max(durations, default=0),
    )


Key = tuple[int, int, str, str]  # interval index, device, category, name


def group(records: Iterable[ev.Event]) -> dict[Key, list[ev.Kernel | ev.Memcpy]]:
    """Kernels and copies per interval (by start), device and name (copy kind)."""
    out: dict[Key, list[ev.Kernel | ev.Memcpy]] = defaultdict(list)
    for r in records:
        if isinstance(r, ev.Kernel):
            out[(r.start // INTERVAL, r.device_id, "kernel", r.name)].append(r)
        elif isinstance(r, ev.Memcpy):
            out[(r.start // INTERVAL, r.device_id, "memcpy", r.copy_kind)].append(r)
    return out


def activity_stats(groups: dict[Key, list[ev.Kernel | ev.Memcpy]], scale: int) -> list[ev.ActivityStats]:
    stats = []
    for (index, device, category, name), records in sorted(groups.items()):
        durations = [r.end - r.start for r in records]
        stats.append(
            ev.ActivityStats(
                interval_start=index * INTERVAL,
                interval_end=(index + 1) * INTERVAL,
                device_id=device,
                category=category,
                name=name,
                count=len(records),
                total_ns=sum(durations),
                durations=histogram(durations, scale),
                traced_ns=INTERVAL,
                bytes=sum(r.bytes for r in records if isinstance(r, ev.Memcpy)),
                nccl=name.startswith("nccl"),
            )
        )
    return stats


def batches_of(events: Sequence[ev.Event], size: int = 40) -> list[ev.Batch]:
    batches = []
    for seq, start in enumerate(range(0, len(events), size)):
        batch = make_batch(events[start : start + size], seq=seq)
        batch.clock = CLOCK
        batches.append(batch)
    return batches


# --- what the receiver decoded ------------------------------------------------------------------


Receiver = OtlpReceiver | OtlpGrpcReceiver


def metrics_of(receiver: Receiver) -> list[Any]:
    messages = receiver.messages("/v1/metrics" if isinstance(receiver, OtlpReceiver) else "metrics")
    return nested(messages, "resource_metrics", "scope_metrics", "metrics")


def points(receiver: Receiver, name: str) -> list[Any]:
    """Every data point of metric ``name``, whichever its instrument."""
    return [
        p
        for m in metrics_of(receiver)
        if m.name == name
        for p in getattr(m, m.WhichOneof("data")).data_points
    ]


def received_buckets(point: Any) -> Counter[int]:
    return Counter({point.positive.offset + k: n for k, n in enumerate(point.positive.bucket_counts) if n})


def point_key(point: Any, category: str) -> Key:
    a = attrs(point)
    name = a["cuda.kernel.name"] if category == "kernel" else a["cuda.memcpy.kind"]
    assert point.start_time_unix_nano - OFFSET == (point.time_unix_nano - OFFSET) - INTERVAL
    return ((point.start_time_unix_nano - OFFSET) // INTERVAL, a["cuda.device.id"], category, name)


# --- the tests ------------------------------------------------------------------------------------


def test_the_two_routes_to_a_bucket_agree(raw: list[ev.Event]) -> None:
    """Bounds are (base**i, base**(i+1)]: 2**k closes a bucket, 2**k + 1 opens the next."""
    assert [log_bucket(v, 0) for v in (1, 2, 3, 4, 5, 1024, 1025)] == [-1, 0, 1, 1, 2, 9, 10]
    assert [log_bucket(v, 1) for v in (2, 3, 4, 5)] == [1, 3, 3, 4]  # sqrt(2)**3 = 2.83 < 3 <= 4 = sqrt(2)**4
    assert [log_bucket(v, -1) for v in (4, 5, 16, 17)] == [0, 1, 1, 2]  # base 4
    durations = {r.end - r.start for r in raw if isinstance(r, ev.Kernel | ev.Memcpy)} - {0}
    edges = {2**k + d for k in range(1, 40) for d in (-1, 0, 1)}
    for scale in (-2, -1, 0, 2, 3, 8):
        assert all(log_bucket(v, scale) == exact_bucket(v, scale) for v in durations | edges), scale


@pytest.mark.parametrize("scale", [-1, 0, 2, 3, 8])  # 2: the collector's fixed scale
def test_exponential_histograms_match_the_raw_records_of_a_replayed_capture(
    receiver: OtlpReceiver, raw: list[ev.Event], scale: int
) -> None:
    groups = group(raw)
    kernels = [r for r in raw if isinstance(r, ev.Kernel)]
    assert len(kernels) > 600 and len({k.name for k in kernels}) > 10  # the captures, not a stub
    stats = activity_stats(groups, scale)
    assert deliver(sink_for(receiver.endpoint, signals=["metrics"]), *batches_of(stats)) == []
    check_against_raw(receiver, groups, scale)


def test_over_grpc_too(raw: list[ev.Event]) -> None:
    groups = group(raw)
    with OtlpGrpcReceiver() as receiver:
        sink = sink_for(receiver.endpoint, signals=["metrics"], protocol="grpc")
        assert deliver(sink, *batches_of(activity_stats(groups, 3))) == []
        check_against_raw(receiver, groups, 3)


def check_against_raw(receiver: Receiver, groups: dict[Key, list[ev.Kernel | ev.Memcpy]], scale: int) -> None:
    """The receiver's histograms hold exactly the raw records' durations, one point per key."""
    histograms = [m for m in metrics_of(receiver) if m.name == "cuda.kernel.traced.duration"]
    assert histograms and all(
        m.unit == "ns" and m.exponential_histogram.aggregation_temporality == DELTA for m in histograms
    )
    seen: set[Key] = set()
    for category in ("kernel", "memcpy"):
        for point in points(receiver, f"cuda.{category}.traced.duration"):
            key = point_key(point, category)
            assert key not in seen  # one point per interval, device and name: none sent twice
            seen.add(key)
            durations = [r.end - r.start for r in groups[key]]
            assert point.scale == scale and point.zero_count == 0 and point.zero_threshold == 0
            assert point.count == len(durations) and point.sum == sum(durations)
            assert (point.min, point.max) == (min(durations), max(durations))
            # Second route, in integers: the buckets hold exactly the raw durations of this key.
            assert received_buckets(point) == Counter(exact_bucket(d, scale) for d in durations)
            assert point.positive.bucket_counts[0] and point.positive.bucket_counts[-1]  # no padding
            assert not point.negative.bucket_counts
    assert seen == set(groups)  # every raw (interval, device, name) arrived, and nothing else
    kernels = sum(len(records) for key, records in groups.items() if key[2] == "kernel")
    assert sum(p.count for p in points(receiver, "cuda.kernel.traced.duration")) == kernels


def test_sums_carry_counts_time_and_bytes_of_the_raw_records(
    receiver: OtlpReceiver, raw: list[ev.Event]
) -> None:
    groups = group(raw)
    stats = activity_stats(groups, 3)
    assert deliver(sink_for(receiver.endpoint, signals=["metrics"]), *batches_of(stats)) == []
    for m in metrics_of(receiver):
        if m.WhichOneof("data") == "sum":
            assert m.sum.aggregation_temporality == DELTA and m.sum.is_monotonic, m.name
    for category, count_unit in (("kernel", "{kernel}"), ("memcpy", "{copy}")):
        for suffix in ("traced", "estimated"):  # fully traced: the estimates are the measurements
            for point in points(receiver, f"cuda.{category}.{suffix}.count"):
                assert point.as_int == len(groups[point_key(point, category)])
            for point in points(receiver, f"cuda.{category}.{suffix}.time"):
                records = groups[point_key(point, category)]
                assert point.as_double == pytest.approx(
                    sum(r.end - r.start for r in records) / 1e9, rel=1e-12
                )
        units = {m.unit for m in metrics_of(receiver) if m.name == f"cuda.{category}.traced.count"}
        assert units == {count_unit}
    copied = {point_key(p, "memcpy"): p.as_int for p in points(receiver, "cuda.memcpy.traced.bytes")}
    assert copied == {
        key: sum(r.bytes for r in records if isinstance(r, ev.Memcpy))
        for key, records in groups.items()
        if key[2] == "memcpy"
    }
    assert sum(copied.values()) > 0


def _one(name: str = "k", **fields: Any) -> ev.ActivityStats:
    values: dict[str, Any] = dict(
        interval_start=10 * SECOND, interval_end=20 * SECOND, device_id=0, category="kernel", name=name,
        count=4, total_ns=4000, durations=histogram([500, 900, 1000, 1600], 2), traced_ns=SECOND,
    )  # fmt: skip
    values.update(fields)
    return ev.ActivityStats(**values)


def test_estimates_are_separate_metrics(receiver: OtlpReceiver) -> None:
    stats = [_one(estimated=True, estimated_count=40, estimated_total_ns=40_000, traced_ns=SECOND // 10)]
    stats.append(_one("m", category="memset", bytes=64, estimated=True, estimated_count=8, estimated_total_ns=8000,
                      estimated_bytes=128))  # fmt: skip
    assert deliver(sink_for(receiver.endpoint, signals=["metrics"]), *batches_of(stats)) == []
    value = {name: p.as_int or p.as_double for name, p in receiver.data_points()}
    assert (value["cuda.kernel.traced.count"], value["cuda.kernel.estimated.count"]) == (4, 40)
    assert (value["cuda.kernel.traced.time"], value["cuda.kernel.estimated.time"]) == (4e-6, 4e-5)
    assert (value["cuda.memset.traced.bytes"], value["cuda.memset.estimated.bytes"]) == (64, 128)
    (memset,) = points(receiver, "cuda.memset.traced.duration")
    assert attrs(memset) == {"cuda.memset.memory_kind": "m", "cuda.device.id": 0}
    for name in ("cuda.kernel.traced.duration", "cuda.kernel.estimated.count"):
        (point,) = points(receiver, name)
        assert attrs(point) == {"cuda.kernel.name": "k", "cuda.device.id": 0, "cuda.kernel.nccl": False}
        assert (point.start_time_unix_nano, point.time_unix_nano) == (
            OFFSET + 10 * SECOND,
            OFFSET + 20 * SECOND,
        )


def test_kernel_names_share_the_sinks_cap_and_nccl_stays_apart_under_other(receiver: OtlpReceiver) -> None:
    late = [700, 3000, 5, 2**20]  # the collector's own "other", at another scale
    stats = [_one("a"), _one("b"), _one("nccl_allreduce", nccl=True), _one("c")]
    stats.append(_one("other", durations=histogram(late, 3), total_ns=sum(late)))
    sink = sink_for(receiver.endpoint, signals=["metrics"], max_kernel_names=2)
    assert deliver(sink, *batches_of(stats, size=2)) == []
    counts: Counter[tuple[str, bool]] = Counter()
    for point in points(receiver, "cuda.kernel.traced.count"):
        a = attrs(point)
        counts[a["cuda.kernel.name"], a["cuda.kernel.nccl"]] += point.as_int
    # "a" and "b" take the two slots; the later names and the collector's own "other" share "other".
    assert counts == {("a", False): 4, ("b", False): 4, ("other", True): 4, ("other", False): 8}
    assert sink.stats()["kernel_names_overflowed"] == 8  # kernels of nccl_allreduce and c
    # One delta point per series and interval: "c" and "other" are merged, at the coarser scale.
    hists = {
        (attrs(p)["cuda.kernel.name"], attrs(p)["cuda.kernel.nccl"]): p
        for p in points(receiver, "cuda.kernel.traced.duration")
    }
    assert len(hists) == len(points(receiver, "cuda.kernel.traced.duration")) == 4
    merged = hists["other", False]
    values = [500, 900, 1000, 1600, *late]
    assert merged.scale == 2 and merged.count == 8 and (merged.min, merged.max) == (5, 2**20)
    assert merged.sum == 4000 + sum(late)
    assert received_buckets(merged) == Counter(exact_bucket(v, 2) for v in values)
    (time,) = [p for p in points(receiver, "cuda.kernel.traced.time") if attrs(p)["cuda.kernel.name"] == "other"
               and not attrs(p)["cuda.kernel.nccl"]]  # fmt: skip
    assert time.as_double == pytest.approx((4000 + sum(late)) / 1e9)


def test_other_is_sent_once_its_interval_is_complete(receiver: OtlpReceiver) -> None:
    """Rows folded into ``other`` arrive in several batches (even with another clock sync): they
    make one point, sent when a later interval shows the interval complete, at the first batch's times."""
    b1, b2, b3 = batches_of([_one("a"), _one("b"), _one("c"), _one("d"), _one("a", interval_start=20 * SECOND,
                                                                            interval_end=30 * SECOND)], size=2)  # fmt: skip
    b2.clock = ev.ClockSync(cupti_ns=CLOCK.cupti_ns, unix_ns=CLOCK.unix_ns + 3)  # a later clock sync
    b2.events.append(_one("e"))
    assert (
        deliver(sink_for(receiver.endpoint, signals=["metrics"], max_kernel_names=2), b1, b2, b3, close=False)
        == []
    )
    first, second = receiver.messages("/v1/metrics")  # nothing was ready after b2
    assert {attrs(p)["cuda.kernel.name"] for p in points_in(first, "cuda.kernel.traced.count")} == {"a", "b"}
    later = points_in(second, "cuda.kernel.traced.count")
    assert sorted(
        (attrs(p)["cuda.kernel.name"], p.start_time_unix_nano - OFFSET, p.as_int) for p in later
    ) == [
        ("a", 20 * SECOND, 4),
        ("other", 10 * SECOND, 12),  # c, d and e
    ]
    (other,) = [
        p for p in points_in(second, "cuda.kernel.traced.duration") if attrs(p)["cuda.kernel.name"] == "other"
    ]
    assert other.count == 12 and other.time_unix_nano == OFFSET + 20 * SECOND


def test_gpu_stats_become_gauges_and_delta_sums(receiver: OtlpReceiver, raw: list[ev.Event]) -> None:
    kernels = [r for r in raw if isinstance(r, ev.Kernel)]
    by_interval: dict[int, list[ev.Kernel]] = defaultdict(list)
    for k in kernels:
        by_interval[k.start // INTERVAL].append(k)
    gpu = []
    for index, ks in sorted(by_interval.items()):
        kernel_ns = sum(k.end - k.start for k in ks)
        gpu.append(
            ev.GpuStats(
                interval_start=index * INTERVAL,
                interval_end=(index + 1) * INTERVAL,
                device_id=0,
                traced_ns=INTERVAL // 2,
                traced_fraction=0.5,
                busy_ns=kernel_ns,
                busy_fraction=kernel_ns / INTERVAL,
                kernel_ns=kernel_ns,
                nccl_ns=7,
                copy_ns=11,
                memset_ns=13,
                kernels=len(ks),
                copies=0,
                memsets=0,
            )
        )
    assert deliver(sink_for(receiver.endpoint, signals=["metrics"]), *batches_of(gpu)) == []
    kinds = {m.name: (m.WhichOneof("data"), m.unit) for m in metrics_of(receiver)}
    assert kinds == {
        "cuda.device.busy_ratio": ("gauge", "1"),
        "cuda.device.traced_ratio": ("gauge", "1"),
        "cuda.device.activity.time": ("sum", "s"),
        "cuda.device.nccl.time": ("sum", "s"),
    }
    busy = {
        (p.time_unix_nano - OFFSET) // INTERVAL - 1: p.as_double
        for p in points(receiver, "cuda.device.busy_ratio")
    }
    assert busy == {g.interval_start // INTERVAL: g.busy_fraction for g in gpu}
    assert all(p.as_double == 0.5 for p in points(receiver, "cuda.device.traced_ratio"))
    assert all(
        attrs(p) == {"hw.id": UUID, "cuda.device.id": 0} for p in points(receiver, "cuda.device.busy_ratio")
    )
    kernel_time = 0.0
    for p in points(receiver, "cuda.device.activity.time"):
        assert p.time_unix_nano - p.start_time_unix_nano == INTERVAL
        a = attrs(p)
        if a["cuda.activity.kind"] == "kernel":
            kernel_time += p.as_double
        else:
            assert p.as_double == {"memcpy": 11e-9, "memset": 13e-9}[a["cuda.activity.kind"]]
    assert kernel_time == pytest.approx(sum(k.end - k.start for k in kernels) / 1e9, rel=1e-12)
    assert {p.as_double for p in points(receiver, "cuda.device.nccl.time")} == {7e-9}


def test_a_failed_export_sends_the_points_again_once(receiver: OtlpReceiver) -> None:
    """Delta points are held until acknowledged: a 500 loses none, and none is sent twice."""
    receiver.answer("/v1/metrics", Answer(status=500))
    batches = batches_of([_one("a"), _one("b")], size=1)
    assert deliver(sink_for(receiver.endpoint, signals=["metrics"]), *batches) == []
    assert receiver.count("/v1/metrics") == 2  # the 500, then both points in one request
    received = [
        attrs(p)["cuda.kernel.name"]
        for m in receiver.messages("/v1/metrics")
        for p in points_in(m, "cuda.kernel.traced.duration")
    ]
    assert Counter(received) == {"a": 1, "b": 1}


def test_json_encoding_carries_the_same_histograms(receiver: OtlpReceiver) -> None:
    stats = [_one("a", durations=histogram([3, 4, 5, 2**20, 2**20 + 1, 0], 5), count=6)]
    assert (
        deliver(sink_for(receiver.endpoint, signals=["metrics"], encoding="json"), *batches_of(stats)) == []
    )
    (point,) = points(receiver, "cuda.kernel.traced.duration")
    assert point.zero_count == 1 and point.count == 6 and (point.min, point.max) == (0, 2**20 + 1)
    assert received_buckets(point) == Counter(exact_bucket(v, 5) for v in (3, 4, 5, 2**20, 2**20 + 1))


def points_in(message: Any, name: str) -> list[Any]:
    metrics = nested([message], "resource_metrics", "scope_metrics", "metrics")
    return [p for m in metrics if m.name == name for p in getattr(m, m.WhichOneof("data")).data_points]


def test_every_statistics_metric_is_documented_with_its_unit() -> None:
    from cuptistream.sinks.otlp.stats import STATS_METRICS

    rows = [
        line
        for line in (Path(__file__).parents[1] / "docs" / "otlp.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    for name, d in STATS_METRICS.items():
        (row,) = [r for r in rows if f"`{name}`" in r.split("|")[1]]
        instrument = {"histogram": "exponential histogram"}.get(d.kind, d.kind)
        assert f"{instrument}, `{d.unit}`" in row, name


# --- end to end: the collector's own statistics ---------------------------------------------------


def test_end_to_end_the_collectors_histograms_match_the_raw_records(tmp_path: Path) -> None:
    """``cuptistream run`` replays the captures with statistics on, into the file sink (the raw
    records) and the OTLP sink (a real receiver): every kernel histogram the receiver decodes holds
    exactly the durations of the raw kernels that ended in its interval, at the collector's scale."""
    root = Path(__file__).resolve().parent.parent
    with OtlpReceiver() as receiver:
        cfg = {
            "sources": [{"type": "replay", "path": str(CAPTURE_DIR)}],
            "statistics": {"interval": "1s", "max_names": 500},
            "sinks": [
                {"type": "file", "directory": str(tmp_path / "out")},
                {"type": "otlp", "endpoint": receiver.endpoint, "signals": ["metrics"]},
            ],
        }
        (tmp_path / "cfg.json").write_text(json.dumps(cfg))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
        command = [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp_path / "cfg.json"), "--"]
        result = subprocess.run(
            [*command, sys.executable, "-c", "0"], capture_output=True, text=True, timeout=120, env=env
        )
        assert result.returncode == 0, result.stderr
    batches = list(cuptistream.read(tmp_path / "out").batches())
    kernels = [e for b in batches for e in b.events if isinstance(e, ev.Kernel)]
    offsets = {b.clock.offset_ns for b in batches if any(isinstance(e, ev.ActivityStats) for e in b.events)}
    assert kernels and len(offsets) == 1  # the replay's one clock
    (offset,) = offsets
    by_key: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    for k in kernels:  # the collector puts a record in the interval it ended in
        by_key[(k.end // SECOND * SECOND + offset, k.device_id, k.name)].append(k.end - k.start)

    received = {}
    for point in points(receiver, "cuda.kernel.traced.duration"):
        a = attrs(point)
        key = (point.start_time_unix_nano, a["cuda.device.id"], a["cuda.kernel.name"])
        assert key not in received and point.time_unix_nano - point.start_time_unix_nano == SECOND
        assert a["cuda.kernel.nccl"] == a["cuda.kernel.name"].startswith("nccl")
        received[key] = point
    assert set(received) == set(by_key) and len(received) > 10  # every raw (interval, device, name), once
    for key, point in received.items():
        durations = by_key[key]
        assert point.count == len(durations) and point.sum == sum(durations)
        assert (point.min, point.max) == (min(durations), max(durations))
        assert received_buckets(point) == Counter(exact_bucket(d, point.scale) for d in durations if d)
        assert point.zero_count == sum(1 for d in durations if d == 0)
    assert {p.scale for p in received.values()} <= {2, 1, 0}  # the collector's scale, or downscaled
    counts = {
        (p.start_time_unix_nano, attrs(p)["cuda.kernel.name"]): p.as_int
        for p in points(receiver, "cuda.kernel.traced.count")
    }
    assert counts == {(k[0], k[2]): len(d) for k, d in by_key.items()}
