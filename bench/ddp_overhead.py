"""Overhead per rank of a torchrun DDP job: cuptistream's default config against no tracing and bare CUPTI.

    python3 bench/ddp_overhead.py [--rounds 5] [--steps 200] [--nproc 2]

Needs a host with ``--nproc`` GPUs (torch with NCCL, cupti-python, a C compiler for the bare client).

Each round runs ``torchrun --nproc_per_node=N examples/train_ddp.py`` once per mode, in a rotated
order so no mode always runs first:

- ``none``: no tracing;
- ``bare``: ``bench/bare_cupti.c`` injected into every rank through ``CUDA_INJECTION64_PATH``, with
  the default config's kinds and API filters (the floor, as in ``bench/overhead_gpu.py``);
- ``cuptistream``: ``cuptistream run -c configs/default.yaml -- torchrun ...``.

Every rank reports its median step time (each step ends with a CUDA synchronize, after warm-up).
Per round and rank, the ratios cuptistream/none and cuptistream/bare are taken within the round;
the table gives median [min..max] over rounds, per rank; the last lines are the headline rows,
cuptistream/bare per rank as median [min..max] (the goal: at most 1.05). The raw numbers go to
``--out`` (default ``bench/out/ddp_overhead.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead_gpu import ROOT, build_bare, cuptistream_command, find_cupti, select_api_cbids
from spread import spread_text

SCRIPT = ROOT / "examples" / "train_ddp.py"
CONFIG = ROOT / "configs" / "default.yaml"
MODES = ["none", "bare", "cuptistream"]


def torchrun() -> list[str]:
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def run_mode(mode: str, args: argparse.Namespace, work: Path, bare: dict[str, str]) -> dict[int, float]:
    out = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=work))
    job = [*torchrun(), f"--nproc_per_node={args.nproc}", str(SCRIPT), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--out", str(out / "ranks")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM")}
    if mode == "bare":
        env.update(bare, BARE_CUPTI_OUT=str(out / "bare.json"))
        command = job
    elif mode == "cuptistream":
        command = [*cuptistream_command(), "run", "-c", str(CONFIG), "-o", str(out / "data"), "--quiet",
                   "--report-json", str(out / "report.json"), "--", *job]  # fmt: skip
    else:
        command = job
    result = subprocess.run(command, env=env, cwd=out, capture_output=True, text=True, timeout=args.timeout)
    if result.returncode != 0:
        raise SystemExit(f"ddp_overhead.py: {mode} failed ({result.returncode}): {result.stderr[-2000:]}")
    return {
        rank: statistics.median(json.loads((out / "ranks" / f"rank{rank}.json").read_text())["step_ms"])
        for rank in range(args.nproc)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "ddp_overhead.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddp-overhead-") as scratch:
        work = Path(scratch)
        bare_so, libcupti = build_bare(work)
        includes, _ = find_cupti()
        cbids, _, _ = select_api_cbids(CONFIG, includes[0])
        bare = {
            "CUDA_INJECTION64_PATH": str(bare_so), "NVTX_INJECTION64_PATH": str(libcupti),
            "BARE_CUPTI_RUNTIME_CBIDS": ",".join(map(str, cbids["runtime"])),
            "BARE_CUPTI_DRIVER_CBIDS": ",".join(map(str, cbids["driver"])),
        }  # fmt: skip
        rounds: list[dict[str, dict[int, float]]] = []
        for round_ in range(args.rounds):
            order = MODES[round_ % len(MODES) :] + MODES[: round_ % len(MODES)]
            rounds.append({mode: run_mode(mode, args, work, bare) for mode in order})
            print(f"round {round_ + 1}: " + ", ".join(
                f"{m} " + "/".join(f"{rounds[-1][m][r]:.3f}" for r in range(args.nproc)) + " ms"
                for m in MODES
            ), flush=True)  # fmt: skip
    summary: dict[str, Any] = {}
    print(
        "| rank | none ms/step | bare ms/step | cuptistream ms/step | cuptistream/none | cuptistream/bare |"
    )
    print("|---|---|---|---|---|---|")
    for rank in range(args.nproc):
        per_mode = {m: [r[m][rank] for r in rounds] for m in MODES}
        to_none = [r["cuptistream"][rank] / r["none"][rank] for r in rounds]
        to_bare = [r["cuptistream"][rank] / r["bare"][rank] for r in rounds]
        summary[str(rank)] = {**per_mode, "cuptistream_to_none": to_none, "cuptistream_to_bare": to_bare}
        print(f"| {rank} | {spread_text(per_mode['none'], '.3f')} | {spread_text(per_mode['bare'], '.3f')} | "
              f"{spread_text(per_mode['cuptistream'], '.3f')} | {spread_text(to_none, '.3f')} | {spread_text(to_bare, '.3f')} |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "ranks": summary}))
    print(f"\nwrote {args.out}")
    for rank, row in summary.items():
        to_bare = row["cuptistream_to_bare"]
        print(f"rank {rank}: cuptistream / bare {statistics.median(to_bare):.3f} "
              f"[{min(to_bare):.3f}..{max(to_bare):.3f}] over {len(to_bare)} rounds")  # fmt: skip


if __name__ == "__main__":
    main()
