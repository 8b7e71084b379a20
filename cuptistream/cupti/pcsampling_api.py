"""ctypes binding of CUPTI's PC Sampling API (``cupti_pcsampling.h``), which cupti-python does not bind.

Layouts follow the header field for field. The header marks the output structs
``PACKED_ALIGNMENT`` (packed, then aligned to 8); every field there is already naturally aligned,
so ctypes' default layout gives the same offsets and the same array stride (sizeof rounded up to 8).
``tests/test_pc_sampling_structs.py`` checks this against the header with a C compiler.

Every params struct starts with a ``size`` field that CUPTI reads to learn which fields the caller
knows. We set it the way the header's ``*ParamsSize`` macros do (offset of the last field plus its
size), which keeps the binding valid across CUPTI 12.x and 13.x: older libraries accept a larger size
as long as the fields they know sit where they expect them.

Nothing here runs at import time; ``library()`` loads libcupti on first use.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char_p,
    c_int,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from dataclasses import dataclass
from functools import cache
from typing import Any

# --- result codes (cupti_result.h) ----------------------------------------------------------

SUCCESS = 0
ERROR_INVALID_PARAMETER = 1
ERROR_INVALID_CONTEXT = 3
ERROR_INVALID_OPERATION = 7
ERROR_OUT_OF_MEMORY = 8
ERROR_NOT_INITIALIZED = 15
ERROR_NOT_SUPPORTED = 27

# --- enums ----------------------------------------------------------------------------------

MODE_CONTINUOUS = 1
MODE_KERNEL_SERIALIZED = 2
OUTPUT_DATA_FORMAT_PARSED = 1

ATTR_SAMPLING_PERIOD = 1
ATTR_STALL_REASON = 2
ATTR_SCRATCH_BUFFER_SIZE = 3
ATTR_HARDWARE_BUFFER_SIZE = 4
ATTR_COLLECTION_MODE = 5
ATTR_ENABLE_START_STOP_CONTROL = 6
ATTR_OUTPUT_DATA_FORMAT = 7
ATTR_SAMPLING_DATA_BUFFER = 8
ATTR_WORKER_THREAD_PERIODIC_SLEEP_SPAN = 9

STALL_REASON_STRING_SIZE = 128  # CUPTI_STALL_REASON_STRING_SIZE: each name buffer we hand CUPTI

# --- output structs -------------------------------------------------------------------------


class StallReason(Structure):
    """``CUpti_PCSamplingStallReason``."""

    _fields_ = [("pcSamplingStallReasonIndex", c_uint32), ("samples", c_uint32)]


class PCData(Structure):
    """``CUpti_PCSamplingPCData``: one PC with its per-stall-reason counts.

    ``stallReasonCount`` is in/out: before GetData it is the capacity of ``stallReason``; CUPTI
    overwrites it with the number written, so it must be reset before every call.
    """

    _fields_ = [
        ("size", c_size_t),
        ("cubinCrc", c_uint64),
        ("pcOffset", c_uint64),
        ("functionIndex", c_uint32),
        ("pad", c_uint32),
        ("functionName", c_void_p),  # char*, owned by CUPTI and shared between records
        ("stallReasonCount", c_size_t),
        ("stallReason", c_void_p),  # CUpti_PCSamplingStallReason*
        ("correlationId", c_uint32),  # serialized mode only; 0 in continuous mode
    ]


class PCSamplingData(Structure):
    """``CUpti_PCSamplingData``: the buffer GetData (and Disable) fill."""

    _fields_ = [
        ("size", c_size_t),
        ("collectNumPcs", c_size_t),
        ("totalSamples", c_uint64),
        ("droppedSamples", c_uint64),
        ("totalNumPcs", c_size_t),
        ("remainingNumPcs", c_size_t),
        ("rangeId", c_uint64),
        ("pPcData", c_void_p),  # CUpti_PCSamplingPCData*
        ("nonUsrKernelsTotalSamples", c_uint64),
        ("hardwareBufferFull", c_uint8),
    ]


# --- configuration --------------------------------------------------------------------------


class _StallReasonData(Structure):
    _fields_ = [("stallReasonCount", c_size_t), ("pStallReasonIndex", POINTER(c_uint32))]


class _AttributeData(Union):
    """The header's ``attributeData`` union; each member is a one- or two-field struct there."""

    _fields_ = [
        ("invalidData", c_uint64 * 3),
        ("samplingPeriod", c_uint32),
        ("stallReasonData", _StallReasonData),
        ("scratchBufferSize", c_size_t),
        ("hardwareBufferSize", c_size_t),
        ("collectionMode", c_int),
        ("enableStartStopControl", c_uint32),
        ("outputDataFormat", c_int),
        ("samplingDataBuffer", c_void_p),
        ("workerThreadPeriodicSleepSpan", c_uint32),  # milliseconds
    ]


class ConfigurationInfo(Structure):
    """``CUpti_PCSamplingConfigurationInfo``."""

    _fields_ = [("attributeType", c_int), ("attributeStatus", c_int), ("attributeData", _AttributeData)]


class ConfigurationInfoParams(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),
        ("numAttributes", c_size_t),
        ("pPCSamplingConfigurationInfo", POINTER(ConfigurationInfo)),
    ]


class GetDataParams(Structure):
    _fields_ = [("size", c_size_t), ("pPriv", c_void_p), ("ctx", c_void_p), ("pcSamplingData", c_void_p)]


class ContextParams(Structure):
    """Enable, Disable, Start and Stop all take ``{size, pPriv, ctx}``."""

    _fields_ = [("size", c_size_t), ("pPriv", c_void_p), ("ctx", c_void_p)]


class GetNumStallReasonsParams(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),
        ("numStallReasons", POINTER(c_size_t)),
    ]


class GetStallReasonsParams(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),
        ("numStallReasons", c_size_t),
        ("stallReasonIndex", POINTER(c_uint32)),
        ("stallReasons", POINTER(c_char_p)),
    ]


class GetCubinCrcParams(Structure):
    _fields_ = [("size", c_size_t), ("cubinSize", c_size_t), ("cubin", c_void_p), ("cubinCrc", c_uint64)]


class GetSassToSourceCorrelationParams(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("cubin", c_void_p),
        ("functionName", c_char_p),
        ("cubinSize", c_size_t),
        ("lineNumber", c_uint32),
        ("pcOffset", c_uint64),
        ("fileName", c_void_p),  # char*, malloc'ed by CUPTI: the caller frees it
        ("dirName", c_void_p),
    ]


def params_size(struct: type[Structure], last_field: str) -> int:
    """The header's ``CUPTI_PCSAMPLING_STRUCT_SIZE(type, lastfield)``: offset + size of the last field."""
    field = getattr(struct, last_field)
    return int(field.offset + field.size)


# --- loading libcupti -----------------------------------------------------------------------


class CuptiError(Exception):
    """A CUPTI call failed. ``code`` is the ``CUptiResult``; ``call`` the function's name."""

    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call} failed: {text} (CUptiResult {code})")
        self.call = call
        self.code = code


class LibraryNotFoundError(Exception):
    """libcupti could not be found or loaded."""


@cache
def library() -> ctypes.CDLL:
    """libcupti, found with cuda-pathfinder (the installed nvidia-cuda-cupti wheel or CUDA_HOME),
    falling back to the nvidia wheel folder next to this interpreter, then the loader's search path."""
    candidates: list[str] = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        candidates.append(load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception:
        pass
    try:
        import nvidia  # the namespace package of the nvidia-* wheels

        for root in nvidia.__path__:
            for sub in ("cu13/lib", "cuda_cupti/lib"):
                folder = os.path.join(root, sub)
                if os.path.isdir(folder):
                    candidates += sorted(
                        os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("libcupti.so")
                    )
    except ImportError:
        pass
    candidates += ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            errors.append(str(error))
    raise LibraryNotFoundError(
        "libcupti not found; install it with `pip install nvidia-cuda-cupti` (or cupti-python)"
        + (f" ({errors[-1]})" if errors else "")
    )


_fn_lock = threading.Lock()
_fns: dict[str, Any] = {}


def function(name: str) -> Any:
    """The C function ``name`` of libcupti, typed ``CUptiResult f(void*)`` (every PC sampling and SASS
    call takes one params struct). Raises ``CuptiError`` with ``ERROR_NOT_SUPPORTED`` if this libcupti
    is too old to have it."""
    with _fn_lock:
        fn = _fns.get(name)
        if fn is None:
            try:
                fn = getattr(library(), name)
            except AttributeError:
                raise CuptiError(name, ERROR_NOT_SUPPORTED, "not in this libcupti") from None
            fn.argtypes = [c_void_p]
            fn.restype = c_int
            _fns[name] = fn
        return fn


def result_string(code: int) -> str:
    try:
        fn = library().cuptiGetResultString
    except (LibraryNotFoundError, AttributeError):
        return f"CUPTI error {code}"
    fn.argtypes = [c_int, POINTER(c_char_p)]
    fn.restype = c_int
    text = c_char_p()
    if fn(code, ctypes.byref(text)) != SUCCESS or not text.value:
        return f"CUPTI error {code}"
    return text.value.decode(errors="replace")


def call(name: str, params: Structure) -> None:
    """Call ``name(&params)``; raise ``CuptiError`` unless it returns CUPTI_SUCCESS."""
    code = function(name)(ctypes.addressof(params))
    if code != SUCCESS:
        raise CuptiError(name, code, result_string(code))


def call_status(name: str, params: Structure) -> int:
    """Call ``name(&params)`` and return the CUptiResult (for calls whose errors carry meaning)."""
    return int(function(name)(ctypes.addressof(params)))


# --- typed wrappers -------------------------------------------------------------------------


def _ctx_params(ctx: int) -> ContextParams:
    return ContextParams(size=params_size(ContextParams, "ctx"), ctx=ctx)


def enable(ctx: int) -> None:
    call("cuptiPCSamplingEnable", _ctx_params(ctx))


def disable(ctx: int) -> None:
    call("cuptiPCSamplingDisable", _ctx_params(ctx))


def start(ctx: int) -> None:
    call("cuptiPCSamplingStart", _ctx_params(ctx))


def stop(ctx: int) -> None:
    call("cuptiPCSamplingStop", _ctx_params(ctx))


def get_data(ctx: int, data: PCSamplingData) -> int:
    """Fill ``data``; returns the CUptiResult (``ERROR_OUT_OF_MEMORY`` means the hardware buffer filled)."""
    params = GetDataParams(
        size=params_size(GetDataParams, "pcSamplingData"), ctx=ctx, pcSamplingData=ctypes.addressof(data)
    )
    return call_status("cuptiPCSamplingGetData", params)


def set_attributes(ctx: int, infos: list[ConfigurationInfo]) -> None:
    array = (ConfigurationInfo * len(infos))(*infos)
    params = ConfigurationInfoParams(
        size=params_size(ConfigurationInfoParams, "pPCSamplingConfigurationInfo"),
        ctx=ctx,
        numAttributes=len(infos),
        pPCSamplingConfigurationInfo=array,
    )
    code = call_status("cuptiPCSamplingSetConfigurationAttribute", params)
    if code != SUCCESS:
        bad = [
            f"attribute {i.attributeType}: {result_string(i.attributeStatus)}"
            for i in array
            if i.attributeStatus
        ]
        raise CuptiError(
            "cuptiPCSamplingSetConfigurationAttribute", code, "; ".join(bad) or result_string(code)
        )


def attribute(kind: int, **value: Any) -> ConfigurationInfo:
    """One ``ConfigurationInfo``; ``value`` names the union member, e.g. ``samplingPeriod=20``."""
    info = ConfigurationInfo(attributeType=kind)
    for member, v in value.items():
        setattr(info.attributeData, member, v)
    return info


def stall_reasons(ctx: int) -> dict[int, str]:
    """Index -> name of every stall reason this GPU reports
    (e.g. ``smsp__pcsamp_warps_issue_stalled_long_scoreboard``)."""
    count = c_size_t(0)
    call(
        "cuptiPCSamplingGetNumStallReasons",
        GetNumStallReasonsParams(
            size=params_size(GetNumStallReasonsParams, "numStallReasons"),
            ctx=ctx,
            numStallReasons=ctypes.pointer(count),
        ),
    )
    n = count.value
    indexes = (c_uint32 * n)()
    buffers = [ctypes.create_string_buffer(STALL_REASON_STRING_SIZE) for _ in range(n)]
    names = (c_char_p * n)(*[ctypes.cast(b, c_char_p) for b in buffers])
    call(
        "cuptiPCSamplingGetStallReasons",
        GetStallReasonsParams(
            size=params_size(GetStallReasonsParams, "stallReasons"),
            ctx=ctx,
            numStallReasons=n,
            stallReasonIndex=indexes,
            stallReasons=names,
        ),
    )
    return {int(indexes[i]): buffers[i].value.decode(errors="replace") for i in range(n)}


def cubin_crc(cubin: bytes) -> int:
    """CUPTI's CRC of a cubin: the key PC records and module events share."""
    buffer = ctypes.create_string_buffer(cubin, len(cubin))
    return cubin_crc_at(ctypes.addressof(buffer), len(cubin))


def cubin_crc_at(address: int, size: int) -> int:
    """``cubin_crc`` of the ``size`` bytes at ``address`` (e.g. a module callback's ``pCubin``)."""
    params = GetCubinCrcParams(size=params_size(GetCubinCrcParams, "cubinCrc"), cubinSize=size, cubin=address)
    call("cuptiGetCubinCrc", params)
    return int(params.cubinCrc)


@dataclass(frozen=True)
class SourceLine:
    file: str
    directory: str
    line: int


class CubinLines:
    """SASS-to-source lookups in one cubin (``cuptiGetSassToSourceCorrelation``, guide §2.10.5).

    The cubin needs line info (nvcc or NVRTC ``-lineinfo``). The call needs the NVIDIA driver
    library, not a GPU: without libcuda it fails with ``CUPTI_ERROR_UNKNOWN``.
    """

    def __init__(self, cubin: bytes) -> None:
        self._buffer = ctypes.create_string_buffer(cubin, len(cubin))  # one copy, kept for every lookup
        self._size = len(cubin)

    def line(self, function: str, pc_offset: int) -> SourceLine | None:
        """Where ``pc_offset`` of ``function`` comes from; None without line info for it. Raises
        ``CuptiError`` when CUPTI fails (``ERROR_UNKNOWN`` also means "function not in this cubin")."""
        params = GetSassToSourceCorrelationParams(
            size=params_size(GetSassToSourceCorrelationParams, "dirName"),
            cubin=ctypes.addressof(self._buffer),
            functionName=function.encode(),
            cubinSize=self._size,
            pcOffset=pc_offset,
        )
        call("cuptiGetSassToSourceCorrelation", params)
        try:
            if not params.fileName or not params.lineNumber:
                return None
            directory = ctypes.string_at(params.dirName).decode(errors="replace") if params.dirName else ""
            file = ctypes.string_at(params.fileName).decode(errors="replace")
            return SourceLine(file, directory, int(params.lineNumber))
        finally:  # CUPTI mallocs both strings for the caller to free
            for pointer in (params.fileName, params.dirName):
                if pointer:
                    libc_free(pointer)


@cache
def _libc_free() -> Any:
    free = ctypes.CDLL(None).free
    free.argtypes = [c_void_p]
    free.restype = None
    return free


def libc_free(pointer: int) -> None:
    """Free memory CUPTI malloc'ed for us (strings it hands over)."""
    _libc_free()(pointer)


class SamplingBuffer:
    """A ``CUpti_PCSamplingData`` with room for ``num_pcs`` PCs x ``num_stall_reasons`` reasons, kept
    alive (CUPTI holds pointers into it between calls). ``reset()`` before each GetData."""

    def __init__(self, num_pcs: int, num_stall_reasons: int) -> None:
        self.num_pcs = num_pcs
        self.num_stall_reasons = max(1, num_stall_reasons)
        self.pcs = (PCData * num_pcs)()
        self.reasons = (StallReason * (num_pcs * self.num_stall_reasons))()  # one block, a slice per PC
        base = ctypes.addressof(self.reasons)
        stride = self.num_stall_reasons * ctypes.sizeof(StallReason)
        for i, pc in enumerate(self.pcs):
            pc.size = ctypes.sizeof(PCData)
            pc.stallReason = base + i * stride
        self.data = PCSamplingData(
            size=ctypes.sizeof(PCSamplingData), collectNumPcs=num_pcs, pPcData=ctypes.addressof(self.pcs)
        )
        self._used = num_pcs
        self.reset()

    def reset(self) -> None:
        """Restore each written PC's stall-reason capacity (CUPTI overwrote it) and zero the totals."""
        for pc in self.pcs[: max(self._used, self.data.totalNumPcs)]:
            pc.stallReasonCount = self.num_stall_reasons
        self._used = 0
        d = self.data
        d.totalSamples = d.droppedSamples = d.totalNumPcs = d.remainingNumPcs = 0
        d.nonUsrKernelsTotalSamples = d.hardwareBufferFull = 0

    @property
    def address(self) -> int:
        return ctypes.addressof(self.data)
