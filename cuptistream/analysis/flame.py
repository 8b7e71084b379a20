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

GPU_FILE = "[GPU]"  # the file of the innermost frame: the GPU operation itself
SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def _leaf(work: str) -> Frame:
    return Frame(GPU_FILE, work, 0)


# --- pprof -------------------------------------------------------------------------------------
# profile.proto field numbers (github.com/google/pprof/proto/profile.proto).


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 fields: two's complement, as protobuf writes them
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _packed(number: int, values: Sequence[int]) -> bytes:
    return _field_bytes(number, b"".join(_varint(v) for v in values)) if values else b""


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.index)
        return found


def pprof(stacks: Sequence[StackTime], ranks: dict[int, int] | None = None, *, time_ns: int = 0) -> bytes:
    """A gzip-compressed ``profile.proto`` of ``stacks``; ``ranks`` maps pid -> rank for labels."""
    strings = _Strings()
    functions: dict[tuple[str, str], int] = {}
    locations: dict[Frame, int] = {}
    body = bytearray()
    for type_, unit in (("gpu_time", "nanoseconds"), ("launches", "count")):
        body += _field_bytes(1, _field_int(1, strings(type_)) + _field_int(2, strings(unit)))
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
                    fields = _field_int(1, function) + _field_int(2, name) + _field_int(3, name)
                    function_msgs += _field_bytes(5, fields + _field_int(4, file))
                location = locations[frame] = len(locations) + 1
                line = _field_bytes(4, _field_int(1, function) + _field_int(2, frame.line))
                location_msgs += _field_bytes(4, _field_int(1, location) + line)
            ids.append(location)
        labels = _field_bytes(3, _field_int(1, strings("pid")) + _field_int(3, stack.pid))
        rank = (ranks or {}).get(stack.pid)
        if rank is not None:
            labels += _field_bytes(3, _field_int(1, strings("rank")) + _field_int(3, rank))
        body += _field_bytes(2, _packed(1, ids) + _packed(2, [stack.gpu_ns, stack.launches]) + labels)
    body += location_msgs + function_msgs
    body += b"".join(_field_bytes(6, text.encode()) for text in strings.index)
    body += _field_int(9, time_ns)
    body += _field_bytes(11, _field_int(1, strings("gpu_time")) + _field_int(2, strings("nanoseconds")))
    return gzip.compress(bytes(body), mtime=0)


# --- speedscope --------------------------------------------------------------------------------


def speedscope(stacks: Sequence[StackTime], names: dict[int, str] | None = None) -> dict[str, Any]:
    """A speedscope file of ``stacks``: one weighted profile per process (``names``: pid -> name)."""
    frames: dict[Frame, int] = {}
    shared: list[dict[str, Any]] = []
    by_pid: dict[int, list[StackTime]] = {}
    for stack in stacks:
        by_pid.setdefault(stack.pid, []).append(stack)
    profiles = []
    for pid, rows in sorted(by_pid.items()):
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
            "type": "sampled", "name": (names or {}).get(pid, f"pid {pid}"), "unit": "nanoseconds",
            "startValue": 0, "endValue": sum(weights), "samples": samples, "weights": weights,
        })  # fmt: skip
    return {
        "$schema": SPEEDSCOPE_SCHEMA, "shared": {"frames": shared}, "profiles": profiles,
        "name": "GPU time by code", "activeProfileIndex": 0, "exporter": "cuptistream",
    }  # fmt: skip


def speedscope_text(stacks: Sequence[StackTime], names: dict[int, str] | None = None) -> str:
    return json.dumps(speedscope(stacks, names), separators=(",", ":"))
