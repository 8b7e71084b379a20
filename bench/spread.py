"""Median, min and max of a benchmark's per-run values, the form every headline row takes.

Imported by the bench scripts by its bare name (``python bench/x.py`` puts ``bench/`` first on the
path)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max"}`` of ``values`` (at least one)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spread_text(values: Sequence[float], fmt: str) -> str:
    """``median [min..max]``, each formatted with ``fmt``; ``-`` for no values."""
    if not values:
        return "-"
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}..{max(values):{fmt}}]"
