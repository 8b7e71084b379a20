"""Pure-Python decoding of the structs PC sampling (GetData/Disable) and SASS (FlushData) fill.

Decoding never calls CUPTI. It reads memory through a ``Memory``:
- ``LiveMemory`` reads this process's memory (the buffers CUPTI just filled);
- ``RecordingMemory`` does the same and keeps a copy of every byte range and string it read;
- ``SnapshotMemory`` replays such a copy, so CI can decode real GPU output captured once
  (``tests/fixtures/sampling/``) with the exact code the live path runs.
"""

from __future__ import annotations

import base64
import ctypes
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

from cuptistream.cupti.pcsampling_api import PCData, PCSamplingData, StallReason
from cuptistream.cupti.sass_api import InstanceValue, MetricsData
from cuptistream.events import PcSample, SassRecord

# The record layouts (x86-64), read with struct: see PCData, StallReason, MetricsData, InstanceValue.
_PC_DATA = struct.Struct("=QQQIIQQQI4x")  # size, cubinCrc, pcOffset, functionIndex, pad, functionName,
#                                           stallReasonCount, stallReason, correlationId
_STALL_REASON_SIZE = ctypes.sizeof(StallReason)  # (index, samples), two uint32
_SASS_DATA = struct.Struct("=QQIIQI4xQ")  # structSize, pPriv, cubinCrc, functionIndex, functionName,
#                                           pcOffset, pInstanceValues
_INSTANCE_VALUE_SIZE = ctypes.sizeof(InstanceValue)  # (metricId, value), two uint64
assert _PC_DATA.size == ctypes.sizeof(PCData) and _SASS_DATA.size == ctypes.sizeof(MetricsData)


class Memory(Protocol):
    def read(self, address: int, size: int) -> bytes: ...

    def cstring(self, address: int) -> str: ...


class LiveMemory:
    """This process's memory. Only valid for addresses CUPTI or we just filled."""

    def read(self, address: int, size: int) -> bytes:
        return ctypes.string_at(address, size)

    def cstring(self, address: int) -> str:
        return ctypes.string_at(address).decode(errors="replace")


@dataclass
class SnapshotMemory:
    """Byte ranges and C strings captured at known addresses."""

    regions: dict[int, bytes] = field(default_factory=dict)
    strings: dict[int, str] = field(default_factory=dict)

    def read(self, address: int, size: int) -> bytes:
        for start, blob in self.regions.items():
            if start <= address and address + size <= start + len(blob):
                return blob[address - start : address - start + size]
        raise KeyError(f"no captured bytes for {size} bytes at {address:#x}")

    def cstring(self, address: int) -> str:
        return self.strings[address]

    def to_json(self) -> dict[str, Any]:
        return {
            "regions": {f"{a:#x}": base64.b64encode(b).decode() for a, b in self.regions.items()},
            "strings": {f"{a:#x}": s for a, s in self.strings.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotMemory:
        return cls(
            regions={int(a, 16): base64.b64decode(b) for a, b in data["regions"].items()},
            strings={int(a, 16): s for a, s in data["strings"].items()},
        )


class RecordingMemory(SnapshotMemory):
    """Reads live memory and records each read, to be saved as a fixture."""

    def read(self, address: int, size: int) -> bytes:
        blob = ctypes.string_at(address, size)
        self.regions[address] = blob
        return blob

    def cstring(self, address: int) -> str:
        text = ctypes.string_at(address).decode(errors="replace")
        self.strings[address] = text
        return text


# --- PC sampling ----------------------------------------------------------------------------


@dataclass
class PcData:
    """One decoded ``CUpti_PCSamplingData``."""

    range_id: int
    total_samples: int
    dropped_samples: int
    non_user_samples: int
    total_num_pcs: int
    remaining_num_pcs: int
    hardware_buffer_full: bool
    samples: list[PcSample]


def _name(memory: Memory, address: int | None, names: dict[int, str]) -> str:
    if not address:
        return ""
    name = names.get(address)
    if name is None:
        name = names[address] = memory.cstring(address)
    return name


def decode_pc_data(
    memory: Memory, address: int, stall_names: dict[int, str], names: dict[int, str] | None = None
) -> PcData:
    """Decode the ``CUpti_PCSamplingData`` at ``address``.

    ``stall_names`` maps CUPTI's stall-reason index to its name; ``names`` caches function names by
    pointer (CUPTI shares one string per function), so each is read once.
    """
    names = {} if names is None else names
    head = PCSamplingData.from_buffer_copy(memory.read(address, ctypes.sizeof(PCSamplingData)))
    samples: list[PcSample] = []
    count = int(head.totalNumPcs)
    if count and head.pPcData:
        # struct, not ctypes objects: a drain can hold thousands of PCs and this runs with the GIL.
        raw = memory.read(head.pPcData, count * _PC_DATA.size)
        for _, crc, offset, function_index, _, function, n, reasons, _ in _PC_DATA.iter_unpack(raw):
            stalls: dict[str, int] = {}
            if n and reasons:
                pairs = memoryview(memory.read(reasons, n * _STALL_REASON_SIZE)).cast("I")
                for i in range(0, 2 * n, 2):
                    count_here = pairs[i + 1]
                    if count_here:
                        key = stall_names.get(pairs[i]) or str(pairs[i])
                        stalls[key] = stalls.get(key, 0) + count_here
            samples.append(
                PcSample(
                    cubin_crc=crc,
                    function_name=_name(memory, function, names),
                    function_index=function_index,
                    pc_offset=offset,
                    stalls=stalls,
                )
            )
    return PcData(
        range_id=int(head.rangeId),
        total_samples=int(head.totalSamples),
        dropped_samples=int(head.droppedSamples),
        non_user_samples=int(head.nonUsrKernelsTotalSamples),
        total_num_pcs=count,
        remaining_num_pcs=int(head.remainingNumPcs),
        hardware_buffer_full=bool(head.hardwareBufferFull),
        samples=samples,
    )


# --- SASS metrics ---------------------------------------------------------------------------


def decode_sass_records(
    memory: Memory,
    address: int,
    num_records: int,
    num_instances: int,
    metric_names: dict[int, str],
    names: dict[int, str] | None = None,
) -> list[SassRecord]:
    """Decode up to ``num_records`` ``CUpti_SassMetrics_Data`` at ``address`` (entries CUPTI left
    empty, no cubin CRC and no function name, are skipped).

    Each record carries ``num_instances`` (metric id, value) pairs. Records of the same instruction
    (same cubin, function and pc offset) are merged, so a record per metric and a record holding
    several metrics decode alike: ``values[metric] = [value per instance, in instance order]``.
    ``names`` may cache function names by pointer only within one FlushData: its strings are freed
    afterwards and malloc reuses their addresses.
    """
    names = {} if names is None else names
    if not num_records:
        return []
    raw = memory.read(address, num_records * _SASS_DATA.size)
    merged: dict[tuple[int, int, str, int], SassRecord] = {}
    for _, _, crc, function_index, function_pointer, pc_offset, values_at in _SASS_DATA.iter_unpack(raw):
        if not crc and not function_pointer:
            continue  # room CUPTI did not fill: buffers are larger than the records it reported
        function = _name(memory, function_pointer, names)
        key = (crc, function_index, function, pc_offset)
        out = merged.get(key)
        if out is None:
            out = merged[key] = SassRecord(
                cubin_crc=crc, function_name=function, function_index=function_index, pc_offset=pc_offset,
                values={},
            )  # fmt: skip
        if num_instances and values_at:
            pairs = memoryview(memory.read(values_at, num_instances * _INSTANCE_VALUE_SIZE)).cast("Q")
            for i in range(0, 2 * num_instances, 2):
                metric = metric_names.get(pairs[i]) or str(pairs[i])
                out.values.setdefault(metric, []).append(pairs[i + 1])
    return list(merged.values())
