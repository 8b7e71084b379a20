"""The launch hook: arm/disarm of the kernel-launch callbacks and the one action per arming.

No GPU here, so CUPTI never calls back. ``FakeSubscriber`` stands in for the process-wide callback
subscriber (``cuptistream.cupti.subscriber.register``, i.e. cuptiSubscribe/cuptiEnableCallback) and,
like CUPTI at a launch, builds a real ``CUpti_CallbackData`` (``ApiCallbackData``) in memory and
hands it to the registered handlers, so the hook reads it exactly as it would read CUPTI's.
``FAKE_CUPTI`` stands in for cupti-python's cbid enums.
"""

from __future__ import annotations

import ctypes
import enum
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from cuptistream.cupti import subscriber
from cuptistream.cupti.launch_hook import LaunchHook, launch_cbids
from cuptistream.cupti.subscriber import API_ENTER, API_EXIT, ApiCallbackData, Domain, SubscriberBusy

DRIVER, RUNTIME = int(Domain.DRIVER_API), int(Domain.RUNTIME_API)
CTX = 0x7F00_1234_5000


class RuntimeCbid(enum.IntEnum):
    # Stands in for cupti-python's runtime_api_trace_cbid (CUPTI needs a GPU, CI has none).
    cudaMalloc_v3020 = 20
    cudaLaunch_v3020 = 13
    cudaLaunchKernel_v7000 = 211
    cudaLaunchHostFunc_v10000 = 273
    cudaGraphLaunch_v10000 = 311
    cudaLaunchHostFunc_v2_v13020 = 500
    cudaMemcpy_v3020 = 31


class DriverCbid(enum.IntEnum):
    # Stands in for cupti-python's driver_api_trace_cbid (CUPTI needs a GPU, CI has none).
    cuMemAlloc = 100
    cuLaunchKernel = 307
    cuLaunchHostFunc = 513
    cuGraphLaunch = 514
    cuCtxSynchronize = 17


# Stands in for cupti-python's cupti module (only its cbid enums are read).
FAKE_CUPTI = SimpleNamespace(runtime_api_trace_cbid=RuntimeCbid, driver_api_trace_cbid=DriverCbid)
LAUNCHES = {
    (RUNTIME, 13),
    (RUNTIME, 211),
    (RUNTIME, 311),
    (DRIVER, 307),
    (DRIVER, 514),
}


class FakeCuptiError(Exception):
    """What cupti-python raises for a failed cuptiEnableCallback (e.g. a cbid this libcupti lacks)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"CUPTI_ERROR_INVALID_PARAMETER ({status})")
        self.status = status


class FakeRegistration:
    def __init__(self, owner: FakeSubscriber, domain: int, cbid: int | None, handler: Any) -> None:
        self.owner, self.domain, self.cbid, self.handler = owner, domain, cbid, handler

    def remove(self) -> None:
        if self in self.owner.active:
            self.owner.active.remove(self)
            self.owner.removed.append((self.domain, self.cbid))


class FakeSubscriber:
    """Stands in for CUPTI's callback subscriber (needs a GPU that CI does not have): records each
    ``register`` and fires launch callbacks at the handlers still registered."""

    def __init__(self, reject: set[tuple[int, int]] | None = None, busy_on_attempt: int = 0) -> None:
        self.reject = reject or set()
        self.busy_on_attempt = busy_on_attempt  # 1-based attempt that raises SubscriberBusy; 0: never
        self.attempts: list[tuple[int, int | None]] = []
        self.active: list[FakeRegistration] = []
        self.removed: list[tuple[int, int | None]] = []

    def register(self, domain: int, handler: Any, cbid: int | None = None) -> FakeRegistration:
        self.attempts.append((int(domain), cbid))
        if len(self.attempts) == self.busy_on_attempt:
            raise SubscriberBusy("Nsight Systems")
        if cbid is not None and (int(domain), cbid) in self.reject:
            raise FakeCuptiError(1)
        reg = FakeRegistration(self, int(domain), cbid, handler)
        self.active.append(reg)
        return reg

    def registered(self) -> set[tuple[int, int | None]]:
        return {(r.domain, r.cbid) for r in self.active}

    def launch(self, domain: int, cbid: int, site: int, context: int, wrap: bool = False) -> None:
        """A launch as CUPTI reports it: ``CUpti_CallbackData`` in real memory, passed by address
        (or wrapped in an object with ``.ptr``, as cupti-python's ``CallbackData`` is)."""
        info = ApiCallbackData(callbackSite=site, context=context or None, contextUid=3, correlationId=9)
        address = ctypes.addressof(info)
        data: Any = SimpleNamespace(ptr=address) if wrap else address
        for reg in list(self.active):
            if reg.domain == domain and reg.cbid in (cbid, None):
                reg.handler(domain, cbid, data)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSubscriber:
    sub = FakeSubscriber()
    # Stands in for the CUPTI subscriber, which needs a GPU that CI does not have.
    monkeypatch.setattr(subscriber, "register", sub.register)
    return sub


def _hook(seen: list[int]) -> LaunchHook:
    return LaunchHook(seen.append, cupti=FAKE_CUPTI)


def test_launch_cbids_keep_kernel_and_graph_launches_only() -> None:
    cbids = launch_cbids(FAKE_CUPTI)
    assert sorted(cbids[Domain.RUNTIME_API]) == [13, 211, 311]  # no HostFunc (v1 or v2), no memcpy/malloc
    assert sorted(cbids[Domain.DRIVER_API]) == [307, 514]


def test_launch_cbids_of_the_installed_cupti_python() -> None:
    cupti = pytest.importorskip("cupti.cupti")  # the enums import without a driver
    cbids = launch_cbids(cupti)
    runtime, driver = cupti.runtime_api_trace_cbid, cupti.driver_api_trace_cbid
    assert int(runtime.cudaLaunchKernel_v7000) in cbids[Domain.RUNTIME_API]
    assert int(runtime.cudaGraphLaunch_v10000) in cbids[Domain.RUNTIME_API]
    assert int(driver.cuLaunchKernel) in cbids[Domain.DRIVER_API]
    assert int(driver.cuGraphLaunch) in cbids[Domain.DRIVER_API]
    assert int(runtime.cudaLaunchHostFunc_v10000) not in cbids[Domain.RUNTIME_API]
    assert int(driver.cuLaunchHostFunc) not in cbids[Domain.DRIVER_API]
    assert int(runtime.cudaMemcpy_v3020) not in cbids[Domain.RUNTIME_API]


def test_arm_registers_the_launch_cbids_only(fake: FakeSubscriber) -> None:
    hook = _hook([])
    assert fake.attempts == []  # constructing does not touch CUPTI
    hook.arm()
    assert fake.registered() == LAUNCHES
    assert len(fake.attempts) == len(LAUNCHES)
    hook.arm()  # armed already: no second set of registrations
    assert len(fake.attempts) == len(LAUNCHES) and len(fake.active) == len(LAUNCHES)
    hook.disarm()
    assert fake.active == [] and set(fake.removed) == LAUNCHES


@pytest.mark.parametrize("wrap", [False, True], ids=["pointer", "CallbackData"])
def test_action_runs_once_at_api_exit_with_the_callbacks_context(fake: FakeSubscriber, wrap: bool) -> None:
    seen: list[int] = []
    hook = _hook(seen)
    hook.arm()
    fake.launch(RUNTIME, 211, API_ENTER, CTX, wrap)
    assert seen == []  # the enter site never runs it
    fake.launch(RUNTIME, 211, API_EXIT, CTX, wrap)
    assert seen == [CTX]
    fake.launch(DRIVER, 307, API_EXIT, CTX + 0x1000, wrap)
    fake.launch(RUNTIME, 311, API_EXIT, CTX + 0x2000, wrap)
    assert seen == [CTX]  # two more launches before disarm: still once
    hook.disarm()
    assert fake.active == []
    fake.launch(RUNTIME, 211, API_EXIT, CTX, wrap)
    assert seen == [CTX]


def test_exit_without_a_context_or_without_data_is_ignored(fake: FakeSubscriber) -> None:
    seen: list[int] = []
    hook = _hook(seen)
    hook.arm()
    fake.launch(DRIVER, 307, API_EXIT, 0)
    handler: Callable[[int, int, Any], None] = fake.active[0].handler
    handler(DRIVER, 307, None)
    assert seen == []
    fake.launch(DRIVER, 514, API_EXIT, CTX)  # still pending: the next proper exit runs it
    assert seen == [CTX]


def test_rearming_runs_the_action_again_without_registering_again(fake: FakeSubscriber) -> None:
    seen: list[int] = []
    hook = _hook(seen)
    hook.arm()
    fake.launch(RUNTIME, 13, API_EXIT, CTX)
    hook.arm()  # the registrations are still there: only the action is due again
    assert len(fake.attempts) == len(LAUNCHES)
    fake.launch(RUNTIME, 13, API_EXIT, CTX + 1)
    assert seen == [CTX, CTX + 1]
    hook.disarm()
    hook.arm()  # after a disarm, arming registers afresh
    assert len(fake.attempts) == 2 * len(LAUNCHES) and fake.registered() == LAUNCHES
    hook.disarm()


def test_a_launch_inside_the_action_does_not_run_it_again(fake: FakeSubscriber) -> None:
    seen: list[int] = []
    holder: list[LaunchHook] = []

    def action(ctx: int) -> None:
        seen.append(ctx)
        holder[0].arm()  # due again already ...
        fake.launch(RUNTIME, 211, API_EXIT, ctx + 1)  # ... but the action launches: not re-entered

    hook = LaunchHook(action, cupti=FAKE_CUPTI)
    holder.append(hook)
    hook.arm()
    fake.launch(RUNTIME, 211, API_EXIT, CTX)
    assert seen == [CTX]
    fake.launch(RUNTIME, 211, API_EXIT, CTX + 2)  # the re-arm stands: the next launch runs it
    assert seen == [CTX, CTX + 2]
    hook.disarm()


def test_two_launching_threads_run_the_action_once(fake: FakeSubscriber) -> None:
    seen: list[int] = []
    inside = threading.Event()
    release = threading.Event()

    def slow(ctx: int) -> None:
        seen.append(ctx)
        inside.set()
        release.wait(0.4)

    hook = LaunchHook(slow, cupti=FAKE_CUPTI)
    hook.arm()
    first = threading.Thread(target=fake.launch, args=(RUNTIME, 211, API_EXIT, CTX))
    first.start()
    assert inside.wait(0.4)
    fake.launch(DRIVER, 307, API_EXIT, CTX + 1)  # another thread launches while the action runs
    release.set()
    first.join(0.4)
    assert seen == [CTX]
    hook.disarm()


def test_a_rejected_cbid_is_skipped_for_good(fake: FakeSubscriber) -> None:
    fake.reject = {(RUNTIME, 311)}  # e.g. a cbid newer than this libcupti
    seen: list[int] = []
    hook = _hook(seen)
    hook.arm()
    assert fake.registered() == LAUNCHES - {(RUNTIME, 311)}
    assert fake.attempts.count((RUNTIME, 311)) == 1
    fake.launch(RUNTIME, 211, API_EXIT, CTX)
    assert seen == [CTX]
    hook.disarm()
    hook.arm()
    assert fake.attempts.count((RUNTIME, 311)) == 1  # not retried
    assert fake.registered() == LAUNCHES - {(RUNTIME, 311)}
    hook.disarm()
    assert fake.active == []


def test_busy_subscriber_propagates_and_leaves_nothing_registered(fake: FakeSubscriber) -> None:
    fake.busy_on_attempt = 3
    hook = _hook([])
    with pytest.raises(SubscriberBusy):
        hook.arm()
    assert fake.active == [] and len(fake.removed) == 2  # the two accepted before it were removed
    fake.busy_on_attempt = 0  # the other tool went away: every cbid is still tried
    hook.arm()
    assert fake.registered() == LAUNCHES
    hook.disarm()


def test_every_cbid_rejected_is_an_error(fake: FakeSubscriber) -> None:
    fake.reject = set(LAUNCHES)
    hook = _hook([])
    with pytest.raises(RuntimeError, match="accepted no kernel-launch callback"):
        hook.arm()
    assert fake.active == [] and len(fake.attempts) == len(LAUNCHES)
    with pytest.raises(RuntimeError):  # and stays one: nothing is left to try
        hook.arm()
    assert len(fake.attempts) == len(LAUNCHES)
