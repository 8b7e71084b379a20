"""Write docs/events.schema.json, the JSON Schema of one Kafka ``value_format: jsonl`` row, from the
event Structs (``cuptistream.recording.rows.row_schema``). tests/test_kafka_jsonl.py fails when it is stale.

    .venv/bin/python scripts/events_schema.py
"""

from __future__ import annotations

import json
from pathlib import Path

from cuptistream.recording.rows import row_schema

PATH = Path(__file__).resolve().parent.parent / "docs" / "events.schema.json"


def render() -> str:
    return json.dumps(row_schema(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    print(f"wrote {PATH}")
