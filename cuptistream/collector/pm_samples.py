"""PM samples from the sampling probe to every decode stream of the collector: the kernel
attribution joins them there with each process's kernels (``statistics.pm_attribution``).

The sampler's connection ``publish``es each ``PmSamples`` event, encoded once; every connection
has an inbox here and hands what it finds there to its streams on its own thread (``take``), as
it decodes, so no stream is touched from another thread. The latest event of each device is kept
and handed to connections that come later (and to streams they open later, ``ProbeConnection``):
a stream then knows from its start that its device is sampled, and its first kernels wait for the
next samples instead of being passed over. Samples go only to the probes of this collector: a
process served by another collector is not attributed. A GPU is known by its UUID across processes
(each may see it under another CUDA ordinal): a connection takes the samples of the GPUs its process
sees, relabelled with its own ordinal (``for_process``).
"""

from __future__ import annotations

import threading
from collections import deque

import msgspec

from cuptistream.events import PmSamples

_encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder(PmSamples).decode


Published = tuple[str, bytes]  # the device (``device_key``), an encoded ``PmSamples`` of it


def device_key(samples: PmSamples, uuids: dict[int, str]) -> str:
    """The sampled GPU, the same in every process: its UUID where the sampling process named its
    devices, else its CUDA ordinal there (``ordinal N``; joined by ordinal, as one process sees it)."""
    uuid = uuids.get(samples.device_id)
    return uuid if uuid else f"ordinal {samples.device_id}"


def for_process(key: str, payload: bytes, ordinals: dict[str, int]) -> bytes | None:
    """``payload`` as a process with ``ordinals`` (device UUID -> its CUDA ordinal) sees it: the
    samples relabelled with that process's ordinal of the GPU (``CUDA_VISIBLE_DEVICES`` differs
    between the pods of a node), None where the process does not see the GPU. Samples keyed by
    ordinal, or a process that named no devices, are taken as they are."""
    if key.startswith("ordinal ") or not ordinals:
        return payload
    ordinal = ordinals.get(key)
    if ordinal is None:
        return None
    samples = decode(payload)
    if samples.device_id == ordinal:
        return payload
    return _encode(msgspec.structs.replace(samples, device_id=ordinal))


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
        self._latest: dict[str, Published] = {}

    def subscribe(self) -> Inbox:
        with self._lock:
            inbox = Inbox(list(self._latest.values()))
            self._inboxes.add(inbox)
            return inbox

    def unsubscribe(self, inbox: Inbox) -> None:
        with self._lock:
            self._inboxes.discard(inbox)

    def publish(self, samples: PmSamples, key: str) -> None:
        """``samples`` of the device ``key`` (``device_key``) to every inbox."""
        published = (key, _encode(samples))
        with self._lock:
            self._latest[key] = published
            for inbox in self._inboxes:
                inbox.put(published)
