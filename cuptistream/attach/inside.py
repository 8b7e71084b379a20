"""The attached probe, inside the target process (``loader`` calls it on a thread of its own, from the
node install's probe runtime): start the config's sources feeding a collector; at the end of the
window stop them, which flushes CUPTI and finalizes it (``driver.live_program``: at a CUDA call's
exit), and undo what starting the probe changed in the process.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from cuptistream.config import load
from cuptistream.cupti import driver, subscriber
from cuptistream.probe.probe import Probe

# Graph creation and instantiation (resource callbacks), as the activity source watches them for its
# detaches between windows: a graph instantiated while CUPTI is attached fails its replays once
# CUPTI is finalized, so then CUPTI stays attached after the window.
_GRAPH_CBIDS = (9, 11, 18)
# Graph launches (driver cuGraphLaunch and its per-thread-stream form): a graph captured before the
# attach cannot be seen, but its replays can, and they too fail after CUPTI is finalized.
_GRAPH_LAUNCH_CBIDS = (514, 515)

LATE_ATTACH = (
    "attached to a running process: CUDA work already in flight and CUDA graphs captured before the "
    "attach are not recorded as they would be from the program's start (graph launches show as "
    "whole graphs; kernel names resolved before the attach are missing)"
)


class Attached:
    """One attached probe: ``Attached.start(...)``, then ``stop()`` once (or the process exits)."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.pid = os.getpid()
        self._graph: str | None = None
        self._watches: list[Any] = []
        self._lock = threading.Lock()
        self._stopped = False

    @classmethod
    def start(cls, collector: str, config_path: str, session_id: str) -> Attached:
        """Raises what ``Probe.start`` raises (``ChannelError``: no collector) or ``UserError``."""
        probe = Probe(load(config_path), collector, session_id, quiet=True)
        attached = cls(probe)
        driver.live_program = attached._veto
        try:
            probe.start()
        except BaseException:
            driver.live_program = None
            raise
        # At exit only in this process (not in a child forked meanwhile: its socket is ours).
        atexit.unregister(probe._stop_at_exit)
        atexit.register(attached._stop_at_exit)
        probe.emitter.report_error("attach", LATE_ATTACH, severity="info")
        attached._watch_graphs()
        return attached

    @property
    def sources(self) -> list[str]:
        return [source.name for source in self.probe.sources]

    @property
    def failed_sources(self) -> dict[str, str]:
        return dict(self.probe.failed_sources)

    def _watch_graphs(self) -> None:
        if not any(source.traces_cuda for source in self.probe.sources):
            return
        try:
            for cbid in _GRAPH_CBIDS:
                self._watches.append(subscriber.register(subscriber.Domain.RESOURCE, self._on_graph, cbid))
            for cbid in _GRAPH_LAUNCH_CBIDS:
                self._watches.append(
                    subscriber.register(subscriber.Domain.DRIVER_API, self._on_graph_launch, cbid)
                )
        except Exception:  # no CUPTI callbacks here: the activity source stopped too, nothing to detach
            self._unwatch()

    def _on_graph(self, domain: int, cbid: int, data: object) -> None:
        self._graph = "the program made a CUDA graph while attached (a detach would fail its replays)"

    def _on_graph_launch(self, domain: int, cbid: int, data: object) -> None:
        if self._graph is None:
            self._graph = "the program launched a CUDA graph while attached (a detach would fail its replays)"

    def _veto(self) -> str | None:
        return self._graph

    def _unwatch(self) -> None:
        for watch in self._watches:
            watch.remove()
        self._watches = []

    def stop(self) -> str:
        """Stop the probe: its sources hand over and CUPTI is finalized unless a graph forbids it.
        How CUPTI was left, one line. Idempotent."""
        with self._lock:
            if self._stopped:
                return ""
            self._stopped = True
        atexit.unregister(self._stop_at_exit)
        driver.last_release = ""
        try:
            self.probe.stop()
        finally:
            self._unwatch()
            driver.live_program = None
        cupti = any(source.traces_cuda for source in self.probe.sources)
        return driver.last_release or ("CUPTI was not used" if not cupti else "CUPTI released")

    def _stop_at_exit(self) -> None:
        if os.getpid() == self.pid:
            self.stop()
