"""The probe's side of "one sampler per device on the node": a source that would own a device's
counters asks the collector first (``SamplerAsk``) and starts only once granted (``SamplerGrant``).

One message per change (ask, grant, release), nothing per sample. Without a collector (a source
driven in-process, no ``Probe``) no source is handed a ``DeviceGrants`` and each samples as it
would alone.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from cuptistream.channel import messages
from cuptistream.probe.link import ProbeLink


@runtime_checkable
class SharesDevice(Protocol):
    """A source that owns a device-wide resource (PM sampling's counters): the probe hands it the
    grants before it starts."""

    def use_grants(self, grants: DeviceGrants) -> None: ...


class DeviceGrants:
    """Grants this probe's sources were given, per (device UUID, source name). The control thread
    delivers them (``granted``); a source's worker waits for its own (``wait``)."""

    def __init__(self, link: ProbeLink) -> None:
        self.link = link
        self._lock = threading.Lock()
        self._arrived: dict[tuple[str, str], threading.Event] = {}
        self._grants: dict[tuple[str, str], messages.SamplerGrant] = {}
        link.standing.append(self._standing)

    def uuid_of(self, device: int) -> str:
        """The UUID of CUDA ordinal ``device`` in this process ("": not known)."""
        return next((d.uuid for d in self.link.devices if d.device_id == device), "")

    def wait(self, uuid: str, source: str, stopping: threading.Event) -> messages.SamplerGrant | None:
        """Ask for ``uuid`` and wait for the grant; None: ``stopping`` was set first."""
        key = (uuid, source)
        with self._lock:
            arrived = self._arrived.setdefault(key, threading.Event())
        # Not sent (no collector now): the next collector hears it at the connect (``_standing``).
        self.link.post(messages.SamplerAsk(uuid=uuid, source=source), wait=1.0)
        while not arrived.wait(0.1):
            if stopping.is_set():
                return None
        with self._lock:
            return self._grants.get(key)

    def release(self, uuid: str, source: str, last_end: int) -> None:
        """``source`` no longer samples or waits for ``uuid`` (its counters disabled, if it had them)."""
        with self._lock:
            self._arrived.pop((uuid, source), None)
            self._grants.pop((uuid, source), None)
        self.link.post(messages.SamplerAsk(uuid=uuid, source=source, ask=False, last_end=last_end), wait=2.0)

    def _standing(self) -> list[messages.Message]:
        """For a new collector: every device this probe samples (first) or waits for."""
        with self._lock:
            keys = list(self._arrived)
            held = set(self._grants)
        holding = [messages.SamplerAsk(uuid=u, source=s, holds=True) for u, s in keys if (u, s) in held]
        waiting = [messages.SamplerAsk(uuid=u, source=s) for u, s in keys if (u, s) not in held]
        return [*holding, *waiting]

    def granted(self, grant: messages.SamplerGrant) -> None:
        """The collector's grant (on the control thread)."""
        key = (grant.uuid, grant.source)
        with self._lock:
            self._grants[key] = grant
            arrived = self._arrived.setdefault(key, threading.Event())
        arrived.set()
