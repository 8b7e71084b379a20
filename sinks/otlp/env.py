"""The OTLP sink's effective settings per signal: its config keys, else the standard ``OTEL_*`` variables.

Precedence, per setting: a config key (``traces_endpoint`` before ``endpoint``) > the signal's variable
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, used as is) > the general one (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``/v1/<signal>`` appended for HTTP) > the default. Headers merge per name, config winning. Header
values are secrets: no message built here ever contains one.

The variables follow the OpenTelemetry specification ("OTLP Exporter Configuration"): timeouts in
milliseconds, headers as ``name=value`` pairs (percent-encoded values) separated by commas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast, get_args
from urllib.parse import unquote, urlsplit

Signal = Literal["traces", "metrics", "logs", "profiles"]
Protocol = Literal["http/protobuf", "http/json", "grpc"]
Compression = Literal["gzip", "none"]
SIGNAL_PATHS: dict[Signal, str] = {
    "traces": "/v1/traces",
    "metrics": "/v1/metrics",
    "logs": "/v1/logs",
    "profiles": "/v1development/profiles",  # the path the OTLP specification gives the alpha signal
}
DEFAULT_TIMEOUT_S = 10.0

_PREFIX = "OTEL_EXPORTER_OTLP_"


@dataclass(frozen=True)
class ConfigKeys:
    """What the YAML said for one signal (None: not set there)."""

    endpoint: str | None  # base URL
    signal_endpoint: str | None  # full URL for this signal
    protocol: Protocol | None
    compression: Compression | None
    timeout: float | None
    headers: Mapping[str, str]


@dataclass(frozen=True)
class SignalSettings:
    url: str  # HTTP: the full URL to POST to; gRPC: scheme://host:port (http means no TLS)
    protocol: Protocol
    compression: Compression
    timeout: float  # seconds, one request
    headers: dict[str, str]  # from OTEL_EXPORTER_OTLP_*HEADERS only; the config's are added at open


def _var(environ: Mapping[str, str], signal: Signal, name: str) -> tuple[str, str] | None:
    """(variable name, value) of the signal's variable, else the general one, if set and not blank."""
    for var in (f"{_PREFIX}{signal.upper()}_{name}", f"{_PREFIX}{name}"):
        value = environ.get(var, "").strip()
        if value:
            return f"the environment variable {var}", value
    return None


def check_url(url: str, where: str) -> None:
    """Raise ValueError (one line, naming ``where``) unless ``url`` is http(s)://host[:port]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: expected a URL like http://127.0.0.1:4318, got {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a non-numeric port
    except ValueError:
        raise ValueError(f"{where}: the port in {url!r} is not a number") from None


def parse_headers(value: str, var: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (values percent-encoded). Errors name the variable and the pair's position,
    never its content: the values are credentials."""
    headers: dict[str, str] = {}
    for position, pair in enumerate(value.split(","), 1):
        if not pair.strip():
            continue
        name, sep, raw = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{var}: entry {position} is not name=value; use k1=v1,k2=v2")
        headers[unquote(name.strip())] = unquote(raw.strip())
    return headers


def _one_of(
    configured: str | None,
    environ: Mapping[str, str],
    signal: Signal,
    name: str,
    allowed: tuple[str, ...],
    expected: str,
) -> str:
    """The config key if set, else the ``OTEL_*`` variable (checked against ``allowed``), else the
    first of ``allowed`` (the default)."""
    if configured is not None:
        return configured
    if found := _var(environ, signal, name):
        var, value = found
        if value not in allowed:
            raise ValueError(f"{var}: expected {expected}, got {value!r}")
        return value
    return allowed[0]


def effective(keys: ConfigKeys, signal: Signal, environ: Mapping[str, str]) -> SignalSettings:
    """The settings ``signal`` is sent with. Raises ValueError naming the key or variable at fault."""
    protocol = cast(Protocol, _one_of(
        keys.protocol, environ, signal, "PROTOCOL", get_args(Protocol), "grpc, http/protobuf or http/json"
    ))  # fmt: skip

    if keys.signal_endpoint:
        url, where = keys.signal_endpoint, f"{signal}_endpoint"
    elif keys.endpoint:
        url, where = _with_path(keys.endpoint, signal, protocol), "endpoint"
    elif found := _var(environ, signal, "ENDPOINT"):
        where, value = found
        check_url(value, where)
        url = value if f"_{signal.upper()}_" in where else _with_path(value, signal, protocol)
    else:
        raise ValueError(
            f"endpoint: required for {signal} (or set {signal}_endpoint, or the environment variable "
            f"{_PREFIX}ENDPOINT)"
        )
    check_url(url, where)

    compression = cast(Compression, _one_of(
        keys.compression, environ, signal, "COMPRESSION", get_args(Compression), "gzip or none"
    ))  # fmt: skip

    timeout = DEFAULT_TIMEOUT_S
    if keys.timeout is not None:
        timeout = keys.timeout
    elif found := _var(environ, signal, "TIMEOUT"):
        var, value = found
        try:
            timeout = float(value) / 1000  # the specification's unit is milliseconds
        except ValueError:
            raise ValueError(f"{var}: expected milliseconds, e.g. 10000, got {value!r}") from None
        if not 0 < timeout < float("inf"):
            raise ValueError(f"{var}: must be a positive number of milliseconds, got {value!r}")

    headers: dict[str, str] = {}
    for var in (f"{_PREFIX}HEADERS", f"{_PREFIX}{signal.upper()}_HEADERS"):  # the signal's win
        if environ.get(var, "").strip():
            headers.update(parse_headers(environ[var], f"the environment variable {var}"))
    for name in keys.headers:  # the config's win; matched case-insensitively, as HTTP does
        for other in [h for h in headers if h.lower() == name.lower()]:
            del headers[other]
    return SignalSettings(url, protocol, compression, timeout, headers)


def _with_path(base: str, signal: Signal, protocol: Protocol) -> str:
    # gRPC names the service in the request, not in the URL.
    return base if protocol == "grpc" else base.rstrip("/") + SIGNAL_PATHS[signal]


def resource_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,...``, percent-encoded) with ``OTEL_SERVICE_NAME`` over its
    ``service.name``, as the specification orders them. Malformed pairs are skipped, as SDKs do."""
    attrs: dict[str, str] = {}
    for pair in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip():
            attrs[unquote(name.strip())] = unquote(value.strip())
    service = environ.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        attrs["service.name"] = service
    return attrs
