"""PM sampling attributed to kernels (``PmKernelStats``) for the ranks of ``tests.helpers.ranks``.

Each rank's GPU is sampled every 250 us over its kernels (the replayed capture spans about 5 ms)
with the GH100 default metric set (``pm_metrics.default_metrics``), reading as ``pm_recording``'s
busy GPU (SM active about 88 %, tensor active about 52 %) with a small spread; ``throttle`` scales
the SM and tensor activity of a rank's samples, as a throttled or shared GPU reads. The rows are
made by the collector's own attribution (``statistics.pm_attribution``) from these samples and the
rank's kernels, and added to the rank's events with the samples.
"""

from __future__ import annotations

import numpy as np

from cuptistream import events as ev
from cuptistream.cupti.pm_metrics import default_metrics
from cuptistream.statistics.pm_attribution import PmAttribution
from tests.helpers.fixture_recording import Process
from tests.helpers.pm_recording import CHIP, SHAPE

PERIOD = 250_000
INTERVAL = 10_000_000_000
BUSY = {"sm_active": 88.0, "tensor_active": 52.0, "tensor_hmma_active": 52.0}
THROTTLED = ("sm_active", "tensor_active", "tensor_hmma_active")


def with_hardware(process: Process, seed: int, throttle: float = 1.0) -> Process:
    """``process`` with PM samples over its kernels and their ``PmKernelStats``."""
    kernels = [e for e in process.events if isinstance(e, ev.Kernel)]
    start = np.array([k.start for k in kernels], np.int64)
    end = np.array([k.end for k in kernels], np.int64)
    names = sorted({k.name for k in kernels})
    codes = np.array([names.index(k.name) for k in kernels], np.int64)
    choice = default_metrics(CHIP)
    first = int(start.min()) - PERIOD
    starts = first + PERIOD * np.arange((int(end.max()) + PERIOD - first) // PERIOD + 1, dtype=np.int64)
    rng = np.random.default_rng(seed)
    values = []
    for field in choice.fields:
        busy = BUSY.get(field, SHAPE[field][0]) * (throttle if field in THROTTLED else 1.0)
        values.append(np.clip(rng.normal(busy, 0.3 if busy else 0.0, len(starts)), 0.0, None).tolist())
    samples = ev.PmSamples(
        device_id=0, chip=CHIP, metrics=list(choice.fields.values()), starts=starts.tolist(),
        ends=(starts + PERIOD).tolist(), values=values,
    )  # fmt: skip
    attribution = PmAttribution(INTERVAL, max_names=64)
    attribution.samples(samples)
    interval = end // INTERVAL
    attribution.kernels(interval, np.zeros(len(start), np.int64), start, end, codes, names)
    rows: list[ev.Event] = []
    for index in np.unique(interval).tolist():
        ended = interval == index
        kernel_ns: dict[str, int] = {}
        for i in np.flatnonzero(ended).tolist():
            kernel_ns[names[codes[i]]] = kernel_ns.get(names[codes[i]], 0) + int(end[i] - start[i])
        low = index * INTERVAL
        rows += attribution.emit(index, low, low + INTERVAL, {0: kernel_ns}, lambda a, b: b - a, INTERVAL)
        attribution.closed_until(low + INTERVAL)
    return Process(process.resource, process.clock, [*process.events, samples, *rows])


def more_launches(process: Process, kernel: str) -> Process:
    """``process`` with every launch of ``kernel`` run twice (the copy right after the original)."""
    extra = [
        ev.Kernel(
            **{**{f: getattr(e, f) for f in e.__struct_fields__}, "start": e.end, "end": 2 * e.end - e.start}
        )
        for e in process.events
        if isinstance(e, ev.Kernel) and e.name == kernel
    ]
    return Process(process.resource, process.clock, [*process.events, *extra])
