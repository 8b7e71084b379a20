"""The C library, opened in one place (``ctypes.CDLL(None)``, with errno): the probe's ``prctl``, the
collector's ``mallopt``, and ``free`` for CUPTI's buffers."""

from __future__ import annotations

import ctypes
from functools import cache


@cache
def libc() -> ctypes.CDLL:
    """This process's C library. Raises ``OSError`` where it cannot be opened."""
    return ctypes.CDLL(None, use_errno=True)
