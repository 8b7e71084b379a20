"""Holding a workload to a fixed iteration rate, so that two runs of it do the same GPU work per
second whatever each one's tracing costs (GPU busy of a ``full`` run against a budget run is only
comparable at equal work per second; unpaced, full tracing slows the program and its GPU idles
more). Used by ``bench/workloads.py`` and ``bench/budget_accuracy.py``; torch-free, so CI tests it."""

from __future__ import annotations


def pace_delay(started: float, iterations_done: int, rate: float, now: float) -> float:
    """Seconds to wait before the next iteration so that ``iterations_done`` since ``started``
    are not ahead of ``rate`` per second; 0 when the program is on time or behind."""
    if rate <= 0:
        return 0.0
    return max(0.0, started + iterations_done / rate - now)


def kept_pace(iterations: int, seconds: float, rate: float, tolerance: float = 0.01) -> bool:
    """Whether a run of ``seconds`` at ``rate`` did (nearly) all its iterations: a run that fell
    behind did less work per second than the rate, and its busy is not comparable."""
    return rate <= 0 or iterations >= (1 - tolerance) * rate * seconds
