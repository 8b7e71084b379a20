"""Pieces every OTLP signal shares: attribute values, the Resource, and deterministic ids."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from functools import cache

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceProto

from cuptistream.events import Batch

AttrValue = str | bool | int | float | list[str]

# Job environment variables with an OpenTelemetry semantic-convention name; others become job.<name>.
_JOB_SEMCONV = {"KUBERNETES_POD_NAME": "k8s.pod.name", "SLURM_JOB_ID": "job.slurm.id", "RANK": "job.rank"}


def any_value(value: AttrValue) -> AnyValue:
    if isinstance(value, bool):  # before int: bool is an int
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value]))
    return AnyValue(string_value=value)


def key_values(attributes: Mapping[str, AttrValue | None]) -> list[KeyValue]:
    """KeyValues for every attribute that is not None, in the mapping's order."""
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items() if v is not None]


def resource_attributes(batch: Batch) -> dict[str, AttrValue]:
    """The Resource of every request for a session: who produced the telemetry."""
    res = batch.resource
    attrs: dict[str, AttrValue] = {
        "service.name": f"unknown_service:{res.process_name}",
        "host.name": res.host,
        "process.pid": res.pid,
        "process.executable.name": res.process_name,
        "process.command_line": shlex.join(res.command_line),
        "process.command_args": list(res.command_line),
        "telemetry.sdk.name": "cuptistream",
        "telemetry.sdk.language": "python",
        "cuptistream.session.id": batch.session_id,
        "cuptistream.schema_version": batch.schema_version,
    }
    if res.devices:
        attrs["hw.gpu.uuids"] = [d.uuid for d in res.devices]
        attrs["hw.gpu.names"] = [d.name for d in res.devices]
    for name, value in res.job.items():
        attrs[_JOB_SEMCONV.get(name, "job." + name.lower())] = value
    attrs.update(batch.attributes)  # the user's session attributes win, service.name included
    return attrs


def resource(batch: Batch) -> ResourceProto:
    return ResourceProto(attributes=key_values(resource_attributes(batch)))


@cache
def scope(name: str) -> InstrumentationScope:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("cuptistream")
    except PackageNotFoundError:
        ver = ""
    return InstrumentationScope(name=name, version=ver)


def derive_id(size: int, session_id: str, *parts: object) -> bytes:
    """A ``size``-byte id that depends only on the session and ``parts``: resending the same events
    yields the same trace and span ids, so a backend deduplicates instead of showing copies."""
    text = "\x1f".join([session_id, *map(str, parts)])
    digest = hashlib.blake2b(text.encode(), digest_size=size).digest()
    return digest if any(digest) else b"\x01" + digest[1:]  # all-zero ids are invalid in OTLP
