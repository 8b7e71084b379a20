"""torch.profiler beside cuptistream: a deterministic MLP under the profiler's schedule API.

``python tests/gpu/workloads/profiler_coexist.py ORDER OUT.json [--config CFG] [--steps N]``

ORDER is one of:

- ``alone``: the profiler only (run it plain, or under ``cuptistream run`` where the probe started
  at CUDA initialization);
- ``session-first``: ``cuptistream.session(CFG)`` started, then the profiler;
- ``profiler-first``: the profiler entered, then a session started inside it, the profiler exited,
  and the session stopped;
- ``no-profiler``: the same steps with no profiler (a baseline for the others).

OUT.json gets the profiler's GPU kernel counts by name (summed over its cycles), the number of
cycles it traced, and how long the steps took. Everything is seeded and sized the same in every
order, so counts of two runs compare exactly.

With ``--ddp``, under ``torchrun`` (a GPU per rank, NCCL): every step ends with an all-reduce of the
first layer's gradient across the ranks, ORDER applies to rank 0 only (``alone`` or
``no-profiler``), every other rank runs the same steps with no profiler, and each rank writes
``OUT`` with ``.rank{R}.json`` for its suffix.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from typing import Any

from torch_mlp import make, steps  # the same seeded MLP as the other coexistence checks (same folder)

WAIT, WARMUP, ACTIVE, REPEAT = 1, 1, 3, 3
PROFILED_STEPS = (WAIT + WARMUP + ACTIVE) * REPEAT + 2
_after_step: list[Any] = []  # --ddp: the all-reduce every step ends with


def step(torch: Any, model: Any, opt: Any, x: Any, y: Any) -> None:
    steps(torch, model, opt, x, y, 1)  # one training step, then a device sync
    for then in _after_step:
        then(torch, model)


def _all_reduce(torch: Any, model: Any) -> None:
    import torch.distributed as dist

    dist.all_reduce(model[0].weight.grad)  # one NCCL kernel per step, on every rank
    torch.cuda.synchronize()


def join_ddp() -> int:
    """Under torchrun: this rank's GPU, NCCL, and the all-reduce after every step; the rank."""
    import os

    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    _after_step.append(_all_reduce)
    return dist.get_rank()


def profiled(args: argparse.Namespace, work: tuple[Any, ...], start_session: Any = None) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile, schedule

    counts: collections.Counter[str] = collections.Counter()
    cycles = 0

    def ready(prof: Any) -> None:
        nonlocal cycles
        cycles += 1
        for event in prof.events():
            if str(event.device_type).endswith("CUDA") and event.name:
                counts[event.name] += 1

    steps = PROFILED_STEPS
    plan = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=REPEAT)
    began = time.monotonic()
    session = None
    with profile(activities=[ProfilerActivity.CUDA], schedule=plan, on_trace_ready=ready) as prof:
        if start_session is not None:
            session = start_session()
        for _ in range(steps):
            step(*work)
            prof.step()
    exited = time.monotonic()
    if session is not None:
        session.stop()
    return {
        "kernels": dict(sorted(counts.items())),
        "total": sum(counts.values()),
        "cycles": cycles,
        "steps_s": round(exited - began, 3),
    }


def session_config(args: argparse.Namespace) -> dict[str, Any]:
    import yaml

    with open(args.config) as file:
        config: dict[str, Any] = yaml.safe_load(file)
    if args.record:
        for sink in config["sinks"]:
            if sink["type"] == "file":
                sink["directory"] = args.record
    return config


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("order", choices=["alone", "session-first", "profiler-first", "no-profiler"])
    parser.add_argument("out")
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--after", type=int, default=20, help="steps after the profiler, outside it")
    parser.add_argument("--record", default="", help="the file sink's directory for in-process sessions")
    parser.add_argument("--ddp", action="store_true", help="under torchrun: ORDER on rank 0, NCCL every step")
    args = parser.parse_args()
    rank = join_ddp() if args.ddp else None
    if args.ddp and args.order not in ("alone", "no-profiler"):
        parser.error("--ddp: ORDER is alone or no-profiler (rank 0's)")
    work = make()
    for _ in range(3):  # warm-up: cuBLAS handles and the allocator, outside every trace
        step(*work)
    if args.ddp and (rank != 0 or args.order == "no-profiler"):  # the profiled steps, unprofiled
        began = time.monotonic()
        for _ in range(PROFILED_STEPS):
            step(*work)
        result = {"kernels": {}, "total": 0, "cycles": 0, "steps_s": round(time.monotonic() - began, 3)}
    elif args.order == "no-profiler":
        result = {"kernels": {}, "total": 0, "cycles": 0}
    elif args.order == "alone":
        result = profiled(args, work)
    elif args.order == "session-first":
        import cuptistream

        session = cuptistream.session(session_config(args)).start()
        result = profiled(args, work)
        for _ in range(args.after):
            step(*work)
        session.stop()
    else:
        import cuptistream

        result = profiled(args, work, lambda: cuptistream.session(session_config(args)).start())
    for _ in range(args.after):
        step(*work)
    result["order"] = args.order
    out_path = args.out
    if rank is not None:
        import os

        import torch.distributed as dist

        result.update(rank=rank, pid=os.getpid(), steps=3 + PROFILED_STEPS + args.after)
        out_path = f"{args.out.removesuffix('.json')}.rank{rank}.json"
        dist.barrier()  # leave together: a rank tearing down while its peer still talks can abort
        dist.destroy_process_group()
    with open(out_path, "w") as out:
        json.dump(result, out, indent=1)
    print(
        f"profiler_coexist {args.order}: {result['total']} kernels in {result['cycles']} cycles", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
