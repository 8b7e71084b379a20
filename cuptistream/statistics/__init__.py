"""Node-side statistics: what the collector's decoded activity records add up to, per interval.

``histogram`` buckets durations (OTLP's base-2 exponential layout, fixed scale), ``coverage`` says
how much of an interval a stream traced, ``accumulator`` folds whole record arrays into per
interval, device and name totals and turns closed intervals into ``ActivityStats`` and ``GpuStats``
events. All of it works on the decoder's numpy arrays: no Python work per record.
"""

from cuptistream.statistics.accumulator import LATENESS_NS, Accumulator
from cuptistream.statistics.coverage import Coverage
from cuptistream.statistics.histogram import MAX_BUCKETS, SCALE

DEFAULT_MAX_NAMES = 500  # as the OTLP sink's ``max_kernel_names``: the same cap, the same ``other``
OTHER = "other"

__all__ = ["DEFAULT_MAX_NAMES", "LATENESS_NS", "MAX_BUCKETS", "OTHER", "SCALE", "Accumulator", "Coverage"]
