"""Human-readable sizes (``10MiB``) and durations (``500ms``) for config values."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3,
}  # fmt: skip
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
}
_MAX_SIZE = 2**63 - 1
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Zµ]*)\s*$")


def parse_size(value: object) -> int:
    """Bytes from an int or a string like ``64KiB``, ``10MB``, ``1.5GiB``. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 10MiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a non-negative size, got {value}")
        return value
    if isinstance(value, str) and len(value) <= 64:
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            size = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
            if size > _MAX_SIZE:
                raise ValueError(f"size {value!r} is too large (at most 8EiB)")
            return int(size)
    raise ValueError(f"expected a size like 10MiB or 65536, got {_short(value)}")


def parse_duration(value: object) -> float:
    """Seconds from a number (seconds) or a string like ``500ms``, ``2s``, ``5min``. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 500ms, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"expected a finite duration, got {value}")
        if value < 0:
            raise ValueError(f"expected a non-negative duration, got {value}")
        return float(value)
    if isinstance(value, str) and len(value) <= 64:
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2) in _DURATION_UNITS:
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            if math.isfinite(seconds):
                return seconds
    raise ValueError(f"expected a duration like 500ms or 2s, got {_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_percent(value: object) -> float:
    """A fraction from a percentage string like ``1%`` or ``0.5%``. Bare numbers are refused: ``0.5``
    could mean half or half a percent. Raises ValueError."""
    if isinstance(value, str) and len(value) <= 32 and value.strip().endswith("%"):
        try:
            percent = float(value.strip()[:-1])
        except ValueError:
            pass
        else:
            if math.isfinite(percent):
                return percent / 100
    raise ValueError(f"expected a percentage like 1% or 0.5%, got {_short(value)}")
