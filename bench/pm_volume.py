"""What hardware counters add to a recording per GPU-hour with the ``pm_sampling`` source's NVML
backend at its defaults (every GPM metric, 100 ms samples, a ``pm_samples`` event per 1 s decode),
from samples a GPU read.

From the GPM capture ``tests/fixtures/gpm`` (its README entry says how it was taken): the samples
the session decoded live are cut into the events the source emits once per ``--decode-period``;
each event is msgpack-encoded and compressed alone in a zstd frame at level 3 (the file sink writes a
batch a second, in which a device's ``pm_samples`` event is one), and the bytes per sampled second
are scaled to an hour. The statistics: the ``pm_stats`` the collector folds per ``--interval``, and
the ``pm_kernel_stats`` rows it attributes to the capture's kernels, per interval and kernel name,
encoded the same way (their count grows with the names that run in an interval, up to the
statistics' ``max_names``).

    python bench/pm_volume.py [--decode-period 1] [--interval 10]

The result goes to ``--out`` (default ``bench/out/pm_volume.json``); the last line is the row.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "gpm"
HOUR_S = 3600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode-period", type=float, default=1.0, help="seconds between pm_samples events")
    parser.add_argument("--interval", type=float, default=10.0, help="statistics interval, seconds")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "pm_volume.json"))
    args = parser.parse_args()

    import msgspec
    import zstandard

    from cuptistream.collector.buffer_decoder import Decoder
    from cuptistream.cupti import capture
    from cuptistream.cupti.names import TableNames
    from cuptistream.cupti.records import RecordLayouts
    from cuptistream.events import PmKernelStats, PmSamples
    from cuptistream.statistics import Accumulator
    from cuptistream.statistics.pm_fold import PmFold

    captured = json.loads((FIXTURE / "gpm_alternating.json").read_text())
    live = captured["decoded"]
    starts, ends = live["starts"], live["ends"]
    per_event = max(1, round(args.decode_period * 1e9 / captured["interval_ns"]))
    events = [
        PmSamples(
            device_id=0,
            chip=captured["device"],
            metrics=captured["metrics"],
            starts=starts[i : i + per_event],
            ends=ends[i : i + per_event],
            values=[
                [None if math.isnan(v) else v for v in column[i : i + per_event]] for column in live["values"]
            ],
        )
        for i in range(0, len(starts), per_event)
    ]
    encode = msgspec.msgpack.encode
    zstd = zstandard.ZstdCompressor(level=3)

    def framed(items: Sequence[object]) -> int:
        return sum(len(zstd.compress(encode(item))) for item in items)

    sampled_s = (ends[-1] - starts[0]) / 1e9
    interval_ns = round(args.interval * 1e9)
    fold = PmFold(interval_ns)
    stats = [s for e in events for s in fold.add(e)] + fold.close()
    cap = capture.read(FIXTURE / "gpm_alternating.cupti")
    names = TableNames(cap.strings)
    decoder = Decoder(names, RecordLayouts(dict(cap.struct_sizes)))
    accumulator = Accumulator(interval_ns, 500, names)
    for event in events:
        accumulator.pm_samples(event)
    for buffer in cap.buffers:
        for _, kind, records in decoder._records(buffer.data, len(buffer.data), None):
            if kind == "kernel":
                accumulator.add("kernel", records)
        accumulator.buffer_done()
    rows = [e for e in accumulator.close() if isinstance(e, PmKernelStats)]
    intervals_per_hour = HOUR_S / args.interval
    stats_bytes = framed(stats) / len(stats)  # per interval
    result = {
        "device": captured["device"],
        "metrics": len(captured["metrics"]),
        "samples": len(starts),
        "sampled_s": round(sampled_s, 3),
        "pm_samples_events": len(events),
        "pm_samples_raw_bytes_per_hour": round(sum(len(encode(e)) for e in events) / sampled_s * HOUR_S),
        "pm_samples_zstd_bytes_per_hour": round(framed(events) / sampled_s * HOUR_S),
        "pm_stats_zstd_bytes_per_interval": round(stats_bytes),
        "pm_stats_zstd_bytes_per_hour": round(stats_bytes * intervals_per_hour),
        "pm_kernel_stats_rows": len(rows),
        "pm_kernel_stats_zstd_bytes_per_row": round(framed(rows) / len(rows)),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(
        f"{result['device']}, {result['metrics']} GPM metrics every {captured['interval_ns'] / 1e6:g} ms: pm_samples "
        f"{result['pm_samples_zstd_bytes_per_hour'] / 1e6:.2f} MB per GPU-hour in zstd "
        f"({result['pm_samples_raw_bytes_per_hour'] / 1e6:.2f} MB encoded); pm_stats "
        f"{result['pm_stats_zstd_bytes_per_hour'] / 1e6:.2f} MB; pm_kernel_stats "
        f"{result['pm_kernel_stats_zstd_bytes_per_row']} B per kernel name and {args.interval:g} s interval"
    )


if __name__ == "__main__":
    main()
