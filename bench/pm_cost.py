"""What the PM sampler costs the program it samples: phases with the sampler on and off in one process.

Run on a GPU machine (torch, nvidia-ml-py, cupti-python and cuptistream importable)::

    python bench/pm_cost.py --workloads W1,W2,W3,W4 --pairs 8 --phase 4 [--backend cupti] [--where probe]

Where the sampler runs is where it costs. Under a collector, NVML's GPM (``backend: nvml``, the
default on Hopper and later) is sampled by the collector, another process (``--where collector``,
the default for ``nvml``): the program pays only what that process's sampling does to the GPU and
the host. Without a collector, or with CUPTI's PM sampling (``backend: cupti``: the GPU writes
samples into a buffer of the program's device memory, in its CUDA context), the session runs in the
program (``--where probe``), a decode every ``decode_period`` on the source's thread. Whole-process
runs move with the host by several percent from one process to the next (``bench/overhead_gpu.py``),
far more than this cost, so here one process per workload alternates phases: the session as the
source or the collector runs it (enabled, configured with the source's defaults, started, decoded
every ``decode_period``; stopped and disabled between phases) and no session.
A pair is one phase of each, the order turned every pair; its ratio is the on phase's mean block time
over the off phase's. Printed per workload: median [min .. max] of the pairs' ratios, and their mean
with its standard error. The session's start and stop fall outside the timed phases, as they come once
per process in a real run. What the source adds on top (one ``pm_samples`` event encoded and sent
per decode) and the collector's other work are not in this figure.

The raw numbers go to ``--out`` (default ``bench/out/pm_cost.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from workloads import DEFAULT_BLOCK, WORKLOADS, run_blocks  # noqa: E402


def _config(backend: str) -> Any:
    from cuptistream.config import convert
    from cuptistream.sources.pm_sampling import PmSamplingConfig

    return convert({"type": "pm_sampling", "backend": backend}, PmSamplingConfig)


def _uuid() -> str:
    import torch

    return f"GPU-{torch.cuda.get_device_properties(0).uuid}"


class InProgram:
    """A started sampling session of device 0 in this process, as the source starts it with its
    defaults (interval, hardware buffer, default metrics), decoded every decode period."""

    def __init__(self, backend: str) -> None:
        from cuptistream.cupti.pm_metrics import default_metrics
        from cuptistream.cupti.pm_sampling_api import PmSamplingSession
        from cuptistream.nvml.gpm import GpmSession, resolve_gpm_metrics

        cfg = _config(backend)
        self.decode_period_s = float(cfg.decode_period)
        if backend == "nvml":
            self._session: Any = GpmSession(_uuid(), time.monotonic_ns)
            self._session.enable()
            self._session.configure(resolve_gpm_metrics(None), cfg.interval_ns, cfg.hardware_buffer)
        else:
            self._session = PmSamplingSession(0)
            chip = self._session.enable()
            self._session.configure(default_metrics(chip).metrics, cfg.interval_ns, cfg.hardware_buffer)
        self._session.start()

    def decode(self) -> int:
        return len(self._session.decode().starts)

    def close(self) -> int:
        self._session.stop()
        samples = self.decode()
        self._session.disable()
        return samples


_COLLECTOR = """
import sys, time
from cuptistream.nvml.gpm import GpmSession, resolve_gpm_metrics
uuid, interval_ns = sys.argv[1], int(sys.argv[2])
session = GpmSession(uuid, time.monotonic_ns)
session.enable()
session.configure(resolve_gpm_metrics(None), interval_ns, 0)
session.start()
print("started", flush=True)
samples = 0
while sys.stdin.readline() == "decode\\n":  # "stop", or the bench gone
    samples += len(session.decode().starts)
session.stop()
samples += len(session.decode().starts)
session.disable()
print(samples, flush=True)
"""


class InCollector:
    """NVML's GPM sampled by another process, as the collector samples it: decoded there every
    decode period (this process sends a line each period, so that the child needs no timer)."""

    def __init__(self) -> None:
        import subprocess

        cfg = _config("nvml")
        self.decode_period_s = float(cfg.decode_period)
        command = [sys.executable, "-c", _COLLECTOR, _uuid(), str(cfg.interval_ns)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self._child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert self._child.stdin is not None and self._child.stdout is not None
        if self._child.stdout.readline().strip() != "started":
            raise SystemExit("the sampling process did not start GPM (see its error above)")

    def decode(self) -> int:
        assert self._child.stdin is not None
        self._child.stdin.write("decode\n")
        self._child.stdin.flush()
        return 0  # counted by the child, said at close

    def close(self) -> int:
        out, _ = self._child.communicate("stop\n", timeout=60)
        return int(out.strip().splitlines()[-1])


def _session(backend: str, where: str) -> InProgram | InCollector:
    return InCollector() if where == "collector" else InProgram(backend)


def _phase(block: Any, n: int, seconds: float, session: InProgram | InCollector | None) -> tuple[float, int]:
    """Blocks for ``seconds`` (decoding ``session`` every decode period, where there is one): the
    mean seconds per iteration and the samples decoded here."""
    times: list[float] = []
    samples = 0
    end = time.perf_counter() + seconds
    period = session.decode_period_s if session is not None else seconds
    next_decode = time.perf_counter() + period
    while time.perf_counter() < end:
        times += run_blocks(block, n, 0.0)
        if session is not None and time.perf_counter() >= next_decode:
            next_decode += period
            samples += session.decode()
    return sum(times) / (len(times) * n), samples


def measure(
    workload: str, backend: str, where: str, pairs: int, phase_s: float, warmup_s: float
) -> dict[str, Any]:
    block, n = WORKLOADS[workload](), DEFAULT_BLOCK[workload]
    run_blocks(block, n, warmup_s)
    rows = []
    for pair in range(pairs):
        on_first = pair % 2 == 0
        result: dict[str, Any] = {}
        for on in (on_first, not on_first):
            session = _session(backend, where) if on else None
            time.sleep(0.2)  # the first samples, outside the timed phase
            per_iteration, samples = _phase(block, n, phase_s, session)
            if session is not None:
                samples += session.close()
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
    return {"workload": workload, "backend": backend, "where": where, "pairs": rows, "median": statistics.median(ratios),
            "min": min(ratios), "max": max(ratios), "mean": statistics.fmean(ratios), "stderr": error}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--backend", choices=["nvml", "cupti"], default="nvml")
    parser.add_argument(
        "--where", choices=["collector", "probe"], default=None,
        help="where the sampler runs (default: collector for nvml, probe for cupti)",
    )  # fmt: skip
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
    where = args.where or ("collector" if args.backend == "nvml" else "probe")
    if args.backend == "cupti" and where == "collector":
        parser.error(
            "--where collector: CUPTI's PM sampling runs in the program's CUDA context; use --where probe"
        )
    results = [
        measure(w, args.backend, where, args.pairs, args.phase, args.warmup)
        for w in args.workloads.split(",")
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(
        f"\nwrote {args.out}; sampler on / off ({args.backend} in the {where}), {args.pairs} pairs of {args.phase:g} s:"
    )
    for r in results:
        print(f"{r['workload']}: {r['median']:.4f} [{r['min']:.4f} .. {r['max']:.4f}], "
              f"mean {r['mean']:.4f} ± {r['stderr']:.4f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
