"""GPU time by the code that launched it (``StackStats``) → OTLP profiles, beside the PC samples.

Each ``StackStats`` event (one interval, device and process) becomes profiles over the interval
(epoch ns through the batch's clock), one per value, each a Sample per row of the event:

* ``gpu_time``/``nanoseconds`` and ``launches``/``count``: what was traced;
* where the interval was traced in part (budget windows), ``gpu_time_estimated`` and
  ``launches_estimated`` too, scaled to the whole interval. They are profiles of their own type,
  never summed with the measured ones, as the statistics' estimated metrics are separate metrics.

A row's Stack is its source frames, innermost first (``StackTable`` sends them outermost first),
each a Location with one Line (function, file, line). Rows the process's table cannot name (the
``StackStats`` ids below 1, or a table lost with its batch) get one frame that says so. The sink
keeps each process's frames and stacks (``StackFrames``) as long as it keeps the process: at most
the probe's ``stacks.max_table_bytes`` each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.proto.profiles.v1development.profiles_pb2 import Profile, Sample

from cuptistream.events import StackStats, StackTable
from cuptistream.stacks.index import (
    NO_PYTHON_ID,
    NO_PYTHON_STACK,
    NO_STACK_RECORDED,
    NONE_RECORDED,
    OTHER_STACK,
)
from cuptistream.stacks.sampler import SYNTHETIC_FILE

from .common import derive_id
from .profiles import Dictionary

# StackStats' ids below 1 (cuptistream.events.StackStats).
_UNNAMED = {NONE_RECORDED: NO_STACK_RECORDED, NO_PYTHON_ID: NO_PYTHON_STACK, OTHER_STACK: "other"}
_UNKNOWN = "[stack not in the table]"
Frames = tuple[tuple[str, str, int], ...]  # (file, function, line), innermost first


@dataclass
class StackFrames:
    """One process's interned frames and stacks, from its ``StackTable`` events."""

    frames: dict[int, tuple[str, str, int]] = field(default_factory=dict)
    stacks: dict[int, Frames] = field(default_factory=dict)

    def add(self, table: StackTable) -> None:
        for frame_id, file, function, line in zip(
            table.frame_ids, table.files, table.functions, table.lines, strict=False
        ):
            self.frames[frame_id] = (file, function, line)
        for stack_id, frame_ids in zip(table.stack_ids, table.stacks, strict=False):
            unknown = (SYNTHETIC_FILE, _UNKNOWN, 0)
            self.stacks[stack_id] = tuple(self.frames.get(f, unknown) for f in reversed(frame_ids))

    def frames_of(self, stack_id: int) -> Frames:
        if stack_id in _UNNAMED:
            return ((SYNTHETIC_FILE, _UNNAMED[stack_id], 0),)
        return self.stacks.get(stack_id) or ((SYNTHETIC_FILE, _UNKNOWN, 0),)


@dataclass
class StackWindow:
    """One StackStats event with its interval in epoch ns and its process's frames."""

    event: StackStats
    frames: StackFrames
    session_id: str
    start_ns: int
    end_ns: int

    def to_profiles(self, tables: Dictionary) -> list[Profile]:
        ev = self.event
        values: list[tuple[str, str, list[int]]] = [
            ("gpu_time", "nanoseconds", ev.gpu_ns),
            ("launches", "count", ev.launches),
        ]
        if ev.estimated:
            values += [
                ("gpu_time_estimated", "nanoseconds", ev.estimated_gpu_ns),
                ("launches_estimated", "count", ev.estimated_launches),
            ]
        stacks = [tables.source_stack(self.frames.frames_of(stack_id)) for stack_id in ev.stack_ids]
        attributes = [tables.attribute("cuda.device.id", ev.device_id)]
        ids = (ev.device_id, ev.process_id, ev.interval_start)
        profiles = []
        for kind, unit, column in values:
            profile = Profile(
                sample_type=tables.value_type(kind, unit),
                time_unix_nano=self.start_ns,
                duration_nano=self.end_ns - self.start_ns,
                profile_id=derive_id(16, self.session_id, kind, *ids),
                attribute_indices=attributes,
            )
            profile.samples.extend(
                Sample(stack_index=stack, values=[value])
                for stack, value in zip(stacks, column, strict=False)
                if value
            )
            profiles.append(profile)
        return profiles
