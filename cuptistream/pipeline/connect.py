"""Bringing a sink up (``Sink.connect``) in the background, so an outage never holds the program.

``serve_lane`` runs one lane: it connects the sink, attempt after attempt, each cancelled after the
sink's ``connect_timeout``, with the shared backoff (``cuptistream.delivery.retry.Backoff``) between them,
until one succeeds or the lane closes. Meanwhile the lane queues within its byte bound and its
``full_policy`` (a sink with ``writes_while_connecting``, such as Kafka, is written to at once and
holds or spools what it gets). Reported through the lane's health (``cuptistream.delivery.health``:
one ``Error`` event and one stderr line per change of state, not per attempt):

- failing: the sink not up ``connect_timeout`` after the start, at that moment, with the last problem;
- ok: the sink up after that;
- stopped: a ``PermanentSinkError``; its queued and later data are counted lost under the error's
  ``reason``, and the program and the other sinks go on.

``require_healthy`` is ``--require-healthy``: every sink up within its ``connect_timeout``, or
``SinkUnavailableError`` (exit 4) naming the first that is not, before the program starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from cuptistream.delivery.retry import Backoff
from cuptistream.errors import PermanentSinkError, SinkUnavailableError
from cuptistream.pipeline.lane import SinkLane
from cuptistream.plugin import Sink

_GRACE = 0.1  # seconds past ``connect_timeout`` the "not up" line waits for the attempt's problem


class Health(Protocol):
    """Where a sink's state changes are said (``SinkLane.health``); each call never raises."""

    def failing(self, problem: str) -> None: ...

    def ok(self) -> None: ...

    def stopped(self, problem: str) -> None: ...


async def attempt(sink: Sink, timeout: float) -> str:
    """One ``connect`` within ``timeout`` seconds: "" when the sink is up, else the problem.
    Raises ``PermanentSinkError``. A sink that ends its own waits a little before ``timeout``
    (the Kafka sink does) says which step failed instead of being cancelled."""
    with trio.move_on_after(timeout):
        try:
            await sink.connect()
            return ""
        except PermanentSinkError:
            raise
        except SinkUnavailableError as error:
            return str(error)
        except Exception as error:  # a sink bug: reported, and retried like an outage
            return f"{sink.where()}: connect failed: {type(error).__name__}: {error}"
    return f"{sink.where()}: no answer within connect_timeout ({timeout:g}s)"


async def connect_until_up(sink: Sink, health: Health) -> None:
    """Attempt ``connect`` until it succeeds, with the shared backoff (kept up also where
    ``retry.enabled`` is false: a sink that never comes up delivers nothing). At ``connect_timeout``
    the sink is said to be failing, with the last problem; once up, ok. Raises ``PermanentSinkError``."""
    timeout = float(sink.config.connect_timeout)
    backoff = Backoff(sink.config.retry)
    problem = ""

    async def watch() -> None:
        await trio.sleep(timeout + _GRACE)  # the first attempt's own problem, when it has one
        why = _without_where(problem, sink) or "no answer"
        health.failing(f"not up after connect_timeout ({timeout:g}s): {why}; its data is queued meanwhile")

    refused: PermanentSinkError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        while True:
            try:
                problem = await attempt(sink, timeout)
            except PermanentSinkError as error:  # raised outside the nursery: no exception group
                refused = error
                break
            if not problem:
                break
            wait = backoff.wait(trio.current_time())
            await trio.sleep(float(sink.config.retry.initial_backoff) if wait is None else wait)
        nursery.cancel_scope.cancel()
    if refused is not None:
        raise refused
    health.ok()  # says so only if it was said to be failing


async def serve_lane(
    lane: SinkLane, health: Health, close: Callable[[], Awaitable[None]], *, connected: bool = False
) -> None:
    """Connect ``lane.sink`` (unless ``connected``), run the lane until it is closed and drained,
    then ``close()`` the sink. Connecting goes on until then (a sink that comes up while closing
    still delivers). The shutdown deadline cancels all of it; the pipeline counts what is left."""
    sink = lane.sink
    if connected:
        await lane.run()
        await close()
        return
    lane.up = False
    if not sink.writes_while_connecting:
        try:
            await connect_until_up(sink, health)
            lane.up = True
        except PermanentSinkError as error:
            _stop(lane, error, health)
        await lane.run()
        await close()
        return
    async with trio.open_nursery() as nursery:
        writing = trio.CancelScope()

        async def connect() -> None:
            try:
                await connect_until_up(sink, health)
                lane.up = True
            except PermanentSinkError as error:
                _stop(lane, error, health)
                writing.cancel()  # a write waiting for room in the sink ends; stop() counted it

        nursery.start_soon(connect)
        with writing:
            await lane.run()
        if writing.cancelled_caught:
            await lane.run()  # stopped: every offer is dropped and counted; wait for the close
        await close()
        nursery.cancel_scope.cancel()  # closed: stop connecting


def _stop(lane: SinkLane, error: PermanentSinkError, health: Health) -> None:
    lane.stop(error.reason)
    health.stopped(f"{_without_where(str(error), lane.sink)} (its data is counted lost as {error.reason})")


def _without_where(message: str, sink: Sink) -> str:
    prefix = sink.where() + ": "
    return message[len(prefix) :] if message.startswith(prefix) else message


async def require_healthy(sinks: list[Sink]) -> None:
    """Every sink up within its ``connect_timeout`` (tried together), or ``SinkUnavailableError``
    for the first that is not: its last problem, or that it did not answer in time."""
    failures: list[str] = []

    async def one(sink: Sink) -> None:
        timeout = float(sink.config.connect_timeout)
        backoff = Backoff(sink.config.retry, trio.current_time() + timeout)
        problem = ""
        with trio.move_on_after(timeout):
            while True:
                try:
                    problem = await attempt(sink, timeout)
                except PermanentSinkError as error:
                    failures.append(str(error))
                    return
                if not problem:
                    return
                wait = backoff.wait(trio.current_time())
                if wait is None:
                    break
                await trio.sleep(wait)
        why = problem or f"{sink.where()}: no answer"
        failures.append(f"{why} (not up within {timeout:g}s, --require-healthy)")

    async with trio.open_nursery() as nursery:
        for sink in sinks:
            nursery.start_soon(one, sink)
    if failures:
        raise SinkUnavailableError(failures[0])
