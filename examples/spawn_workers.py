"""Four CPU-only worker processes and one CUDA worker, started with multiprocessing's spawn.

    cuptistream run -c configs/default.yaml -- python examples/spawn_workers.py

Like a data-loading pool next to a GPU process: only the CUDA worker initializes CUDA, so only it
gets a probe and a file set; the CPU workers run as if cuptistream were not there.
"""

from __future__ import annotations

import multiprocessing as mp
import os


def cpu_worker(queue: mp.Queue) -> None:
    total = sum(i * i for i in range(200_000))
    queue.put(("cpu", os.getpid(), total))


def cuda_worker(queue: mp.Queue) -> None:
    import torch

    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(100):
        x = torch.relu(x @ x).div_(1024)
    torch.cuda.synchronize()
    queue.put(("cuda", os.getpid(), 100))


def main() -> None:
    context = mp.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=cpu_worker, args=(queue,)) for _ in range(4)]
    workers.append(context.Process(target=cuda_worker, args=(queue,)))
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join()
    for kind, pid, value in sorted(results):
        print(kind, pid, value, flush=True)


if __name__ == "__main__":
    main()
