"""ctypes binding of CUPTI's SASS Metrics API (``cupti_sass_metrics.h``), which cupti-python does not bind.

Layouts follow the header (natural alignment; no packing there). Each params struct's ``structSize``
is set as the header's ``*_STRUCT_SIZE`` macro computes it: offset plus size of the field the macro
names. For ``CUpti_SassMetricsFlushData_Params`` the header's macro names ``numOfInstances``, not the
last field ``pMetricsData``; we copy that faithfully.

Loading libcupti, ``call`` and ``CuptiError`` are ``cupti.library``'s.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_char_p, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

from cuptistream.cupti.library import CuptiError, call, libc_free, params_size

GRANULARITY = {"gpu": 0, "sm": 1, "smsp": 2}


class MetricDetails(Structure):
    _fields_ = [("metricId", c_uint64), ("pMetricName", c_char_p), ("pMetricDescription", c_char_p)]


class GetNumOfMetricsParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pChipName", c_char_p),
        ("numOfMetrics", c_size_t),
    ]


class GetMetricsParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pChipName", c_char_p),
        ("numOfMetrics", c_size_t),
        ("pMetricsList", c_void_p),  # CUpti_SassMetrics_MetricDetails*
    ]


class GetPropertiesParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pChipName", c_char_p),
        ("pMetricName", c_char_p),
        ("metric", MetricDetails),
    ]


class MetricConfig(Structure):
    """``CUpti_SassMetrics_Config``."""

    _fields_ = [("metricId", c_uint64), ("outputGranularity", c_uint8)]


class SetConfigParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("numOfMetricConfig", c_size_t),
        ("pConfigs", c_void_p),  # CUpti_SassMetrics_Config*
        ("deviceIndex", c_uint32),
    ]


class UnsetConfigParams(Structure):
    _fields_ = [("structSize", c_size_t), ("pPriv", c_void_p), ("deviceIndex", c_uint32)]


class EnableParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),
        ("enableLazyPatching", c_uint8),
    ]


class DisableParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),
        ("numOfDroppedRecords", c_size_t),
    ]


class GetDataPropertiesParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),
        ("numOfPatchedInstructionRecords", c_size_t),
        ("numOfInstances", c_size_t),
    ]


class InstanceValue(Structure):
    """``CUpti_SassMetrics_InstanceValue``: one metric's value on one instance (GPU, SM or SMSP)."""

    _fields_ = [("metricId", c_uint64), ("value", c_uint64)]


class MetricsData(Structure):
    """``CUpti_SassMetrics_Data``: one patched instruction. Note the 32-bit ``cubinCrc`` (the PC
    sampling records carry 64 bits)."""

    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("cubinCrc", c_uint32),
        ("functionIndex", c_uint32),
        ("functionName", c_void_p),  # char*, malloc'ed by CUPTI for each record: the caller frees it
        ("pcOffset", c_uint32),
        ("pInstanceValues", c_void_p),  # CUpti_SassMetrics_InstanceValue*
    ]


class FlushDataParams(Structure):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),
        ("numOfPatchedInstructionRecords", c_size_t),
        ("numOfInstances", c_size_t),
        ("pMetricsData", c_void_p),  # CUpti_SassMetrics_Data*
    ]


class ChipNameParams(Structure):
    """``CUpti_Device_GetChipName_Params`` (cupti_target.h)."""

    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("deviceIndex", c_size_t),
        ("pChipName", c_char_p),
    ]


class ProfilerInitializeParams(Structure):
    """``CUpti_Profiler_Initialize_Params`` (cupti_profiler_target.h)."""

    _fields_ = [("structSize", c_size_t), ("pPriv", c_void_p)]


# --- typed wrappers -------------------------------------------------------------------------


def profiler_initialize() -> None:
    """``cuptiProfilerInitialize``: the SASS sample calls it before anything else. Idempotent in CUPTI."""
    call(
        "cuptiProfilerInitialize",
        ProfilerInitializeParams(structSize=params_size(ProfilerInitializeParams, "pPriv")),
    )


def profiler_deinitialize() -> None:
    """``cuptiProfilerDeInitialize``: releases the profiler state ``profiler_initialize`` set up."""
    call(
        "cuptiProfilerDeInitialize",
        ProfilerInitializeParams(structSize=params_size(ProfilerInitializeParams, "pPriv")),
    )


def chip_name(device_index: int) -> str:
    params = ChipNameParams(structSize=params_size(ChipNameParams, "pChipName"), deviceIndex=device_index)
    call("cuptiDeviceGetChipName", params)
    return (params.pChipName or b"").decode()


def metrics(chip: str) -> dict[str, tuple[int, str]]:
    """Every SASS metric of ``chip``: name → (metric id, description)."""
    chip_b = chip.encode()
    num = GetNumOfMetricsParams(
        structSize=params_size(GetNumOfMetricsParams, "numOfMetrics"), pChipName=chip_b
    )
    call("cuptiSassMetricsGetNumOfMetrics", num)
    details = (MetricDetails * num.numOfMetrics)()
    call(
        "cuptiSassMetricsGetMetrics",
        GetMetricsParams(
            structSize=params_size(GetMetricsParams, "pMetricsList"),
            pChipName=chip_b,
            numOfMetrics=num.numOfMetrics,
            pMetricsList=ctypes.addressof(details),
        ),
    )
    return {
        (d.pMetricName or b"").decode(): (int(d.metricId), (d.pMetricDescription or b"").decode())
        for d in details
    }


def set_config(device_index: int, configs: list[tuple[int, int]]) -> None:
    """``configs``: (metric id, granularity) pairs."""
    array = (MetricConfig * len(configs))(
        *[MetricConfig(metricId=m, outputGranularity=g) for m, g in configs]
    )
    call(
        "cuptiSassMetricsSetConfig",
        SetConfigParams(
            structSize=params_size(SetConfigParams, "deviceIndex"),
            numOfMetricConfig=len(configs),
            pConfigs=ctypes.addressof(array),
            deviceIndex=device_index,
        ),
    )


def unset_config(device_index: int) -> None:
    call(
        "cuptiSassMetricsUnsetConfig",
        UnsetConfigParams(structSize=params_size(UnsetConfigParams, "deviceIndex"), deviceIndex=device_index),
    )


def enable(ctx: int, lazy_patching: bool) -> None:
    call(
        "cuptiSassMetricsEnable",
        EnableParams(
            structSize=params_size(EnableParams, "enableLazyPatching"),
            ctx=ctx,
            enableLazyPatching=int(lazy_patching),
        ),
    )


def disable(ctx: int) -> int:
    """Ends the window; returns the number of records CUPTI dropped (not flushed before disable)."""
    params = DisableParams(structSize=params_size(DisableParams, "numOfDroppedRecords"), ctx=ctx)
    call("cuptiSassMetricsDisable", params)
    return int(params.numOfDroppedRecords)


def data_properties(ctx: int) -> tuple[int, int]:
    """(patched instruction records, instances per record) collected so far in this window."""
    params = GetDataPropertiesParams(
        structSize=params_size(GetDataPropertiesParams, "numOfInstances"), ctx=ctx
    )
    call("cuptiSassMetricsGetDataProperties", params)
    return int(params.numOfPatchedInstructionRecords), int(params.numOfInstances)


# Kernels the program launches between GetDataProperties and FlushData are patched too and add
# records. A buffer sized to the query is outgrown under a busy program (a torch transformer):
# FlushData then returns CUPTI_ERROR_OUT_OF_MEMORY with the heap corrupt, and the process
# segfaults. Four times the room holds it.
FLUSH_HEADROOM = 4
FLUSH_MIN_EXTRA = 1024
FLUSH_MAX_BYTES = 256 << 20


def flush_capacity(records: int, instances: int) -> int:
    """Records a FlushData buffer holds: ``FLUSH_HEADROOM`` times what GetDataProperties reported (at
    least ``FLUSH_MIN_EXTRA`` more), within ``FLUSH_MAX_BYTES``; never fewer than ``records``."""
    per_record = ctypes.sizeof(MetricsData) + instances * ctypes.sizeof(InstanceValue)
    wanted = max(records * FLUSH_HEADROOM, records + FLUSH_MIN_EXTRA)
    return max(records, min(wanted, FLUSH_MAX_BYTES // per_record))


class FlushBuffer:
    """Room for ``records`` x ``instances`` values, laid out as FlushData expects."""

    def __init__(self, records: int, instances: int) -> None:
        self.records = records
        self.instances = instances
        self.data = (MetricsData * records)()
        self.values = (InstanceValue * (records * instances))()  # one block, a slice per record
        base = ctypes.addressof(self.values)
        stride = instances * ctypes.sizeof(InstanceValue)
        # The header says "equal to CUpti_SassMetricsFlushData_Params_STRUCT_SIZE" for structSize;
        # NVIDIA's sample leaves it unset, so CUPTI does not appear to read it.
        struct_size = params_size(FlushDataParams, "numOfInstances")
        for i, record in enumerate(self.data):
            record.structSize = struct_size
            record.pInstanceValues = base + i * stride

    @property
    def address(self) -> int:
        return ctypes.addressof(self.data)


def flush(ctx: int, buffer: FlushBuffer) -> None:
    call(
        "cuptiSassMetricsFlushData",
        FlushDataParams(
            structSize=params_size(FlushDataParams, "numOfInstances"),
            ctx=ctx,
            numOfPatchedInstructionRecords=buffer.records,
            numOfInstances=buffer.instances,
            pMetricsData=buffer.address,
        ),
    )


def free_function_names(buffer: FlushBuffer) -> None:
    """FlushData mallocs each record's ``functionName``; NVIDIA's sample frees them. Call once decoded."""
    for record in buffer.data:
        if record.functionName:
            libc_free(record.functionName)
            record.functionName = None


__all__ = ["GRANULARITY", "CuptiError", "FlushBuffer"]
