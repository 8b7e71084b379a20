"""The collector's statistics: added CPU cost per record, and bytes per GPU-hour in the file sink.

Cost: the real kernel, memcpy and memset records of the committed captures (``sources/captures``,
Hopper), tiled into ``--buffers`` buffers of about ``--records`` records whose times move on at
1 M records/s (so 10 s intervals open and close as they would live), folded into one stream's
``Accumulator`` at the defaults: what ``DecodeStream`` adds to decoding. For scale, packing the same
arrays into events (``PackedConverters``, the collector's hot path) is timed beside it. With
``--names N`` the kernels get N distinct names. Best of ``--rounds``.

Bytes: the fullest interval's statistics events, msgpack in one zstd frame at level 3 (as the file
sink writes a batch), times 360 intervals of 10 s: a CPU estimate of what a GPU-hour of the
statistics weighs (``bench/budget_accuracy.py --modes budget`` measures it on a GPU).

    python bench/statistics_cost.py [--records 40000] [--buffers 50] [--names 0] [--rounds 5]

The result goes to ``--out`` (default ``bench/out/statistics_cost.json``); the last line is the
headline row: ns per record (best of the rounds) and zstd bytes per GPU-hour.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import msgspec
import numpy as np
import zstandard

from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.config.model import StatisticsConfig
from cuptistream.cupti import capture
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.packed import PackedConverters
from cuptistream.cupti.records import RecordLayouts
from cuptistream.events import Event, PmSamples
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURE_DIR  # shipped real-GPU captures
from cuptistream.statistics import Accumulator


def _arrays() -> tuple[list[tuple[int, str, np.ndarray]], TableNames]:
    """Every kernel, memcpy and memset array of the committed captures (one TableNames for all)."""
    out: list[tuple[int, str, np.ndarray]] = []
    strings: dict[int, str] = {}
    for path in sorted(CAPTURE_DIR.glob("*.cupti")):
        cap = capture.read(path)
        strings.update(cap.strings)
        decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)))
        for buf in cap.buffers:
            for kind, event, records in decoder._records(buf.data, len(buf.data), None):
                if event in ("kernel", "memcpy", "memset"):
                    out.append((kind, event, records))
    return out, TableNames(strings)


def _buffers(
    records: int, count: int, names: int
) -> tuple[list[list[tuple[int, str, np.ndarray]]], TableNames]:
    """``count`` buffers of about ``records`` records each, times moving on buffer by buffer at about
    1M records/s (the collector's target rate), so 10 s intervals close as they would live."""
    arrays, table = _arrays()
    total = sum(len(r) for _, _, r in arrays)
    copies = max(1, records // total)
    step = 1_000_000_000 * records // 1_000_000  # ns of GPU time per buffer at 1M records/s
    base = min(int(r["start"].min()) for _, _, r in arrays)
    out = []
    for b in range(count):
        buf = []
        for kind, event, r in arrays:
            tiled = np.tile(r, copies)
            shift = (np.repeat(np.arange(copies), len(r)) * (step // copies)).astype(np.uint64)
            for field in ("start", "end"):
                tiled[field] = tiled[field] - np.uint64(base) + np.uint64(10**18 + b * step) + shift
            if names and event == "kernel":
                tiled["name"] = np.arange(len(tiled)) % names + 1
            buf.append((kind, event, tiled))
        out.append(buf)
    if names:  # the captures' own (long, mangled) kernel names, numbered to make them distinct
        real = sorted({table(int(p)) for _, e, r in arrays if e == "kernel" for p in np.unique(r["name"])})
        table = TableNames({i + 1: f"{real[i % len(real)]}_{i}" for i in range(names)})
    return out, table


def cost(records: int, count: int, names: int, rounds: int) -> dict[str, float]:
    buffers, table = _buffers(records, count, names)
    n = sum(len(r) for buf in buffers for _, _, r in buf)
    best = float("inf")
    for _ in range(rounds):
        acc = Accumulator(StatisticsConfig().interval_ns, StatisticsConfig().max_names, table)
        began = time.perf_counter()
        for buf in buffers:
            for _kind, event, r in buf:
                acc.add(event, r)
            acc.buffer_done()
        acc.close()
        best = min(best, time.perf_counter() - began)
    packers = PackedConverters(table).by_event
    packing = float("inf")
    for _ in range(rounds):  # for scale: what packing the same arrays into events costs
        began = time.perf_counter()
        for buf in buffers:
            for kind, event, r in buf:
                packers[event](kind, r)
        packing = min(packing, time.perf_counter() - began)
    return {"records": n, "ns_per_record": best / n * 1e9, "packing_ns_per_record": packing / n * 1e9}


PM_METRICS = 14  # the pm_sampling source's default set on GH100
PM_PERIOD_NS = 20_000_000


def _pm_samples(first: int, last: int) -> PmSamples:
    """Samples of ``PM_METRICS`` metrics every 20 ms from ``first`` (on the 20 ms grid) past ``last``."""
    starts = list(range(first - first % PM_PERIOD_NS, last + PM_PERIOD_NS, PM_PERIOD_NS))
    values: list[list[float | None]] = [[50.0 + m] * len(starts) for m in range(PM_METRICS)]
    return PmSamples(
        device_id=0, chip="GH100", metrics=[f"metric_{m}" for m in range(PM_METRICS)], starts=starts,
        ends=[s + PM_PERIOD_NS for s in starts], values=values,
    )  # fmt: skip


def pm_cost(records: int, count: int, names: int, rounds: int) -> dict[str, float]:
    """ns per record the PM attribution adds: rounds with and without samples, interleaved."""
    buffers, table = _buffers(records, count, names)
    n = sum(len(r) for buf in buffers for _, _, r in buf)
    spans = [
        (min(int(r["start"].min()) for _, _, r in buf), max(int(r["end"].max()) for _, _, r in buf))
        for buf in buffers
    ]
    samples, covered = [], 0  # each buffer's samples begin where the last buffer's ended
    for first, last in spans:
        samples.append(_pm_samples(max(first, covered), last))
        covered = samples[-1].ends[-1]
    added: list[float] = []
    for _ in range(rounds):
        took = {}
        for with_pm in (False, True):
            acc = Accumulator(StatisticsConfig().interval_ns, StatisticsConfig().max_names, table)
            began = time.perf_counter()
            for buf, pm in zip(buffers, samples, strict=True):
                if with_pm:
                    acc.pm_samples(pm)
                for _kind, event, r in buf:
                    acc.add(event, r)
                acc.buffer_done()
            acc.close()
            took[with_pm] = time.perf_counter() - began
        added.append((took[True] - took[False]) / n * 1e9)
    return {
        "records": n, "rounds": rounds, "added_ns_per_record_median": float(np.median(added)),
        "added_ns_per_record_min": min(added), "added_ns_per_record_max": max(added),
    }  # fmt: skip


def bytes_per_hour(records: int, count: int, names: int) -> dict[str, float]:
    buffers, table = _buffers(records, count, names)
    acc = Accumulator(StatisticsConfig().interval_ns, StatisticsConfig().max_names, table)
    events: list[Event] = []
    for buf in buffers:
        for _kind, event, r in buf:
            acc.add(event, r)
        events += acc.buffer_done()
    events += acc.close()
    by_interval: dict[int, list[Event]] = {}
    for e in events:
        by_interval.setdefault(e.interval_start, []).append(e)  # type: ignore[attr-defined]
    # The fullest interval, one zstd frame of its own, as the file sink writes a batch of them.
    fullest = max(by_interval.values(), key=len)
    payload = msgspec.msgpack.encode(fullest)
    packed = zstandard.ZstdCompressor(level=3).compress(payload)
    return {
        "intervals": len(by_interval),
        "events_per_interval": len(fullest),
        "msgpack_bytes_per_interval": len(payload),
        "zstd_bytes_per_interval": len(packed),
        "zstd_bytes_per_gpu_hour": len(packed) * 360,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--buffers", type=int, default=50)
    parser.add_argument("--names", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pm", action="store_true", help="also time the PM attribution, interleaved")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out" / "statistics_cost.json"
    )
    args = parser.parse_args()
    result = {
        "cost": cost(args.records, args.buffers, args.names, args.rounds),
        "bytes": bytes_per_hour(args.records, args.buffers, args.names),
    }
    if args.pm:
        result["pm"] = pm_cost(args.records, args.buffers, args.names, args.rounds)
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    c, b = result["cost"], result["bytes"]
    names = f"{args.names} kernel names" if args.names else "the captures' kernel names"
    print(f"statistics ({names}): {c['ns_per_record']:.1f} ns per record "
          f"(packing {c['packing_ns_per_record']:.1f}), best of {args.rounds}; "
          f"{b['zstd_bytes_per_gpu_hour'] / 1e6:.2f} MB per GPU-hour (zstd-3)")  # fmt: skip
    if args.pm:
        p = result["pm"]
        print(f"PM attribution adds {p['added_ns_per_record_median']:.1f} ns per record "
              f"[{p['added_ns_per_record_min']:.1f} .. {p['added_ns_per_record_max']:.1f}], "
              f"{args.rounds} interleaved rounds")  # fmt: skip


if __name__ == "__main__":
    main()
