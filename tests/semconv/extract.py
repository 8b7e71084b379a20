"""Regenerate tests/semconv/names.txt from a checkout of open-telemetry/semantic-conventions.

    git -C semantic-conventions checkout v1.44.0
    python tests/semconv/extract.py semantic-conventions v1.44.0 > tests/semconv/names.txt

Lists every attribute and metric the YAML model defines under the namespaces cuptistream's OTLP sink
claims to follow (deprecated ones marked), so tests can check that nothing is invented inside them.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import yaml

NAMESPACES = ("service", "process", "host", "hw", "telemetry", "k8s", "thread", "os")
FOLDERS = ("service", "process", "host", "hardware", "telemetry", "k8s", "thread", "os")


def _entries(doc: dict) -> list[tuple[str, str, bool]]:
    """(kind, name, deprecated) for the attributes and metrics of one YAML file, in either format;
    a metric's name is followed by its unit and instrument."""
    out: list[tuple[str, str, bool]] = []
    for group in doc.get("groups") or []:  # the classic format: attribute_group / metric groups
        if group.get("type") == "metric" and "metric_name" in group:
            name = f"{group['metric_name']} {group.get('unit', '')} {group.get('instrument', '')}"
            out.append(("metric", name, "deprecated" in group))
        for attr in group.get("attributes") or []:
            if "id" in attr:
                out.append(("attribute", attr["id"], "deprecated" in attr))
    for attr in doc.get("attributes") or []:  # definition/2
        if "key" in attr or "id" in attr:
            out.append(("attribute", attr.get("key") or attr["id"], "deprecated" in attr))
    for metric in doc.get("metrics") or []:
        name = f"{metric['name']} {metric.get('unit', '')} {metric.get('instrument', '')}"
        out.append(("metric", name, "deprecated" in metric))
    return out


def main(root: str, version: str) -> None:
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    found: dict[tuple[str, str], bool] = {}
    for folder in FOLDERS:
        for path in sorted(pathlib.Path(root, "model", folder).rglob("*.yaml")):
            for kind, name, deprecated in _entries(yaml.safe_load(path.read_text()) or {}):
                if name.split(".")[0] in NAMESPACES:
                    found[(kind, name)] = found.get((kind, name), False) or deprecated
    print(f"# open-telemetry/semantic-conventions {version} ({commit}), model/{{{','.join(FOLDERS)}}}")
    print(
        "# attribute NAME [deprecated] | metric NAME UNIT INSTRUMENT [deprecated]; see tests/semconv/extract.py"
    )
    for (kind, name), deprecated in sorted(found.items()):
        print(f"{kind} {name}{' deprecated' if deprecated else ''}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
