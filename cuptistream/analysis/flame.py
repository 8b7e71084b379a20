"""``cuptistream flame``: GPU time by the code that launched it, as a flame graph file.

Two formats people already open:

- **pprof** (``profile.proto``, gzip-compressed): ``go tool pprof``, Pyroscope, Grafana, Parca.
  Sample values are GPU time (ns) and launches; each sample's stack is the launching Python stack
  with the GPU operation (kernel name, ``[memcpy HtoD]``, ``[memset]``) as its innermost frame, and
  labels ``pid`` and ``rank``.
- **speedscope** (JSON, https://www.speedscope.app/file-format-schema.json): one weighted profile
  per process, in nanoseconds.

The stacks come from ``cuptistream.analysis.stacks``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from typing import Any

from cuptistream.analysis.stacks import Frame, StackTime
from cuptistream.protowire import field_bytes, field_varint, packed

GPU_FILE = "[GPU]"  # the file of the innermost frame: the GPU operation itself
SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def _leaf(work: str) -> Frame:
    return Frame(GPU_FILE, work, 0)


# --- pprof -------------------------------------------------------------------------------------
# profile.proto field numbers (github.com/google/pprof/proto/profile.proto).


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.index)
        return found


def pprof(stacks: Sequence[StackTime], ranks: dict[tuple[str, int], int] | None = None) -> bytes:
    """A gzip-compressed ``profile.proto`` of ``stacks``; ``ranks`` maps (host, pid) -> rank for labels."""
    strings = _Strings()
    functions: dict[tuple[str, str], int] = {}
    locations: dict[Frame, int] = {}
    body = bytearray()
    for type_, unit in (("gpu_time", "nanoseconds"), ("launches", "count")):
        body += field_bytes(1, field_varint(1, strings(type_)) + field_varint(2, strings(unit)))
    function_msgs = bytearray()
    location_msgs = bytearray()
    for stack in stacks:
        ids = []
        for frame in (_leaf(stack.work), *reversed(stack.frames)):  # pprof: innermost first
            location = locations.get(frame)
            if location is None:
                key = (frame.function, frame.file)
                function = functions.get(key)
                if function is None:
                    function = functions[key] = len(functions) + 1
                    name, file = strings(frame.function), strings(frame.file)
                    fields = field_varint(1, function) + field_varint(2, name) + field_varint(3, name)
                    function_msgs += field_bytes(5, fields + field_varint(4, file))
                location = locations[frame] = len(locations) + 1
                line = field_bytes(4, field_varint(1, function) + field_varint(2, frame.line))
                location_msgs += field_bytes(4, field_varint(1, location) + line)
            ids.append(location)
        labels = field_bytes(3, field_varint(1, strings("pid")) + field_varint(3, stack.pid))
        rank = (ranks or {}).get((stack.host, stack.pid))
        if rank is not None:
            labels += field_bytes(3, field_varint(1, strings("rank")) + field_varint(3, rank))
        body += field_bytes(2, packed(1, ids) + packed(2, [stack.gpu_ns, stack.launches]) + labels)
    body += location_msgs + function_msgs
    body += b"".join(field_bytes(6, text.encode()) for text in strings.index)
    body += field_bytes(11, field_varint(1, strings("gpu_time")) + field_varint(2, strings("nanoseconds")))
    return gzip.compress(bytes(body), mtime=0)


# --- speedscope --------------------------------------------------------------------------------


def speedscope(
    stacks: Sequence[StackTime], names: dict[tuple[str, int], str] | None = None
) -> dict[str, Any]:
    """A speedscope file of ``stacks``: one weighted profile per process (``names``: (host, pid) ->
    name)."""
    frames: dict[Frame, int] = {}
    shared: list[dict[str, Any]] = []
    by_process: dict[tuple[str, int], list[StackTime]] = {}
    for stack in stacks:
        by_process.setdefault((stack.host, stack.pid), []).append(stack)
    profiles = []
    for process, rows in sorted(by_process.items()):
        samples, weights = [], []
        for stack in rows:
            ids = []
            for frame in (*stack.frames, _leaf(stack.work)):  # speedscope: outermost first
                index = frames.get(frame)
                if index is None:
                    index = frames[frame] = len(shared)
                    entry: dict[str, Any] = {"name": frame.function}
                    if not frame.synthetic and frame.file != GPU_FILE:
                        entry.update(file=frame.file, line=frame.line)
                    shared.append(entry)
                ids.append(index)
            samples.append(ids)
            weights.append(stack.gpu_ns)
        profiles.append({
            "type": "sampled", "name": (names or {}).get(process, f"pid {process[1]}"), "unit": "nanoseconds",
            "startValue": 0, "endValue": sum(weights), "samples": samples, "weights": weights,
        })  # fmt: skip
    return {
        "$schema": SPEEDSCOPE_SCHEMA, "shared": {"frames": shared}, "profiles": profiles,
        "name": "GPU time by code", "activeProfileIndex": 0, "exporter": "cuptistream",
    }  # fmt: skip


def speedscope_text(stacks: Sequence[StackTime], names: dict[tuple[str, int], str] | None = None) -> str:
    return json.dumps(speedscope(stacks, names), separators=(",", ":"))
