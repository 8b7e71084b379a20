"""pprof's ``profile.proto`` (github.com/google/pprof, package ``perftools.profiles``) as protobuf
message classes, so the tests decode ``cuptistream flame``'s output with the protobuf runtime
rather than with our own encoder's inverse.

No Python package ships the generated module and ``go tool pprof`` cannot be installed on the test
machines, so the descriptor is built here from the published field names and numbers.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_I64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_U64 = descriptor_pb2.FieldDescriptorProto.TYPE_UINT64
_STR = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_MSG = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_REP = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_OPT = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL

# message -> [(field, number, type, repeated, message type)]
_MESSAGES: dict[str, list[tuple[str, int, int, bool, str]]] = {
    "Profile": [
        ("sample_type", 1, _MSG, True, "ValueType"), ("sample", 2, _MSG, True, "Sample"),
        ("mapping", 3, _MSG, True, "Mapping"), ("location", 4, _MSG, True, "Location"),
        ("function", 5, _MSG, True, "Function"), ("string_table", 6, _STR, True, ""),
        ("drop_frames", 7, _I64, False, ""), ("keep_frames", 8, _I64, False, ""),
        ("time_nanos", 9, _I64, False, ""), ("duration_nanos", 10, _I64, False, ""),
        ("period_type", 11, _MSG, False, "ValueType"), ("period", 12, _I64, False, ""),
        ("comment", 13, _I64, True, ""), ("default_sample_type", 14, _I64, False, ""),
    ],
    "ValueType": [("type", 1, _I64, False, ""), ("unit", 2, _I64, False, "")],
    "Sample": [
        ("location_id", 1, _U64, True, ""), ("value", 2, _I64, True, ""), ("label", 3, _MSG, True, "Label"),
    ],
    "Label": [("key", 1, _I64, False, ""), ("str", 2, _I64, False, ""), ("num", 3, _I64, False, ""),
              ("num_unit", 4, _I64, False, "")],
    "Mapping": [
        ("id", 1, _U64, False, ""), ("memory_start", 2, _U64, False, ""), ("memory_limit", 3, _U64, False, ""),
        ("file_offset", 4, _U64, False, ""), ("filename", 5, _I64, False, ""), ("build_id", 6, _I64, False, ""),
    ],
    "Location": [
        ("id", 1, _U64, False, ""), ("mapping_id", 2, _U64, False, ""), ("address", 3, _U64, False, ""),
        ("line", 4, _MSG, True, "Line"), ("is_folded", 5, _BOOL, False, ""),
    ],
    "Line": [("function_id", 1, _U64, False, ""), ("line", 2, _I64, False, ""), ("column", 3, _I64, False, "")],
    "Function": [
        ("id", 1, _U64, False, ""), ("name", 2, _I64, False, ""), ("system_name", 3, _I64, False, ""),
        ("filename", 4, _I64, False, ""), ("start_line", 5, _I64, False, ""),
    ],
}  # fmt: skip


def profile_class() -> Any:
    """The ``perftools.profiles.Profile`` message class."""
    file = descriptor_pb2.FileDescriptorProto(
        name="cuptistream_test_profile.proto", package="perftools.profiles"
    )
    file.syntax = "proto3"
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind, repeated, type_name in fields:
            entry = message.field.add(name=field, number=number, type=kind, label=_REP if repeated else _OPT)
            if type_name:
                entry.type_name = f".perftools.profiles.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("perftools.profiles.Profile"))
