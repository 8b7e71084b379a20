"""What ``cuptistream compare`` says of a flagged rank's longer kernels from the hardware counters
attributed to them (the collector's ``PmKernelStats``): did the rank run the same kernels less
efficiently, or more of them, or longer ones, at the same utilization?

Per rank and kernel name (as displayed), each metric's whole-span mean is the intervals' means
weighted by their covered kernel time, as in summary's table (``summary_kernel_hardware``). For each
of a flagged rank's top longer kernels (``kernels_longer``), the rank's reading is set against the
median of the other compared ranks' readings of the same name (of a pair: the peer's). A reading
counts only where samples covered at least ``MIN_COVERED`` of the name's kernel time. Verdicts:

- ``less efficient``: SM, tensor or DRAM active reads lower on the rank by at least ``LOWER_RELATIVE``
  of the others' median and at least ``LOWER_POINTS`` points: the same kernel kept the SMs, tensor
  pipes or memory less busy (lower clocks, a throttled or shared GPU).
- ``more launches``: no activity reads lower, and the rank launched the name more often than the
  median (by the rule's ``min_relative``; ``estimate_tolerance`` for estimated counts): more work.
- ``longer launches``: no activity reads lower, as many launches: each launch did more work
  (larger inputs) or waited (on another stream, a collective, the host).
- ``no reading``: the rank, or every other rank, has no covered reading of the name.

The thresholds sit above what noise gives: a name's reading is the device's counters over the
samples it ran in, shared with whatever else ran there, and identical ranks read a few tenths of a
point apart; a throttled GPU reads tens of percent lower.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from cuptistream.analysis.records import LPmKernelStats
from cuptistream.analysis.select import Selection
from cuptistream.analysis.summary_kernel_hardware import NameTotals
from cuptistream.cupti.pm_metrics import field_of

HARDWARE = 6  # the kind ``compare_read.gpu_work`` gives PmKernelStats (after STATS)
ACTIVITY = ("sm_active", "tensor_active", "dram_active")  # a lower one: less efficient
SHOWN = (*ACTIVITY, "sm_occupancy")  # the columns of the text and JSON output
LOWER_RELATIVE = 0.10
LOWER_POINTS = 3.0
MIN_COVERED = 0.25
RULE = (
    f"per longer kernel of a flagged rank, against the median of the other ranks' readings of it: "
    f"less efficient where {'/'.join(ACTIVITY)} reads lower by >= {100 * LOWER_RELATIVE:g} % and "
    f">= {LOWER_POINTS:g} points; else more launches where it launched more often (min_relative), "
    f"else longer launches; a reading needs >= {100 * MIN_COVERED:g} % of the kernel time covered by samples"
)


class CPmKernelStats(LPmKernelStats, tag="pm_kernel_stats"):
    gpu: ClassVar[int] = HARDWARE


def hardware_rows(events: Sequence[Any], offset_ns: int, selection: Selection) -> list[Any]:
    """The PmKernelStats (light or full) that ``selection`` keeps: its devices, and its time window
    by interval start, as ``compare_stats.stats_work`` keeps statistics."""
    low, high = -(2**63), 2**63
    if events and selection.timed:
        low, high = selection.window(offset_ns, events)
    return [
        e
        for e in events
        if (selection.devices is None or e.device_id in selection.devices)
        and low <= e.interval_start + offset_ns < high
    ]


def reading(totals: NameTotals | None) -> dict[str, float] | None:
    """The name's means by field (``SHOWN``), or None where too little of its time was covered."""
    if totals is None or not totals.kernel_ns or totals.covered_ns < MIN_COVERED * totals.kernel_ns:
        return None
    by_field = {field_of(m): v for m, v in totals.means().items()}
    return {f: float(v) for f in SHOWN if (v := by_field.get(f)) is not None}


def verdicts(
    longer: Sequence[Mapping[str, Any]],
    mine: Mapping[str, NameTotals],
    others: Sequence[Mapping[str, NameTotals]],
    more_launches: float,
) -> list[dict[str, Any]]:
    """Per row of ``longer`` (``outliers.kernel_differences``): the rank's and the others' median
    readings, and the verdict (module docstring). ``more_launches``: the relative count past which
    the rank launched the name more often."""
    out = []
    for row in longer:
        name = row["name"]
        rank = reading(mine.get(name))
        peers = [r for o in others if (r := reading(o.get(name))) is not None]
        median = {
            f: float(np.median([p[f] for p in peers if f in p])) for f in SHOWN if any(f in p for p in peers)
        }
        covered = (
            mine[name].covered_ns / mine[name].kernel_ns if name in mine and mine[name].kernel_ns else 0.0
        )
        lower = (
            []
            if rank is None
            else [f for f in ACTIVITY if f in rank and f in median and _lower(rank[f], median[f])]
        )
        if rank is None or not median:
            verdict = "no reading"
        elif lower:
            verdict = "less efficient"
        elif row["rank_count"] > (1 + more_launches) * row["median_count"]:
            verdict = "more launches"
        else:
            verdict = "longer launches"
        out.append({
            "name": name, "verdict": verdict, "lower": lower, "rank_pct": rank or {}, "others_pct": median,
            "others": len(peers), "covered_share": round(covered, 4),
            "rank_count": row["rank_count"], "median_count": row["median_count"],
        })  # fmt: skip
    return out


def _lower(value: float, median: float) -> bool:
    drop = median - value
    return drop >= LOWER_POINTS and drop >= LOWER_RELATIVE * median


WORDS = {
    "less efficient": "ran less efficiently: lower activity for the same kernel (a throttled or shared GPU)",
    "more launches": "ran more work: more launches at the same utilization",
    "longer launches": "ran longer launches at the same utilization: larger inputs, or waits",
    "no reading": "no hardware reading to tell (too little of its time covered by PM samples)",
}
