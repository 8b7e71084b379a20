"""PM samples attributed to kernels (``statistics.pm_attribution``): synthetic sample columns joined
with the real kernel records of the shipped GPU captures, every figure recomputed here with plain
Python over the same inputs (overlaps kernel by kernel and sample by sample)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest

import cuptistream
from cuptistream.events import PmKernelStats, PmSamples
from cuptistream.statistics import Accumulator
from cuptistream.statistics import pm_attribution as pm_module
from tests.test_statistics import _arrays

S = 1_000_000_000
US = 1_000
T0 = 100 * S + 123 * US  # inside one 1 s interval, with room on both sides
METRICS = [
    "sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.per_second",
]

Sample = tuple[int, int, list[float]]
KernelRow = tuple[int, int, str]


def _kernels(capture: str = "torch_train", at: int = T0) -> tuple[list[np.ndarray], list[KernelRow]]:
    """The capture's kernel arrays moved together so the first starts at ``at`` (spacing kept), and
    the same kernels as plain (start, end, name) rows."""
    arrays, names = _arrays(capture)
    kernels = [r.copy() for e, r in arrays if e == "kernel"]
    base = min(int(r["start"].min()) for r in kernels)
    rows: list[KernelRow] = []
    for r in kernels:
        for field in ("start", "end"):
            r[field] = (r[field].astype(np.int64) - base + at).astype(r[field].dtype)
        rows += [
            (int(s), int(e), names(int(p))) for s, e, p in zip(r["start"], r["end"], r["name"], strict=True)
        ]
    return kernels, rows


def _samples(begin: int, end: int) -> list[Sample]:
    """Samples of 6 and 9 us in turn, a 2 us gap after every seventh; tensor active varies, DRAM is
    NaN in every fifth (a value CUPTI could not evaluate)."""
    out: list[Sample] = []
    at, i = begin, 0
    while at < end:
        length = 6 * US if i % 2 else 9 * US
        dram = math.nan if i % 5 == 4 else float(1e9 * (i % 3))
        out.append((at, at + length, [float((i * 37) % 100), dram]))
        at += length + (2 * US if i % 7 == 6 else 0)
        i += 1
    return out


def _event(samples: list[Sample], device: int = 0) -> PmSamples:
    return PmSamples(
        device_id=device, chip="GH100", metrics=METRICS, starts=[s for s, _, _ in samples],
        ends=[e for _, e, _ in samples], values=[[v[m] for _, _, v in samples] for m in range(len(METRICS))],
    )  # fmt: skip


def _expected(
    samples: list[Sample],
    kernels: list[KernelRow],
    traced: Callable[[int, int], int],
    max_names: int = 10_000,
) -> dict[str, dict[str, object]]:
    """Per name (or ``other``): the figures by their definitions, one kernel and one sample at a time."""
    overlap: dict[str, list[int]] = defaultdict(lambda: [0] * len(samples))
    kernel_ns: dict[str, int] = defaultdict(int)
    for start, end, name in kernels:
        kernel_ns[name] += end - start
        for i, (a, b, _) in enumerate(samples):
            overlap[name][i] += max(0, min(end, b) - max(start, a))
    everyone = [sum(overlap[n][i] for n in overlap) for i in range(len(samples))]
    ranked = sorted(kernel_ns, key=lambda n: -kernel_ns[n])
    groups = {n: [n] for n in ranked[:max_names]}
    if ranked[max_names:]:
        groups["other"] = ranked[max_names:]
    out: dict[str, dict[str, object]] = {}
    for label, members in groups.items():
        w = [sum(overlap[n][i] for n in members) for i in range(len(samples))]
        covered = sum(w)
        if not covered:
            continue
        span = [traced(a, b) or b - a for a, b, _ in samples]
        means = []
        for m in range(len(samples[0][2])):
            pairs = [(w[i], v[m]) for i, (_, _, v) in enumerate(samples) if w[i] and not math.isnan(v[m])]
            weight = sum(x for x, _ in pairs)
            means.append(sum(x * v for x, v in pairs) / weight if weight else math.nan)
        total = sum(kernel_ns[n] for n in members)
        out[label] = {
            "kernel_ns": total,
            "covered_ns": covered,
            "covered_share": covered / total,
            "samples": sum(1 for x in w if x),
            "mean": means,
            "own_share": sum(w[i] * w[i] / span[i] for i in range(len(samples))) / covered,
            "all_share": sum(w[i] * everyone[i] / span[i] for i in range(len(samples))) / covered,
        }
    return out


def _check(
    rows: list[PmKernelStats], expected: dict[str, dict[str, object]], metrics: list[str] = METRICS
) -> None:
    assert {r.name for r in rows} == set(expected) and len(rows) == len(expected)
    for r in rows:
        want = expected[r.name]
        assert (r.kernel_ns, r.covered_ns, r.samples) == (
            want["kernel_ns"],
            want["covered_ns"],
            want["samples"],
        )
        assert r.metrics == metrics
        assert r.mean == pytest.approx(want["mean"], rel=1e-9, nan_ok=True)
        for key in ("covered_share", "own_share", "all_share"):
            assert getattr(r, key) == pytest.approx(want[key], rel=1e-9), key


def _full_traced(kernels: list[KernelRow]) -> Callable[[int, int], int]:
    """Continuous tracing: from the first kernel's start to the newest end (``Coverage``)."""
    first, newest = min(s for s, _, _ in kernels), max(e for _, e, _ in kernels)
    return lambda a, b: max(0, min(b, newest) - max(a, first))


def _run(
    acc: Accumulator, arrays: list[np.ndarray], samples: PmSamples, samples_first: bool
) -> list[PmKernelStats]:
    """``samples_first``: the samples come before the kernels; else an earlier decode's (one
    sample before them all) says the device is sampled, the kernels wait, and then they come."""
    if samples_first:
        acc.pm_samples(samples)
    else:
        earlier = msgspec.structs.replace(
            samples, starts=samples.starts[:1], ends=samples.ends[:1], values=[v[:1] for v in samples.values]
        )
        acc.pm_samples(earlier)
        rest = msgspec.structs.replace(
            samples, starts=samples.starts[1:], ends=samples.ends[1:], values=[v[1:] for v in samples.values]
        )
    for records in arrays:
        acc.add("kernel", records)
        acc.buffer_done()
    if not samples_first:
        assert acc.pm is not None and sum(b.waiting_n for b in acc.pm._devices.values()) > 0
        acc.pm_samples(rest)
    return [e for e in acc.close() if isinstance(e, PmKernelStats)]


@pytest.mark.parametrize("samples_first", [True, False], ids=["samples_first", "kernels_wait"])
def test_each_metric_is_the_overlap_weighted_mean_of_the_samples_a_kernel_ran_in(samples_first: bool) -> None:
    arrays, kernels = _kernels()
    samples = _samples(T0 - 20 * US, max(e for _, e, _ in kernels) + 20 * US)
    straddling = sum(1 for s, e, _ in kernels if any(s < b < e for _, b, _ in samples))
    assert straddling >= 10  # kernels split across sample boundaries
    _, names = _arrays("torch_train")
    acc = Accumulator(S, 500, names)
    rows = _run(acc, arrays, _event(samples), samples_first)
    _check(rows, _expected(samples, kernels, _full_traced(kernels)))
    assert any(r.covered_share < 1 for r in rows)  # kernels in the gaps between samples
    assert all(r.interval_start == T0 // S * S and r.device_id == 0 and r.traced_ns > 0 for r in rows)


def test_concurrent_kernels_each_get_the_whole_sample_value_and_the_concurrency_shows() -> None:
    arrays, kernels = _kernels()
    again, rows_again = _kernels(at=T0 + 1_500)  # the same kernels 1.5 us later: a second stream
    samples = _samples(T0 - 20 * US, max(e for _, e, _ in rows_again) + 20 * US)
    _, names = _arrays("torch_train")
    acc = Accumulator(S, 500, names)
    rows = _run(acc, arrays + again, _event(samples), True)
    both = kernels + rows_again
    _check(rows, _expected(samples, both, _full_traced(both)))
    alone = {r.name: r for r in _run(Accumulator(S, 500, names), arrays, _event(samples), True)}
    assert any(r.all_share > 1 for r in rows)  # kernels ran at once
    assert all(r.all_share > alone[r.name].all_share for r in rows)


def test_budget_mode_attributes_only_traced_time_and_reports_the_covered_share() -> None:
    arrays, kernels = _kernels()
    first, last = T0, max(e for _, e, _ in kernels)
    windows = [(first, first + (last - first) // 3), (first + (last - first) // 2, last)]

    def inside(s: int, e: int) -> bool:
        return any(a <= s and e <= b for a, b in windows)

    kept = [
        r[np.array([inside(int(s), int(e)) for s, e in zip(r["start"], r["end"], strict=True)], bool)]
        for r in arrays
    ]
    in_windows = [k for k in kernels if inside(k[0], k[1])]
    assert 0 < len(in_windows) < len(kernels)
    # Samples stop before the second window ends (a sampler that left): part of it is uncovered.
    samples = _samples(first - 20 * US, (windows[1][0] + windows[1][1]) // 2)
    _, names = _arrays("torch_train")
    acc = Accumulator(S, 500, names)
    for n, (a, b) in enumerate(windows, 1):
        acc.span(n, a, 0, ["concurrent_kernel"])
        acc.span(n, a, b, ["concurrent_kernel"])
    rows = _run(acc, kept, _event(samples), True)

    def traced(a: int, b: int) -> int:
        return sum(max(0, min(b, y) - max(a, x)) for x, y in windows)

    _check(rows, _expected(samples, in_windows, traced))
    assert any(r.covered_share < 1 for r in rows)
    assert all(r.traced_ns == sum(b - a for a, b in windows) for r in rows)


def test_the_name_cap_keeps_the_top_names_by_kernel_time_and_folds_the_rest_into_other() -> None:
    arrays, kernels = _kernels()
    samples = _samples(T0 - 20 * US, max(e for _, e, _ in kernels) + 20 * US)
    _, names = _arrays("torch_train")
    rows = _run(Accumulator(S, 3, names), arrays, _event(samples), True)
    assert len(rows) == 4 and rows[-1].name == "other"
    _check(rows, _expected(samples, kernels, _full_traced(kernels), max_names=3))


def test_devices_without_samples_and_streams_without_samples_fold_nothing() -> None:
    arrays, kernels = _kernels()
    _, names = _arrays("torch_train")
    plain = Accumulator(S, 500, names)
    for records in arrays:
        plain.add("kernel", records)
    assert plain.pm is None and not [e for e in plain.close() if isinstance(e, PmKernelStats)]
    other_device = Accumulator(S, 500, names)
    samples = _samples(T0, max(e for _, e, _ in kernels))
    assert _run(other_device, arrays, _event(samples, device=1), True) == []


def test_waiting_kernels_and_kept_samples_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pm_module, "MAX_WAITING", 50)
    arrays, kernels = _kernels("exact_counts", at=T0)
    _, names = _arrays("exact_counts")
    acc = Accumulator(S, 500, names)
    acc.pm_samples(_event(_samples(T0 - 20 * US, T0)))  # samples that stop: every kernel waits
    for records in arrays:
        for part in np.array_split(records, 20):
            acc.add("kernel", part)
            acc.buffer_done()
    assert acc.pm is not None and acc.pm.folded_early >= len(kernels) - 50
    assert all(book.waiting_n <= 50 for book in acc.pm._devices.values())
    acc.close()
    # After the intervals closed, the samples one interval back are all that is kept.
    long = _samples(T0, T0 + 3 * S + 100 * US)[::1]
    pm = pm_module.PmAttribution(S, 10)
    pm.samples(_event(long))
    pm.closed_until(T0 // S * S + 3 * S)
    book = pm._devices[0]
    assert book.first > 0 and int(book.ends.min()) >= T0 // S * S + 2 * S


# --- through the collector --------------------------------------------------------------------------

_PROGRAM = """
import sys, cuptistream
from cuptistream.cupti import driver
from cuptistream.cupti.pm_sampling_api import Decoded
from cuptistream.sources.pm_sampling import PmSamplingSource

first, last = int(sys.argv[3]), int(sys.argv[4])

class StandIn:  # the device side of PM sampling, as CUPTI's answers it: one decode holds them all
    def __init__(self, device): self.given = False
    def enable(self): return "GH100"
    def configure(self, metrics, interval_ns, hardware_buffer): self.metrics, self.step = metrics, interval_ns; return metrics
    def start(self): pass
    def stop(self): pass
    def disable(self): pass
    def decode(self, max_samples):
        starts = [] if self.given else list(range(first, last, self.step))
        self.given = True
        values = [[10.0 * (m + 1)] * len(starts) for m in range(len(self.metrics))]
        return Decoded(starts, [s + self.step for s in starts], values, False, "end_of_records")

PmSamplingSource.session_factory = StandIn
PmSamplingSource.find_context = lambda self, device: 0xC0
driver.acquire("test")  # no driver here: the source's release must not finalize CUPTI
sampler = {"type": "pm_sampling", "metrics": sys.argv[5].split(","), "interval": "20us", "decode_period": "50ms"}
replay = {"type": "replay", "path": sys.argv[2]}
cfg = {"sources": [sampler if sys.argv[6] == "sampler" else replay], "sinks": [{"type": "null"}]}
with cuptistream.session(cfg, collector=sys.argv[1], quiet=True):
    pass
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_the_collector_attributes_a_sampling_probes_samples_to_a_replayed_probes_kernels(
    tmp_path: Path, workers: int
) -> None:
    """A probe with a ``pm_sampling`` source (its device side a stand-in that answers as CUPTI does),
    then another that replays the torch capture's real kernels (its stream is handed the device's
    latest samples as it opens): the recording holds a ``pm_kernel_stats`` row per kernel name,
    covered whole, each metric the value the samples held."""
    from cuptistream.collector.collector import Collector
    from cuptistream.cupti import capture
    from cuptistream.events import ActivityStats
    from cuptistream.sources.replay import DEFAULT_PATH

    path = DEFAULT_PATH / "torch_train.cupti"
    cap = capture.read(path)
    _, kernels = _kernels()  # only the names; the times are the capture's own below
    arrays, _ = _arrays("torch_train")
    starts = [int(r["start"].min()) for e, r in arrays if e == "kernel"]
    ends = [int(r["end"].max()) for e, r in arrays if e == "kernel"]
    first, last = min(starts) - 100 * US, max(ends) + 100 * US
    config = cuptistream.load_config({
        "pipeline": {"decode_workers": workers}, "sources": [],
        "statistics": {"interval": "1s"}, "sinks": [{"type": "file", "directory": str(tmp_path / "out")}],
    })  # fmt: skip
    collector = Collector(config).start()
    sock = str(tmp_path / "c.sock")
    collector.listen(sock)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    metrics = ",".join([METRICS[0], "dram__cycles_active.avg.pct_of_peak_sustained_elapsed"])
    try:
        for role in ("sampler", "replay"):
            program = [sys.executable, "-c", _PROGRAM, sock, str(path), str(first), str(last), metrics, role]
            done = subprocess.run(program, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
    finally:
        report = collector.finish(probe_timeout=30)
    assert report is not None and cap.buffers
    events = list(cuptistream.read(tmp_path / "out"))
    rows = [e for e in events if isinstance(e, PmKernelStats)]
    kernel_names = {e.name for e in events if isinstance(e, ActivityStats) and e.category == "kernel"}
    assert {r.name for r in rows} == kernel_names == {name for _, _, name in kernels}
    for r in rows:
        assert r.covered_share == 1.0 and r.covered_ns == r.kernel_ns > 0
        assert r.metrics == metrics.split(",") and r.mean == pytest.approx([10.0, 20.0])
        assert 0 < r.own_share <= r.all_share
