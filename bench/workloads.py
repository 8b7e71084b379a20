"""The GPU workloads the benchmarks run (W1-W4, and W5 and D1), one per process.

    python bench/workloads.py --workload W1 [--seconds 2] [--warmup-seconds 0.5] [--profiler] [--block N]

- W1: tiny-kernel loop, ``y = y + 1`` on 1024 floats: one iteration is one kernel launch.
- W2: MLP of 8 ``Linear(1024, 1024)`` layers (ReLU between), batch 64, one SGD step per iteration
  (forward, MSE loss, backward, step).
- W3: replay of a CUDA graph of 50 tiny kernels (``y.add_(1)`` on 1024 floats): one iteration is one
  ``graph.replay()``.
- W4: 4-layer ``nn.TransformerEncoder`` (d_model 512, 8 heads, batch_first), batch 16 x 256 tokens, one
  AdamW step per iteration.
- W5: W2 and W4 alternating every 30 s (a program that changes phase).
- D1: a DDP training step, for ``torchrun --nproc_per_node=N`` (a GPU per rank): 4 x
  ``Linear(2048, 2048)`` + ReLU, batch 64, SGD, the gradients all-reduced with NCCL by
  ``DistributedDataParallel`` (``examples/train_ddp.py``'s model). Built outside torchrun it is a
  one-rank job. Ranks stop together: every time-bounded loop asks ``agreed`` (a gloo all-reduce on
  the CPU, outside the timed block, so it adds no GPU kernel) whether any rank's time is up.

The model, optimizer and graph are built first (not timed). Then blocks of ``--block`` iterations run
for ``--warmup-seconds`` (not timed), then for ``--seconds`` (timed), each block ending with
``torch.cuda.synchronize()`` so the host clock covers the GPU work. With ``--profiler`` the warm-up
and the timed blocks run inside ``torch.profiler.profile(activities=[ProfilerActivity.CUDA])``
(Kineto); the profiler's stop comes after the timed region and is reported as ``profiler_stop_s``.

Prints one JSON line on stdout: ``workload``, ``iterations``, ``per_iteration_us`` (timed time /
timed iterations), ``block_per_iteration_us`` (one value per block), ``max_rss_kib`` (this process's
peak RSS, ``getrusage(RUSAGE_SELF).ru_maxrss``), and a few details.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

try:
    from pacing import pace_delay
except ImportError:  # imported as ``bench.workloads`` (bench/fanin.py's GPU programs)
    from bench.pacing import pace_delay

if TYPE_CHECKING:
    from torch import nn

Block = Callable[[int], None]

# Iterations per block: a block takes roughly 10-50 ms without tracing, so the per-block sync costs
# well under 1% and a 3 s window holds ~100 blocks.
DEFAULT_BLOCK = {"W1": 2000, "W2": 20, "W3": 200, "W4": 4, "W5": 20, "D1": 10}


def w1_tiny_kernels() -> Block:
    import torch

    y = torch.zeros(1024, device="cuda")

    def block(n: int) -> None:
        nonlocal y
        for _ in range(n):
            y = y + 1

    return block


def w2_mlp_sgd() -> Block:
    import torch
    from torch import nn

    layers: list[nn.Module] = []
    for i in range(8):
        layers.append(nn.Linear(1024, 1024))
        if i < 7:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device="cuda")
    target = torch.randn(64, 1024, device="cuda")
    loss_fn = nn.MSELoss()

    def block(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), target)
            loss.backward()
            opt.step()

    return block


def w3_graph_replay(kernels: int = 50) -> Block:
    import torch

    y = torch.zeros(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream before capture, as torch's docs do
        for _ in range(3 * kernels):
            y.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            y.add_(1)
    torch.cuda.synchronize()

    def block(n: int) -> None:
        replay = graph.replay
        for _ in range(n):
            replay()

    return block


def w4_transformer_adamw() -> Block:
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 256, 512, device="cuda")

    def block(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()

    return block


def w5_phases(period_s: float = 30.0) -> Block:
    """W2's MLP steps and W4's transformer steps, alternating every ``period_s`` seconds of wall
    time (the always-on mode's accuracy on a program that changes phase)."""
    mlp, transformer = w2_mlp_sgd(), w4_transformer_adamw()
    began = time.monotonic()

    def block(n: int) -> None:
        phase = int((time.monotonic() - began) // period_s) % 2
        if phase == 0:
            mlp(n)
        else:
            transformer(max(1, n // 5))  # a transformer step takes ~5 MLP steps

    return block


_STOP_GROUP: object | None = None  # the gloo group ``agreed`` uses, once a DDP workload is built


def init_ddp() -> int:
    """Join the torchrun job (NCCL, the GPU of ``LOCAL_RANK``) unless joined; this process's rank."""
    global _STOP_GROUP
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # outside torchrun: a one-rank job
        os.environ.setdefault("MASTER_PORT", "29533")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    if _STOP_GROUP is None:
        _STOP_GROUP = dist.new_group(backend="gloo")
    return dist.get_rank()


def agreed(done: bool) -> bool:
    """Whether any rank of the DDP job is done (every rank asks at every turn of a timed loop);
    ``done`` as is outside a DDP job. A CPU all-reduce: ranks leave a time-bounded loop after the same block."""
    if _STOP_GROUP is None:
        return done
    import torch
    import torch.distributed as dist

    flag = torch.tensor([int(done)], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_STOP_GROUP)  # type: ignore[arg-type]
    return bool(flag.item())


def leave_ddp() -> None:
    """Leave the DDP job together: a rank that tears its groups down while a peer still uses them
    (its gloo connection closed under it) can abort at exit."""
    import torch.distributed as dist

    if _STOP_GROUP is not None:
        dist.barrier(group=_STOP_GROUP)  # type: ignore[arg-type]
    dist.destroy_process_group()


def d1_ddp_step(width: int = 2048, batch: int = 64) -> Block:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    local = int(os.environ.get("LOCAL_RANK", "0"))
    rank = init_ddp()
    torch.manual_seed(1234 + rank)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(4)))
    ddp = DistributedDataParallel(model.cuda(), device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device="cuda")

    def block(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = ddp(x).square().mean()
            loss.backward()  # DDP all-reduces the gradient buckets with NCCL here
            opt.step()

    return block


WORKLOADS: dict[str, Callable[[], Block]] = {
    "W1": w1_tiny_kernels,
    "W2": w2_mlp_sgd,
    "W3": w3_graph_replay,
    "W4": w4_transformer_adamw,
    "W5": w5_phases,
    "D1": d1_ddp_step,
}


def run_blocks(block: Block, n: int, seconds: float, min_blocks: int = 1, rate: float = 0.0) -> list[float]:
    """Run blocks of ``n`` iterations until ``seconds`` have passed; each block's seconds (its
    work, not the wait). ``rate`` > 0: at most that many iterations per second (``pacing``)."""
    import torch

    times: list[float] = []
    start = time.perf_counter()
    while True:
        time.sleep(pace_delay(start, n * len(times), rate, time.perf_counter()))
        t0 = time.perf_counter()
        block(n)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if agreed(len(times) >= min_blocks and t1 - start >= seconds):
            return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds (default 2)")
    parser.add_argument("--warmup-seconds", type=float, default=0.5, help="untimed warm-up (default 0.5)")
    parser.add_argument("--profiler", action="store_true", help="run inside torch.profiler (Kineto), CUDA")
    parser.add_argument("--block", type=int, default=0, help="iterations per block (default per workload)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="at most this many iterations per second (pacing)"
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("workloads.py: no CUDA device", file=sys.stderr)
        return 2

    torch.manual_seed(0)
    t_setup = time.perf_counter()
    block = WORKLOADS[args.workload]()
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t_setup
    n = args.block or DEFAULT_BLOCK[args.workload]

    if args.profiler:
        from torch.profiler import ProfilerActivity, profile

        region: contextlib.AbstractContextManager[object] = profile(activities=[ProfilerActivity.CUDA])
    else:
        region = contextlib.nullcontext()

    region.__enter__()
    try:
        warm = run_blocks(block, n, args.warmup_seconds, rate=args.rate)
        t_timed = time.perf_counter()
        times = run_blocks(block, n, args.seconds, rate=args.rate)
        timed_wall_s = time.perf_counter() - t_timed
    finally:
        t_stop = time.perf_counter()
        region.__exit__(None, None, None)
        stop_s = time.perf_counter() - t_stop

    iterations = n * len(times)
    total = sum(times)
    result = {
        "workload": args.workload,
        "profiler": args.profiler,
        "iterations": iterations,
        "per_iteration_us": total / iterations * 1e6,
        "block_iterations": n,
        "block_per_iteration_us": [round(t / n * 1e6, 4) for t in times],
        "timed_s": total,
        "timed_wall_s": timed_wall_s,  # with the waits of --rate
        "rate": args.rate,
        "warmup_iterations": n * len(warm),
        "setup_s": setup_s,
        "profiler_stop_s": stop_s if args.profiler else None,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    line = json.dumps(result) + "\n"
    if _STOP_GROUP is None:
        sys.stdout.write(line)
        sys.stdout.flush()
        return 0
    # D1 under torchrun: one line per rank, on the pipe the ranks share, one rank at a time (torchrun
    # runs them unbuffered, so a print's text and its newline are two writes, and a line past the
    # pipe's atomic size is several: in lockstep, two ranks' lines would interleave).
    import torch.distributed as dist

    result["rank"] = dist.get_rank()
    result["world_size"] = dist.get_world_size()
    line = json.dumps(result) + "\n"
    for rank in range(dist.get_world_size()):
        if rank == dist.get_rank():
            sys.stdout.write(line)
            sys.stdout.flush()
        dist.barrier(group=_STOP_GROUP)  # type: ignore[arg-type]
    leave_ddp()
    return 0


if __name__ == "__main__":
    sys.exit(main())
