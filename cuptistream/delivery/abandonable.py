"""Run a blocking library call that has no deadline of its own where it can be abandoned.

``call_by(fn, deadline)`` runs ``fn`` in a new daemon thread and waits for it until ``deadline``
(``time.monotonic()``). Past it, ``TimeoutError`` is raised and the thread is left to finish or hang
on its own: a daemon thread never keeps the process alive. A result that still comes after that is
handed to ``late`` (e.g. to close a client nobody will use). Use it only for calls that are safe to
leave running, such as kafka-python's ``KafkaProducer()`` bootstrap, which can poll forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.finished = False  # fn returned or raised (set under ``lock``)
        self.value: T | None = None
        self.error: BaseException | None = None
        self.abandoned = False  # the caller stopped waiting (set under ``lock``)


def call_by(fn: Callable[[], T], deadline: float, *, name: str, late: Callable[[T], None] | None = None) -> T:
    """``fn()``'s result or exception, if it comes by ``deadline``; else ``TimeoutError`` (the thread,
    named ``name``, is abandoned, and a result it returns later goes to ``late``)."""
    outcome: _Outcome[T] = _Outcome()

    def run() -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = fn()
        except BaseException as raised:  # handed to the waiting caller (dropped if it left)
            error = raised
        with outcome.lock:
            outcome.finished, outcome.value, outcome.error = True, value, error
            left = outcome.abandoned
        outcome.done.set()
        if left and error is None and late is not None:
            try:
                late(value)  # type: ignore[arg-type]
            except Exception:  # nobody is waiting: nothing to report it to
                pass

    threading.Thread(target=run, name=name, daemon=True).start()
    outcome.done.wait(max(0.0, deadline - time.monotonic()))
    with outcome.lock:
        if not outcome.finished:
            outcome.abandoned = True
            raise TimeoutError(f"{name}: no result by the deadline")
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]
