"""Checks decoded OTLP requests against the OpenTelemetry semantic conventions, from the names listed
in tests/semconv/names.txt (taken from the conventions' YAML model; its first line names the version).

Rules: an attribute or metric in a namespace the conventions own (service, process, host, hw, ...)
must be one the conventions define, not deprecated, and a metric's unit and instrument must match;
everything else must be in one of cuptistream's documented namespaces (docs/otlp.md). Durations are
in seconds (exponential histograms of ns durations excepted). Log records name their event in the
EventName field, and every ResourceX carries the schema URL of the conventions' version.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

NAMES = Path(__file__).parent / "semconv" / "names.txt"
OWN_PREFIXES = ("cuda.", "nvtx.", "cuptistream.", "job.")
# Session attributes the tests set themselves, as a user would.
USER_ATTRIBUTES = frozenset({"team"})


@cache
def conventions() -> tuple[str, dict[str, bool], dict[str, tuple[str, str, bool]], frozenset[str]]:
    """(version, attribute -> deprecated, metric -> (unit, instrument, deprecated), owned namespaces)."""
    lines = NAMES.read_text().splitlines()
    version = lines[0].split()[2]
    attributes: dict[str, bool] = {}
    metrics: dict[str, tuple[str, str, bool]] = {}
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split()
        if parts[0] == "attribute":
            attributes[parts[1]] = parts[-1] == "deprecated"
        else:
            metrics[parts[1]] = (parts[2], parts[3], parts[-1] == "deprecated")
    owned = frozenset(name.split(".")[0] for name in (*attributes, *metrics)) | {"event"}
    return version.lstrip("v"), attributes, metrics, owned


def _check_attributes(where: str, attributes: Any, problems: list[str]) -> None:
    _, known, _, owned = conventions()
    for kv in attributes:
        key = kv.key
        if key in USER_ATTRIBUTES:
            continue
        if key.split(".")[0] in owned:
            if key not in known:
                problems.append(f"{where}: {key} is not in the semantic conventions")
            elif known[key]:
                problems.append(f"{where}: {key} is deprecated in the semantic conventions")
        elif not key.startswith(OWN_PREFIXES):
            problems.append(f"{where}: {key} is in no documented namespace")


def _instrument(metric: Any) -> str:
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        return "gauge"
    if kind == "sum":
        return "counter" if metric.sum.is_monotonic else "updowncounter"
    return kind or "none"


def violations(path: str, message: Any) -> list[str]:
    """Every way one decoded export request strays from the conventions."""
    version, _, known_metrics, owned = conventions()
    schema = f"https://opentelemetry.io/schemas/{version}"
    problems: list[str] = []
    field = {"traces": "resource_spans", "metrics": "resource_metrics", "logs": "resource_logs"}
    resources = list(getattr(message, field.get(path.rsplit("/", 1)[-1], "resource_profiles")))
    if path.endswith("profiles"):  # profile attributes live in the request's dictionary
        strings = message.dictionary.string_table
        keys = [
            type("KV", (), {"key": strings[a.key_strindex]})() for a in message.dictionary.attribute_table[1:]
        ]
        _check_attributes("profile dictionary", keys, problems)
    for rx in resources:
        if rx.schema_url != schema:
            problems.append(f"{path}: schema_url {rx.schema_url!r}, expected {schema}")
        _check_attributes(f"{path} resource", rx.resource.attributes, problems)
        for scoped in getattr(rx, "scope_profiles", []):
            if scoped.schema_url != schema:
                problems.append(f"{path}: scope schema_url {scoped.schema_url!r}, expected {schema}")
        for scoped in getattr(rx, "scope_spans", []):
            for span in scoped.spans:
                _check_attributes(f"span {span.name}", span.attributes, problems)
        for scoped in getattr(rx, "scope_metrics", []):
            for metric in scoped.metrics:
                name = metric.name
                if name.split(".")[0] in owned:
                    if name not in known_metrics:
                        problems.append(f"metric {name} is not in the semantic conventions")
                    else:
                        unit, instrument, deprecated = known_metrics[name]
                        if (metric.unit, _instrument(metric)) != (unit, instrument) or deprecated:
                            problems.append(
                                f"metric {name}: {metric.unit} {_instrument(metric)}, the conventions "
                                f"say {unit} {instrument}{' (deprecated)' if deprecated else ''}"
                            )
                elif not name.startswith(OWN_PREFIXES):
                    problems.append(f"metric {name} is in no documented namespace")
                # The one exception: an exponential histogram of ns durations keeps its unit, since
                # its base-2 bucket bounds are no bucket bounds in seconds (sinks/otlp/stats.py).
                exact = metric.HasField("exponential_histogram") and metric.unit == "ns"
                if metric.unit in ("ns", "us", "ms") and not exact:
                    problems.append(f"metric {name}: durations go in seconds, not {metric.unit}")
                points = getattr(metric, metric.WhichOneof("data") or "gauge").data_points
                for point in points:
                    _check_attributes(f"metric {name}", point.attributes, problems)
        for scoped in getattr(rx, "scope_logs", []):
            for record in scoped.log_records:
                _check_attributes("log record", record.attributes, problems)
                if not record.event_name:
                    problems.append("log record without EventName")
    return problems
