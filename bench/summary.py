"""Summary and trace export over a 10-million-event recording: peak RSS and events/s per core.

Builds the recording from the committed real-GPU fixtures (sources/captures: three H200 captures
decoded by the replay source, ~3.7k events): their events are repeated, each repetition shifted in
time by the fixtures' span so GPU intervals do not pile up, and written as the file sink writes
(batches of 8192 events, one zstd frame each, one file set per process). Then each command runs in
a fresh process pinned to one CPU core; os.wait4 gives its peak RSS and CPU time.

    python bench/summary.py                      # 10M events, summary + export
    python bench/summary.py --events 1000000 --skip-export
    python bench/summary.py --against /tmp/old-checkout --rounds 5 --skip-export   # reader A/B
    python bench/summary.py --events 2000000 --layouts packed,columns --rounds 5  # file layouts

With ``--against DIR`` every summary round runs this checkout's reader and DIR's on the same
recording, interleaved (each in a fresh process on the same core), and the report gives both, and
this checkout's events per CPU second over DIR's per round (median, min, max). DIR must import as
a checkout does (``cuptistream/sources`` and ``cuptistream/sinks`` reachable, as
``tests/gpu/entry_points.py`` links them).

With ``--layouts A,B`` the same events are written in each layout and every round runs ``summary``
and a full read (``cuptistream.read``) over each, interleaved; the report gives B over A per round.

The goals: peak RSS < 300 MB for both; summary >= 1M events/s per core; columns not slower to read
than the packed maps. The recording is built under ``--dir`` (default ``bench/out/summary``, removed
after unless ``--keep``); the results go to ``--out`` (default ``bench/out/summary.json``), and the
last lines printed are the headline rows, median [min..max] over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
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
sys.exit(code)
"""


def as_stored(events: list[dict], layout: str) -> msgspec.Raw:
    """One batch's events array as the file sink writes it: kernels, memory copies and sets, and
    API calls as one ``events.Columns`` element per type (``columns``, as the file sink writes them)
    or as the collector's packed maps (``packed``: every field, integers as int64); the rest as
    maps."""
    import numpy as np

    from cuptistream.cupti import packed
    from cuptistream.recording.codec import array_header

    packers = {
        "kernel": packed._KERNEL_PACKER, "memcpy": packed._MEMCPY_PACKERS[False],
        "memset": packed._MEMSET_PACKER, "api": packed._API_PACKER,
    }  # fmt: skip
    if any(e["type"] == "memcpy" and "src_device_id" in e for e in events):
        packers["memcpy"] = packed._MEMCPY_PACKERS[True]
    by_type: dict[str, list[dict]] = {}
    rest: list[dict] = []
    for e in events:
        (by_type.setdefault(e["type"], []) if e["type"] in packers else rest).append(e)
    parts = [msgspec.msgpack.encode(e) for e in rest]
    elements = len(rest)
    for tag, rows in by_type.items():
        packer = packers[tag]
        ints = {name: np.array([e.get(name, 0) for e in rows], dtype=np.int64) for name in packer.ints}
        triples = {
            name: tuple(np.array([e.get(name, (0, 0, 0))[k] for e in rows], dtype=np.int64) for k in range(3))
            for name in packer.triples
        }
        keys = [tuple(e[name] for name in packer.strings) for e in rows]
        index: dict[tuple, int] = {}
        groups = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.intp)
        if layout == "columns":
            parts.append(bytes(packer.pack_columns(ints, triples, groups, list(index))))
            elements += 1
        else:
            parts.append(bytes(packer.pack(ints, triples, groups, list(index))))
            elements += len(rows)
    return msgspec.Raw(array_header(elements) + b"".join(parts))


def build(directory: Path, events: int, batch_events: int = 8192, layout: str = "maps") -> int:
    from cuptistream import events as ev
    from cuptistream.recording.segments import SegmentWriter
    from tests.helpers.fixture_recording import fixture_processes

    processes = fixture_processes()
    encoder = msgspec.msgpack.Encoder()
    # Templates as plain dicts (tagged), so each repetition only shifts the time fields.
    templates = []
    for p in processes:
        items = [e for e in p.events if not isinstance(e, ev.PcSampleBatch | ev.SassMetricBatch)]
        dicts = [msgspec.to_builtins(e) for e in items]
        times = [t for d in dicts for k in ("start", "end", "timestamp") if (t := d.get(k))]
        templates.append((p, dicts, max(times) - min(times) + 1_000_000))
    per_rep = sum(len(d) for _, d, _ in templates)
    reps = -(-events // per_rep)
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    for p, dicts, span in templates:
        writer = SegmentWriter(
            directory,
            prefix="cuptistream",
            suffix=".msgpack.zst",
            fsync="never",
            origin=f"rank{p.resource.rank}-bench-{p.resource.pid}",
        )
        header = {
            "schema_version": ev.SCHEMA_VERSION,
            "session_id": "bench",
            "resource": p.resource,
            "attributes": {},
            "clock": p.clock,
        }
        pending: list[dict] = []
        seq = 0
        share = events * len(dicts) // per_rep
        for rep in range(reps):
            shift = rep * span
            for d in dicts:
                if len(pending) + written >= events or share <= 0:
                    break
                e = dict(d)
                for k in ("start", "end", "timestamp"):
                    if e.get(k):
                        e[k] += shift
                pending.append(e)
                share -= 1
                if len(pending) == batch_events:
                    elements = pending if layout == "maps" else as_stored(pending, layout)
                    writer.append(encoder.encode({**header, "seq": seq, "events": elements}))
                    written += len(pending)
                    seq += 1
                    pending = []
        if pending:
            elements = pending if layout == "maps" else as_stored(pending, layout)
            writer.append(encoder.encode({**header, "seq": seq, "events": elements}))
            written += len(pending)
        writer.close()
    return written


def measure(argv: list[str], cpu: int, root: Path = ROOT) -> dict:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cpu), *argv],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(child.pid, 0)
    err = child.stderr.read().decode() if child.stderr else ""
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err}")
    wall = float(next(line.split()[1] for line in err.splitlines() if line.startswith("WALL")))
    return {
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument(
        "--dir", default=str(ROOT / "bench" / "out" / "summary"), help="where the recording is built"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "out" / "summary.json", help="the results (JSON)"
    )
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)))
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="summary runs (median, min and max events/s per CPU second reported)",
    )
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument("--against", type=Path, help="another checkout whose reader runs in every round too")
    parser.add_argument("--keep", action="store_true", help="keep the recording (reused if present)")
    parser.add_argument(
        "--layouts",
        default="maps",
        help="maps (one msgpack map per event), packed (the hot kinds as the collector's packed maps: "
        "every field, int64), columns (the file sink's Columns elements), or several, "
        "comma-separated: recordings of the same events, summaries and full reads interleaved",
    )
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    if not set(layouts) <= {"maps", "packed", "columns"} or (len(layouts) > 1 and args.against):
        raise SystemExit("--layouts: maps, packed, columns, or several (and --against with one layout only)")
    if len(layouts) > 1:
        compare_layouts(args, layouts)
        return

    directory = Path(args.dir)
    rec = directory / "recording"
    marker = directory / f"events-{args.events}"
    if not marker.exists():
        shutil.rmtree(directory, ignore_errors=True)
        t0 = time.perf_counter()
        n = build(rec, args.events, layout=layouts[0])
        marker.write_text(str(n))
        print(f"built {n} events in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    n = int(marker.read_text())
    size = sum(p.stat().st_size for p in rec.iterdir())
    results: dict = {"events": n, "recording_mb": round(size / 2**20, 1), "files": len(list(rec.iterdir()))}
    roots = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    runs: dict[str, list[dict]] = {name: [] for name in roots}
    for _ in range(args.rounds):
        for name, root in roots.items():  # interleaved: both readers see the same machine state
            out = directory / f"summary-{name}.json"
            runs[name].append(
                measure(["summary", str(rec), "--format", "json", "-o", str(out)], args.cpu, root)
            )
    for r in (r for rs in runs.values() for r in rs):
        r["events_per_s_wall"] = round(n / r["wall_s"])
        r["events_per_cpu_s"] = round(n / r["cpu_s"])
    results["summary"] = runs["this"]
    results["summary_events_per_cpu_s"] = spread([r["events_per_cpu_s"] for r in runs["this"]])
    if args.against:
        results["against"] = {"dir": str(args.against), "summary": runs["against"]}
        results["against"]["summary_events_per_cpu_s"] = spread(
            [r["events_per_cpu_s"] for r in runs["against"]]
        )
        ratios = [
            a["events_per_cpu_s"] / b["events_per_cpu_s"]
            for a, b in zip(runs["this"], runs["against"], strict=True)
        ]
        results["this_over_against"] = spread([round(x, 3) for x in ratios])
    if not args.skip_export:
        export = measure(["export", str(rec), "-o", str(directory / "trace.json.gz")], args.cpu)
        export["trace_mb"] = round((directory / "trace.json.gz").stat().st_size / 2**20, 1)
        export["events_per_s_wall"] = round(n / export["wall_s"])
        results["export"] = export
    print(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    rows = [f"summary of {n:,} events: {_mmm(results['summary_events_per_cpu_s'], 1e6, '.2f')} M events/s per core, "
            f"peak RSS {_mmm(spread([r['peak_rss_mb'] for r in runs['this']]), 1, '.0f')} MB"]  # fmt: skip
    if args.against:
        rows.append(f"this checkout over {args.against}: {_mmm(results['this_over_against'], 1, '.3f')}")
    if "export" in results:
        rows.append(f"export: {results['export']['events_per_s_wall'] / 1e6:.2f} M events/s wall, "
                    f"peak RSS {results['export']['peak_rss_mb']:.0f} MB")  # fmt: skip
    write(args.out, results, rows)


def _mmm(s: dict[str, float], scale: float, fmt: str) -> str:
    return f"{s['median'] / scale:{fmt}} [{s['min'] / scale:{fmt}}..{s['max'] / scale:{fmt}}]"


def write(out: Path, results: dict, rows: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    for row in rows:
        print(row)


READ = """
import sys, time
from cuptistream.recording.reader import read
start = time.process_time()
print(sum(1 for _ in read(sys.argv[1])), time.process_time() - start)
"""


def compare_layouts(args: argparse.Namespace, layouts: list[str]) -> None:
    """The same events in each layout; per round, ``summary`` over each (a fresh process on
    ``--cpu``), then a full read (``cuptistream.recording.read``, every event as its Struct)."""
    directory = Path(args.dir)
    shutil.rmtree(directory, ignore_errors=True)
    recordings = {layout: directory / f"recording-{layout}" for layout in layouts}
    counts = {layout: build(rec, args.events, layout=layout) for layout, rec in recordings.items()}
    assert len(set(counts.values())) == 1, counts
    n = counts[layouts[0]]
    results: dict = {"events": n}
    runs: dict[str, list[dict]] = {layout: [] for layout in layouts}
    reads: dict[str, list[float]] = {layout: [] for layout in layouts}
    for _ in range(args.rounds):
        for layout, rec in recordings.items():
            out = directory / f"summary-{layout}.json"
            runs[layout].append(measure(["summary", str(rec), "--format", "json", "-o", str(out)], args.cpu))
            done = subprocess.run(
                ["taskset", "-c", str(args.cpu), sys.executable, "-c", READ, str(rec)],
                cwd=ROOT, capture_output=True, text=True, check=True,
            )  # fmt: skip
            events, cpu_s = done.stdout.split()
            assert int(events) == n, (layout, events, n)
            reads[layout].append(round(n / float(cpu_s)))
    for layout, rec in recordings.items():
        for r in runs[layout]:
            r["events_per_cpu_s"] = round(n / r["cpu_s"])
        results[layout] = {
            "recording_mb": round(sum(p.stat().st_size for p in rec.iterdir()) / 2**20, 2),
            "summary": runs[layout],
            "summary_events_per_cpu_s": spread([r["events_per_cpu_s"] for r in runs[layout]]),
            "read_events_per_cpu_s": spread(reads[layout]),
        }
    summaries = {json.loads((directory / f"summary-{layout}.json").read_text()) == json.loads(
        (directory / f"summary-{layouts[0]}.json").read_text()) for layout in layouts}  # fmt: skip
    results["same_summary"] = summaries == {True}
    for layout in layouts[1:]:
        base = layouts[0]
        summary = [
            c["events_per_cpu_s"] / m["events_per_cpu_s"]
            for m, c in zip(runs[base], runs[layout], strict=True)
        ]
        read = [c / m for m, c in zip(reads[base], reads[layout], strict=True)]
        results[f"{layout}_over_{base}"] = {
            "summary": spread([round(x, 3) for x in summary]),
            "read": spread([round(x, 3) for x in read]),
        }
    print(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    rows = [
        f"{layout} over {layouts[0]}: full read {_mmm(results[f'{layout}_over_{layouts[0]}']['read'], 1, '.2f')}, "
        f"summary {_mmm(results[f'{layout}_over_{layouts[0]}']['summary'], 1, '.2f')}"
        for layout in layouts[1:]
    ]
    write(args.out, results, rows)


if __name__ == "__main__":
    main()
