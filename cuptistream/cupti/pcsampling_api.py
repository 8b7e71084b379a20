"""ctypes binding of CUPTI's PC Sampling API (``cupti_pcsampling.h``), which cupti-python does not bind.

Layouts follow the header field for field. The header marks the output structs
``PACKED_ALIGNMENT`` (packed, then aligned to 8); every field there is already naturally aligned,
so ctypes' default layout gives the same offsets and the same array stride (sizeof rounded up to 8).
``tests/test_pc_sampling_structs.py`` checks this against the header with a C compiler.

Every params struct starts with a ``size`` field that CUPTI reads to learn which fields the caller
knows. We set it the way the header's ``*ParamsSize`` macros do (offset of the last field plus its
size), which keeps the binding valid across CUPTI 12.x and 13.x: older libraries accept a larger size
as long as the fields they know sit where they expect them.

Loading libcupti, ``call`` and ``CuptiError`` are ``cupti.library``'s; the result codes and
``CuptiError`` are re-exported here for callers that use this module as the PC sampling namespace.
CUPTI's cubin utilities (CRC, SASS-to-source lines) are in ``cupti.cubin_api``. Nothing here runs at
import time.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, Union, c_char_p, c_int, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p
from typing import Any

from cuptistream.cupti.cubin_api import cubin_crc_at
from cuptistream.cupti.library import (
    ERROR_INVALID_OPERATION,
    ERROR_INVALID_PARAMETER,
    ERROR_NOT_SUPPORTED,
    ERROR_OUT_OF_MEMORY,
    SUCCESS,
    CuptiError,
    call,
    call_status,
    params_size,
)
from cuptistream.cupti.library import result_name as result_string

__all__ = [  # the library names re-exported (see above)
    "ERROR_INVALID_OPERATION", "ERROR_INVALID_PARAMETER", "ERROR_NOT_SUPPORTED", "ERROR_OUT_OF_MEMORY",
    "SUCCESS", "CuptiError", "cubin_crc_at", "result_string",
]  # fmt: skip

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
