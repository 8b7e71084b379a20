"""Who samples a device's counters: the collector itself where NVML can, else one probe per GPU on the
node, whatever number of processes use it.

A GPU's performance counters have one owner. Every probe whose ``pm_sampling`` source found a CUDA
context on its device asks (``SamplerAsk``, the device named by its UUID, which is the same in
every process whatever its ``CUDA_VISIBLE_DEVICES``). A source that would sample through NVML's GPM
says how (``SamplerAsk.gpm``): the collector then samples the device itself (``gpm_sampler``), with
no CUDA context and no GPU memory, and tells every such source so (``SamplerGrant.collector``); they
sample nothing while it does. Where NVML cannot sample the device in the collector (its container
has no driver library, the chip has no GPM), or the sources sample through CUPTI (which needs the
process's CUDA context), the first to ask is granted the device (``SamplerGrant``) and the others
wait, without touching CUPTI. When the sampler stops, disconnects or exits, the longest-waiting
probe still on the device is granted it, with the previous sampler's last sample end, so that it
reports the samples missing over the hand-over. The collector stops sampling a device once none
of the sources it samples for is left, and hands it to a probe still waiting.

A collector that starts anew (a restart: the probes reconnect and send their claims again) does not
know who samples; for ``reclaim_s`` it grants nobody and samples nothing, so that the probes
sampling now say so (``holds``) before a device whose counters are still held is sampled again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cuptistream.channel import messages
from cuptistream.collector.gpm_sampler import ORIGIN
from cuptistream.plugin import Emitter


class Asker(Protocol):
    """A probe connection, as the grants see it."""

    pid: int
    emitter: Emitter  # where the collector's own samples of a device it serves go
    ordinals: dict[str, int]  # device UUID -> the process's CUDA ordinal

    def send(self, message: messages.Message) -> bool: ...


class OwnSampler(Protocol):
    """The collector's sampling of one device (``gpm_sampler.CollectorSampler``)."""

    name: str

    def start(self, target: Asker, since: int = 0) -> None: ...

    def serve(self, target: Asker) -> None: ...

    def lend(self) -> None: ...

    def take_back(self) -> None: ...

    def stop(self) -> None: ...


Claim = tuple[Asker, str]  # a probe connection and the name of its source
Send = tuple[Asker, messages.SamplerGrant]
OwnFactory = Callable[[str, messages.GpmAsk], OwnSampler]  # device UUID, how -> a sampler not started
RECLAIM_S = 3.0  # three of the probes' reconnect attempts (``probe.emitter``'s housekeeping)


@dataclass
class _Device:
    holder: Claim | None = None
    waiting: list[Claim] = field(default_factory=list)
    last_end: int = 0  # the holder's last sample end (CUPTI clock ns), as far as the collector saw
    gpm: dict[Claim, messages.GpmAsk] = field(default_factory=dict)  # claims NVML can serve, and how
    own: OwnSampler | None = None  # the collector samples the device itself
    served: list[Claim] = field(default_factory=list)  # ... for these claims; the first gets the events
    cannot: bool = False  # the collector tried to sample the device and could not


class SamplerGrants:
    """The collector's book of device samplers. Thread-safe: every connection thread calls it; a
    grant is sent from the thread whose message or departure freed the device. ``own``: makes the
    collector's sampler of a device (None: the collector samples nothing itself)."""

    def __init__(self, reclaim_s: float = RECLAIM_S, own: OwnFactory | None = None) -> None:
        self._lock = threading.Lock()
        self._devices: dict[str, _Device] = {}
        self._own = own
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
        """The collector stops: grant nothing more, and stop its own sampling (what it sampled is
        handed on). Its probes hang up in any order as it stops, and a sampler's hang-up must not
        hand its device on: it still samples, and tells the next collector it holds the device (a
        grant now would have two processes claim it)."""
        with self._lock:
            self._closed = True
            stops = [device.own for device in self._devices.values() if device.own is not None]
            for device in self._devices.values():
                device.own = None
        self._timer.cancel()
        self._stop(stops)

    def ask(self, asker: Asker, message: messages.SamplerAsk) -> None:
        """``message`` from ``asker``: a request (granted at once where nobody samples the device)
        or a release (the device goes to the next in line)."""
        claim = (asker, message.source)
        sends: list[Send] = []
        stops: list[OwnSampler] = []
        with self._lock:
            device = self._devices.setdefault(message.uuid, _Device())
            if message.holds:  # it samples now (sent to a new collector)
                if device.own is not None:  # sampled here meanwhile: the probe that samples keeps it
                    stops.append(device.own)
                    device.own = None
                    device.waiting[:0], device.served = device.served, []
                if claim in device.waiting:
                    device.waiting.remove(claim)
                if device.holder is None:
                    device.holder = claim
                elif device.holder != claim:  # granted to another meanwhile: it gets the device next
                    device.waiting.insert(0, claim)
            elif message.ask:
                if device.holder == claim or claim in device.waiting or claim in device.served:
                    return
                if message.gpm is not None:
                    device.gpm[claim] = message.gpm
                if device.own is not None and message.gpm is not None:
                    device.served.append(claim)
                    sends.append(_collector_grant(message.uuid, claim))
                else:
                    device.waiting.append(claim)
                    if device.holder is None and device.own is None and self._granting.is_set():
                        sends = self._next(message.uuid, device, 0)
            else:
                device.gpm.pop(claim, None)
                if claim in device.waiting:
                    device.waiting.remove(claim)
                if claim in device.served:
                    sends, stops = self._unserve(message.uuid, device, [claim])
                elif device.holder == claim:
                    device.last_end = max(device.last_end, message.last_end)
                    sends = self._next(message.uuid, device, asker.pid)
        self._stop(stops)
        self._send(sends)

    def lend(self, uuids: Iterable[str]) -> list[OwnSampler]:
        """Stop the collector's own sampling of ``uuids`` for a metrics window (the range profiler
        takes their counters); returns what to ``take_back`` after it."""
        with self._lock:
            lent = [device.own for uuid in set(uuids) if (device := self._devices.get(uuid)) and device.own]
        for sampler in lent:
            sampler.lend()
        return lent

    @staticmethod
    def take_back(lent: Sequence[OwnSampler]) -> None:
        """Sample again what ``lend`` stopped (a sampler stopped meanwhile stays stopped)."""
        for sampler in lent:
            sampler.take_back()

    def sampled(self, asker: Asker, uuid: str, last_end: int) -> None:
        """``asker``'s samples of ``uuid`` reached ``last_end``: where it holds the device, the
        start of the gap a hand-over would leave (known even when the sampler is killed)."""
        with self._lock:
            device = self._devices.get(uuid)
            if device is not None and device.holder is not None and device.holder[0] is asker:
                device.last_end = max(device.last_end, last_end)

    def left(self, asker: Asker) -> None:
        """``asker``'s connection ended: it waits for nothing, and what it sampled goes on."""
        sends: list[Send] = []
        stops: list[OwnSampler] = []
        with self._lock:
            for uuid, device in self._devices.items():
                device.waiting = [claim for claim in device.waiting if claim[0] is not asker]
                device.gpm = {claim: ask for claim, ask in device.gpm.items() if claim[0] is not asker}
                if gone := [claim for claim in device.served if claim[0] is asker]:
                    more_sends, more_stops = self._unserve(uuid, device, gone)
                    sends += more_sends
                    stops += more_stops
                elif device.holder is not None and device.holder[0] is asker:
                    sends += self._next(uuid, device, asker.pid)
        self._stop(stops)
        self._send(sends)

    def _reclaimed(self) -> None:
        """The reclaim time passed: grant the devices nobody claimed to hold."""
        sends: list[Send] = []
        with self._lock:
            self._granting.set()
            for uuid, device in self._devices.items():
                if device.holder is None and device.own is None:
                    sends += self._next(uuid, device, 0)
        self._send(sends)

    def holder(self, uuid: str) -> int:
        """The pid that samples ``uuid`` now (0: none, or the collector)."""
        with self._lock:
            device = self._devices.get(uuid)
            return device.holder[0].pid if device is not None and device.holder is not None else 0

    def sampled_here(self, uuid: str) -> list[int]:
        """The pids the collector samples ``uuid`` for itself, the one whose process gets the events
        first ([]: the collector does not sample it)."""
        with self._lock:
            device = self._devices.get(uuid)
            return [asker.pid for asker, _ in device.served] if device is not None else []

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

    def _next(self, uuid: str, device: _Device, previous: int) -> list[Send]:
        """Hand the device on (under the lock): to the collector's own sampling where the
        longest-waiting claim would sample through NVML and the collector can (every such claim is
        then served), else to that claim. []: nobody waits, or the collector stops (``close``)."""
        device.holder = None
        if not device.waiting or self._closed:
            return []
        since = device.last_end if previous else 0
        device.last_end = 0
        if previous:
            self.handovers += 1
        first = device.waiting[0]
        ask = device.gpm.get(first)
        if ask is not None and self._sample_here(uuid, device, first, ask, since):
            device.served = [claim for claim in device.waiting if claim in device.gpm]
            device.waiting = [claim for claim in device.waiting if claim not in device.gpm]
            return [_collector_grant(uuid, claim) for claim in device.served]
        asker, source = device.holder = device.waiting.pop(0)
        return [(asker, messages.SamplerGrant(uuid=uuid, source=source, previous=previous, since=since))]

    def _sample_here(
        self, uuid: str, device: _Device, first: Claim, ask: messages.GpmAsk, since: int
    ) -> bool:
        """Start the collector's own sampling of ``uuid`` for ``first`` (under the lock; NVML's
        calls take milliseconds). False, said once to ``first``'s process: NVML cannot here."""
        if self._own is None or device.cannot:
            return False
        try:
            sampler = self._own(uuid, ask)
            sampler.start(first[0], since)
        except Exception as error:  # GpmUnavailable, or NVML's own error (out of memory for a sample)
            device.cannot = True
            first[0].emitter.report_error(
                ORIGIN,
                f"the collector cannot sample GPU {uuid} through NVML ({error}); a probe samples it",
                severity="info",
            )
            return False
        device.own = sampler
        first[0].emitter.report_error(
            ORIGIN,
            f"PM sampling of GPU {uuid} ({sampler.name}) runs in the collector, through NVML's GPM every "
            f"{ask.interval_ns / 1e6:g} ms: no probe samples it, and it takes no GPU memory",
            severity="info",
        )
        return True

    def _unserve(self, uuid: str, device: _Device, gone: list[Claim]) -> tuple[list[Send], list[OwnSampler]]:
        """``gone`` no longer want the device sampled (under the lock): the events go to the next
        served process, or, with none left, the collector's sampling stops (returned, to stop
        outside the lock) and the device goes to a probe still waiting."""
        first = device.served[0]
        device.served = [claim for claim in device.served if claim not in gone]
        if device.own is None:
            return [], []
        if device.served:
            if first in gone:
                device.own.serve(device.served[0][0])
            return [], []
        own, device.own = device.own, None
        return self._next(uuid, device, 0), [own]

    @staticmethod
    def _stop(stops: list[OwnSampler]) -> None:
        """Stop the collector's samplers outside the lock (a last decode, and its events)."""
        for sampler in stops:
            sampler.stop()

    @staticmethod
    def _send(sends: list[Send]) -> None:
        """Send outside the lock. A probe that cannot be told is gone: its departure (``left``)
        hands the device on."""
        for asker, message in sends:
            asker.send(message)


def _collector_grant(uuid: str, claim: Claim) -> Send:
    """Tell ``claim`` that the collector samples ``uuid``: it samples nothing."""
    return claim[0], messages.SamplerGrant(uuid=uuid, source=claim[1], collector=True)
