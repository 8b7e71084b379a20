"""Batches for Kafka sink tests: known events on two devices plus device-less API calls."""

from __future__ import annotations

import msgspec

from cuptistream.events import SCHEMA_VERSION, ApiCall, ClockSync, EncodedBatch, Event, Kernel, Resource
from cuptistream.plugin import OutgoingBatch
from cuptistream.recording.codec import encode_batch, encode_chunk

RESOURCE = Resource(host="testhost", pid=4242, process_name="train.py", command_line=["python", "train.py"])


def events_for(seq: int, count: int) -> list[Event]:
    """``count`` events for batch ``seq``: every 50th an ApiCall (no device), the rest Kernels on
    devices 0 and 1. ``correlation_id`` is unique across batches, so order can be checked."""
    events: list[Event] = []
    for i in range(count):
        cid = seq * 1_000_000 + i
        if i % 50 == 49:
            events.append(
                ApiCall(
                    domain="runtime", name="cudaLaunchKernel", cbid=211, start=cid, end=cid + 3,
                    process_id=4242, thread_id=7, correlation_id=cid,
                )
            )  # fmt: skip
        else:
            events.append(
                Kernel(
                    start=cid, end=cid + 5, name=f"kernel_{i % 17}", device_id=i % 2, context_id=1,
                    stream_id=7, correlation_id=cid, grid=(i % 9, 1, 1), block=(128, 1, 1),
                )
            )  # fmt: skip
    return events


def batch_for(seq: int, events: list[Event], session_id: str = "session-1") -> OutgoingBatch:
    header = EncodedBatch(
        schema_version=SCHEMA_VERSION,
        session_id=session_id,
        seq=seq,
        resource=RESOURCE,
        attributes={"job": "test"},
        clock=ClockSync(cupti_ns=1_000, unix_ns=1_700_000_000_000_000_000),
        events=msgspec.Raw(b""),
    )
    return OutgoingBatch(data=encode_batch(header, [encode_chunk(events)]), seq=seq, event_count=len(events))


def key_of(event: Event) -> bytes:
    """The default key template ``{host}:{pid}:{device}`` for ``event`` in these batches."""
    device = getattr(event, "device_id", None)
    return f"{RESOURCE.host}:{RESOURCE.pid}:{'-' if device is None else device}".encode()
