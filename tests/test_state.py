"""The state source and ``cuptistream.correlate``.

No GPU here: ``FakeCupti`` (subscriber tests) stands in for CUPTI's subscribe/enable calls and fires
the state callbacks; the ``CUpti_StateData`` they carry is a real ctypes struct. ``correlate`` is
checked against the real cupti-python without a driver, and against a recording stand-in for the
two push/pop calls, which cannot succeed here.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any

import pytest

from cuptistream.cupti import external_correlation as corr
from cuptistream.cupti.subscriber import Subscriber
from cuptistream.sources.state import StateConfig, StateSource, _StateData
from tests.test_callbacks import MemoryEmitter
from tests.test_callbacks_subscriber import FakeCupti


def fire_state(fake: FakeCupti, cbid: int, result: int, message: bytes) -> None:
    data = _StateData(result=result, message=message)
    fake.fire(6, cbid, ctypes.addressof(data))


def test_state_callbacks_become_error_events_with_severity_and_code() -> None:
    fake, emitter = FakeCupti(), MemoryEmitter()
    source = StateSource(StateConfig(type="state"), emitter, sub=Subscriber(fake))
    source.start()
    assert 6 in fake.enabled_domains
    fire_state(fake, 1, 999, b"device lost")
    fire_state(fake, 2, 14, b"kind not compatible ")
    fire_state(fake, 3, 0, b"")
    source.stop()
    fire_state(fake, 2, 1, b"after stop")  # unsubscribed: not delivered
    assert emitter.errors == [
        ("cupti_state", "CUPTI_ERROR_UNKNOWN (999): device lost", "fatal"),
        ("cupti_state", "CUPTI_ERROR_NOT_COMPATIBLE (14): kind not compatible", "error"),
        ("cupti_state", "CUPTI_SUCCESS (0): no message", "warning"),
    ]
    assert fake.callback is None


def test_warnings_can_be_left_out() -> None:
    fake, emitter = FakeCupti(), MemoryEmitter()
    source = StateSource(StateConfig(type="state", warnings=False), emitter, sub=Subscriber(fake))
    source.start()
    fire_state(fake, 3, 0, b"minor")
    fire_state(fake, 2, 1, b"bad")
    source.stop()
    assert [e[2] for e in emitter.errors] == ["error"]


class RecordingCupti:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def activity_push_external_correlation_id(self, kind: int, value: int) -> None:
        self.calls.append(("push", kind, value))

    def activity_pop_external_correlation_id(self, kind: int) -> int:
        self.calls.append(("pop", kind, 0))
        return 0


@pytest.fixture
def fresh_correlate(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(corr, "_warned", False)
    monkeypatch.setattr(corr, "_active", 0)
    monkeypatch.setattr(corr, "_cupti", None)
    return corr


def test_correlate_pushes_named_ids_and_pops_them_even_on_error(fresh_correlate: Any) -> None:
    fake = RecordingCupti()
    fresh_correlate._cupti = fake
    fresh_correlate.activate()
    with pytest.raises(KeyError), fresh_correlate.correlate(step=17, request=2**64 - 1):
        raise KeyError("the program's own error passes through")
    with fresh_correlate.correlate(99):
        pass
    fresh_correlate.deactivate()
    assert fake.calls == [
        ("push", 3, 17), ("push", 5, 2**64 - 1), ("pop", 5, 0), ("pop", 3, 0), ("push", 3, 99), ("pop", 3, 0)
    ]  # fmt: skip


def test_correlate_is_a_no_op_with_one_warning_without_a_session(fresh_correlate: Any) -> None:
    fake = RecordingCupti()
    fresh_correlate._cupti = fake
    with pytest.warns(RuntimeWarning, match="no cuptistream session"), fresh_correlate.correlate(step=1):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fresh_correlate.correlate(step=2):  # no second warning
            pass
    assert fake.calls == []


def test_correlate_without_a_driver_warns_once_and_never_raises(fresh_correlate: Any) -> None:
    fresh_correlate.activate()  # real cupti-python: the push raises NotSupportedError here
    with pytest.warns(RuntimeWarning, match="CUDA driver is not found"), fresh_correlate.correlate(step=3):
        pass
    fresh_correlate.deactivate()


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {"epoch": 1}, "unknown id name"),
        ((), {"step": -1}, "expected an integer"),
        ((), {"step": True}, "expected an integer"),
        ((5,), {"step": 1}, "already uses CUPTI kind custom0"),
        ((), {}, "needs an id"),
    ],
)
def test_correlate_rejects_bad_arguments(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        corr.correlate(*args, **kwargs)


def test_repeated_notifications_are_counted_not_sent_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUPTI repeats "User did not give a new activity buffer" once per buffer it asked for while the
    pool was empty (tens of thousands of times in seconds): the first is sent, the repeats within the
    window are counted, the next report after it and ``stop`` say how many; fatal ones always go."""
    from cuptistream.sources import state

    clock = [1000.0]
    monkeypatch.setattr(state.time, "monotonic", lambda: clock[0])
    fake, emitter = FakeCupti(), MemoryEmitter()
    source = StateSource(StateConfig(type="state"), emitter, sub=Subscriber(fake))
    source.start()
    no_buffer = b"User did not give a new activity buffer to CUPTI"
    for _ in range(1000):
        fire_state(fake, 2, 8, no_buffer)
    fire_state(fake, 3, 8, no_buffer)  # the same words as a warning: reported apart
    fire_state(fake, 1, 999, b"device lost")
    fire_state(fake, 1, 999, b"device lost")
    clock[0] += state.REPEAT_WINDOW_S
    fire_state(fake, 2, 8, no_buffer)
    for _ in range(5):
        fire_state(fake, 2, 8, no_buffer)
    source.stop()
    buffer_error = "CUPTI_ERROR_OUT_OF_MEMORY (8): User did not give a new activity buffer to CUPTI"
    assert emitter.errors == [
        ("cupti_state", buffer_error, "error"),
        (
            "cupti_state",
            "CUPTI_ERROR_OUT_OF_MEMORY (8): User did not give a new activity buffer to CUPTI",
            "warning",
        ),
        ("cupti_state", "CUPTI_ERROR_UNKNOWN (999): device lost", "fatal"),
        ("cupti_state", "CUPTI_ERROR_UNKNOWN (999): device lost", "fatal"),
        ("cupti_state", buffer_error + " (and 999 more like it since its last report)", "error"),
        (
            "cupti_state",
            buffer_error + " (and 5 more like it in the last 10 s, not sent one by one)",
            "error",
        ),
    ]
    assert source.notifications == 1009
