"""What a compiled walk would save: the record walk and gather in numba against today's Python loop.

    pip install numba                                  # not a dependency of cuptistream
    taskset -c 1 python bench/walk_numba.py [--rounds 7] [--seconds 0.3]

Issue 30's per-record cost is Python steps per record; the walk (each record's offset, grouped by
kind: ``cuptistream.cupti.records.walk``) is the one loop that no numpy call replaces ("a vectorised
walk (not taken)" in docs/benchmarks.md). Here the same walk is compiled with numba: one pass
writes each record's offset and kind, a second groups the offsets by kind (a counting sort), and
the offsets go to ``records.gather`` as arrays. Both walks must give the same offsets on every
buffer, or the bench stops.

Per data set (W3's 4 MiB buffers and the shipped captures), in this thread's CPU time, rounds
interleaved: ``py`` and ``numba`` (the walk), ``py+gather`` and ``numba+gather``, ns per record,
median [min .. max]. Then what a process pays before its first compiled walk: ``import numba``
and loading the compiled walk from numba's on-disk cache, each in a fresh interpreter (3 runs).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cuptistream.cupti import capture  # noqa: E402
from cuptistream.cupti.records import RecordLayouts, gather, size_table, walk  # noqa: E402

W3 = ROOT / "bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti"
SHIPPED = ROOT / "sources/captures"


def compiled() -> Callable[..., tuple[int, int]]:
    import numba

    @numba.njit(cache=True, nogil=True)
    def walk_grouped(ints, valid, table, grouped, kinds, counts):
        """Offsets grouped by kind into ``grouped`` (kinds ascending), per-kind counts in ``counts``.
        Returns (records, offset reached): short of ``valid`` at a kind of unknown size."""
        limit = table.shape[0]
        offset = 0
        n = 0
        while offset < valid:
            kind = ints[offset >> 2]
            size = table[kind] if 0 <= kind < limit else 0
            if size == 0:
                break
            grouped[n] = offset
            kinds[n] = kind
            counts[kind] += 1
            n += 1
            offset += size
        starts = np.zeros(limit + 1, np.int64)
        for k in range(limit):
            starts[k + 1] = starts[k] + counts[k]
        place = starts[:limit].copy()
        order = np.empty(n, np.int64)
        for i in range(n):
            order[place[kinds[i]]] = grouped[i]
            place[kinds[i]] += 1
        grouped[:n] = order
        return n, offset

    return walk_grouped


def numba_walk(walk_grouped: Callable[..., tuple[int, int]], view: memoryview, valid: int,
               layouts: RecordLayouts) -> dict[int, np.ndarray]:  # fmt: skip
    table = np.asarray(size_table(layouts), dtype=np.int64)
    ints = np.frombuffer(view, dtype=np.int32, count=valid // 4)
    grouped = np.empty(valid // 16 + 1, np.int64)  # records are at least 16 bytes
    kinds = np.empty(len(grouped), np.int32)
    counts = np.zeros(len(table), np.int64)
    _, reached = walk_grouped(ints, valid, table, grouped, kinds, counts)
    if reached != valid:
        raise ValueError("unknown kind or overrun: the Python walk learns and reports it")
    out: dict[int, np.ndarray] = {}
    at = 0
    for kind in np.flatnonzero(counts).tolist():
        out[kind] = grouped[at : at + counts[kind]]
        at += int(counts[kind])
    return out


def startup_cost() -> tuple[list[float], list[float]]:
    """(import numba, load the compiled walk from the cache) in seconds, fresh interpreters."""
    code = (
        "import time; t = time.process_time(); import numba, numpy as np; a = time.process_time();"
        f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import walk_numba;"
        "f = walk_numba.compiled(); z = np.zeros(4, np.int64);"
        "f(np.zeros(4, np.int32), 0, z, z.copy(), np.zeros(4, np.int32), z.copy());"
        "print(a - t, time.process_time() - a)"
    )
    imports, loads = [], []
    for _ in range(4):  # the first run may compile and fill the cache
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        a, b = (float(x) for x in out.stdout.split())
        imports.append(a)
        loads.append(b)
    return imports[1:], loads[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.3)
    args = parser.parse_args()
    walk_grouped = compiled()
    for path in (W3, SHIPPED):
        files = sorted(path.glob("*.cupti")) if path.is_dir() else [path]
        sets: list[tuple[memoryview, RecordLayouts]] = []
        for file in files:
            cap = capture.read(file)
            layouts = RecordLayouts(dict(cap.struct_sizes))
            sets += [(memoryview(bytearray(b.data)), layouts) for b in cap.buffers]
        records = 0
        for view, layouts in sets:
            mine = walk(view, len(view), layouts, None)
            theirs = numba_walk(walk_grouped, view, len(view), layouts)
            assert mine.keys() == theirs.keys(), "kinds differ"
            assert all(mine[k] == theirs[k].tolist() for k in mine), "offsets differ"
            records += sum(len(o) for o in mine.values())

        def py(with_gather: bool, sets: list[tuple[memoryview, RecordLayouts]] = sets) -> None:
            for view, layouts in sets:
                for kind, offsets in walk(view, len(view), layouts, None).items():
                    chosen = layouts.dtype(kind)
                    if with_gather and chosen:
                        gather(view, offsets, chosen[1])

        def nb(with_gather: bool, sets: list[tuple[memoryview, RecordLayouts]] = sets) -> None:
            for view, layouts in sets:
                for kind, offsets in numba_walk(walk_grouped, view, len(view), layouts).items():
                    chosen = layouts.dtype(kind)
                    if with_gather and chosen:
                        gather(view, offsets, chosen[1])

        paths: dict[str, Callable[[], None]] = {
            "py": lambda: py(False),
            "numba": lambda: nb(False),
            "py+gather": lambda: py(True),
            "numba+gather": lambda: nb(True),
        }
        times: dict[str, list[float]] = {name: [] for name in paths}
        for round_ in range(args.rounds):
            order = list(paths) if round_ % 2 == 0 else list(reversed(paths))
            for name in order:
                reps, start = 0, time.thread_time_ns()
                while time.thread_time_ns() - start < args.seconds * 1e9:
                    paths[name]()
                    reps += 1
                times[name].append((time.thread_time_ns() - start) / reps / records)
        print(f"{path.name}: {len(sets)} buffers, {records} records, ns per record")
        for name, values in times.items():
            print(f"  {name:13} {statistics.median(values):6.0f} [{min(values):.0f} .. {max(values):.0f}]")
    imports, loads = startup_cost()
    print(f"import numba: {statistics.median(imports):.2f} s CPU [{min(imports):.2f} .. {max(imports):.2f}]")
    print(f"load the compiled walk from the cache: {statistics.median(loads):.2f} s CPU "
          f"[{min(loads):.2f} .. {max(loads):.2f}]")  # fmt: skip


if __name__ == "__main__":
    main()
