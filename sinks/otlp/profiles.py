"""PC samples → OTLP profiles (the ``profiles`` signal, ``v1development`` in opentelemetry-proto v1.10.0,
wire-identical in v1.11.0; the ``[profiles]`` extra pins the Python package that carries it). The
request's shared tables (``Dictionary``) also carry the source stacks of ``stack_profiles``.

One Profile per drain of a context's PC sampling data (a ``PcSampleBatch``: the sampling window since
the previous drain):

* a Location per (cubin, PC offset): its Mapping is the cubin (``cubin-<crc>`` with the
  ``cuda.cubin.crc`` attribute), its address the PC offset within the function, its Line the
  function (GPU code has no call stack, so every Stack is that one Location);
* a Sample per (PC, stall reason, issued or not), the reason as the ``cuda.pc_sampling.stall_reason``
  attribute (CUPTI's name), ``cuda.pc_sampling.issued`` (see ``split_stalls``), the value the number
  of samples: ``sample_type`` = samples/count, and the values of a drain add up to its samples;
* ``period_type`` = cycles/count and ``period`` = 2^``sampling_period`` (cycles between samples per
  SM), where the event says;
* ``time_unix_nano`` = the previous drain of the same context (epoch ns), ``duration_nano`` up to
  this drain; the first drain of a context has duration 0 and its own time.

A request carries one dictionary (strings, mappings, functions, locations, stacks, attributes) shared
by its profiles; every table starts with its zero value, as the proto requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.profiles.v1development.profiles_pb2 import (
    Function,
    KeyValueAndUnit,
    Line,
    Link,
    Location,
    Mapping,
    Profile,
    ProfilesDictionary,
    ResourceProfiles,
    Sample,
    ScopeProfiles,
    Stack,
    ValueType,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from cuptistream.events import PcSampleBatch

from .common import derive_id

STALL_REASON = "cuda.pc_sampling.stall_reason"
ISSUED = "cuda.pc_sampling.issued"
CUBIN_CRC = "cuda.cubin.crc"
NOT_ISSUED = "_not_issued"


def split_stalls(stalls: dict[str, int]) -> list[tuple[str, bool, int]]:
    """(reason, issued, samples) for one PC, so the values add up to the PC's samples.

    CUPTI counts every sample under its stall reason ``X`` and, when the warp issued no instruction,
    again under ``X_not_issued`` (a subset: summing both would count those samples twice). A
    profile's values are summed by every viewer, so each reason becomes its issued part and its
    not-issued part, told apart by ``cuda.pc_sampling.issued``.
    """
    out = []
    for reason, count in stalls.items():
        if reason.endswith(NOT_ISSUED):
            if count:
                out.append((reason[: -len(NOT_ISSUED)], False, count))
        elif (issued := count - stalls.get(reason + NOT_ISSUED, 0)) > 0:
            out.append((reason, True, issued))
    return out


@dataclass
class Window:
    """One PcSampleBatch with its window resolved to epoch ns."""

    event: PcSampleBatch
    session_id: str
    start_ns: int
    end_ns: int

    def to_profiles(self, tables: Dictionary) -> list[Profile]:
        ev = self.event
        profile = Profile(
            sample_type=tables.value_type("samples", "count"),
            time_unix_nano=self.start_ns,
            duration_nano=self.end_ns - self.start_ns,
            profile_id=derive_id(
                16, self.session_id, "pc", ev.device_id, ev.context_id, ev.range_id, ev.timestamp
            ),
        )
        if ev.sampling_period:
            profile.period_type.CopyFrom(tables.value_type("cycles", "count"))
            profile.period = 1 << ev.sampling_period
        for pc in ev.samples:
            stack = tables.stack(pc.cubin_crc, pc.function_name, pc.pc_offset)
            for reason, issued, count in split_stalls(pc.stalls):
                attributes = [tables.attribute(STALL_REASON, reason), tables.attribute(ISSUED, issued)]
                profile.samples.append(
                    Sample(stack_index=stack, attribute_indices=attributes, values=[count])
                )
        profile.attribute_indices.extend(
            [
                tables.attribute("cuda.device.id", ev.device_id),
                tables.attribute("cuda.context.id", ev.context_id),
            ]
        )
        return [profile]


class ProfileItem(Protocol):
    """What one profiles item (one event) becomes: its profiles, their entries in the shared tables."""

    def to_profiles(self, tables: Dictionary) -> list[Profile]: ...


class Dictionary:
    """The tables of one request, each item once, index 0 the zero value."""

    def __init__(self) -> None:
        self.message = ProfilesDictionary(
            mapping_table=[Mapping()], location_table=[Location()], function_table=[Function()],
            link_table=[Link()], string_table=[""], attribute_table=[KeyValueAndUnit()],
            stack_table=[Stack()],
        )  # fmt: skip
        self._strings: dict[str, int] = {"": 0}
        self._mappings: dict[int, int] = {}
        self._functions: dict[str, int] = {}
        self._pc_stacks: dict[tuple[int, str, int], int] = {}
        self._attributes: dict[tuple[str, object, type], int] = {}
        self._source_functions: dict[tuple[str, str], int] = {}
        self._source_locations: dict[tuple[str, str, int], int] = {}
        self._source_stacks: dict[tuple[int, ...], int] = {}

    def string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self.message.string_table)
            self.message.string_table.append(text)
        return index

    def value_type(self, kind: str, unit: str) -> ValueType:
        return ValueType(type_strindex=self.string(kind), unit_strindex=self.string(unit))

    def attribute(self, key: str, value: str | int | bool) -> int:
        index = self._attributes.get((key, value, type(value)))
        if index is None:
            if isinstance(value, bool):
                any_value = AnyValue(bool_value=value)
            elif isinstance(value, int):
                any_value = AnyValue(int_value=value)
            else:
                any_value = AnyValue(string_value=value)
            index = self._attributes[(key, value, type(value))] = len(self.message.attribute_table)
            entry = KeyValueAndUnit(key_strindex=self.string(key), value=any_value)
            self.message.attribute_table.append(entry)
        return index

    def _mapping(self, cubin_crc: int) -> int:
        index = self._mappings.get(cubin_crc)
        if index is None:
            index = self._mappings[cubin_crc] = len(self.message.mapping_table)
            self.message.mapping_table.append(
                Mapping(
                    filename_strindex=self.string(f"cubin-{cubin_crc:08x}"),
                    attribute_indices=[self.attribute(CUBIN_CRC, cubin_crc)],
                )
            )
        return index

    def _function(self, name: str) -> int:
        index = self._functions.get(name)
        if index is None:
            index = self._functions[name] = len(self.message.function_table)
            text = self.string(name)
            self.message.function_table.append(Function(name_strindex=text, system_name_strindex=text))
        return index

    def stack(self, cubin_crc: int, function: str, pc_offset: int) -> int:
        """The Stack of one PC: one Location."""
        key = (cubin_crc, function, pc_offset)
        index = self._pc_stacks.get(key)
        if index is None:
            location = len(self.message.location_table)
            self.message.location_table.append(
                Location(
                    mapping_index=self._mapping(cubin_crc),
                    address=pc_offset,
                    lines=[Line(function_index=self._function(function))],
                )
            )
            index = self._pc_stacks[key] = len(self.message.stack_table)
            self.message.stack_table.append(Stack(location_indices=[location]))
        return index

    def source_stack(self, frames: Sequence[tuple[str, str, int]]) -> int:
        """The Stack of source frames (file, function, line), innermost first as the proto wants."""
        locations = tuple(self._source_location(*frame) for frame in frames)
        index = self._source_stacks.get(locations)
        if index is None:
            index = self._source_stacks[locations] = len(self.message.stack_table)
            self.message.stack_table.append(Stack(location_indices=locations))
        return index

    def _source_location(self, file: str, function: str, line: int) -> int:
        index = self._source_locations.get((file, function, line))
        if index is None:
            function_index = self._source_functions.get((file, function))
            if function_index is None:
                function_index = self._source_functions[(file, function)] = len(self.message.function_table)
                name = self.string(function)
                self.message.function_table.append(
                    Function(
                        name_strindex=name, system_name_strindex=name, filename_strindex=self.string(file)
                    )
                )
            index = self._source_locations[(file, function, line)] = len(self.message.location_table)
            self.message.location_table.append(
                Location(lines=[Line(function_index=function_index, line=line)])
            )
        return index


def profiles_request(
    groups: Sequence[tuple[Resource, Sequence[ProfileItem]]], scope: InstrumentationScope, schema_url: str
) -> ExportProfilesServiceRequest:
    """One request: a ResourceProfiles per (resource, items) group, one dictionary for all."""
    tables = Dictionary()
    resource_profiles = []
    for resource, items in groups:
        profiles = [profile for item in items for profile in item.to_profiles(tables)]
        resource_profiles.append(
            ResourceProfiles(
                resource=resource,
                scope_profiles=[ScopeProfiles(scope=scope, profiles=profiles, schema_url=schema_url)],
                schema_url=schema_url,
            )
        )
    return ExportProfilesServiceRequest(resource_profiles=resource_profiles, dictionary=tables.message)
