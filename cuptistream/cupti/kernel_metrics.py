"""The metrics of an on-demand window's range profiling (``cuptistream trace --metrics SPEC``): a
named set, or metric names separated by commas, checked on the device's chip with the host metric
library (``perfworks``: no GPU needed), and how many passes (kernel replays) they take there.

Sets, and their passes on GH100: ``utilization`` (1: SM, warp, tensor and FMA pipe activity, DRAM
activity and bytes), ``memory`` (2: DRAM bytes and throughput, L1 and L2 hit rates),
``speed_of_light`` (9: Nsight Compute's throughput breakdown of SM, memory, L1, L2 and DRAM). Each
also reads the kernel's duration as profiled (``gpu__time_duration.sum``). A set takes what the chip
has of it; a listed name the chip lacks is a ``ConfigError`` naming close matches.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from cuptistream.cupti.perfworks import ChipMetrics, UnknownChipError
from cuptistream.errors import ConfigError

SETS: dict[str, tuple[str, ...]] = {
    "utilization": (
        "gpu__time_duration.sum",
        "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
        "dram__cycles_active.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
    ),
    "memory": (
        "gpu__time_duration.sum",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "l1tex__t_sector_hit_rate.pct",
        "lts__t_sector_hit_rate.pct",
    ),
    "speed_of_light": (
        "gpu__time_duration.sum",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "l1tex__throughput.avg.pct_of_peak_sustained_active",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
    ),
}
MAX_PASSES = 64  # kernel replays per launch: past this a window would barely run the program


@dataclass(frozen=True)
class KernelMetricChoice:
    chip: str
    metrics: list[str]
    passes: int


def parse_spec(spec: str) -> list[str]:
    """The metric names or the one set name of ``spec`` (``--metrics``), chip aside; ``ConfigError``
    for an empty spec or an unknown set name."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise ConfigError(f"--metrics: name a set ({', '.join(SETS)}) or metrics separated by commas")
    if len(names) == 1 and "__" not in names[0] and names[0] not in SETS:
        close = difflib.get_close_matches(names[0], list(SETS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"--metrics: no set {names[0]!r}{hint}; sets: {', '.join(SETS)}, or metric names")
    return names


def choose(spec: str, chip: str) -> KernelMetricChoice:
    """``spec`` on ``chip``: the metrics to profile and their passes. ``ConfigError``: an unknown set,
    a metric the chip lacks (with close matches), more than ``MAX_PASSES`` passes, a chip the
    installed CUPTI does not know."""
    names = parse_spec(spec)
    try:
        catalog = ChipMetrics(chip)
    except UnknownChipError:
        raise ConfigError(f"--metrics: the installed CUPTI does not know the chip {chip}") from None
    with catalog:
        if len(names) == 1 and names[0] in SETS:
            metrics = [name for name in SETS[names[0]] if catalog.exists(name)]
        else:
            for name in names:
                if not catalog.exists(name):
                    close = difflib.get_close_matches(name, catalog.names(), n=3, cutoff=0.6)
                    hint = f"; close matches: {', '.join(close)}" if close else ""
                    raise ConfigError(f"--metrics: {name!r} is not a metric on {chip}{hint}")
            metrics = list(dict.fromkeys(names))
        passes = catalog.passes(metrics, "range_profiler")
    if passes > MAX_PASSES:
        raise ConfigError(
            f"--metrics: these {len(metrics)} metrics take {passes} passes on {chip} (at most {MAX_PASSES}); "
            "profile fewer at a time"
        )
    return KernelMetricChoice(chip, metrics, passes)
