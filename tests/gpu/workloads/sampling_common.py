"""Shared pieces of the sampling GPU workloads: a collecting Emitter, NVRTC kernels with known hot
spots, and raw libcuda module load/launch/unload (exact launch counts, explicit unloads)."""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import cuptistream  # noqa: F401
except ImportError:  # the GPU machine may lack the pipeline's dependencies (trio); the sources need none
    _pkg = types.ModuleType("cuptistream")
    _pkg.__path__ = [str(Path(__file__).resolve().parents[3] / "cuptistream")]
    sys.modules["cuptistream"] = _pkg

from cuptistream.events import Event
from cuptistream.plugin import Emitter

# dep_chain: a loop of dependent FMAs (execution-dependency stalls, math).
# strided: a memory-bound gather with a large stride (long-scoreboard stalls).
# counted: a fixed-trip loop; SASS smsp__sass_inst_executed per loop PC = warps * ITERS per launch.
KERNELS = r"""
extern "C" __global__ void dep_chain(float* out, int iters) {
    float a = threadIdx.x * 0.001f, b = 1.0001f, c = 0.9999f;
    for (int i = 0; i < iters; ++i) { a = a * b + c; a = a * c + b; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}
extern "C" __global__ void strided(const float* in, float* out, int n, int stride, int iters) {
    unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.f;
    unsigned j = idx;
    for (int i = 0; i < iters; ++i) { j = (j * 1103515245u + 12345u + stride) % n; acc += in[j]; }
    out[idx] = acc;
}
extern "C" __global__ void counted(int* out) {
    int v = threadIdx.x;
    #pragma unroll 1
    for (int i = 0; i < 100; ++i) { v = v * 3 + i; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
"""

OTHER_KERNEL = r"""
extern "C" __global__ void other_module_kernel(float* out, int iters) {
    float a = threadIdx.x;
    for (int i = 0; i < iters; ++i) { a = sqrtf(a + 1.0f) * 1.5f; }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}
"""


class CollectingEmitter(Emitter):
    """Keeps every event, loss and error in memory (the GPU workloads assert on them)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.losses: list[tuple[str, str, int, str]] = []
        self.errors: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def emit(self, events: Sequence[Event]) -> None:
        with self._lock:
            self.events.extend(events)

    def emit_chunk(self, chunk: Any) -> None:
        raise NotImplementedError

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        with self._lock:
            self.losses.append((stage, reason, count, unit))

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        with self._lock:
            self.errors.append((severity, origin, message))


def compile_cubin(source: str, arch: str) -> bytes:
    from cuda.core import Program, ProgramOptions

    return bytes(Program(source, "c++", ProgramOptions(arch=arch, lineinfo=True)).compile("cubin").code)


class Cuda:
    """The few driver calls the workloads need, through ctypes on libcuda."""

    def __init__(self, device: int = 0) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        self.device = ctypes.c_int(0)
        self.check(self.lib.cuDeviceGet(ctypes.byref(self.device), device), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.device), "retain")
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    @staticmethod
    def check(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed: CUresult {code}")

    def arch(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.cuDeviceGetAttribute(ctypes.byref(major), 75, self.device)
        self.lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, self.device)
        return f"sm_{major.value}{minor.value}"

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        self.check(self.lib.cuMemsetD8_v2(ptr, 1, ctypes.c_size_t(nbytes)), "cuMemset")
        return int(ptr.value)

    def load(self, cubin: bytes) -> int:
        module = ctypes.c_void_p()
        self.check(
            self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData"
        )
        return int(module.value or 0)

    def unload(self, module: int) -> None:
        self.check(self.lib.cuModuleUnload(ctypes.c_void_p(module)), "cuModuleUnload")

    def function(self, module: int, name: str) -> int:
        fn = ctypes.c_void_p()
        self.check(
            self.lib.cuModuleGetFunction(ctypes.byref(fn), ctypes.c_void_p(module), name.encode()),
            "cuModuleGetFunction",
        )
        return int(fn.value or 0)

    def launch(self, fn: int, grid: int, block: int, *args: Any) -> None:
        holders = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_uint64(a) for a in args]
        params = (ctypes.c_void_p * len(holders))(
            *[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders]
        )
        self.check(
            self.lib.cuLaunchKernel(ctypes.c_void_p(fn), grid, 1, 1, block, 1, 1, 0, None, params, None),
            "cuLaunchKernel",
        )

    def sync(self) -> None:
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")
