"""Four ranks on ONE GPU in lockstep (torch.distributed, gloo), one of them slowed by extra matmuls.

    cuptistream run -c configs/default.yaml -- torchrun --standalone --nproc_per_node=4 \
        tests/gpu/workloads/slow_rank.py --slow-rank 2 --slowdown 0.10 --seconds 20 --out DIR

Every rank runs the same step: ``--matmuls`` fp32 matmuls of ``--size`` (TF32 off), a CUDA
synchronize, then a gloo all-reduce of one CPU number, which keeps the ranks in lockstep (a fast rank
waits in the all-reduce, on the host: gloo has no GPU kernel). The slow rank adds ``n_extra`` fp16
matmuls of ``--extra-size`` every step, after its model work: a kernel no other rank launches.

Calibration: 30 lockstep steps without injection give the step's wall time (the four ranks share the
GPU, so a step takes about four ranks' GPU work); then the slow rank times 20 extra matmuls while the
others wait at a barrier (the GPU is its alone, as it is when its extra matmuls run in the loop:
the others are already waiting in the all-reduce). ``n_extra = round(slowdown * step_ms /
matmul_ms)``, at least 1 when ``slowdown > 0``, so the job's step gets ``slowdown`` longer. Rank 0
decides when ``--seconds`` have passed and the decision rides on the all-reduce, so every rank runs
the same number of steps.

``--backend nccl``: one GPU per rank (``LOCAL_RANK``), and each step ends with an NCCL
all-reduce of a ``--allreduce-mb`` gradient on the GPU, then the stop flag's, also on the GPU. A fast
rank then waits for the slow one inside the NCCL kernel, on its GPU: the peers' extra NCCL time that
``compare`` names as the sign of a straggler.

``--out DIR`` writes ``DIR/rank{N}.json``: the calibration, ``n_extra``, the steps, the injected
matmuls (calibration included) and the mean step wall time with and without injection.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _gpu_ms(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument(
        "--slowdown", type=float, default=0.0, help="how much longer the job's step gets, a fraction"
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--matmuls", type=int, default=8)
    parser.add_argument("--extra-size", type=int, default=2048)  # GPU-bound, not launch-bound
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--allreduce-mb", type=float, default=16.0, help="nccl: the gradient all-reduced")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    nccl = args.backend == "nccl"
    # gloo: every rank on the one GPU; nccl: a GPU per rank
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if nccl else 0)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(rank)
    x = torch.randn(args.size, args.size, device="cuda")
    w = torch.randn(args.size, args.size, device="cuda") / args.size**0.5
    a = torch.randn(args.extra_size, args.extra_size, device="cuda", dtype=torch.float16)
    b = torch.randn(args.extra_size, args.extra_size, device="cuda", dtype=torch.float16)
    injected = 0

    def model() -> None:
        y = x
        for _ in range(args.matmuls):
            y = torch.tanh(y @ w)

    def extra() -> None:
        nonlocal injected
        torch.mm(a, b)
        injected += 1

    flag = torch.zeros(1, device="cuda" if nccl else "cpu")
    grad = torch.zeros(max(1, int(args.allreduce_mb * 2**20 / 4)), device="cuda") if nccl else None

    def step(n_extra: int) -> bool:
        model()
        for _ in range(n_extra):
            extra()
        if grad is not None:
            dist.all_reduce(grad)  # the gradient: a fast rank waits here, in the NCCL kernel
        torch.cuda.synchronize()
        flag.fill_(1.0 if rank == 0 and time.perf_counter() - began >= args.seconds else 0.0)
        dist.all_reduce(flag)  # lockstep; rank 0's stop decision reaches every rank
        return bool(flag.item() > 0)

    began = time.perf_counter() + 3600.0  # no stop during calibration
    for _ in range(5):
        step(0)
    warm = time.perf_counter()
    for _ in range(30):
        step(0)
    step_ms = 1000 * (time.perf_counter() - warm) / 30
    slow = rank == args.slow_rank and args.slowdown > 0
    matmul_ms = 0.0
    if slow:
        extra()  # cuBLAS picks its kernel
        matmul_ms = _gpu_ms(extra, 20)
    dist.barrier()
    n_extra = max(1, round(args.slowdown * step_ms / matmul_ms)) if slow else 0

    steps = 0
    began = time.perf_counter()
    while True:
        steps += 1
        if step(n_extra):
            break
    wall = time.perf_counter() - began
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{rank}.json").write_text(json.dumps({
            "rank": rank, "world_size": world, "slow_rank": args.slow_rank, "slowdown": args.slowdown,
            "step_wall_ms_calibration": step_ms, "extra_matmul_ms_alone": matmul_ms, "n_extra": n_extra,
            "steps": steps, "injected_matmuls": injected, "calibration_matmuls": 21 if slow else 0,
            "step_wall_ms": 1000 * wall / steps, "measured_slowdown": 1000 * wall / steps / step_ms - 1,
            "pid": os.getpid(), "backend": args.backend, "device": torch.cuda.current_device(),
        }, indent=1))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
