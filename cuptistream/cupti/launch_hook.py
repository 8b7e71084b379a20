"""Run CUPTI calls on the application's own thread, at the exit of its next kernel launch.

Under PyTorch, ``cuptiPCSamplingStart`` called from a thread of ours while the program keeps
launching can fail to return, and the launch path blocks with it.
NVIDIA's ``pc_sampling_continuous`` sample makes its PC sampling calls from the launch callbacks
instead, on the thread that launches; this does the same, but only when a call is due: the worker
``arm()``s the hook, the next launch (runtime or driver API, any thread) runs ``action(ctx)`` at
its exit, and the hook goes quiet again. Between actions no launch pays for a Python callback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cuptistream.cupti import subscriber
from cuptistream.cupti.subscriber import API_EXIT, Domain, Registration, api_callback_data

_LAUNCH_PREFIXES = {
    Domain.RUNTIME_API: ("cudaLaunch", "cudaGraphLaunch"),
    Domain.DRIVER_API: ("cuLaunch", "cuGraphLaunch"),
}


def launch_cbids(cupti: Any) -> dict[Domain, list[int]]:
    """Every runtime and driver API cbid that launches GPU work (kernels, cooperative, graphs)."""
    enums = {Domain.RUNTIME_API: cupti.runtime_api_trace_cbid, Domain.DRIVER_API: cupti.driver_api_trace_cbid}
    return {
        domain: [
            int(m.value)
            for m in enums[domain]
            if m.name.startswith(_LAUNCH_PREFIXES[domain]) and "HostFunc" not in m.name
        ]
        for domain in enums
    }


class LaunchHook:
    """``arm()`` from any thread; ``action(ctx)`` then runs once on the next launching thread.

    ``action`` gets the launch's context and runs inside the CUDA call: it may call CUPTI but must
    be short. The arming thread ``disarm()``s once nothing is due (the action can wake it).
    """

    def __init__(self, action: Callable[[int], None], cupti: Any = None) -> None:
        if cupti is None:
            from cupti import cupti as cupti_module

            cupti = cupti_module
        self._action = action
        self._cbids = launch_cbids(cupti)
        self._lock = threading.Lock()  # arm/disarm
        self._running = threading.Lock()  # one action at a time, whichever thread launches
        self._registrations: list[Registration] = []
        self._pending = False

    def arm(self) -> None:
        with self._lock:
            self._pending = True
            if self._registrations:
                return
            for domain, cbids in self._cbids.items():
                for cbid in list(cbids):
                    try:
                        self._registrations.append(subscriber.register(domain, self._on_launch, cbid=cbid))
                    except (subscriber.SubscriberBusy, subscriber.CuptiUnavailable):
                        self._remove_locked()
                        raise
                    except Exception:
                        # A cbid newer than this libcupti (13.0 rejected some that cupti-python 13.4
                        # lists): this CUDA cannot make that call either. Skip it for good.
                        cbids.remove(cbid)
            if not self._registrations:
                raise RuntimeError("CUPTI accepted no kernel-launch callback")

    def disarm(self) -> None:
        with self._lock:
            self._pending = False
            self._remove_locked()

    def _remove_locked(self) -> None:
        registrations, self._registrations = self._registrations, []
        for reg in registrations:
            reg.remove()

    def _on_launch(self, domain: int, cbid: int, data: Any) -> None:
        if not self._pending:
            return  # armed, but this action already ran: the arming thread disarms soon
        info = api_callback_data(data)
        if info is None or info.callbackSite != API_EXIT or not info.context:
            return
        if not self._running.acquire(blocking=False):
            return  # another thread is running it right now
        try:
            if not self._pending:
                return
            self._pending = False
            self._action(int(info.context))
        finally:
            self._running.release()
