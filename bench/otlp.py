"""OTLP sink throughput: spans/s mapped, encoded, gzipped and POSTed to a local receiver.

    .venv/bin/python bench/otlp.py [--runs 5] [--batches 20] [--batch-events 8192] [--encoding protobuf]

Each batch is half runtime API calls, half kernels (every kernel a child of its call), inside one
NVTX range per batch. The receiver reads the body and answers 200 without decoding, so the number
measures the sink. Also measures the mapping+encoding rate alone (no HTTP). Each run's rate goes to
``--out`` (default ``bench/out/otlp.json``); the last two lines are the headline rows, spans/s as
median [min..max] over the runs.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cuptistream.config import convert
from cuptistream.events import Event, NvtxRange
from cuptistream.plugin import OutgoingBatch
from cuptistream.sinks.otlp import OtlpSink, OtlpSinkConfig
from cuptistream.sinks.otlp.common import SCHEMA_URL, resource, scope
from cuptistream.sinks.otlp.encoding import to_json
from cuptistream.sinks.otlp.traces import SpanAssembler
from cuptistream.sinks.otlp.wire import traces_request
from tests.otlp_batches import TID, api, kernel, make_batch, outgoing


class _Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def batches(count: int, events_per_batch: int) -> list[OutgoingBatch]:
    out = []
    corr = 1
    t = 0
    for seq in range(count):
        events: list[Event] = []
        start = t
        for _ in range(events_per_batch // 2):
            events.append(api(corr, t, t + 2_000))
            events.append(kernel(corr, t + 3_000, t + 8_000, name=f"kernel_{corr % 50}"))
            corr += 1
            t += 10_000
        events.append(NvtxRange(name=f"step {seq}", start=start, end=t, thread_id=TID))
        out.append(outgoing(make_batch(events, seq=seq)))
    return out


def run_once(endpoint: str, work: list[OutgoingBatch], encoding: str) -> tuple[float, int]:
    cfg = {"type": "otlp", "endpoint": endpoint, "encoding": encoding, "signals": ["traces"]}
    sink = OtlpSink(convert(cfg, OtlpSinkConfig))
    for b in work:
        b.__dict__.pop("batch", None)  # decode again every run, as the pipeline would

    async def main() -> None:
        await sink.open()
        for b in work:
            await sink.write(b)
        await sink.close()

    started = time.perf_counter()
    trio.run(main)
    return time.perf_counter() - started, sink.stats()["spans_sent"]


def encode_only(work: list[OutgoingBatch], encoding: str) -> tuple[float, int]:
    cfg = convert({"type": "otlp", "endpoint": "http://127.0.0.1:1", "encoding": encoding}, OtlpSinkConfig)
    assembler = SpanAssembler()
    spans = 0
    started = time.perf_counter()
    for b in work:
        b.__dict__.pop("batch", None)
        decoded = b.batch
        ready = assembler.add(decoded)
        body = traces_request([(resource(decoded), ready)], scope(cfg.scope_name), SCHEMA_URL)
        if encoding == "json":
            body = to_json(ExportTraceServiceRequest.FromString(body))
        gzip.compress(body, compresslevel=6, mtime=0)
        spans += len(ready)
    return time.perf_counter() - started, spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-events", type=int, default=8192)
    parser.add_argument("--encoding", default="protobuf", choices=["protobuf", "json"])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out" / "otlp.json", help="rates (JSON)"
    )
    args = parser.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    work = batches(args.batches, args.batch_events)

    rows, raw = [], {}
    for label, fn in (
        ("encode only (map + serialize + gzip)", lambda: encode_only(work, args.encoding)),
        ("sent to local receiver", lambda: run_once(endpoint, work, args.encoding)),
    ):
        rates = []
        for _ in range(args.runs):
            seconds, spans = fn()
            rates.append(spans / seconds)
        raw[label] = rates
        rows.append(
            f"otlp {label} [{args.encoding}, gzip, {spans} spans/run]: {statistics.median(rates):,.0f} "
            f"[{min(rates):,.0f}..{max(rates):,.0f}] spans/s over {args.runs} runs"
        )
        print(rows[-1], flush=True)
    server.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "spans_per_s": raw}))
    print(f"wrote {args.out}")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
