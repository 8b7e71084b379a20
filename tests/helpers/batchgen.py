"""Deterministic batches of varied events for the file, reader and stdout tests (and their child
processes): batch ``seq`` always has the same events, so a reader can check contents exactly.
``run_sink`` writes batches through a sink from open to close."""

from __future__ import annotations

import random

import trio

from cuptistream.events import (
    SCHEMA_VERSION,
    ClockSync,
    DeviceInfo,
    EncodedBatch,
    Event,
    Kernel,
    Memcpy,
    NvtxRange,
    Resource,
)
from cuptistream.plugin import OutgoingBatch, Sink
from cuptistream.recording.codec import Chunk, encode_batch, encode_chunk

RESOURCE = Resource(
    host="testhost",
    pid=4242,
    process_name="python",
    command_line=["python", "train.py", "--ünïcode", 'quote"and\nnewline'],
    devices=[DeviceInfo(device_id=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-0000")],
    job={"RANK": "0", "WORLD_SIZE": "1"},
)
CLOCK = ClockSync(cupti_ns=1_000_000_000, unix_ns=1_763_700_000_000_000_000)
_NAMES = [f"void kernel_{i}<float, {i}>(float*, int)" for i in range(40)] + ["ampere_sgemm_128x64_nn", "κ"]


def make_events(seq: int, count: int, kinds: bool = False) -> list[Event]:
    """``count`` varied events for batch ``seq``: Kernels only, or (``kinds``) a mix of families."""
    rng = random.Random(seq)
    base = 1_700_000_000_000_000_000 + seq * 10_000_000
    events: list[Event] = []
    for i in range(count):
        start = base + i * 1000 + rng.randrange(1000)
        pick = rng.randrange(10) if kinds else 0
        if pick == 8:
            events.append(
                Memcpy(
                    start=start,
                    end=start + rng.randrange(1, 10**6),
                    bytes=rng.randrange(2**40),
                    copy_kind="HtoD",
                    src_kind="pinned",
                    dst_kind="device",
                    device_id=rng.randrange(8),
                    context_id=1,
                    stream_id=rng.randrange(64),
                    correlation_id=seq * count + i,
                    src_device_id=None if i % 3 else 1,
                )
            )
        elif pick == 9:
            events.append(
                NvtxRange(
                    name=f"step {i}",
                    start=start,
                    end=start + 5000,
                    thread_id=rng.randrange(2**63),
                    depth=i % 4,
                    color=0xFF00FF00 if i % 2 else None,
                    payload=i * 0.5 if i % 5 else None,
                )
            )
        else:
            name = _NAMES[rng.randrange(len(_NAMES))]
            events.append(
                Kernel(
                    start=start,
                    end=start + rng.randrange(1, 2**32),
                    name=name,
                    device_id=rng.randrange(8),
                    context_id=rng.randrange(1, 4),
                    stream_id=rng.randrange(2**32),
                    correlation_id=seq * count + i,
                    grid=(rng.randrange(1, 65536), rng.randrange(1, 64), 1),
                    block=(rng.choice((32, 128, 256, 1024)), 1, 1),
                    registers_per_thread=rng.randrange(256),
                    dynamic_shared_bytes=rng.randrange(3) * 4096,
                    graph_id=rng.randrange(3),
                    demangled_name=name if i % 7 == 0 else None,
                )
            )
    return events


def header(seq: int, session_id: str = "session-1") -> EncodedBatch:
    return EncodedBatch(
        schema_version=SCHEMA_VERSION,
        session_id=session_id,
        seq=seq,
        resource=RESOURCE,
        attributes={"cluster": "a", "note": "x y"},
        clock=CLOCK,
        events=None,  # type: ignore[arg-type]  # filled by encode_batch
    )


def batch_bytes(seq: int, count: int, kinds: bool = False, chunk: int = 1000) -> bytes:
    """The msgpack of batch ``seq``, assembled from chunks as the pipeline does."""
    events = make_events(seq, count, kinds)
    chunks: list[Chunk] = [encode_chunk(events[i : i + chunk]) for i in range(0, count, chunk)]
    return encode_batch(header(seq), chunks)


def outgoing(seq: int, count: int, kinds: bool = False) -> OutgoingBatch:
    return OutgoingBatch(data=batch_bytes(seq, count, kinds), seq=seq, event_count=count)


def run_sink(sink: Sink, batches: list[OutgoingBatch]) -> None:
    """Opens ``sink``, writes ``batches`` in order and closes it, in one trio run."""

    async def main() -> None:
        await sink.open()
        for batch in batches:
            await sink.write(batch)
        await sink.close()

    trio.run(main)
