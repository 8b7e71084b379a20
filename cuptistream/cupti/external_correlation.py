"""``cuptistream.correlate``: tag GPU work with your own ids (CUPTI external correlation).

::

    with cuptistream.correlate(step=17):
        loss = model(batch)          # every CUDA API call in here is linked to step 17
    with cuptistream.correlate(step=17, request=4242): ...
    with cuptistream.correlate(99): ...   # the same as custom0=99

While the block runs, the calling thread has the ids pushed with
``cuptiActivityPushExternalCorrelationId``; the activity source then emits an
``ExternalCorrelation`` event (``external_kind``, ``external_id``, ``correlation_id``) linking each
CUDA API record, and through its correlation id the kernels and copies it launched, to your id.
CUPTI has three custom kinds, so at most three ids can be active per block. The names map to them:

========================  ================
name                      ``external_kind``
========================  ================
``step``, ``custom0``     ``custom0``
``microbatch``, ``custom1`` ``custom1``
``request``, ``custom2``  ``custom2``
positional id             ``custom0``
========================  ================

Blocks nest: an inner block's id of the same kind wins until it exits. Ids are per thread.

When no cuptistream session is collecting CUPTI data, ``correlate`` does nothing (it never
initializes CUPTI on its own) and warns once. Sources that trace activity call ``activate()`` and
``deactivate()``. A failing CUPTI call also turns it into a no-op with a one-time warning: tagging
never breaks the program. Bad arguments (unknown names, non-integer ids) raise ``ValueError``.
"""

from __future__ import annotations

import threading
import warnings
from types import TracebackType
from typing import Any

# CUpti_ExternalCorrelationKind (cupti_activity.h)
KINDS = {"custom0": 3, "custom1": 4, "custom2": 5}
NAMES = {
    "step": "custom0", "custom0": "custom0",
    "microbatch": "custom1", "custom1": "custom1",
    "request": "custom2", "custom2": "custom2",
}  # fmt: skip

_lock = threading.Lock()
_active = 0
_warned = False
_cupti: Any = None  # cupti-python's module, set on first use; tests may replace it


def activate() -> None:
    """A source started collecting CUPTI activity: ``correlate`` pushes ids from now on."""
    global _active
    with _lock:
        _active += 1


def deactivate() -> None:
    global _active
    with _lock:
        _active = max(0, _active - 1)


def is_active() -> bool:
    return _active > 0


def _warn_once(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"cuptistream.correlate does nothing: {reason}", RuntimeWarning, stacklevel=4)


def _module() -> Any:
    global _cupti
    if _cupti is None:
        from cupti import cupti

        _cupti = cupti
    return _cupti


def _check_id(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"correlate({name}=...): expected an integer in [0, 2**64), got {value!r}")
    return value


def _resolve(external_id: int | None, ids: dict[str, int]) -> list[tuple[int, int]]:
    """[(CUPTI kind, id)] in push order; raises ValueError for unknown names or a kind used twice."""
    named: dict[str, tuple[str, int]] = {}
    if external_id is not None:
        named["custom0"] = ("a positional id", _check_id("id", external_id))
    for name, value in ids.items():
        kind = NAMES.get(name)
        if kind is None:
            known = ", ".join(NAMES)
            raise ValueError(f"correlate({name}=...): unknown id name; use one of {known}")
        if kind in named:
            raise ValueError(f"correlate({name}=...): {named[kind][0]} already uses CUPTI kind {kind}")
        named[kind] = (name, _check_id(name, value))
    if not named:
        raise ValueError("correlate() needs an id, e.g. correlate(step=17)")
    return [(KINDS[kind], value) for kind, (_, value) in sorted(named.items())]


class Correlation:
    """The context manager ``correlate`` returns. Enter it once."""

    def __init__(self, pushes: list[tuple[int, int]]) -> None:
        self.pushes = pushes
        self._pushed: list[int] = []

    def __enter__(self) -> Correlation:
        if not is_active():
            _warn_once("no cuptistream session is collecting CUPTI activity in this process")
            return self
        try:
            cupti = _module()
            for kind, value in self.pushes:
                cupti.activity_push_external_correlation_id(kind, value)
                self._pushed.append(kind)
        except Exception as error:
            self._pop()
            _warn_once(f"CUPTI refused the id ({error})")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._pop()

    def _pop(self) -> None:
        while self._pushed:
            kind = self._pushed.pop()
            try:
                _module().activity_pop_external_correlation_id(kind)
            except Exception as error:
                _warn_once(f"CUPTI refused to pop the id ({error})")


def correlate(external_id: int | None = None, /, **ids: int) -> Correlation:
    """Tag the CUDA work done inside the ``with`` block with ``external_id`` and/or named ids."""
    return Correlation(_resolve(external_id, ids))
