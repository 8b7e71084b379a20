"""A small DistributedDataParallel training loop, one process per GPU, for ``torchrun``.

    cuptistream run -c configs/default.yaml -- torchrun --nproc_per_node=2 examples/train_ddp.py
    torchrun --nproc_per_node=2 examples/train_ddp.py --profile --out kineto/   # under torch.profiler

Each rank trains the same MLP on its own random batches; DDP all-reduces the gradients with NCCL
every step. The run is deterministic in the work it launches (fixed seed, fixed step count), so two
runs of the same command launch the same kernels: tests/gpu/test_multiprocess_gpu.py compares
cuptistream's kernel count per rank with torch.profiler's on a second run.

``--out DIR`` writes ``DIR/rank{N}.json`` per rank: the device's ordinal and UUID, the step count,
and the per-step wall times (ms, each step ends with a CUDA synchronize) after ``--warmup`` steps.
``--profile`` runs every step under ``torch.profiler`` and adds its kernel counts (total, per name)
to that file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def _kineto_kernels(profiler: torch.profiler.profile) -> Counter[str]:
    counts: Counter[str] = Counter()
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and not event.name.startswith("Memcpy") \
                and not event.name.startswith("Memset"):  # fmt: skip
            counts[event.name] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10, help="steps not timed")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write rank{N}.json here")
    parser.add_argument("--profile", action="store_true", help="run under torch.profiler; counts go to --out")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)

    profiler = (
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        if args.profile
        else contextlib.nullcontext()
    )
    step_ms: list[float] = []
    with profiler:
        model = nn.Sequential(
            *(nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(4))
        )
        model = DistributedDataParallel(model.cuda(), device_ids=[local_rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for step in range(args.warmup + args.steps):
            began = time.perf_counter()
            x = torch.randn(args.batch, args.width, device="cuda")
            loss = model(x).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            if step >= args.warmup:
                step_ms.append((time.perf_counter() - began) * 1e3)

    if args.out:
        properties = torch.cuda.get_device_properties(local_rank)
        result = {
            "rank": rank,
            "local_rank": local_rank,
            "pid": os.getpid(),
            "device": local_rank,
            "device_uuid": f"GPU-{properties.uuid}",
            "steps": args.steps,
            "warmup": args.warmup,
            "step_ms": step_ms,
        }
        if args.profile:
            kernels = _kineto_kernels(profiler)  # type: ignore[arg-type]
            result["kineto_kernels"] = sum(kernels.values())
            result["kineto_by_name"] = dict(kernels)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
