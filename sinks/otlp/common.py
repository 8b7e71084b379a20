"""Pieces every OTLP signal shares: attribute values, the Resource, and deterministic ids.

Attribute names follow the OpenTelemetry semantic conventions of ``SEMCONV_VERSION`` where they have
one (service, process, host, hw, telemetry); what they lack lives under ``cuda.*``, ``nvtx.*``,
``job.*`` and ``cuptistream.*`` (docs/otlp.md lists every name).
"""

from __future__ import annotations

import hashlib
import shlex
import uuid
from collections.abc import Mapping
from functools import cache

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceProto

from cuptistream.events import Batch

AttrValue = str | bool | int | float | list[str]

SEMCONV_VERSION = "1.44.0"  # the names in tests/semconv/names.txt
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SDK_NAME = "cuptistream"

# Job environment variables with an OpenTelemetry semantic-convention name; others become job.<name>.
_JOB_SEMCONV = {"KUBERNETES_POD_NAME": "k8s.pod.name", "SLURM_JOB_ID": "job.slurm.id"}
# service.instance.id: a UUID v5 (as the conventions recommend) of the session and the process.
_INSTANCE_NAMESPACE = uuid.UUID("0c7b5b0e-5f57-4b8e-9a49-3f1d3c2a6c10")


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


def resource_attributes(batch: Batch, overrides: Mapping[str, str] = {}) -> dict[str, AttrValue]:
    """The Resource of every request for one observed process: who produced the telemetry.

    Precedence: what is derived here < ``overrides`` (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME)
    < the config's ``session.attributes``.
    """
    res = batch.resource
    attrs: dict[str, AttrValue] = {
        # The SDK rule for an unnamed service, with the observed program's executable.
        "service.name": f"unknown_service:{res.process_name}" if res.process_name else "unknown_service",
        "service.instance.id": instance_id(batch.session_id, res.host, res.pid),
        "telemetry.sdk.name": SDK_NAME,
        "telemetry.sdk.language": "python",
        "telemetry.sdk.version": sdk_version(),
        "host.name": res.host,
        "process.pid": res.pid,
        "process.executable.name": res.process_name,
    }
    if res.ppid:
        attrs["process.parent_pid"] = res.ppid
    if res.command_line:  # empty unless session.command_line is on: it can carry secrets
        attrs["process.command_line"] = shlex.join(res.command_line)
        attrs["process.command_args"] = list(res.command_line)
    for name, value in res.job.items():
        attrs[_JOB_SEMCONV.get(name, "job." + name.lower())] = value
    # The conventions have no rank: job.* (docs/otlp.md), as integers, whichever launcher set them.
    for key in ("rank", "local_rank", "world_size"):
        number: int | None = getattr(res, key, None)
        if number is not None:
            attrs["job." + key] = number
    if res.devices:  # hw.* has no list of a process's GPUs
        attrs["cuda.device.uuids"] = [d.uuid for d in res.devices]
        attrs["cuda.device.names"] = [d.name for d in res.devices]
    attrs["cuptistream.session.id"] = batch.session_id
    attrs["cuptistream.schema_version"] = batch.schema_version
    attrs.update(overrides)
    attrs.update(batch.attributes)  # the user's session attributes win, service.name included
    return attrs


def instance_id(session_id: str, host: str, pid: int) -> str:
    return str(uuid.uuid5(_INSTANCE_NAMESPACE, f"{session_id}/{host}/{pid}"))


def resource(batch: Batch, overrides: Mapping[str, str] = {}) -> ResourceProto:
    return ResourceProto(attributes=key_values(resource_attributes(batch, overrides)))


@cache
def sdk_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuptistream")
    except PackageNotFoundError:
        return ""


@cache
def scope(name: str) -> InstrumentationScope:
    return InstrumentationScope(name=name, version=sdk_version())


def derive_id(size: int, session_id: str, *parts: object) -> bytes:
    """A ``size``-byte id that depends only on the session and ``parts``: resending the same events
    yields the same trace and span ids, so a backend deduplicates instead of showing copies."""
    text = "\x1f".join([session_id, *map(str, parts)])
    digest = hashlib.blake2b(text.encode(), digest_size=size).digest()
    return digest if any(digest) else b"\x01" + digest[1:]  # all-zero ids are invalid in OTLP
