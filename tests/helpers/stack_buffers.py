"""The stacks fixture (``tests/fixtures/stacks``, a GPU recording of decoded events) turned back into
what the collector gets from the probe: activity buffers of CUPTI's record layouts (the sizes CUPTI
13.0 wrote: Kernel10, Memcpy6, Memset4, API) with the kernel names as a string table, and the stack
events as the encoded chunks the probe sends. Batch by batch, in the recording's order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cupti import cupti

from cuptistream.cupti.activity_enums import COPY_KINDS, MEMORY_KINDS
from cuptistream.events import ApiCall, Kernel, Memcpy, Memset, StackChanges, StackTable
from cuptistream.recording.codec import Chunk, encode_chunk
from cuptistream.recording.reader import read

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
KERNEL, MEMCPY, MEMSET, DRIVER, RUNTIME = 10, 1, 2, 4, 5
DTYPES = {
    KERNEL: cupti.activity_kernel10_dtype, MEMCPY: cupti.activity_memcpy6_dtype,
    MEMSET: cupti.activity_memset4_dtype, DRIVER: cupti.activity_api_dtype, RUNTIME: cupti.activity_api_dtype,
}  # fmt: skip
STRUCT_SIZES = {kind: dtype.itemsize for kind, dtype in DTYPES.items()}


@dataclass
class Step:
    """One recorded batch: its activity buffer (empty: none) and its stack chunks."""

    buffer: bytes
    stacks: list[Chunk]


class Replay:
    """The fixture's process that launched GPU work: its steps, and the string table its kernel
    name pointers index."""

    def __init__(self, path: Path = CAPTURE) -> None:
        everything = list(read(path).batches())
        pids = {b.resource.pid for b in everything if any(isinstance(e, Kernel) for e in b.events)}
        assert len(pids) == 1, pids
        self.pid = pids.pop()
        self.batches = [b for b in everything if b.resource.pid == self.pid]
        self.resource = self.batches[0].resource
        self.strings: dict[int, str] = {}
        self._pointers: dict[str, int] = {}
        self.steps = [self._step(b.events) for b in self.batches]

    def _pointer(self, name: str) -> int:
        pointer = self._pointers.get(name)
        if pointer is None:
            pointer = self._pointers[name] = 0x1000 + 64 * len(self._pointers)
            self.strings[pointer] = name
        return pointer

    def _step(self, events: list[Any]) -> Step:
        rows: dict[int, list[Any]] = {kind: [] for kind in DTYPES}
        stacks = []
        for e in events:
            if isinstance(e, Kernel):
                rows[KERNEL].append(e)
            elif isinstance(e, Memcpy):
                rows[MEMCPY].append(e)
            elif isinstance(e, Memset):
                rows[MEMSET].append(e)
            elif isinstance(e, ApiCall):
                rows[RUNTIME if e.domain == "runtime" else DRIVER].append(e)
            elif isinstance(e, StackTable | StackChanges):
                stacks.append(encode_chunk([e]))
        parts = [self._records(kind, found).tobytes() for kind, found in rows.items() if found]
        return Step(b"".join(parts), stacks)

    def _records(self, kind: int, events: list[Any]) -> np.ndarray:
        out = np.zeros(len(events), DTYPES[kind])
        out["kind"] = kind
        for column in ("start", "end", "correlation_id"):
            out[column] = [getattr(e, column) for e in events]
        if kind in (DRIVER, RUNTIME):
            out["cbid"] = [e.cbid for e in events]
            out["thread_id"] = [e.thread_id for e in events]
            out["process_id"] = [e.process_id for e in events]
            return out
        out["device_id"] = [e.device_id for e in events]
        out["stream_id"] = [e.stream_id for e in events]
        if kind == KERNEL:
            out["name"] = [self._pointer(e.name) for e in events]
            out["graph_id"] = [e.graph_id for e in events]
        elif kind == MEMCPY:
            out["copy_kind"] = [COPY_KINDS.index(e.copy_kind) for e in events]
            out["bytes"] = [e.bytes for e in events]
        else:
            out["memory_kind"] = [MEMORY_KINDS.index(e.memory_kind) for e in events]
            out["bytes"] = [e.bytes for e in events]
        return out

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)
