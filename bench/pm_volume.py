"""What PM sampling adds to a recording per GPU-hour at its default settings (a sample every 20 ms,
decoded every second: one ``pm_samples`` event a second), and what its statistics add.

From the counter values captured on the GPU (default: ``tests/fixtures/pm``, a bf16 GEMM loop then
an elementwise loop; its README entry says how it was taken), an hour of the source's events is
built by cycling through the captured samples in order, one event per decode period, and encoded
as the file sink writes them: msgpack, a batch per second in one zstd frame at level 3. The
``pm_stats`` events are the collector's fold of that hour (``statistics.interval``, 10 s).

    python bench/pm_volume.py [FIXTURE_DIR] [--decode-period 1] [--interval 10]

The result goes to ``--out`` (default ``bench/out/pm_volume.json``); the last line is the row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOUR_S = 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixtures", nargs="?", default=str(ROOT / "tests" / "fixtures" / "pm"))
    parser.add_argument("--decode-period", type=float, default=1.0, help="seconds between decodes")
    parser.add_argument("--interval", type=float, default=10.0, help="statistics interval, seconds")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "pm_volume.json"))
    args = parser.parse_args()

    import msgspec
    import zstandard

    from cuptistream.events import PmSamples
    from cuptistream.statistics.pm_fold import PmFold

    captures = sorted(Path(args.fixtures).glob("pm_*.json"))
    if not captures:
        raise SystemExit(f"{args.fixtures}: no pm_<chip>.json capture; see tests/fixtures/README.md")
    capture = json.loads(captures[0].read_text())
    interval_ns = int(capture["interval_ns"])
    captured = len(capture["starts"])
    per_event = round(args.decode_period * 1e9 / interval_ns)
    encode = msgspec.msgpack.encode
    zstd = zstandard.ZstdCompressor(level=3)
    fold = PmFold(round(args.interval * 1e9))
    samples_bytes = samples_zstd = stats_bytes = stats_events = 0
    at = 10**15  # an arbitrary CUPTI clock start
    for second in range(round(HOUR_S / args.decode_period)):
        rows = [(second * per_event + i) % captured for i in range(per_event)]
        starts = [at + (second * per_event + i) * interval_ns for i in range(per_event)]
        event = PmSamples(
            device_id=0, chip=capture["chip"], metrics=capture["metrics"], starts=starts,
            ends=[s + interval_ns for s in starts], values=[[column[r] for r in rows] for column in capture["values"]],
        )  # fmt: skip
        packed = encode(event)
        samples_bytes += len(packed)
        samples_zstd += len(zstd.compress(packed))
        for stats in fold.add(event):
            stats_bytes += len(encode(stats))
            stats_events += 1
    result = {
        "capture": str(captures[0]),
        "chip": capture["chip"],
        "metrics": len(capture["metrics"]),
        "interval_ms": interval_ns / 1e6,
        "samples_per_hour": round(HOUR_S * 1e9 / interval_ns),
        "pm_samples_bytes_per_hour": samples_bytes,
        "pm_samples_zstd_bytes_per_hour": samples_zstd,
        "pm_stats_events_per_hour": stats_events,
        "pm_stats_bytes_per_hour": stats_bytes,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(
        f"{capture['chip']}, {len(capture['metrics'])} metrics every {interval_ns / 1e6:g} ms: pm_samples "
        f"{samples_bytes / 1e6:.1f} MB per GPU-hour msgpack, {samples_zstd / 1e6:.1f} MB zstd; pm_stats "
        f"{stats_bytes / 1e6:.2f} MB ({stats_events} events)"
    )


if __name__ == "__main__":
    main()
