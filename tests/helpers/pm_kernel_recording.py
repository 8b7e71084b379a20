"""Recordings of PM sampling with the samples attributed to kernels (``PmKernelStats``), shaped like
a program that alternates a bf16 GEMM and an elementwise kernel on an H100.

The samples are ``pm_recording``'s (two hosts, 20 ms samples, 5 s idle, 20 s of work, 5 s idle),
except that the work runs in 100 ms cycles: 80 ms of GEMM kernels (4.4 ms each), then 20 ms of
elementwise kernels (0.7 ms each), and the samples in which the elementwise kernels run read what
they do (tensor active near 0, DRAM active about 80 %). Kernels are not aligned to the samples, so
some straddle two. Elementwise kernels also run for 40 ms before the sampler starts: uncovered.
``PmStats`` are folded by the collector's fold and ``PmKernelStats`` made by the collector's own
attribution (``statistics.pm_attribution``) from these samples and kernels, each interval's rows
after its ``PmStats``. ``kernels_of`` gives the same kernels as plain rows, for recomputing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cuptistream import events as ev
from cuptistream.cupti.pm_metrics import field_of
from cuptistream.statistics.pm_attribution import PmAttribution
from cuptistream.statistics.pm_fold import PmFold
from tests.helpers.fixture_recording import Process, write_recording
from tests.helpers.pm_recording import (
    CUPTI_START,
    IDLE_S,
    MS,
    SECOND,
    STATS_INTERVAL,
    WORK_S,
    pm_processes,
    sample_events,
    samples_of,
)

US = 1_000
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
ELEMENTWISE = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIN3c108BFloat16EEESt5arrayIPcLm3EEEEviT0_T1_"
NAMES = [GEMM, ELEMENTWISE]
CYCLE = 100 * MS
GEMM_PART = 80 * MS
WORK_START = CUPTI_START + IDLE_S * SECOND
# field -> (reading while elementwise kernels run, spread)
ELEMENTWISE_SHAPE = {
    "sm_active": (75.0, 3.0),
    "tensor_active": (0.5, 0.2),
    "tensor_hmma_active": (0.5, 0.2),
    "dram_active": (80.0, 4.0),
}

Kernel = tuple[int, int, str]  # start, end, name (CUPTI ns)


def kernels_of() -> list[Kernel]:
    """Every host's kernels: the same program on each."""
    out: list[Kernel] = []
    at = CUPTI_START - 40 * MS
    while at + 700 * US <= CUPTI_START:  # before the sampler started
        out.append((at, at + 700 * US, ELEMENTWISE))
        at += 800 * US
    for cycle in range(WORK_S * SECOND // CYCLE):
        base = WORK_START + cycle * CYCLE
        at = base + 200 * US
        while at + 4_400 * US <= base + GEMM_PART + 1_500 * US:  # the last one runs into the next sample
            out.append((at, at + 4_400 * US, GEMM))
            at += 4_500 * US
        while at + 700 * US <= base + CYCLE - 400 * US:
            out.append((at, at + 700 * US, ELEMENTWISE))
            at += 800 * US
    return out


def samples_with_kernels(host: str, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``pm_recording.samples_of``, the samples of the elementwise part of each cycle reading as
    elementwise kernels do."""
    metrics, starts, values = samples_of(host, seed)
    rng = np.random.default_rng(100 + seed)
    offset = starts - WORK_START
    elementwise = (offset >= 0) & (offset < WORK_S * SECOND) & (offset % CYCLE >= GEMM_PART)
    for row, metric in enumerate(metrics):
        shape = ELEMENTWISE_SHAPE.get(field_of(metric) or "")
        if shape is not None:
            noise = rng.normal(shape[0], shape[1], int(elementwise.sum()))
            values[row, elementwise] = np.clip(noise, 0.0, 100.0)
    return metrics, starts, values


def pm_kernel_events(host: str, seed: int) -> list[ev.Event]:
    """One host's PmSamples (a second each), PmStats and PmKernelStats."""
    metrics, starts, values = samples_with_kernels(host, seed)
    kernels = kernels_of()
    start = np.array([k[0] for k in kernels], np.int64)
    end = np.array([k[1] for k in kernels], np.int64)
    codes = np.array([NAMES.index(k[2]) for k in kernels], np.int64)
    interval = end // STATS_INTERVAL
    fold = PmFold(STATS_INTERVAL)
    attribution = PmAttribution(STATS_INTERVAL, max_names=20)
    out: list[ev.Event] = []
    for n, samples in enumerate(sample_events(metrics, starts, values)):
        out.append(samples)
        attribution.samples(samples)
        if not n:  # the device is sampled from now on: its kernels fold as samples past them come
            attribution.kernels(interval, np.zeros(len(start), np.int64), start, end, codes, NAMES)
        out.extend(fold.add(samples))
    out.extend(fold.close())
    placed: list[ev.Event] = []
    for event in out:
        placed.append(event)
        if isinstance(event, ev.PmStats):  # the interval closed: its kernels' rows follow
            placed.extend(_attributed(attribution, event.interval_start, codes, end, end - start))
    return placed


def _attributed(
    attribution: PmAttribution, low: int, codes: np.ndarray, end: np.ndarray, duration: np.ndarray
) -> list[ev.PmKernelStats]:
    """The interval's rows, with each name's kernel time as the accumulator hands it over (the
    kernels that ended in the interval), the whole interval traced."""
    index = low // STATS_INTERVAL
    ended = end // STATS_INTERVAL == index
    kernel_ns: dict[str, int] = {}
    for i in np.flatnonzero(ended).tolist():
        name = NAMES[int(codes[i])]
        kernel_ns[name] = kernel_ns.get(name, 0) + int(duration[i])
    rows = attribution.emit(
        index, low, low + STATS_INTERVAL, {0: kernel_ns}, lambda a, b: b - a, STATS_INTERVAL
    )
    attribution.closed_until(low + STATS_INTERVAL)
    return rows


def pm_kernel_processes() -> list[Process]:
    return pm_processes(events_of=pm_kernel_events)


def write_pm_kernel_recording(directory: Path) -> Path:
    return write_recording(directory, pm_kernel_processes(), batch_events=7)
