"""GPU workload for the stack join: four functions whose GPU work is known by construction, run in
turns of ``phase`` seconds for ``seconds`` in all, then two threads launching at once.

- ``gemm_loop``: bf16 4096² matmuls (cuBLAS kernels);
- ``elementwise_loop``: ``x * a + b`` on 16 M floats (torch elementwise kernels);
- ``graph_replay``: replays of a CUDA graph of 20 small kernels (their records carry the graph
  launch's correlation id);
- ``train_step``: an MLP forward and ``loss.backward()`` (autograd launches the backward kernels
  from its own thread, which runs no Python).

Each turn sits in an NVTX range named after its function on the main thread: with the ``marker``
kind the test knows, for every launch, which function made it (the truth the stack join is checked
against). The threads' part: ``thread_sin`` launches only ``sin`` and ``thread_cos`` only ``cos``,
each on its own stream, at the same time. Prints one JSON line last.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import torch


def gemm_loop(a: torch.Tensor, until: float) -> int:
    n = 0
    while time.monotonic() < until:
        for _ in range(4):
            a @ a
        torch.cuda.synchronize()
        n += 4
    return n


def elementwise_loop(x: torch.Tensor, until: float) -> int:
    n = 0
    while time.monotonic() < until:
        for _ in range(8):
            x = x * 0.999 + 0.001
        torch.cuda.synchronize()
        n += 8
    return n


def graph_replay(graph: torch.cuda.CUDAGraph, until: float) -> int:
    n = 0
    while time.monotonic() < until:
        for _ in range(4):
            graph.replay()
        torch.cuda.synchronize()
        n += 4
    return n


def train_step(model: torch.nn.Module, batch: torch.Tensor, until: float) -> int:
    n = 0
    while time.monotonic() < until:
        loss = model(batch).square().mean()
        loss.backward()
        torch.cuda.synchronize()
        n += 1
    return n


def thread_sin(x: torch.Tensor, until: float) -> None:
    with torch.cuda.stream(torch.cuda.Stream()):
        while time.monotonic() < until:
            for _ in range(16):
                torch.sin(x)
            torch.cuda.synchronize()


def thread_cos(x: torch.Tensor, until: float) -> None:
    with torch.cuda.stream(torch.cuda.Stream()):
        while time.monotonic() < until:
            for _ in range(16):
                torch.cos(x)
            torch.cuda.synchronize()


def main(seconds: float, phase: float, threads_s: float) -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1 << 24, device="cuda")
    small = torch.randn(1 << 16, device="cuda")
    # Large enough that a backward pass takes milliseconds, as a real model's does.
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 8192),
        torch.nn.ReLU(),
        torch.nn.Linear(8192, 8192),
        torch.nn.ReLU(),
        torch.nn.Linear(8192, 4096),
    ).cuda()
    batch = torch.randn(4096, 4096, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up outside the graph, as torch asks
            small.mul_(1.0001)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        for _ in range(20):
            small.mul_(1.0001)
    torch.cuda.synchronize()

    counts = {"gemm_loop": 0, "elementwise_loop": 0, "graph_replay": 0, "train_step": 0}
    turns = [
        ("gemm_loop", lambda until: gemm_loop(a, until)),
        ("elementwise_loop", lambda until: elementwise_loop(x, until)),
        ("graph_replay", lambda until: graph_replay(graph, until)),
        ("train_step", lambda until: train_step(model, batch, until)),
    ]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, run in turns:
            torch.cuda.nvtx.range_push(name)
            counts[name] += run(time.monotonic() + phase)
            torch.cuda.nvtx.range_pop()

    until = time.monotonic() + threads_s
    workers = [
        threading.Thread(target=thread_sin, args=(small, until)),
        threading.Thread(target=thread_cos, args=(small, until)),
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    torch.cuda.synchronize()
    print(json.dumps({"counts": counts, "main_thread": threading.get_ident()}))


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
