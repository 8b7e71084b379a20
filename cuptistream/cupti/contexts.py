"""Finding CUDA contexts for the sampling sources, and reading resource-callback module data.

PC sampling and SASS metrics are enabled per context. A source learns of contexts created after it
starts from the resource domain (``CONTEXT_CREATED``); for contexts that exist already it asks the
driver for the calling thread's current context and every device's active primary context.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_size_t, c_uint32, c_void_p

from cuptistream.cupti import gpus
from cuptistream.cupti.library import call

# CUpti_CallbackIdResource (cupti_callbacks.h; stable across CUPTI 12 and 13). 5 is CU_INIT_FINISHED.
CONTEXT_CREATED = 1
CONTEXT_DESTROY_STARTING = 2
MODULE_LOADED = 6
MODULE_UNLOAD_STARTING = 7


class ModuleResourceData(Structure):
    """``CUpti_ModuleResourceData``: what ``resourceDescriptor`` points to for module callbacks."""

    # pCubin as c_void_p: a c_char_p field reads as a bytes copy cut at the first NUL, not the address.
    _fields_ = [("moduleId", c_uint32), ("cubinSize", c_size_t), ("pCubin", c_void_p)]


def module_data(address: int) -> tuple[int, int, int]:
    """(module id, cubin size, cubin address) from a module callback's ``resourceDescriptor``."""
    data = ModuleResourceData.from_address(address)
    return int(data.moduleId), int(data.cubinSize), int(data.pCubin or 0)


def _libcuda() -> ctypes.CDLL | None:
    try:
        return gpus.libcuda()
    except OSError:
        return None


def current_context() -> int:
    """The calling thread's current CUDA context, or 0."""
    cuda = _libcuda()
    if cuda is None:
        return 0
    ctx = c_void_p()
    return int(ctx.value or 0) if cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 else 0


def active_primary_contexts() -> list[int]:
    """Each device's primary context that is active now (the one PyTorch and the runtime use)."""
    return list(primary_contexts_by_device().values())


def primary_contexts_by_device() -> dict[int, int]:
    """CUDA ordinal -> its primary context, for each device whose primary context is active now
    (the driver's answer alone: no CUPTI call)."""
    cuda = _libcuda()
    if cuda is None or cuda.cuInit(0) != 0:
        return {}
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return {}
    found: dict[int, int] = {}
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        flags, active = ctypes.c_uint(0), ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        if (
            cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) != 0
            or not active
        ):
            continue
        ctx = c_void_p()
        # Retain only to read the handle; release at once so we never keep the context alive.
        if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) == 0:
            cuda.cuDevicePrimaryCtxRelease_v2(device)
            if ctx.value:
                found[ordinal] = int(ctx.value)
    return found


def context_ids(ctx: int) -> tuple[int, int]:
    """(device id, CUPTI context id) of ``ctx``: the ids activity records use."""
    device, context = c_uint32(0), c_uint32(0)
    call("cuptiGetDeviceId", c_void_p(ctx), ctypes.byref(device))
    call("cuptiGetContextId", c_void_p(ctx), ctypes.byref(context))
    return int(device.value), int(context.value)


def make_current(ctx: int) -> None:
    """Make ``ctx`` current on the calling thread (SASS SetConfig checks the caller's context)."""
    cuda = _libcuda()
    if cuda is not None:
        cuda.cuCtxSetCurrent(c_void_p(ctx))
