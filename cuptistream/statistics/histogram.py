"""Duration histograms in OTLP's base-2 exponential layout, at one fixed scale.

Scale 2 (``base = 2 ** 0.25``, buckets 19% wide, any value within 9% of its bucket's middle) is
the finest scale at which 160 buckets (OTLP's default ``max_size``) still span every duration a
GPU operation has: index -1 holds 1 ns, index 159 ends at 2**40 ns (18 minutes). A fixed scale
means histograms of any interval, device or node merge by adding counts; scale 3 would span only
2**20 (1 ns to 1 ms) in 160 buckets and need downscaling on nearly every kernel mix.

Counts are kept dense while accumulating (``DENSE`` slots: zeros, then indices -1 .. 254, which
holds every positive int64) and trimmed to their non-zero range when emitted (``to_histogram``).
"""

from __future__ import annotations

import numpy as np

from cuptistream.events import Histogram

SCALE = 2
MAX_BUCKETS = 160  # OTLP's default max_size; wider ones are downscaled
LOWEST = -1  # the index of 1 ns: (2 ** -0.25, 1]
DENSE = 2 + 255  # slot 0: zero durations; slot 1 + (index - LOWEST): index -1 .. 254


def slots(durations: np.ndarray) -> np.ndarray:
    """The dense slot of each duration (int64 ns, >= 0): 0 for 0, else ``index - LOWEST + 1`` with
    OTLP's ``index = ceil(log2(v) * 2**SCALE) - 1`` (upper bounds inclusive). ``log2`` is exact at
    powers of two, the only bucket bounds an integer can hit (the others are irrational), so the
    floating-point index is the exact one for every duration below 2**53 ns."""
    with np.errstate(divide="ignore"):
        index = np.ceil(np.log2(durations.astype(np.float64)) * (1 << SCALE)).astype(np.int64) - 1
    return np.where(durations > 0, index - LOWEST + 1, 0)


def to_histogram(dense: np.ndarray, lowest: int, highest: int) -> Histogram:
    """The OTLP-layout histogram of one dense count row, trimmed to its non-zero buckets and
    downscaled (two buckets into one, scale - 1) until at most ``MAX_BUCKETS`` remain."""
    zero = int(dense[0])
    used = np.flatnonzero(dense[1:])
    if not len(used):
        return Histogram(scale=SCALE, zero_count=zero, min=lowest, max=highest)
    first, last = int(used[0]), int(used[-1])
    counts = dense[1 + first : 2 + last].astype(np.int64)
    offset, scale = first + LOWEST, SCALE
    while len(counts) > MAX_BUCKETS:
        index = np.arange(offset, offset + len(counts)) >> 1  # OTLP's downscale: index >> 1
        counts = np.bincount(index - index[0], weights=counts).astype(np.int64)
        offset, scale = int(index[0]), scale - 1
    return Histogram(
        scale=scale, offset=offset, counts=counts.tolist(), zero_count=zero, min=lowest, max=highest
    )
