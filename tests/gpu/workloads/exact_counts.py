"""A workload with known counts: N launches of one NVRTC kernel, B bytes copied, K nested NVTX
ranges, a CUDA graph of ``graph_kernels`` kernels replayed G times.

``run()`` returns what the workload did, so a test can compare it with what was traced. Run as a
script it does the work once (``python -m tests.gpu.workloads.exact_counts N B K G``) and prints the
same as JSON, so it can run under ``cuptistream run``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

KERNEL = "cs_exact_kernel"
GRAPH_KERNEL = "cs_graph_kernel"
SOURCE = r"""
extern "C" __global__ void cs_exact_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
extern "C" __global__ void cs_graph_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 0.5f;
}
"""


def _check(result: object) -> object:
    error, *rest = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f"CUDA call failed: {error}")
    return rest[0] if len(rest) == 1 else rest


def setup():
    """Compile the kernels and make the buffers (before any tracing starts)."""
    from cuda.core import Device, Program, ProgramOptions

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    cc = dev.compute_capability
    prog = Program(SOURCE, "c++", ProgramOptions(arch=f"sm_{cc.major}{cc.minor}"))
    mod = prog.compile("cubin")
    kernels = (mod.get_kernel(KERNEL), mod.get_kernel(GRAPH_KERNEL))
    buf = dev.allocate(1 << 26, stream=stream)  # 64 MiB: kernel argument and copy target
    stream.sync()
    return dev, stream, kernels, buf


def run(
    launches: int, copy_bytes: int, nvtx_depth: int, graph_replays: int, graph_kernels: int = 3, ctx=None
) -> dict:
    from cuda.bindings import driver as cu
    from cuda.core import LaunchConfig, launch

    dev, stream, (kernel, graph_kernel), buf = ctx or setup()
    dptr = int(buf.handle)
    n = np.int32(1024)
    config = LaunchConfig(grid=8, block=128)
    for _ in range(launches):
        launch(stream, config, kernel, buf, n)
    # Copies: half host->device, half device->host, in 4 pieces each way, from pageable memory.
    half = copy_bytes // 2
    host = np.zeros(half, dtype=np.uint8)
    piece = half // 4
    sizes = [piece, piece, piece, half - 3 * piece]
    if half:
        offset = 0
        for size in sizes:
            _check(cu.cuMemcpyHtoD(dptr, host.ctypes.data + offset, size))
            offset += size
        offset = 0
        for size in sizes:
            _check(cu.cuMemcpyDtoH(host.ctypes.data + offset, dptr, size))
            offset += size
    # NVTX: K nested push/pop ranges.
    if nvtx_depth:
        import torch.cuda.nvtx as nvtx
    for depth in range(nvtx_depth):
        nvtx.range_push(f"cs_range_{depth}")
    for _ in range(nvtx_depth):
        nvtx.range_pop()
    # A CUDA graph captured from `graph_kernels` launches, replayed G times.
    if graph_replays and graph_kernels:
        handle = int(stream.handle)
        _check(cu.cuStreamBeginCapture(handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
        for _ in range(graph_kernels):
            launch(stream, config, graph_kernel, buf, n)
        graph = _check(cu.cuStreamEndCapture(handle))
        graph_exec = _check(cu.cuGraphInstantiate(graph, 0))
        for _ in range(graph_replays):
            _check(cu.cuGraphLaunch(graph_exec, handle))
    stream.sync()
    dev.sync()
    return {
        "kernel": KERNEL, "launches": launches, "copy_bytes": 2 * half, "copies": 2 * len(sizes),
        "nvtx_depth": nvtx_depth, "graph_kernel": GRAPH_KERNEL, "graph_replays": graph_replays,
        "graph_kernels": graph_kernels,
    }  # fmt: skip


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:5]] or [10_000, 64 << 20, 8, 50]
    print(json.dumps(run(*args)))
