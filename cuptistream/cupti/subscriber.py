"""The one CUPTI callback subscriber of this process, shared by every component that needs callbacks.

CUPTI allows a single subscriber per process (``cuptiSubscribe``), so no source may subscribe on
its own. Components register small handlers here instead::

    from cuptistream.cupti import subscriber

    reg = subscriber.register(subscriber.Domain.RESOURCE, on_module, cbid=MODULE_LOADED)
    ...
    reg.remove()

The subscriber is created on the first registration and released when the last one is removed,
so another tool (or a later session) can subscribe after us. Enabling is reference-counted per
(domain, cbid) and per whole domain: two components asking for the same callback both get it, and
it stays enabled until both have removed their handlers.

Failure modes:

- ``SubscriberBusy`` (a ``UserError``) when another tool holds CUPTI's subscriber slot (Nsight
  Systems, torch.profiler/Kineto, another cuptistream). Its ``holder`` names that tool where CUPTI
  reports it (``cuptiSubscribe_v2``).
- ``CuptiUnavailable`` (a ``NoGpuError``) when CUPTI cannot be used at all, e.g. no CUDA driver.
- Handlers run on the application's (or CUPTI's) thread, inside the CUDA call. They must be tiny
  and must not call CUDA. An exception from a handler never reaches CUPTI: it is counted
  (``handler_errors()``) and the first message is kept (``last_handler_error()``).
"""

from __future__ import annotations

import _thread
import ctypes
import enum
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from cuptistream.errors import CuptiUnavailable as CuptiUnavailable
from cuptistream.errors import SubscriberBusy as SubscriberBusy
from cuptistream.errors import UserError

Handler = Callable[[int, int, Any], None]
"""``handler(domain, cbid, data)``. ``data`` is cupti-python's object for the domain (``CallbackData``
for driver/runtime API, ``ResourceData``, ``SynchronizeData``, ``NvtxData``, ``StateData``)."""

SUBSCRIBER_NAME = "cuptistream"
_MULTIPLE_SUBSCRIBERS = 39  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
_INVALID_PARAMETER = 1  # CUPTI_ERROR_INVALID_PARAMETER
_PARAMS_SIZES = (40, 32)  # CUpti_SubscriberParams with and without allowMultipleSubscribers
_OLD_NAME_LEN = 256  # >= CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN (64)


_DATA_TYPES = {
    1: "CallbackData",
    2: "CallbackData",
    3: "ResourceData",
    4: "SynchronizeData",
    5: "NvtxData",
    6: "StateData",
}


class Domain(enum.IntEnum):
    """``CUpti_CallbackDomain`` (stable across CUPTI 12 and 13)."""

    DRIVER_API = 1
    RUNTIME_API = 2
    RESOURCE = 3
    SYNCHRONIZE = 4
    NVTX = 5
    STATE = 6


def describe_cupti_failure(error: BaseException) -> str:
    """One line for a failed CUPTI call, without a traceback.

    cupti-python imports without a driver; its calls then raise ``NotSupportedError: CUDA driver is
    not found``. That case gets a message saying what to do about it.
    """
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if type(error).__name__ == "NotSupportedError" or "driver is not found" in text:
        return f"CUPTI is unavailable: {text}; run on a machine with an NVIDIA GPU and driver"
    return f"CUPTI call failed: {text}"


def address_of(data: Any) -> int:
    """The raw address of a callback's ``cbdata`` struct, whether CUPTI handed a pointer or an object;
    0 where there is none (cupti-python passes None for some resource callbacks)."""
    if data is None:
        return 0
    return data if isinstance(data, int) else int(data.ptr)


def is_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says CUPTI cannot run on this machine at all (as opposed to a call failing)."""
    return type(error).__name__ == "NotSupportedError" or "driver is not found" in str(error)


class _SubscriberParams(ctypes.Structure):
    # CUpti_SubscriberParams, cupti_callbacks.h (CUPTI >= 12.8). Built with ctypes so that we own
    # the buffer CUPTI writes the current holder's name into.
    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("subscriberName", ctypes.c_char_p),
        ("oldSubscriberName", ctypes.c_char_p),
        ("oldSubscriberSize", ctypes.c_size_t),
        ("allowMultipleSubscribers", ctypes.c_uint8),
        ("padding", ctypes.c_uint8 * 7),
    ]


API_ENTER, API_EXIT = 0, 1  # CUpti_ApiCallbackSite


class ApiCallbackData(ctypes.Structure):
    """``CUpti_CallbackData`` (cupti_callbacks.h): what runtime and driver API callbacks receive."""

    _fields_ = [
        ("callbackSite", ctypes.c_int32),
        ("functionName", ctypes.c_void_p),
        ("functionParams", ctypes.c_void_p),
        ("functionReturnValue", ctypes.c_void_p),
        ("symbolName", ctypes.c_void_p),
        ("context", ctypes.c_void_p),
        ("contextUid", ctypes.c_uint32),
        ("correlationData", ctypes.c_void_p),
        ("correlationId", ctypes.c_uint32),
    ]


def api_callback_data(data: Any) -> ApiCallbackData | None:
    """The ``CUpti_CallbackData`` a runtime or driver API callback got, or None where it got none."""
    address = address_of(data)
    return ApiCallbackData.from_address(address) if address else None


class Registration:
    """A registered handler. ``remove()`` is idempotent and may be called from any thread."""

    __slots__ = ("_removed", "_subscriber", "cbid", "domain", "handler")

    def __init__(self, subscriber: Subscriber, domain: int, cbid: int | None, handler: Handler) -> None:
        self._subscriber = subscriber
        self._removed = False
        self.domain = domain
        self.cbid = cbid
        self.handler = handler

    def remove(self) -> None:
        if not self._removed:
            self._removed = True
            self._subscriber._unregister(self)


class Subscriber:
    """Owns CUPTI's subscriber handle and routes each callback to the handlers registered for it.

    Use the module-level ``register`` (the process-wide instance); separate instances exist for tests.
    """

    def __init__(self, cupti_module: Any | None = None) -> None:
        self._cupti = cupti_module  # cupti-python's ``cupti.cupti``, imported on first use
        self._lock = threading.Lock()  # serializes subscribe and enable calls, as CUPTI requires
        self._handle: int | None = None
        self._registrations: list[Registration] = []
        # Read on every callback without the lock: replaced whole, never mutated in place.
        self._routes: dict[tuple[int, int | None], tuple[Handler, ...]] = {}
        self._domain_refs: Counter[int] = Counter()
        self._cbid_refs: Counter[tuple[int, int]] = Counter()
        self._errors = 0
        self._first_error = ""
        self._dispatch_ref = self._dispatch  # CUPTI keeps a raw pointer: keep the bound method alive
        self._data_types: dict[int, Any] = {}

    # --- public API ---------------------------------------------------------------------------

    def register(self, domain: int, handler: Handler, cbid: int | None = None) -> Registration:
        """Call ``handler(domain, cbid, data)`` for ``cbid`` in ``domain`` (every cbid when None).

        Subscribes to CUPTI on first use. Raises ``SubscriberBusy`` or ``CuptiUnavailable``; on any
        error nothing stays registered.
        """
        reg = Registration(self, int(domain), None if cbid is None else int(cbid), handler)
        with self._lock:
            subscribed_here = self._handle is None
            if subscribed_here:
                self._subscribe()
            try:
                self._enable(reg.domain, reg.cbid)
            except BaseException:
                if subscribed_here and not self._registrations:
                    self._unsubscribe_quietly()
                raise
            self._registrations.append(reg)
            self._rebuild_routes()
        return reg

    def foreign_holder(self) -> str | None:
        """None when CUPTI's subscriber is ours or free; else who holds it, as CUPTI names it ("" when
        it does not say). Takes the free slot for a moment and gives it back. Raises
        ``CuptiUnavailable`` where CUPTI cannot run."""
        with self._lock:
            if self._handle is not None:
                return None
            try:
                self._subscribe()
            except SubscriberBusy as busy:
                return busy.holder
            self._unsubscribe_quietly()
            return None

    @property
    def active(self) -> bool:
        return self._handle is not None

    @property
    def handle(self) -> int | None:
        return self._handle

    def handler_errors(self) -> int:
        """How many handler calls raised (and were swallowed) since this subscriber was made."""
        return self._errors

    def last_handler_error(self) -> str:
        """The first handler exception's message, for an Error event."""
        return self._first_error

    def forget(self) -> None:
        """Drop all registrations and the handle without calling CUPTI (after ``cuptiFinalize``)."""
        with self._lock:
            for reg in self._registrations:
                reg._removed = True
            self._registrations.clear()
            self._domain_refs.clear()
            self._cbid_refs.clear()
            self._routes = {}
            self._handle = None

    def drop_dead(self, reg: Registration) -> None:
        """Remove ``reg`` without calling CUPTI: ``cuptiFinalize`` destroyed the handle it was
        enabled on (``driver.park``). The ``resubscribe`` that must follow enables what is left."""
        with self._lock:
            reg._removed = True
            if reg in self._registrations:
                self._registrations.remove(reg)
                self._rebuild_routes()

    def resubscribe(self) -> None:
        """Subscribe again with every registration kept, after ``cuptiFinalize`` destroyed the handle
        (``driver.park``). Never raises: where CUPTI refuses (another tool took the slot meanwhile),
        the registrations are dropped as ``forget`` drops them and the failure is counted."""
        with self._lock:
            self._handle = None
            # What the new handle enables, counted afresh from what is registered now.
            self._domain_refs = Counter(r.domain for r in self._registrations if r.cbid is None)
            self._cbid_refs = Counter((r.domain, r.cbid) for r in self._registrations if r.cbid is not None)
            if not self._registrations:
                return
            domains, cbids = list(self._domain_refs), list(self._cbid_refs)
            try:
                self._subscribe()
                cupti = self._module()
                for domain in domains:
                    cupti.enable_domain(1, self._handle, domain)
                for domain, cbid in cbids:
                    if domain not in self._domain_refs:
                        cupti.enable_callback(1, self._handle, domain, cbid)
                return
            except Exception as error:
                self._count_error(error)
        self.forget()

    # --- the callback -------------------------------------------------------------------------

    def _dispatch(self, userdata: Any, domain: int, cbid: int, data: Any) -> None:
        # Runs inside the CUDA call on the application's thread: look up, call, never raise.
        try:
            if isinstance(data, int) and domain in self._data_types:
                data = self._data_types[domain].from_ptr(data)  # a bare pointer: wrap it like cupti-python
            routes = self._routes
            for key in ((domain, cbid), (domain, None)):
                handlers = routes.get(key)
                if handlers:
                    for handler in handlers:
                        try:
                            handler(domain, cbid, data)
                        except BaseException as error:  # nothing may reach CUPTI
                            self._count_error(error)
        except BaseException as error:
            self._count_error(error)

    def _count_error(self, error: BaseException) -> None:
        self._errors += 1
        if not self._first_error:
            self._first_error = f"{type(error).__name__}: {error}"
        if isinstance(error, KeyboardInterrupt):
            _thread.interrupt_main()  # Ctrl-C during a callback still stops the program

    # --- CUPTI calls, under the lock ----------------------------------------------------------

    def _module(self) -> Any:
        if self._cupti is None:
            try:
                from cupti import cupti
            except ImportError as error:
                raise CuptiUnavailable(
                    f"cupti-python is not installed ({error}); `pip install cupti-python` "
                    "(or `cupti-python<13` for a CUDA 12 driver)"
                ) from None
            self._cupti = cupti
        return self._cupti

    def _subscribe(self) -> None:
        cupti = self._module()
        self._data_types = {
            domain: getattr(cupti, name) for domain, name in _DATA_TYPES.items() if hasattr(cupti, name)
        }
        try:
            handle = self._subscribe_v2(cupti) if hasattr(cupti, "subscribe_v2") else None
            if handle is None:
                handle = cupti.subscribe(self._dispatch_ref, None)
        except UserError:
            raise
        except Exception as error:
            if getattr(error, "status", None) == _MULTIPLE_SUBSCRIBERS:
                raise SubscriberBusy("") from None
            if is_unavailable(error):
                raise CuptiUnavailable(describe_cupti_failure(error)) from None
            raise RuntimeError(f"cuptiSubscribe: {describe_cupti_failure(error)}") from None
        self._handle = int(handle)

    def _subscribe_v2(self, cupti: Any) -> int | None:
        """``cuptiSubscribe_v2``, which names us and the current holder. None where this CUPTI
        rejects every known ``CUpti_SubscriberParams`` size (libcupti 13.0 rejects 13.x's 40 bytes)."""
        old_name = ctypes.create_string_buffer(_OLD_NAME_LEN)
        for size in _PARAMS_SIZES:
            params = _SubscriberParams(
                structSize=size,
                subscriberName=SUBSCRIBER_NAME.encode(),
                oldSubscriberName=ctypes.cast(old_name, ctypes.c_char_p),
                oldSubscriberSize=_OLD_NAME_LEN,
            )
            try:
                return int(cupti.subscribe_v2(self._dispatch_ref, None, ctypes.addressof(params)))
            except Exception as error:
                status = getattr(error, "status", None)
                if status == _MULTIPLE_SUBSCRIBERS:
                    raise SubscriberBusy(old_name.value.decode(errors="replace")) from None
                if status != _INVALID_PARAMETER:
                    raise
        return None

    def _unsubscribe_quietly(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                self._module().unsubscribe(handle)
            except Exception as error:  # release is best effort
                self._count_error(error)

    def _enable(self, domain: int, cbid: int | None) -> None:
        cupti = self._module()
        if cbid is None:
            if self._domain_refs[domain] == 0:
                cupti.enable_domain(1, self._handle, domain)
            self._domain_refs[domain] += 1
        else:
            if self._cbid_refs[(domain, cbid)] == 0 and self._domain_refs[domain] == 0:
                cupti.enable_callback(1, self._handle, domain, cbid)
            self._cbid_refs[(domain, cbid)] += 1

    def _disable(self, domain: int, cbid: int | None) -> None:
        cupti = self._module()
        if cbid is None:
            self._domain_refs[domain] -= 1
            if self._domain_refs[domain] == 0:
                del self._domain_refs[domain]
                cupti.enable_domain(0, self._handle, domain)
                # Turning the domain off also turned off callbacks still wanted one by one.
                for (dom, one), refs in self._cbid_refs.items():
                    if dom == domain and refs:
                        cupti.enable_callback(1, self._handle, domain, one)
        else:
            self._cbid_refs[(domain, cbid)] -= 1
            if self._cbid_refs[(domain, cbid)] == 0:
                del self._cbid_refs[(domain, cbid)]
                if self._domain_refs[domain] == 0:
                    cupti.enable_callback(0, self._handle, domain, cbid)

    def _unregister(self, reg: Registration) -> None:
        with self._lock:
            if reg not in self._registrations:
                return
            self._registrations.remove(reg)
            self._rebuild_routes()
            if self._handle is None:
                return
            try:
                if self._registrations:
                    self._disable(reg.domain, reg.cbid)
            except Exception as error:  # removing a handler never fails the caller
                self._count_error(error)
            if not self._registrations:
                self._domain_refs.clear()
                self._cbid_refs.clear()
                self._unsubscribe_quietly()

    def _rebuild_routes(self) -> None:
        routes: dict[tuple[int, int | None], list[Handler]] = {}
        for reg in self._registrations:
            routes.setdefault((reg.domain, reg.cbid), []).append(reg.handler)
        self._routes = {key: tuple(handlers) for key, handlers in routes.items()}


_process_subscriber = Subscriber()


def get() -> Subscriber:
    """The process-wide subscriber."""
    return _process_subscriber


def register(domain: int, handler: Handler, cbid: int | None = None) -> Registration:
    """Register ``handler`` with the process-wide subscriber (see ``Subscriber.register``)."""
    return _process_subscriber.register(domain, handler, cbid)
