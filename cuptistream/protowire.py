"""Protobuf wire format, written by hand where building messages would cost too much (OTLP spans)
or where no Python package ships the schema (pprof profiles)."""

from __future__ import annotations


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64: two's complement in ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def field_bytes(field: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes or embedded message)."""
    return tag(field, 2) + varint(len(payload)) + payload


def field_varint(field: int, value: int) -> bytes:
    """An integer field, left out at 0 (proto3's default)."""
    return tag(field, 0) + varint(value) if value else b""


def packed(field: int, values: list[int]) -> bytes:
    """A packed repeated integer field, left out when empty."""
    return field_bytes(field, b"".join(varint(v) for v in values)) if values else b""
