"""The CUDA driver (libcuda) as the probe needs it: loaded once, and the GPUs this process sees.

Only the driver's device queries are used here (``cuInit``, ``cuDeviceGet*``): they create no
context, so asking costs no GPU memory and changes nothing the program will do.
"""

from __future__ import annotations

import ctypes
from functools import cache

from cuptistream.events import DeviceInfo


@cache
def libcuda() -> ctypes.CDLL:
    """The CUDA driver library. Raises ``OSError`` where there is none."""
    return ctypes.CDLL("libcuda.so.1")


def device_name(ordinal: int = 0) -> str:
    """The GPU's name (``cuDeviceGetName``), for error messages; "GPU <n>" where unavailable."""
    try:
        cuda = libcuda()
        device = ctypes.c_int(0)
        buf = ctypes.create_string_buffer(256)
        if (
            cuda.cuInit(0) == 0
            and cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
            and cuda.cuDeviceGetName(buf, 256, device) == 0
        ):
            return f"{buf.value.decode(errors='replace')} (device {ordinal})"
    except OSError:
        pass
    return f"GPU {ordinal}"


def _uuid_text(raw: bytes) -> str:
    text = raw.hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def visible_devices() -> list[DeviceInfo]:
    """Every GPU the process sees, by CUDA ordinal (after ``CUDA_VISIBLE_DEVICES``), with its
    name and UUID as ``nvidia-smi -L`` prints it; [] without a driver or GPU."""
    try:
        cuda = libcuda()
    except OSError:
        return []
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    found = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        uuid = ctypes.create_string_buffer(16)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        cuda.cuDeviceGetName(name, 256, device)
        cuda.cuDeviceGetUuid(uuid, device)
        found.append(
            DeviceInfo(device_id=ordinal, name=name.value.decode(errors="replace"), uuid=_uuid_text(uuid.raw))
        )
    return found


def any_context_active() -> bool:
    """Whether any GPU's primary context is active (``cuDevicePrimaryCtxGetState``): CUDA work, and
    so CUDA graphs, may exist already. True where it cannot be told."""
    try:
        cuda = libcuda()
    except OSError:
        return True
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return True
    for ordinal in range(count.value):
        device, flags, active = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            return True
        if cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) != 0:
            return True
        if active.value:
            return True
    return False
