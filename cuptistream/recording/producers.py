"""Producers: the observed processes whose events share one pipeline.

A collector serves every process of a job, so each chunk of events names its ``Producer`` and a
batch holds the events of one producer only: its envelope then says which process (pid, parent,
rank, devices) the events came from and which clock reading turns their timestamps into Unix time.
A chunk without a producer is the collector's own (losses, self-stats, its errors).

The collector updates a producer from its probe's messages (clock readings) and from the decoded
records (the devices they name); batches built afterwards carry the update.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import msgspec

from cuptistream.events import ClockSync, DeviceInfo, Resource


class Producer:
    """One probe's process. Thread-safe: updated by its connection, read by the pipeline."""

    def __init__(self, resource: Resource, visible_devices: Iterable[DeviceInfo] = ()) -> None:
        self.resource = resource
        self.visible = {device.device_id: device for device in visible_devices}
        self._lock = threading.Lock()
        self._offset_ns: int | None = None

    def clock_reading(self, clock: ClockSync) -> None:
        self._offset_ns = clock.offset_ns

    def clock_sync(self) -> ClockSync | None:
        """This process's event clock next to the Unix clock; None before its first reading."""
        offset = self._offset_ns
        if offset is None:
            return None
        now = time.time_ns()
        return ClockSync(cupti_ns=now - offset, unix_ns=now)

    def saw_devices(self, ordinals: Iterable[int]) -> None:
        """Records named these device ordinals: list them in the envelope from now on."""
        with self._lock:
            known = {device.device_id for device in self.resource.devices}
            new = sorted(set(ordinals) - known)
            if not new:
                return
            added = [self.visible.get(o) or DeviceInfo(device_id=o, name="", uuid="") for o in new]
            devices = sorted([*self.resource.devices, *added], key=lambda d: d.device_id)
            # A new Resource, not a mutation: a batch being encoded keeps the one it took.
            self.resource = msgspec.structs.replace(self.resource, devices=devices)
