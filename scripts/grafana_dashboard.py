"""Write cuptistream/warehouse/grafana/cuptistream-fleet.json, the Grafana dashboard of the shipped
ClickHouse queries (``cuptistream.warehouse.dashboard``): one table per query, its SQL the query
file's with the parameters as the ClickHouse plugin's time macros and the dashboard's variables.
tests/test_warehouse_grafana.py fails when the shipped file is stale: change a query, then run this.

    .venv/bin/python scripts/grafana_dashboard.py
    .venv/bin/python scripts/grafana_dashboard.py -o -    # to stdout
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cuptistream.warehouse.dashboard import DASHBOARD, dashboard_json

PATH = Path(__file__).resolve().parent.parent / "cuptistream" / "warehouse" / DASHBOARD


def render() -> str:
    return dashboard_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-o", "--output", default=None, help="file to write, '-' for stdout (default: the shipped one)"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output) if args.output else PATH
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        print(f"grafana_dashboard: cannot write {path}: {error.strerror}; give a writable -o path or '-'",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
