"""What the PM sampler costs the program it samples: phases with the sampler on and off in one process.

Run on a GPU machine (torch, nvidia-ml-py, cupti-python and cuptistream importable)::

    python bench/pm_cost.py --workloads W1,W2,W3,W4 --pairs 8 --phase 4

The ``pm_sampling`` source's cost to the program is its sampling session in the probe: NVML's GPM
(``backend: nvml``, a thread that takes a sample every interval) or CUPTI's PM sampling
(``backend: cupti``, the GPU writes samples into a buffer of its memory), plus a decode every
``decode_period`` on the source's thread. Whole-process runs move with the host by several percent
from one process to the next (``bench/overhead_gpu.py``), far more than this cost, so here one
process per workload alternates phases: the session as the source runs it (enabled, configured
with its defaults, started, decoded every ``decode_period``; stopped and disabled between phases)
and no session.
A pair is one phase of each, the order turned every pair; its ratio is the on phase's mean block time
over the off phase's. Printed per workload: median [min .. max] of the pairs' ratios, and their mean
with its standard error. The session's start and stop fall outside the timed phases, as they come once
per process in a real run. What the source adds on top (one ``pm_samples`` event encoded and sent
per decode) and the collector's work (another process) are not in this figure.

The raw numbers go to ``--out`` (default ``bench/out/pm_cost.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from workloads import DEFAULT_BLOCK, WORKLOADS, run_blocks  # noqa: E402


def _session(backend: str) -> tuple[Any, float]:
    """A started sampling session of device 0, as the source starts it with its defaults (interval,
    hardware buffer, default metrics), and the source's decode period in seconds."""
    import torch

    from cuptistream.config import convert
    from cuptistream.cupti.pm_metrics import default_metrics
    from cuptistream.cupti.pm_sampling_api import PmSamplingSession
    from cuptistream.nvml.gpm import GpmSession, resolve_gpm_metrics
    from cuptistream.sources.pm_sampling import PmSamplingConfig

    cfg = convert({"type": "pm_sampling", "backend": backend}, PmSamplingConfig)
    if backend == "nvml":
        uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
        session: Any = GpmSession(uuid, time.monotonic_ns)
        session.enable()
        session.configure(resolve_gpm_metrics(None), cfg.interval_ns, cfg.hardware_buffer)
    else:
        session = PmSamplingSession(0)
        chip = session.enable()
        session.configure(default_metrics(chip).metrics, cfg.interval_ns, cfg.hardware_buffer)
    session.start()
    return session, float(cfg.decode_period)


def _phase(block: Any, n: int, seconds: float, session: Any, decode_period_s: float) -> tuple[float, int]:
    """Blocks for ``seconds`` (decoding ``session`` every ``decode_period_s``, where there is one):
    the mean seconds per iteration and the samples decoded."""
    times: list[float] = []
    samples = 0
    end = time.perf_counter() + seconds
    next_decode = time.perf_counter() + decode_period_s
    while time.perf_counter() < end:
        times += run_blocks(block, n, 0.0)
        if session is not None and time.perf_counter() >= next_decode:
            next_decode += decode_period_s
            samples += len(session.decode().starts)
    return sum(times) / (len(times) * n), samples


def measure(workload: str, backend: str, pairs: int, phase_s: float, warmup_s: float) -> dict[str, Any]:
    block, n = WORKLOADS[workload](), DEFAULT_BLOCK[workload]
    run_blocks(block, n, warmup_s)
    rows = []
    for pair in range(pairs):
        on_first = pair % 2 == 0
        result: dict[str, Any] = {}
        for on in (on_first, not on_first):
            session, decode_period_s = _session(backend) if on else (None, 0.0)
            time.sleep(0.2)  # the first samples, outside the timed phase
            per_iteration, samples = _phase(block, n, phase_s, session, decode_period_s)
            if session is not None:
                session.stop()
                samples += len(session.decode().starts)
                session.disable()
            result["on" if on else "off"] = per_iteration
            if on:
                result["samples"] = samples
        result["ratio"] = result["on"] / result["off"]
        rows.append(result)
        print(
            f"{workload} pair {pair}: on/off {result['ratio']:.4f}, {result['samples']} samples", flush=True
        )
    ratios = [r["ratio"] for r in rows]
    error = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
    return {"workload": workload, "backend": backend, "pairs": rows, "median": statistics.median(ratios),
            "min": min(ratios), "max": max(ratios), "mean": statistics.fmean(ratios), "stderr": error}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--backend", choices=["nvml", "cupti"], default="nvml")
    parser.add_argument("--pairs", type=int, default=8, help="on/off pairs per workload (default 8)")
    parser.add_argument("--phase", type=float, default=4.0, help="seconds per phase (default 4)")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "pm_cost.json")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS or w in ("W5", "D1")]
    if unknown:
        parser.error(f"--workloads: {', '.join(unknown)} unknown here; choose among W1, W2, W3, W4")
    if args.pairs < 2 or args.phase <= 0:
        parser.error("--pairs must be at least 2 and --phase above 0")
    results = [
        measure(w, args.backend, args.pairs, args.phase, args.warmup) for w in args.workloads.split(",")
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}; sampler on / off ({args.backend}), {args.pairs} pairs of {args.phase:g} s:")
    for r in results:
        print(f"{r['workload']}: {r['median']:.4f} [{r['min']:.4f} .. {r['max']:.4f}], "
              f"mean {r['mean']:.4f} ± {r['stderr']:.4f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
