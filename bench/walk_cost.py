"""Cost per record of the walk (each record's offset and kind in an activity buffer), issue 30.

    taskset -c 1 python bench/walk_cost.py [--rounds 5] [--seconds 0.5] [--against DIR] [--captures PATH]

Over every buffer of the shipped real-GPU captures (``sources/captures/*.cupti``; ``--captures``: a
capture file or folder instead, e.g. a busy GPU's own 4 MiB buffers from bench/capture_stream.py), times
``records.walk`` alone, ``Decoder._records`` (walk + gather) and ``Decoder.decode_packed`` (what the
collector runs per buffer). Each sample runs in a fresh interpreter and is the best of 5 stretches
of passes over all buffers, about ``--seconds`` in all, in that thread's CPU time (time other
processes take from the core is not counted; they still share its caches).

``--against DIR``: another checkout of the project (say the change's base, unpacked with
``git archive BASE | tar -x -C DIR``), timed the same way in the same rounds, the order alternating,
so that a noisy neighbour spreads over both. Prints the median, min and max over the rounds, in
microseconds per pass and nanoseconds per record, and each stage's ratio to the first checkout.
Pin it to one core (``taskset``): the figures are per core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("walk", "Decoder._records", "Decoder.decode_packed")


def _timed(run: Callable[[], object], seconds: float, repeats: int = 5) -> float:
    """CPU seconds per call: the best of ``repeats`` stretches of about ``seconds / repeats``."""
    start = time.thread_time()
    run()
    once = time.thread_time() - start
    calls = max(1, int(seconds / repeats / max(once, 1e-9)))
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            run()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def sample(seconds: float, where: str = "") -> dict[str, object]:
    """One sample of every stage, in this interpreter (whichever ``cuptistream`` it imports), over
    the captures at ``where`` (a file or folder; "": this checkout's shipped ones)."""
    import cuptistream
    from cuptistream.collector.buffer_decoder import Decoder
    from cuptistream.cupti import capture, records
    from cuptistream.cupti.names import TableNames

    captures = (
        Path(where) if where else Path(cuptistream.__file__).resolve().parent.parent / "sources" / "captures"
    )
    paths = [captures] if captures.is_file() else sorted(captures.glob("*.cupti"))
    caps = [capture.read(path) for path in paths]
    buffers = [(cap, memoryview(bytes(buf.data))) for cap in caps for buf in cap.buffers]

    def layouts(cap: capture.Capture) -> records.RecordLayouts:
        return records.RecordLayouts(dict(cap.struct_sizes))

    count = sum(
        len(at) for cap, data in buffers for at in records.walk(data, len(data), layouts(cap), None).values()
    )

    def walk_all() -> None:
        for cap, data in buffers:
            records.walk(data, len(data), layouts(cap), None)

    def decoding(packed: bool) -> Callable[[], None]:
        def run() -> None:
            # One decoder per capture, as a session has one; fresh each pass (NVTX pairing state).
            decoders = {id(cap): Decoder(TableNames(cap.strings), layouts(cap)) for cap in caps}
            for cap, data in buffers:
                if packed:
                    decoders[id(cap)].decode_packed(data, len(data))
                else:
                    decoders[id(cap)]._records(data, len(data), None)

        return run

    runs = {"walk": walk_all, "Decoder._records": decoding(False), "Decoder.decode_packed": decoding(True)}
    return {
        "module": records.__file__,
        "buffers": [len(data) for _, data in buffers],
        "records": count,
        **{stage: _timed(runs[stage], seconds) for stage in STAGES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="per stage and sample")
    parser.add_argument("--against", type=Path, action="append", default=[], help="another checkout")
    parser.add_argument("--captures", default="", help="a capture file or folder (default: the shipped ones)")
    parser.add_argument("--sample", action="store_true", help=argparse.SUPPRESS)  # one child's run
    args = parser.parse_args()
    if args.sample:
        print(json.dumps(sample(args.seconds, args.captures)))
        return
    args.captures = str(Path(args.captures).resolve()) if args.captures else ""

    checkouts = [ROOT, *(path.resolve() for path in args.against)]
    samples: dict[Path, list[dict]] = {path: [] for path in checkouts}
    for round_ in range(args.rounds):
        for path in checkouts if round_ % 2 == 0 else reversed(checkouts):
            # The checkout first; the rest of the path stays (the device installs dependencies there).
            rest = os.environ.get("PYTHONPATH", "")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(path), rest) if p)}
            child = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--sample",
                "--seconds",
                str(args.seconds),
                "--captures",
                args.captures,
            ]
            done = subprocess.run(child, env=env, cwd=path, capture_output=True, text=True, check=True)
            samples[path].append(json.loads(done.stdout))

    first = samples[ROOT][0]
    print(f"{len(first['buffers'])} buffers ({first['buffers']} bytes), {first['records']} records")
    print(f"{args.rounds} interleaved rounds, CPU time per pass over all buffers (taskset pins the core)")
    medians: dict[tuple[Path, str], float] = {}
    for path in checkouts:
        module = samples[path][0]["module"]
        assert Path(module).resolve().is_relative_to(path), f"{path} imported {module}"
        assert all(s["records"] == first["records"] for s in samples[path]), "checkouts disagree on records"
        print(f"\n{path}")
        print(f"  {'stage':24} {'median us':>10} {'min':>8} {'max':>8} {'ns/record':>10}")
        for stage in STAGES:
            us = [s[stage] * 1e6 for s in samples[path]]
            medians[(path, stage)] = median = statistics.median(us)
            ns = median * 1e3 / first["records"]
            print(f"  {stage:24} {median:10.1f} {min(us):8.1f} {max(us):8.1f} {ns:10.1f}")
    for path in checkouts[1:]:
        ratios = ", ".join(
            f"{stage} {medians[(path, stage)] / medians[(ROOT, stage)]:.2f}" for stage in STAGES
        )
        print(f"\n{path.name} / {ROOT.name} (medians): {ratios}")


if __name__ == "__main__":
    main()
