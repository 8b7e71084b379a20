"""The kernel names of a range-profiled window, in launch order, per context.

CUPTI's range profiler in auto range mode makes one range per kernel launch and names it by its
index ("0", "1", ...), not by the kernel. While profiling, this notes the function name of each
driver-API kernel launch (the runtime's launches reach the driver too) on the launching thread, so
range ``i`` of a context is the ``i``-th launch noted on it. A CUDA graph launch runs many kernels
as ranges of their own under one call: the names past it cannot be matched, and ``names`` stops
there.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from cuptistream.cupti import subscriber
from cuptistream.cupti.api_functions import api_names
from cuptistream.cupti.launch_hook import launch_cbids
from cuptistream.cupti.subscriber import API_ENTER, Domain, Registration, api_callback_data

GRAPH_LAUNCH = "[CUDA graph launch]"


def kernel_launch_cbids(cupti: Any) -> dict[int, bool]:
    """Driver API cbid -> whether it launches a graph, for every call that launches kernels."""
    names = api_names("driver")
    return {
        cbid: names.get(cbid, "").startswith("cuGraphLaunch")
        for cbid in launch_cbids(cupti)[Domain.DRIVER_API]
    }


class LaunchNames:
    """``start()``, then ``names(context)`` at any time; ``stop()`` removes the callbacks. Raises
    what ``subscriber.register`` raises when CUPTI has no subscriber for us."""

    def __init__(self, cupti: Any = None) -> None:
        if cupti is None:
            from cupti import cupti as cupti_module

            cupti = cupti_module
        self._cbids = kernel_launch_cbids(cupti)
        self._launches: dict[int, list[str]] = {}  # context -> function names, in launch order
        self._lock = threading.Lock()
        self._registrations: list[Registration] = []

    def start(self) -> None:
        for cbid in self._cbids:
            try:
                self._registrations.append(subscriber.register(Domain.DRIVER_API, self._on_launch, cbid=cbid))
            except (subscriber.SubscriberBusy, subscriber.CuptiUnavailable):
                self.stop()
                raise
            except Exception:  # a cbid this libcupti does not know: this CUDA cannot make the call
                continue

    def stop(self) -> None:
        registrations, self._registrations = self._registrations, []
        for registration in registrations:
            registration.remove()

    def names(self, context: int) -> list[str]:
        """The kernels launched on ``context`` since ``start``, up to its first graph launch."""
        with self._lock:
            launched = list(self._launches.get(context, []))
        if GRAPH_LAUNCH in launched:
            return launched[: launched.index(GRAPH_LAUNCH)]
        return launched

    def _on_launch(self, domain: int, cbid: int, data: Any) -> None:
        info = api_callback_data(data)
        if info is None or info.callbackSite != API_ENTER or not info.context:
            return
        if self._cbids.get(cbid):
            name = GRAPH_LAUNCH
        else:
            name = ctypes.string_at(info.symbolName).decode(errors="replace") if info.symbolName else ""
        with self._lock:
            self._launches.setdefault(int(info.context), []).append(name)
