"""PC sampling and SASS metrics never run together in one process.

On the H100 with CUPTI 13.0 (2026-11-23, docs/gpu-validation.md), a torch transformer training loop
with both sources running crashed with a segmentation fault within a minute, three runs out of
three, in garbage collection during a PC sampling drain (heap corruption); either source alone ran
clean. Until the cause is found, the second of the two to start is refused with one line, and the
program keeps running with the first.
"""

from __future__ import annotations

import threading

from cuptistream.errors import UserError

_lock = threading.Lock()
_running: dict[str, str] = {}  # "pc_sampling" / "sass" -> the running source's name

_OTHER = {"pc_sampling": "sass", "sass": "pc_sampling"}


def claim(kind: str, name: str) -> None:
    """Mark ``kind`` running as source ``name``. Raises UserError while the other kind runs here."""
    with _lock:
        other = _OTHER[kind]
        if other in _running:
            raise UserError(
                f"{kind} cannot run while {other} source {_running[other]!r} runs in this process: the "
                "two together crashed a torch program on CUPTI 13.0 (docs/gpu-validation.md); run them "
                "in separate sessions"
            )
        _running[kind] = name


def release(kind: str, name: str) -> None:
    with _lock:
        if _running.get(kind) == name:
            del _running[kind]
