"""The one retry policy every sink uses (``SinkConfig.retry``): exponential backoff with jitter, a
server's ``Retry-After`` honoured, and one deadline after which the data is given up.

Two ways in, the same schedule:

- ``Backoff``: the schedule alone, for code on its own thread (the Kafka sink's delivery thread keeps
  one per message and asks it how long to wait, with ``time.monotonic()``);
- ``call_with_retry``: the loop, for trio code (the OTLP transports, the file sink). An attempt raises
  ``RetryableError`` for a failure that may pass; anything else it raises, or returns, ends the loop.

Failure modes: ``call_with_retry`` raises ``RetriesExhausted`` (its message says why: the deadline,
or ``retry.enabled: false``, and the last attempt's reason) and never sleeps past the deadline.
Inside a sink's ``write``, its first retryable failure marks the sink failing
(``cuptistream.delivery.health``): one line and one ``Error`` event while the retries go on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import trio

from cuptistream.config import RetryConfig
from cuptistream.delivery import health as sink_health
from cuptistream.errors import RetriesExhausted as RetriesExhausted
from cuptistream.errors import RetryableError as RetryableError

T = TypeVar("T")


class Counts(Protocol):
    """Where ``call_with_retry`` counts (e.g. the OTLP sink's per-request result)."""

    attempts: int
    retries: int


class Backoff:
    """The waits between attempts at one piece of data, up to ``deadline`` (``math.inf``: none).

    Clock-agnostic: callers pass ``now`` on the clock ``deadline`` is on.
    """

    def __init__(self, config: RetryConfig, deadline: float = math.inf) -> None:
        self.config = config
        self.deadline = deadline
        self.retries = 0
        self._next = float(config.initial_backoff)

    def wait(self, now: float, retry_after: float | None = None) -> float | None:
        """Seconds to wait before the next attempt, or None: give up (retrying is off, or the wait
        would reach the deadline). The backoff grows by ``multiplier`` up to ``max_backoff``, each wait
        50-100 % of it (jitter, so many clients do not retry in step); ``retry_after`` replaces it."""
        if not self.config.enabled:
            return None
        if retry_after is None:
            wait = self._next * random.uniform(0.5, 1.0)
            self._next = min(self._next * self.config.multiplier, float(self.config.max_backoff))
        else:
            wait = max(0.0, retry_after)
        if now + wait >= self.deadline:
            return None
        self.retries += 1
        return wait

    def give_up_reason(self) -> str:
        return "deadline" if self.config.enabled else "retry disabled"


async def call_with_retry(
    attempt: Callable[[float], Awaitable[T]],
    config: RetryConfig,
    timeout: float,
    deadline: float,
    counts: Counts | None = None,
) -> T:
    """``await attempt(t)`` until it returns, retrying each ``RetryableError`` after the backoff.

    ``t`` is the attempt's own time limit: ``timeout``, or less when the deadline is nearer (the
    attempt is also cancelled at the deadline). ``deadline`` is absolute, on ``trio.current_time()``,
    so several calls can share one (the OTLP sink gives every request of a batch the same).
    """
    backoff = Backoff(config, deadline)
    last = ""
    while True:
        remaining = deadline - trio.current_time()
        if remaining <= 0:
            raise RetriesExhausted(f"deadline (last: {last or 'no answer'})", last)
        if counts is not None:
            counts.attempts += 1
        retry_after: float | None = None
        with trio.move_on_after(remaining):
            try:
                return await attempt(min(timeout, remaining))
            except RetryableError as error:
                last, retry_after = error.reason, error.retry_after
                sink_health.retrying(last)
        wait = backoff.wait(trio.current_time(), retry_after)
        if wait is None:
            raise RetriesExhausted(f"{backoff.give_up_reason()} (last: {last or 'no answer'})", last)
        if counts is not None:
            counts.retries += 1
        await trio.sleep(wait)
