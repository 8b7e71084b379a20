"""libcupti through ctypes: the one loader, the one error type and the one way to call it.

Every raw CUPTI call in cuptistream goes through here: the activity API (``driver``, ``buffers``), PC
sampling (``pcsampling_api``) and SASS metrics (``sass_api``), which cupti-python does not bind. The
library is the *same* libcupti that cupti-python uses (found with cuda-pathfinder, which returns the
already-loaded copy), so a raw call here and a cupti-python call elsewhere talk to one CUPTI.

Failure modes:

- ``LibraryNotFoundError`` (a ``NoGpuError``: one line, exit code 3) when libcupti cannot be loaded.
- ``CuptiError`` when a call returns anything but ``SUCCESS``; ``call`` and ``code`` name the function
  and its ``CUptiResult``, the message says both. A function this libcupti lacks (too old) is a
  ``CuptiError`` with ``ERROR_NOT_SUPPORTED``.

Nothing here loads anything at import time.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, Structure, c_char_p, c_int, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p
from functools import cache
from typing import Any

from cuptistream.cupti.libc import libc
from cuptistream.errors import CuptiError as CuptiError
from cuptistream.errors import LibraryNotFoundError as LibraryNotFoundError
from cuptistream.errors import NoGpuError

# --- CUptiResult values we branch on (cupti_result.h; stable across CUPTI 12 and 13) -------------

SUCCESS = 0
ERROR_INVALID_PARAMETER = 1
ERROR_INVALID_CONTEXT = 3
ERROR_INVALID_OPERATION = 7
ERROR_OUT_OF_MEMORY = 8
ERROR_MAX_LIMIT_REACHED = 12
ERROR_NOT_COMPATIBLE = 14
ERROR_NOT_INITIALIZED = 15
ERROR_INVALID_KIND = 21
ERROR_NOT_SUPPORTED = 27
ERROR_UNKNOWN = 999


def result_name(code: int) -> str:
    """``CUPTI_ERROR_NOT_COMPATIBLE`` for 14, etc.: cupti-python's enum, else libcupti's own
    ``cuptiGetResultString``; falls back to the number."""
    try:
        from cupti import cupti

        return "CUPTI_" + cupti.Result(code).name
    except (ImportError, ValueError):
        pass
    text = c_char_p()
    try:
        if function("cuptiGetResultString")(code, ctypes.byref(text)) == SUCCESS and text.value:
            return text.value.decode(errors="replace")
    except (CuptiError, NoGpuError):
        pass
    return f"CUPTI result {code}"


CuptiError.result_name = staticmethod(result_name)  # messages name the code as CUPTI does


# --- loading ------------------------------------------------------------------------------------

_u32p, _sizep = POINTER(c_uint32), POINTER(c_size_t)
# The functions called with plain arguments. Every other CUPTI function this package calls (PC
# sampling, SASS metrics, profiler, chip name, CRC) takes one params struct: ``CUptiResult f(void*)``.
_SIGNATURES: dict[str, list[Any]] = {
    "cuptiGetVersion": [_u32p],
    "cuptiGetTimestamp": [POINTER(c_uint64)],
    "cuptiGetResultString": [c_int, POINTER(c_char_p)],
    "cuptiGetDeviceId": [c_void_p, _u32p],
    "cuptiGetContextId": [c_void_p, _u32p],
    "cuptiActivityEnable": [c_int],
    "cuptiActivityEnableAndDump": [c_int],
    "cuptiActivityDisable": [c_int],
    "cuptiActivityFlushAll": [c_uint32],
    "cuptiActivityFlushPeriod": [c_uint32],
    "cuptiActivityGetNumDroppedRecords": [c_void_p, c_uint32, _sizep],
    "cuptiActivityGetNextRecord": [c_void_p, c_size_t, POINTER(c_void_p)],
    "cuptiActivityGetStructSize": [c_int, c_uint32, _sizep],  # CUPTI >= 13
    "cuptiActivitySetAttribute": [c_int, _sizep, c_void_p],
    "cuptiActivityEnableRuntimeApi": [c_uint32, c_uint8],
    "cuptiActivityEnableDriverApi": [c_uint32, c_uint8],
    "cuptiActivityRegisterCallbacks": [c_void_p, c_void_p],
    "cuptiFinalize": [],
}


def _candidates() -> list[str]:
    """cuda-pathfinder's copy (the installed nvidia-cuda-cupti wheel or CUDA_HOME; the one cupti-python
    loaded), then the nvidia wheel folder next to this interpreter, then the loader's search path."""
    found: list[str] = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        found.append(load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception:
        pass
    try:
        import nvidia  # the namespace package of the nvidia-* wheels

        for root in nvidia.__path__:
            for sub in ("cu13/lib", "cuda_cupti/lib"):
                folder = os.path.join(root, sub)
                if os.path.isdir(folder):
                    names = sorted(f for f in os.listdir(folder) if f.startswith("libcupti.so"))
                    found += [os.path.join(folder, f) for f in names]
    except ImportError:
        pass
    return [*found, "libcupti.so.13", "libcupti.so.12", "libcupti.so"]


@cache
def libcupti() -> ctypes.CDLL:
    """The process's libcupti, with the signatures of ``_SIGNATURES`` declared."""
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError as error:
            errors.append(str(error))
    else:
        raise LibraryNotFoundError(
            "libcupti cannot be loaded; install `nvidia-cuda-cupti` (or cupti-python)"
            + (f" ({errors[-1]})" if errors else "")
        )
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = argtypes
            fn.restype = c_int
    return lib


def function(name: str) -> Any:
    """The C function ``name`` of libcupti, declared (``_SIGNATURES``, else ``CUptiResult f(void*)``).
    Raises ``CuptiError`` with ``ERROR_NOT_SUPPORTED`` if this libcupti is too old to have it."""
    try:
        fn = getattr(libcupti(), name)
    except AttributeError:
        raise CuptiError(name, ERROR_NOT_SUPPORTED, "not in this libcupti") from None
    if getattr(fn, "argtypes", False) is None:  # a ctypes function not declared yet
        fn.argtypes = [c_void_p]
        fn.restype = c_int
    return fn


def call_status(name: str, *args: Any) -> int:
    """Call ``name(*args)`` and return the ``CUptiResult`` (for calls whose errors carry meaning).
    A params struct (a ctypes ``Structure``) goes by reference: every CUPTI function that takes one
    takes a pointer to it."""
    return int(function(name)(*[ctypes.byref(a) if isinstance(a, Structure) else a for a in args]))


def call(name: str, *args: Any) -> None:
    """``call_status``; raises ``CuptiError`` unless the call returns ``SUCCESS``."""
    code = call_status(name, *args)
    if code != SUCCESS:
        raise CuptiError(name, code)


def params_size(struct: type[Structure], last_field: str) -> int:
    """The value for a params struct's ``size``/``structSize`` field, as the headers' ``*_STRUCT_SIZE``
    macros compute it: offset plus size of ``last_field``. CUPTI reads it to learn which fields the
    caller knows, which keeps a binding valid across CUPTI 12.x and 13.x."""
    field = getattr(struct, last_field)
    return int(field.offset + field.size)


class SizedParams(Structure):
    """A params struct whose ``structSize`` is filled in as its header's ``*_STRUCT_SIZE`` macro
    computes it (``params_size``), up to ``_last`` (default: the last field)."""

    _last = ""

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        self.structSize = params_size(type(self), self._last or self._fields_[-1][0])


@cache
def _libc_free() -> Any:
    free = libc().free
    free.argtypes = [c_void_p]
    free.restype = None
    return free


def libc_free(pointer: int) -> None:
    """Free memory a C library malloc'ed for us (strings CUPTI hands over, ``__cxa_demangle``'s output)."""
    _libc_free()(pointer)
