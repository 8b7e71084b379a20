"""The process-wide CUPTI subscriber: routing, reference-counted enabling, busy and no-driver errors.

There is no GPU driver on this machine, so CUPTI cannot subscribe here. ``FakeCupti`` stands in for
cupti-python's subscribe/enable calls only, recording what a real CUPTI would be asked to do, and
lets the test fire callbacks the way CUPTI would. The no-driver test uses the real cupti-python.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pytest

from cuptistream.cupti.subscriber import (
    API_ENTER,
    API_EXIT,
    ApiCallbackData,
    CuptiUnavailable,
    Domain,
    Subscriber,
    SubscriberBusy,
    describe_cupti_failure,
)


class FakeCuptiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


class FakeCupti:
    """Records subscribe/enable calls; ``fire`` invokes the subscribed callback like CUPTI does."""

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder
        self.callback: Any = None
        self.calls: list[tuple[Any, ...]] = []
        self.enabled_domains: set[int] = set()
        self.enabled_cbids: set[tuple[int, int]] = set()

    def subscribe_v2(self, callback: Any, userdata: Any, p_params: int) -> int:
        if self.holder is not None:
            # CUPTI writes the current holder's name into params.oldSubscriberName.
            buffer = ctypes.c_void_p.from_address(p_params + 16).value
            assert buffer is not None and ctypes.c_size_t.from_address(p_params + 24).value >= 64
            ctypes.memmove(buffer, self.holder.encode() + b"\0", len(self.holder) + 1)
            raise FakeCuptiError(39)
        name = ctypes.c_char_p.from_address(p_params + 8).value
        self.calls.append(("subscribe", name))
        self.callback = callback
        return 0xABC

    def unsubscribe(self, handle: int) -> None:
        self.calls.append(("unsubscribe", handle))
        self.callback = None

    def enable_domain(self, enable: int, handle: int, domain: int) -> None:
        assert handle == 0xABC
        self.calls.append(("domain", enable, domain))
        if enable:
            self.enabled_domains.add(domain)
        else:
            self.enabled_domains.discard(domain)
            self.enabled_cbids = {k for k in self.enabled_cbids if k[0] != domain}

    def enable_callback(self, enable: int, handle: int, domain: int, cbid: int) -> None:
        assert handle == 0xABC
        self.calls.append(("cbid", enable, domain, cbid))
        if enable:
            self.enabled_cbids.add((domain, cbid))
        else:
            self.enabled_cbids.discard((domain, cbid))

    def fire(self, domain: int, cbid: int, data: Any = "data") -> None:
        if self.callback is not None and (
            domain in self.enabled_domains or (domain, cbid) in self.enabled_cbids
        ):
            self.callback(None, domain, cbid, data)


class DriverCalls:
    """A program thread making CUDA driver calls: each fires the driver API callback at its enter and
    at its exit, as CUPTI does, every ``period_s`` until ``stop()``. ``sites`` keeps the order."""

    def __init__(
        self, cupti: FakeCupti, sites: tuple[int, ...] = (API_ENTER, API_EXIT), period_s: float = 0.001
    ) -> None:
        self._cupti, self._period_s = cupti, period_s
        self._data = {site: ApiCallbackData(callbackSite=site) for site in sites}
        self.sites: list[int] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="program-thread", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            for site, data in self._data.items():
                self.sites.append(site)
                self._cupti.fire(Domain.DRIVER_API, 17, ctypes.addressof(data))

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()


def test_routes_by_domain_and_cbid_and_names_itself() -> None:
    fake = FakeCupti()
    sub = Subscriber(fake)
    seen: list[tuple[str, int, int]] = []
    a = sub.register(Domain.RESOURCE, lambda d, c, data: seen.append(("a", d, c)), cbid=5)
    b = sub.register(Domain.RESOURCE, lambda d, c, data: seen.append(("b", d, c)))
    assert fake.calls[0] == ("subscribe", b"cuptistream")
    fake.fire(3, 5)
    fake.fire(3, 6)
    assert seen == [("a", 3, 5), ("b", 3, 5), ("b", 3, 6)]
    a.remove()
    b.remove()
    assert fake.calls[-1] == ("unsubscribe", 0xABC)
    assert not sub.active


def test_enable_is_reference_counted() -> None:
    fake = FakeCupti()
    sub = Subscriber(fake)
    keep = sub.register(Domain.STATE, lambda *a: None)  # keeps the subscription alive
    one = sub.register(Domain.NVTX, lambda *a: None, cbid=7)
    two = sub.register(Domain.NVTX, lambda *a: None, cbid=7)
    assert fake.calls.count(("cbid", 1, 5, 7)) == 1
    one.remove()
    assert (5, 7) in fake.enabled_cbids
    two.remove()
    assert (5, 7) not in fake.enabled_cbids
    # A whole-domain registration ending must not switch off a cbid still wanted on its own.
    single = sub.register(Domain.NVTX, lambda *a: None, cbid=9)
    whole = sub.register(Domain.NVTX, lambda *a: None)
    whole.remove()
    assert 5 not in fake.enabled_domains and (5, 9) in fake.enabled_cbids
    single.remove()
    keep.remove()
    keep.remove()  # idempotent
    assert not sub.active


def test_handler_exceptions_are_counted_not_raised() -> None:
    fake = FakeCupti()
    sub = Subscriber(fake)
    after: list[int] = []

    def bad(domain: int, cbid: int, data: Any) -> None:
        raise ValueError("boom")

    sub.register(Domain.SYNCHRONIZE, bad)
    sub.register(Domain.SYNCHRONIZE, lambda d, c, data: after.append(c))
    fake.fire(4, 1)
    fake.fire(4, 2)
    assert after == [1, 2]  # the failing handler did not stop the next one
    assert sub.handler_errors() == 2
    assert sub.last_handler_error() == "ValueError: boom"


def test_busy_names_the_other_subscriber_and_leaves_nothing_registered() -> None:
    fake = FakeCupti(holder="Nsight Systems")
    sub = Subscriber(fake)
    with pytest.raises(SubscriberBusy) as info:
        sub.register(Domain.RESOURCE, lambda *a: None)
    assert info.value.holder == "Nsight Systems"
    assert "'Nsight Systems'" in str(info.value) and "\n" not in str(info.value)
    assert not sub.active
    fake.holder = None  # the other tool went away: a later registration subscribes
    sub.register(Domain.RESOURCE, lambda *a: None).remove()
    assert ("subscribe", b"cuptistream") in fake.calls


def test_enable_failure_releases_the_fresh_subscription() -> None:
    fake = FakeCupti()

    def refuse(*args: Any) -> None:
        raise FakeCuptiError(1)

    fake.enable_domain = refuse  # type: ignore[method-assign]
    sub = Subscriber(fake)
    with pytest.raises(FakeCuptiError):
        sub.register(Domain.NVTX, lambda *a: None)
    assert fake.calls[-1] == ("unsubscribe", 0xABC)
    assert not sub.active


def test_no_driver_is_one_clear_line() -> None:
    # Real cupti-python, no driver on this machine: subscribe raises NotSupportedError.
    sub = Subscriber()
    with pytest.raises(CuptiUnavailable) as info:
        sub.register(Domain.RESOURCE, lambda *a: None)
    message = str(info.value)
    assert message.startswith("CUPTI is unavailable: CUDA driver is not found")
    assert "NVIDIA GPU and driver" in message and "\n" not in message
    assert not sub.active
    assert describe_cupti_failure(RuntimeError("x\ny")) == "CUPTI call failed: x"


def test_resubscribe_after_finalize_keeps_every_registration() -> None:
    """``driver.park`` ran ``cuptiFinalize``, which destroyed the handle: the registrations are
    subscribed again at once, each domain and single callback enabled as before, and still routed."""
    cupti = FakeCupti()
    sub = Subscriber(cupti)
    seen: list[tuple[int, int]] = []
    sub.register(Domain.STATE, lambda d, c, data: seen.append((d, c)))
    sub.register(Domain.RESOURCE, lambda d, c, data: seen.append((d, c)), cbid=7)
    cupti.calls.clear()
    cupti.enabled_domains.clear()  # what cuptiFinalize leaves
    cupti.enabled_cbids.clear()
    sub.resubscribe()
    assert cupti.calls == [
        ("subscribe", b"cuptistream"),
        ("domain", 1, Domain.STATE),
        ("cbid", 1, Domain.RESOURCE, 7),
    ]
    assert sub.active
    cupti.callback(None, Domain.STATE, 3, 0)
    cupti.callback(None, Domain.RESOURCE, 7, 0)
    assert seen == [(Domain.STATE, 3), (Domain.RESOURCE, 7)]


def test_resubscribe_refused_drops_the_registrations_and_counts_it() -> None:
    """Another tool took the slot while CUPTI was detached: nothing stays registered, no raise."""
    cupti = FakeCupti()
    sub = Subscriber(cupti)
    reg = sub.register(Domain.STATE, lambda d, c, data: None)
    cupti.holder = "nsys"
    sub.resubscribe()
    assert not sub.active and sub.handler_errors() == 1
    reg.remove()  # removing a dropped registration is a no-op


def test_resubscribe_with_nothing_registered_subscribes_nothing() -> None:
    cupti = FakeCupti()
    Subscriber(cupti).resubscribe()
    assert cupti.calls == []
