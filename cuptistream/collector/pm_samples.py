"""PM samples from the sampling probe to every decode stream of the collector: the kernel
attribution joins them there with each process's kernels (``statistics.pm_attribution``).

The sampler's connection ``publish``es each ``PmSamples`` event, encoded once; every connection
has an inbox here and hands what it finds there to its streams on its own thread (``take``), as
it decodes, so no stream is touched from another thread. The latest event of each device is kept
and handed to connections that come later (and to streams they open later, ``ProbeConnection``):
a stream then knows from its start that its device is sampled, and its first kernels wait for the
next samples instead of being passed over. Samples go only to the probes of this collector: a
process served by another collector is not attributed.
"""

from __future__ import annotations

import threading
from collections import deque

import msgspec

from cuptistream.events import PmSamples

_encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder(PmSamples).decode


Published = tuple[int, bytes]  # device, an encoded ``PmSamples`` of it


class Inbox:
    """One connection's samples still to hand over, in order."""

    def __init__(self, latest: list[Published]) -> None:
        self._queue: deque[Published] = deque(latest)  # append and popleft are atomic: no lock

    def put(self, published: Published) -> None:
        self._queue.append(published)

    def take(self) -> list[Published]:
        out = []
        while self._queue:
            out.append(self._queue.popleft())
        return out


class SampleBoard:
    """The collector's: who gets PM samples, and the latest per device. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inboxes: set[Inbox] = set()
        self._latest: dict[int, Published] = {}

    def subscribe(self) -> Inbox:
        with self._lock:
            inbox = Inbox(list(self._latest.values()))
            self._inboxes.add(inbox)
            return inbox

    def unsubscribe(self, inbox: Inbox) -> None:
        with self._lock:
            self._inboxes.discard(inbox)

    def publish(self, samples: PmSamples) -> None:
        published = (samples.device_id, _encode(samples))
        with self._lock:
            self._latest[samples.device_id] = published
            for inbox in self._inboxes:
                inbox.put(published)
