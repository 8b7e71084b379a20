"""``cuptistream compare`` over 8 ranks x ~1M records: records/s per core and peak RSS, at two span lengths.

Each rank's recording is the committed real-GPU fixtures' events (sources/captures: three H200
captures decoded by the replay source, ~3.7k events: 67 % API calls, 17 % kernels, 13 % external
correlations), put on one clock and repeated until the rank has ``--records`` events, written as the
file sink writes them (8192-event batches, one zstd frame each, one file set per rank). The two
recordings differ only in where the repetitions sit in time: ``short`` puts one every 50 ms (the
job spans ~17 s: 2 intervals of 10 s), ``mid`` every 5 s (~22 min, 135 intervals), ``long`` every
5 minutes (~22 hours, 270 intervals) and ``longer`` every 50 minutes (~9 days, 270 intervals).
Same records, same batches, so memory that grew with the span would show as a rising peak RSS.

``compare`` runs in a fresh process pinned to one core (``--format json -o FILE``: every interval's
rows are written); ``os.wait4`` gives its CPU time and its ``VmHWM`` its peak RSS; records/s per core is records /
(user + sys CPU seconds). Median, min and max over ``--rounds`` runs.

    python bench/compare.py                              # 8 ranks x 1M records, 3 rounds
    python bench/compare.py --records 200000 --rounds 1  # a quick look

The goal: >= 1M records/s per core; peak RSS that does not grow with the span. The recordings are
built under ``--dir`` (default ``bench/out/compare``, removed after unless ``--keep``), the results
go to ``--out`` (default ``bench/out/compare.json``), and the last lines printed are the headline
rows: per span, records/s per core and peak RSS, median [min..max] over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from spread import spread  # noqa: E402 - bench/, first on the path of a script run from it

CHILD = r"""
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
t0 = time.perf_counter()
from cuptistream.cli import main
code = main(sys.argv[2:])
print(f"WALL {time.perf_counter() - t0:.3f}", file=sys.stderr)
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"HWM {hwm}", file=sys.stderr)  # kB; this program's own peak (see measure)
sys.exit(code)
"""
SPACING_NS = {"short": 50_000_000, "mid": 5_000_000_000, "long": 300_000_000_000, "longer": 3_000_000_000_000}


def template() -> list[dict]:
    """The fixtures' events as tagged dicts on one clock (Unix ns), starting at 0."""
    from cuptistream import events as ev
    from tests.helpers.fixture_recording import fixture_processes

    out = []
    for p in fixture_processes():
        items = [e for e in p.events if not isinstance(e, ev.PcSampleBatch | ev.SassMetricBatch | ev.Loss)]
        dicts = [msgspec.to_builtins(e) for e in items]
        times = [t for d in dicts for k in ("start", "end", "timestamp") if (t := d.get(k))]
        low = min(times)
        for d in dicts:
            for k in ("start", "end", "timestamp"):
                if d.get(k):
                    d[k] -= low
        out.extend(dicts)
    return out


def build(directory: Path, ranks: int, records: int, spacing_ns: int, batch_events: int = 8192) -> int:
    """``ranks`` file sets of ``records`` events each; returns the records written."""
    from cuptistream import events as ev
    from cuptistream.recording.segments import SegmentWriter

    events = template()
    encoder = msgspec.msgpack.Encoder()
    writers = []
    for rank in range(ranks):
        resource = ev.Resource(host=f"node{rank // 4}", pid=9000 + rank, process_name="train", command_line=[],
                               rank=rank, world_size=ranks)  # fmt: skip
        writer = SegmentWriter(directory, prefix="cuptistream", suffix=".msgpack.zst", fsync="never",
                               origin=f"rank{rank}-node{rank // 4}-{9000 + rank}")  # fmt: skip
        header = {"schema_version": ev.SCHEMA_VERSION, "session_id": "bench", "resource": resource, "attributes": {},
                  "clock": ev.ClockSync(cupti_ns=1_800_000_000_000_000_000, unix_ns=1_800_000_000_000_000_000)}  # fmt: skip
        writers.append((writer, header))
    pending: list[dict] = []
    seq = 0

    def flush() -> None:
        nonlocal seq, pending
        raw = msgspec.Raw(encoder.encode(pending))  # the same events for every rank: encoded once
        for writer, header in writers:
            writer.append(encoder.encode({**header, "seq": seq, "events": raw}))
        seq += 1
        pending = []

    base = 1_800_000_000_000_000_000
    written = 0
    rep = 0
    while written < records:
        shift = base + rep * spacing_ns
        for d in events:
            if written >= records:
                break
            e = dict(d)
            for k in ("start", "end", "timestamp"):
                if e.get(k):
                    e[k] += shift
            pending.append(e)
            written += 1
            if len(pending) == batch_events:
                flush()
        rep += 1
    if pending:
        flush()
    for writer, _ in writers:
        writer.close()
    return written * ranks


def measure(argv: list[str], cpu: int) -> dict:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(cpu), *argv], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(child.pid, 0)
    err = child.stderr.read().decode() if child.stderr else ""
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err}")
    wall = float(next(line.split()[1] for line in err.splitlines() if line.startswith("WALL")))
    # Peak RSS from the child's VmHWM: ru_maxrss would keep the high-water mark of this process, which
    # the child shares until exec (vfork), and this one grows as it builds the recordings.
    hwm = int(next(line.split()[1] for line in err.splitlines() if line.startswith("HWM")))
    return {"peak_rss_mb": round(hwm / 1024, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "wall_s": wall}  # fmt: skip


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    return next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), ""
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--records", type=int, default=1_000_000, help="records per rank")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dir", default=str(ROOT / "bench" / "out" / "compare"), help="where the recordings are built"
    )
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)))
    parser.add_argument("--keep", action="store_true", help="keep the recordings (reused if present)")
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "out" / "compare.json"), help="the results (JSON)"
    )
    args = parser.parse_args()

    root = Path(args.dir)
    results: dict = {
        "ranks": args.ranks, "records_per_rank": args.records, "rounds": args.rounds,
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "load_before": os.getloadavg()},
        "spans": {},
    }  # fmt: skip
    for span, spacing in SPACING_NS.items():
        directory = root / span
        marker = root / f"{span}-{args.ranks}x{args.records}"
        if not marker.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            t0 = time.perf_counter()
            marker.write_text(str(build(directory, args.ranks, args.records, spacing)))
            print(f"built {span} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        n = int(marker.read_text())
        out = root / f"compare-{span}.json"
        runs = [measure(["compare", str(directory), "--format", "json", "-o", str(out)], args.cpu)
                for _ in range(args.rounds)]  # fmt: skip
        for r in runs:
            r["records_per_cpu_s"] = round(n / r["cpu_s"])
        report = json.loads(out.read_text())
        results["spans"][span] = {
            "records": n, "recording_mb": round(sum(p.stat().st_size for p in directory.iterdir()) / 2**20, 1),
            "span_s": round(report["total"]["span_ns"] / 1e9, 1), "intervals": report["meta"]["intervals"],
            "outliers": len(report["outliers"]), "runs": runs,
            "records_per_cpu_s": spread([r["records_per_cpu_s"] for r in runs]),
            "peak_rss_mb": spread([r["peak_rss_mb"] for r in runs]),
        }  # fmt: skip
        print(json.dumps({span: results["spans"][span]}), file=sys.stderr)
    results["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(f"wrote {args.out}")
    for span, row in results["spans"].items():
        rate, rss = row["records_per_cpu_s"], row["peak_rss_mb"]
        print(f"{span} ({row['span_s']:g} s, {row['records']:,} records): "
              f"{rate['median'] / 1e6:.2f} [{rate['min'] / 1e6:.2f}..{rate['max'] / 1e6:.2f}] M records/s per core, "
              f"peak RSS {rss['median']:.0f} [{rss['min']:.0f}..{rss['max']:.0f}] MB")  # fmt: skip


if __name__ == "__main__":
    main()
