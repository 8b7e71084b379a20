"""What the source keeps per sampled CUDA context: ids, stall reasons, buffers, period and window times.
Declarations only; every part of the source reads and writes it under the context's ``lock``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from cuptistream.cupti import pcsampling_api as pcs


@dataclass
class SampledContext:
    """One sampled CUDA context."""

    ctx: int
    device_id: int
    context_id: int
    stall_names: dict[int, str]
    final: pcs.SamplingBuffer  # given to CUPTI as SAMPLING_DATA_BUFFER; Disable fills it
    buffer_shape: tuple[int, int]  # (PCs, stall reasons) per GetData buffer
    period: int
    wanted_period: int  # Adaptation.adapt asks, the next tick sets it
    stall_indexes: Any  # ctypes uint32 array of the selected reasons, kept alive for CUPTI
    lock: threading.Lock = field(default_factory=threading.Lock)
    spare: list[pcs.SamplingBuffer] = field(default_factory=list)  # GetData buffers not in use
    buffers: int = 0  # GetData buffers allocated (at most drain._BUFFERS_PER_CONTEXT)
    enabled: bool = True
    started: bool = False
    window_start: float = 0.0
    window_end: float = 0.0
    next_start: float = 0.0
    next_drain: float = 0.0
