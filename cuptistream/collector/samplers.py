"""Who samples a device's counters: one probe per GPU on the node, whatever number of processes use it.

A GPU's performance counters have one owner. Every probe whose ``pm_sampling`` source found a CUDA
context on its device asks (``SamplerAsk``, the device named by its UUID, which is the same in
every process whatever its ``CUDA_VISIBLE_DEVICES``); the first to ask is granted the device
(``SamplerGrant``) and the others wait, without touching CUPTI. When the sampler stops, disconnects
or exits, the longest-waiting probe still on the device is granted it, with the previous sampler's
last sample end, so that it reports the samples missing over the hand-over.

A collector that starts anew (a restart: the probes reconnect and send their claims again) does not
know who samples; for ``reclaim_s`` it grants nobody, so that the probes sampling now say so
(``holds``) before a waiting probe is granted a device whose counters are still held. The collector itself
does not sample: PM sampling in a process needs that process to hold a CUDA context on the device
(docs/config.md, ``pm_sampling``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

from cuptistream.channel import messages


class Asker(Protocol):
    """A probe connection, as the grants see it."""

    pid: int

    def send(self, message: messages.Message) -> bool: ...


Claim = tuple[Asker, str]  # a probe connection and the name of its source
RECLAIM_S = 3.0  # three of the probes' reconnect attempts (``probe.emitter``'s housekeeping)


@dataclass
class _Device:
    holder: Claim | None = None
    waiting: list[Claim] = field(default_factory=list)
    last_end: int = 0  # the holder's last sample end (CUPTI clock ns), as far as the collector saw


class SamplerGrants:
    """The collector's book of device samplers. Thread-safe: every connection thread calls it; a
    grant is sent from the thread whose message or departure freed the device."""

    def __init__(self, reclaim_s: float = RECLAIM_S) -> None:
        self._lock = threading.Lock()
        self._devices: dict[str, _Device] = {}
        self.handovers = 0
        self._granting = threading.Event()  # set once the probes sampling now had time to reclaim
        self._closed = False
        self._timer = threading.Timer(reclaim_s, self._reclaimed)
        self._timer.daemon = True
        if reclaim_s > 0:
            self._timer.start()
        else:
            self._granting.set()

    def close(self) -> None:
        """The collector stops: grant nothing more. Its probes hang up in any order as it stops, and
        a sampler's hang-up must not hand its device on: it still samples, and tells the next
        collector it holds the device (a grant now would have two processes claim it)."""
        with self._lock:
            self._closed = True
        self._timer.cancel()

    def ask(self, asker: Asker, message: messages.SamplerAsk) -> None:
        """``message`` from ``asker``: a request (granted at once where nobody samples the device)
        or a release (the device goes to the next in line)."""
        claim = (asker, message.source)
        with self._lock:
            device = self._devices.setdefault(message.uuid, _Device())
            if message.holds:  # it samples now (sent to a new collector)
                if claim in device.waiting:
                    device.waiting.remove(claim)
                if device.holder is None:
                    device.holder = claim
                elif device.holder != claim:  # granted to another meanwhile: it gets the device next
                    device.waiting.insert(0, claim)
                return
            if message.ask:
                if device.holder == claim or claim in device.waiting:
                    return
                device.waiting.append(claim)
                free = device.holder is None and self._granting.is_set()
                grant = self._next(message.uuid, device, 0) if free else None
            else:
                if claim in device.waiting:
                    device.waiting.remove(claim)
                if device.holder != claim:
                    return
                device.last_end = max(device.last_end, message.last_end)
                grant = self._next(message.uuid, device, asker.pid)
        self._send(grant)

    def sampled(self, asker: Asker, uuid: str, last_end: int) -> None:
        """``asker``'s samples of ``uuid`` reached ``last_end``: where it holds the device, the
        start of the gap a hand-over would leave (known even when the sampler is killed)."""
        with self._lock:
            device = self._devices.get(uuid)
            if device is not None and device.holder is not None and device.holder[0] is asker:
                device.last_end = max(device.last_end, last_end)

    def left(self, asker: Asker) -> None:
        """``asker``'s connection ended: it waits for nothing, and what it sampled goes on."""
        grants: list[tuple[Asker, messages.SamplerGrant]] = []
        with self._lock:
            for uuid, device in self._devices.items():
                device.waiting = [claim for claim in device.waiting if claim[0] is not asker]
                holds = device.holder is not None and device.holder[0] is asker
                if holds and (grant := self._next(uuid, device, asker.pid)) is not None:
                    grants.append(grant)
        for grant in grants:
            self._send(grant)

    def _reclaimed(self) -> None:
        """The reclaim time passed: grant the devices nobody claimed to hold."""
        grants = []
        with self._lock:
            self._granting.set()
            for uuid, device in self._devices.items():
                if device.holder is None and (grant := self._next(uuid, device, 0)) is not None:
                    grants.append(grant)
        for grant in grants:
            self._send(grant)

    def holder(self, uuid: str) -> int:
        """The pid that samples ``uuid`` now (0: none)."""
        with self._lock:
            device = self._devices.get(uuid)
            return device.holder[0].pid if device is not None and device.holder is not None else 0

    def last_sample_end(self, uuid: str) -> int:
        """The end of ``uuid``'s holder's last sample the collector saw (CUPTI clock ns; 0: none)."""
        with self._lock:
            device = self._devices.get(uuid)
            return device.last_end if device is not None else 0

    def waiting(self, uuid: str) -> list[int]:
        """The pids waiting for ``uuid``, first in line first."""
        with self._lock:
            device = self._devices.get(uuid)
            return [asker.pid for asker, _ in device.waiting] if device is not None else []

    def _next(self, uuid: str, device: _Device, previous: int) -> tuple[Asker, messages.SamplerGrant] | None:
        """Hand the device to the longest-waiting claim (under the lock); None: nobody waits, or
        the collector stops (``close``)."""
        device.holder = None
        if not device.waiting or self._closed:
            return None
        asker, source = device.holder = device.waiting.pop(0)
        since = device.last_end if previous else 0
        device.last_end = 0
        if previous:
            self.handovers += 1
        return asker, messages.SamplerGrant(uuid=uuid, source=source, previous=previous, since=since)

    def _send(self, grant: tuple[Asker, messages.SamplerGrant] | None) -> None:
        """Send outside the lock. A probe that cannot be told is gone: its departure (``left``)
        hands the device on."""
        if grant is not None:
            asker, message = grant
            asker.send(message)
