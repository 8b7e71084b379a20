"""The rule ``cuptistream compare`` flags ranks with, and the words it explains a flag with.

Rule (per metric, across the ranks being compared): with ``m`` the median of the ranks' values and
``MAD`` the median of ``|x - m|``, a rank's robust z-score is ``z = (x - m) / (1.4826 * MAD)`` (the
modified z-score of Iglewicz and Hoaglin; 1.4826 * MAD estimates the standard deviation of normal
data and ignores a minority of outliers). A rank is flagged on the metric when ``|z| > threshold``
(3.5) **and** ``|x - m| >= min_relative * |m|`` (2 %): the second condition keeps ranks that agree
to a fraction of a percent (MAD near 0, as on identical replicas) from being flagged for noise.
With MAD = 0 any rank that differs by ``min_relative`` or more is flagged.

Two ranks have no majority, and the rule above would find both equally far from their median. A
synchronous job's straggler is the rank with more GPU work while its peer waits, so of a pair
(``flag_pair``) a rank is flagged when its compute-kernel time exceeds its peer's by ``min_relative``
or more and it does not also spend more time in NCCL than its peer (then it waits too, and is not
the cause); its NCCL time and kernel count are flagged with it where they differ by the same
thresholds. Time in NCCL alone does not decide a pair: with no injection the two ranks of a DDP job
can differ by a fifth in it. A pair's flags are measured against the peer (``reference``:
``peer``), not the median. A single rank is flagged for nothing.

A rank compared on estimates (always-on statistics, a few percent of the time traced) is flagged
over the whole span only when it was also flagged in at least half of the intervals it was compared
in (``borne_out``): one thinly traced interval can carry a whole-span total past the thresholds,
while a rank that is really slower is flagged in nearly every interval.

Ranks that share a GPU (``shared``): the GPU time-slices their contexts, and a kernel's recorded
duration includes the time the GPU ran other ranks' kernels while it was resident, unevenly (one
rank's kernels can absorb 25 % more than another's doing the same work). For those ranks
``busy_fraction`` and ``copy_ns`` are not flagged, and ``compute_ns`` and ``nccl_ns`` are compared on
the *work basis* (``work_basis``): a kernel name the rank launches as often as the median rank
(within ``min_relative``; within ``estimate_tolerance`` where the rank's counts are estimates from
budget windows, whose sampling spreads them by several percent on identical work) counts the median
rank's time for that name, since its difference is time-slicing; a name it launches more or less
often, or alone, counts its own time. So a rank is
flagged on kernel time only for work the others do not do. ``kernels`` and ``copy_bytes`` are counts
and are compared as measured.

Failure modes: a metric that is 0 on every rank (no NCCL kernels under gloo, no copies) flags
nothing; when half or more of the ranks are slow, the median is a slow rank and the fast ones are
flagged as "low" instead; of a pair, a rank late for a reason the GPU does not show (input, CPU) is
not found, since only more GPU work names a pair's straggler.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

# What each metric is, for the rule's statement and the causes.
METRICS = ("busy_fraction", "compute_ns", "nccl_ns", "copy_ns", "copy_bytes", "kernels")
_SCALE = 1.4826  # MAD -> standard deviation of normal data
# Metrics that time-slicing makes unreliable on a shared GPU: not flagged for ranks that share one.
SLICED = ("busy_fraction", "copy_ns")
WORK_BASIS = ("compute_ns", "nccl_ns")
COUNTS = ("kernels", "copy_bytes")  # estimated ones are flagged only past Rule.estimate_tolerance
SHARED_RULE = (
    "busy_fraction and copy_ns not flagged (time-sliced); compute_ns and nccl_ns compared on the work "
    "basis: a kernel name launched as often as by the median rank (within min_relative, or "
    "estimate_tolerance for estimated counts) counts the median rank's time, others their own"
)

PAIR_RULE = (
    "flag the rank whose compute_ns exceeds its peer's by min_relative and whose nccl_ns does not; "
    "relative to the peer"
)

ESTIMATED_RULE = "over the whole span, only where also flagged in at least half of the intervals compared"


def borne_out(flagged_intervals: int, compared_intervals: int) -> bool:
    """Whether an estimated rank's whole-span flags hold: it was flagged in at least half of the
    intervals it was compared in."""
    return 2 * flagged_intervals >= compared_intervals


@dataclass(frozen=True)
class Rule:
    threshold: float = 3.5
    min_relative: float = 0.02
    min_ranks: int = 3  # fewer: two ranks are compared as a pair (``flag_pair``), one not at all
    # Estimated counts (always-on mode, a few percent of the time traced) of identical work spread
    # by up to about a tenth across ranks in lockstep: "launched as often" allows this much, and an
    # estimated rank's counts are flagged only past it.
    estimate_tolerance: float = 0.15

    def describe(self) -> dict[str, Any]:
        return {
            "name": "modified z-score (median and MAD across ranks)",
            "z": "(x - median) / (1.4826 * MAD), MAD = median(|x - median|)",
            "flag_when": f"|z| > {self.threshold} and |x - median| >= {self.min_relative:g} * |median|",
            **asdict(self),
            "metrics": list(METRICS),
            "pair": PAIR_RULE,
            "shared_device": SHARED_RULE,
            "estimated": ESTIMATED_RULE,
        }

    def text(self) -> str:
        return (
            f"rule: flag a rank when |z| > {self.threshold:g}, z = (x - median) / (1.4826 * MAD) across "
            f"ranks, and it differs from the median by >= {100 * self.min_relative:g} %; "
            f"with >= {self.min_ranks} ranks; two ranks: {PAIR_RULE}; ranks sharing a GPU: {SHARED_RULE}; "
            f"estimated ranks: {ESTIMATED_RULE}"
        )


@dataclass(frozen=True)
class Flag:
    """One rank's value of one metric that the rule flags."""

    rank: str
    metric: str
    value: float
    median: float
    mad: float
    z: float | None  # None: MAD is 0 (the rank differs from identical peers)
    relative: float | None  # (value - median) / median; None when the median is 0
    direction: str  # "high" or "low"
    basis: str = "measured"  # "work": on a shared GPU, kernel time on the work basis (``work_basis``)
    reference: str = "median"  # "peer": one of two ranks, compared with the other (``flag_pair``)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def flag(metric: str, values: Mapping[str, float], rule: Rule, estimated: Collection[str] = ()) -> list[Flag]:
    """The ranks of ``values`` (rank label -> value) that ``rule`` flags on ``metric``; a rank in
    ``estimated`` must differ from the median by ``rule.estimate_tolerance`` at least."""
    if len(values) < rule.min_ranks:
        return []
    x = np.array(list(values.values()), np.float64)
    median = float(np.median(x))
    mad = float(np.median(np.abs(x - median)))
    out = []
    for label, value in values.items():
        dev = float(value) - median
        least = rule.estimate_tolerance if label in estimated else rule.min_relative
        if dev == 0 or abs(dev) < least * abs(median):
            continue
        z = dev / (_SCALE * mad) if mad > 0 else None
        if z is not None and abs(z) <= rule.threshold:
            continue
        out.append(
            Flag(
                rank=label,
                metric=metric,
                value=float(value),
                median=median,
                mad=mad,
                z=None if z is None else round(z, 2),
                relative=round(dev / median, 4) if median else None,
                direction="high" if dev > 0 else "low",
            )
        )
    return out


def flag_all(
    rows: Sequence[Mapping[str, Any]], rule: Rule, work: Mapping[str, Mapping[str, float]] | None = None
) -> list[Flag]:
    """Every flag over ``METRICS`` for ``rows`` (one per rank, with ``rank``, ``basis`` and each metric).

    A rank whose counts (``COUNTS``) are estimates from always-on statistics (``basis`` ``statistics
    (estimated...``) is flagged on them only past ``rule.estimate_tolerance``: identical work read
    from a few percent of the time spread by up to about a tenth. Its times keep ``min_relative`` and the
    MAD rule, so a 5 % slower rank is still found from its estimates.

    ``work``: for the ranks that share a GPU (label -> ``WORK_BASIS`` metric -> value on the work
    basis): their kernel time is compared on that basis and their ``SLICED`` metrics are not flagged.
    """
    work = work or {}
    estimated = {str(r["rank"]) for r in rows if str(r.get("basis", "")).startswith("statistics (estimated")}
    values = {
        metric: {str(r["rank"]): work.get(str(r["rank"]), {}).get(metric, r[metric]) for r in rows}
        for metric in METRICS
    }
    if len(rows) == 2:
        return [replace(f, basis="work") if f.rank in work and f.metric in WORK_BASIS else f
                for f in flag_pair(values, rule, estimated)]  # fmt: skip
    flags: list[Flag] = []
    for metric in METRICS:
        for f in flag(metric, values[metric], rule, estimated if metric in COUNTS else ()):
            if f.rank not in work:
                flags.append(f)
            elif metric in WORK_BASIS:
                flags.append(replace(f, basis="work"))
            elif metric not in SLICED:
                flags.append(f)
    return flags


def flag_pair(
    values: Mapping[str, Mapping[str, float]], rule: Rule, estimated: Collection[str] = ()
) -> list[Flag]:
    """The flags of a pair of ranks (``values``: metric -> rank label -> value, two labels): those of
    its straggler, if one rank has more compute-kernel time by ``rule.min_relative`` and not more NCCL
    time; each measured against the peer. Kernel counts differ past ``rule.estimate_tolerance`` where
    either rank's are estimates."""
    compute = values["compute_ns"]
    if len(compute) != 2:
        return []
    slow, peer = sorted(compute, key=lambda label: compute[label], reverse=True)
    nccl = values["nccl_ns"]
    if (
        compute[slow] <= 0
        or compute[slow] < (1 + rule.min_relative) * compute[peer]
        or nccl[slow] > nccl[peer]
    ):
        return []
    flags = []
    for metric, least in (
        ("compute_ns", rule.min_relative),
        ("nccl_ns", rule.min_relative),
        ("kernels", rule.estimate_tolerance if estimated else rule.min_relative),
    ):
        mine, theirs = float(values[metric][slow]), float(values[metric][peer])
        if abs(mine - theirs) < least * abs(theirs) or mine == theirs:
            continue
        flags.append(
            Flag(
                rank=slow, metric=metric, value=mine, median=theirs, mad=0.0, z=None,
                relative=round((mine - theirs) / theirs, 4) if theirs else None,
                direction="high" if mine > theirs else "low", reference="peer",
            )
        )  # fmt: skip
    return flags


def work_basis(
    ns: np.ndarray,
    counts: np.ndarray,
    nccl: np.ndarray,
    shared: Sequence[int],
    rule: Rule,
    estimated: Sequence[bool] = (),
) -> dict[int, dict[str, float]]:
    """Kernel time on the work basis for the rows ``shared`` of ``ns`` and ``counts`` (rank x kernel
    name; ``nccl``: which names are NCCL): a name launched as often as by the median rank (within
    ``rule.min_relative``, or ``rule.estimate_tolerance`` for the rows whose ``estimated`` is true)
    counts the median rank's time for it, any other its own time."""
    if not shared:
        return {}
    median_ns = np.median(ns, axis=0)
    median_count = np.median(counts, axis=0)
    out = {}
    for row in shared:
        tolerance = rule.estimate_tolerance if row < len(estimated) and estimated[row] else rule.min_relative
        same = np.abs(counts[row] - median_count) <= tolerance * median_count
        basis = np.where(same, median_ns, ns[row])
        out[row] = {"compute_ns": float(basis[~nccl].sum()), "nccl_ns": float(basis[nccl].sum())}
    return out


def _pct(f: Flag) -> str:
    text = f"{100 * f.relative:+.0f} %" if f.relative is not None else f"{f.value:g} vs 0"
    return text + (", work basis: shared GPU" if f.basis == "work" else "")


def reference_words(flags: Sequence[Flag]) -> str:
    """What ``flags`` were measured against, in words: "the median rank", or "its peer" for a pair."""
    return "its peer" if any(f.reference == "peer" for f in flags) else "the median rank"


def cause(flags: Sequence[Flag]) -> str:
    """A likely cause for one rank's flags, in words (the metrics decide, in this order)."""
    by = {f.metric: f for f in flags}
    said = []
    compute, copy, nccl = by.get("compute_ns"), by.get("copy_ns"), by.get("nccl_ns")
    slow = [f for f in (compute, copy) if f is not None and f.direction == "high"]
    if slow:
        what = " and ".join(
            f"{'compute-kernel' if f.metric == 'compute_ns' else 'copy'} time ({_pct(f)})" for f in slow
        )
        said.append(f"straggler: more {what} than {reference_words(flags)}, so its peers wait for it")
        if nccl is not None and nccl.direction == "low":
            said.append(f"it spends less time in NCCL ({_pct(nccl)}): the others wait for it there")
    elif nccl is not None and nccl.direction == "low":
        said.append(
            f"less time in NCCL than the others ({_pct(nccl)}) with no more GPU work: the others wait for "
            "it, so it is late for a reason the GPU does not show (input pipeline, CPU, I/O, launch)"
        )
    elif nccl is not None:
        said.append(
            f"more time in NCCL than the others ({_pct(nccl)}): it waits for other ranks, or its link "
            "is slower"
        )
    if compute is not None and compute.direction == "low":
        said.append(f"less compute-kernel time ({_pct(compute)}): less work than its peers (uneven batches?)")
    kernels = by.get("kernels")
    if kernels is not None:
        said.append(f"launches a different number of kernels ({_pct(kernels)}): different work")
    busy = by.get("busy_fraction")
    if busy is not None and not said:
        said.append(
            f"GPU busy {'more' if busy.direction == 'high' else 'less'} than its peers ({_pct(busy)})"
            + (": idle while the others work, a host-side delay" if busy.direction == "low" else "")
        )
    if not said and "copy_bytes" in by:
        said.append(f"copies a different amount of data ({_pct(by['copy_bytes'])})")
    return "; ".join(said) or "differs from its peers"


def kernel_differences(
    names: Sequence[str],
    rank_ns: np.ndarray,
    rank_count: np.ndarray,
    median_ns: np.ndarray,
    median_count: np.ndarray,
    top: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The kernels that take longest more, and least more (most less), on a rank than the median."""
    diff = rank_ns - median_ns

    def rows(order: np.ndarray) -> list[dict[str, Any]]:
        return [
            {
                "name": names[i],
                "rank_ns": int(rank_ns[i]),
                "median_ns": int(median_ns[i]),
                "diff_ns": int(diff[i]),
                "rank_count": int(rank_count[i]),
                "median_count": float(median_count[i]),
            }
            for i in order.tolist()
        ]

    longer = np.argsort(-diff, kind="stable")
    shorter = np.argsort(diff, kind="stable")
    return rows(longer[diff[longer] > 0][:top]), rows(shorter[diff[shorter] < 0][:top])
