"""Capture what a busy GPU hands the collector: a workload's activity buffers as the default config's
activity source completes them (4 MiB buffers, the default kinds and API filters), as a capture file.

    python bench/capture_stream.py --workload W3 --seconds 0.2 --out tests/fixtures/w3_stream.cupti

The shipped captures hold ~930 records per buffer, mostly small API records; a GPU running W3 fills
4 MiB buffers with ~19,000 records, nearly all 216-byte kernel records, which cost the collector
more per record. With this file the CPU benchmarks and tests decode GPU-shaped buffers
(``python bench/fanin.py --replay-path FILE``, ``bench/raw_floor.py``; the tests read
``tests/fixtures/w3_stream.cupti``, made by the command above).

Writes ``--out`` (default ``bench/out/<workload>_stream.cupti``) and prints one JSON line: buffers,
records by activity kind, bytes of buffers, the file's bytes, and the records CUPTI dropped. Needs a
GPU, torch and CUPTI; not run in CI.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="W3", help="a bench/workloads.py workload (default W3)")
    parser.add_argument("--seconds", type=float, default=0.5, help="how long it runs traced")
    parser.add_argument(
        "--out", default="", help="the capture file to write (default bench/out/<workload>_stream.cupti)"
    )
    args = parser.parse_args()

    import torch

    from bench.workloads import WORKLOADS
    from cuptistream.cupti import capture
    from cuptistream.cupti.records import RecordLayouts, walk
    from sources.activity import ActivitySource, ActivitySourceConfig
    from tests.gpu.workloads.collect import Collect

    if args.workload not in WORKLOADS:
        raise SystemExit(f"capture_stream: unknown workload {args.workload}; one of {', '.join(WORKLOADS)}")
    out = Path(args.out or ROOT / "bench" / "out" / f"{args.workload.lower()}_stream.cupti").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    block = WORKLOADS[args.workload]()
    block(10)  # built and warm before tracing starts
    torch.cuda.synchronize()
    sink = Collect()
    source = ActivitySource(ActivitySourceConfig(type="activity", capture=str(out)), sink)
    source.start()
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        block(20)
        torch.cuda.synchronize()
    source.stop()
    cap = capture.read(out)
    layouts = RecordLayouts(dict(cap.struct_sizes))
    by_kind: collections.Counter[int] = collections.Counter()
    for buf in cap.buffers:
        data = memoryview(bytearray(buf.data))
        by_kind.update({kind: len(offsets) for kind, offsets in walk(data, len(data), layouts, None).items()})
    print(json.dumps({
        "workload": args.workload, "seconds": args.seconds, "buffers": len(cap.buffers),
        "records_by_kind": {str(k): n for k, n in sorted(by_kind.items())},
        "buffer_bytes": sum(len(b.data) for b in cap.buffers), "file_bytes": out.stat().st_size,
        "losses": sink.losses, "errors": sink.errors[:5],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
