"""The probe's side of "one sampler per device on the node": a source that would own a device's
counters asks the collector first (``SamplerAsk``) and starts only once granted (``SamplerGrant``).
Where the collector samples the device itself (NVML's GPM), its answer says so, and the source
waits on for a grant of its own, which comes only if the collector stops sampling while it runs.

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
        self._asks: dict[tuple[str, str], messages.SamplerAsk] = {}  # sent again to a new collector
        self._grants: dict[tuple[str, str], messages.SamplerGrant] = {}
        link.standing.append(self._standing)

    def uuid_of(self, device: int) -> str:
        """The UUID of CUDA ordinal ``device`` in this process ("": not known)."""
        return next((d.uuid for d in self.link.devices if d.device_id == device), "")

    def wait(
        self, uuid: str, source: str, stopping: threading.Event, gpm: messages.GpmAsk | None = None,
        ask: bool = True,
    ) -> messages.SamplerGrant | None:  # fmt: skip
        """Ask for ``uuid`` (``gpm``: how the source would sample it through NVML, which the collector
        can do in its place) and wait for the answer: a grant, or the collector's word that it
        samples the device (``collector``). ``ask`` False: after that word, wait for what comes next
        without asking again. None: ``stopping`` was set first."""
        key = (uuid, source)
        with self._lock:
            arrived = self._arrived.setdefault(key, threading.Event())
            message = self._asks.setdefault(key, messages.SamplerAsk(uuid=uuid, source=source, gpm=gpm))
        if ask:  # not sent (no collector now): the next collector hears it at the connect (``_standing``)
            self.link.post(message, wait=1.0)
        while not arrived.wait(0.1):
            if stopping.is_set():
                return None
        with self._lock:
            grant = self._grants.get(key)
            if grant is not None and grant.collector:  # not the source's: it waits for the next answer
                del self._grants[key]
                arrived.clear()
            return grant

    def release(self, uuid: str, source: str, last_end: int) -> None:
        """``source`` no longer samples or waits for ``uuid`` (its counters disabled, if it had them)."""
        with self._lock:
            self._arrived.pop((uuid, source), None)
            self._asks.pop((uuid, source), None)
            self._grants.pop((uuid, source), None)
        self.link.post(messages.SamplerAsk(uuid=uuid, source=source, ask=False, last_end=last_end), wait=2.0)

    def _standing(self) -> list[messages.Message]:
        """For a new collector: every device this probe samples (first) or waits for, or that the
        collector before sampled for it (asked again: the new one decides anew)."""
        with self._lock:
            asks = dict(self._asks)
            held = {key for key, grant in self._grants.items() if not grant.collector}
        holding = [messages.SamplerAsk(uuid=u, source=s, holds=True) for u, s in asks if (u, s) in held]
        waiting = [message for key, message in asks.items() if key not in held]
        return [*holding, *waiting]

    def granted(self, grant: messages.SamplerGrant) -> None:
        """The collector's answer (on the control thread)."""
        key = (grant.uuid, grant.source)
        with self._lock:
            self._grants[key] = grant
            arrived = self._arrived.setdefault(key, threading.Event())
        arrived.set()
