"""Make cuptistream's plugins findable on the GPU machine without ``pip install -e .``.

``python3 tests/gpu/entry_points.py /tmp/site`` writes a ``cuptistream-0.dist-info`` with the
entry points of ``pyproject.toml`` into that directory (put it and the checkout on PYTHONPATH):
sources and sinks are found through entry points, and the GPU machine has no network for a build.
It also links ``sources/`` and ``sinks/`` into ``cuptistream/`` in that copy of the tree, which is
what the installed package's ``package-dir`` mapping does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    target = Path(sys.argv[1]) / "cuptistream-0.dist-info"
    target.mkdir(parents=True, exist_ok=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = []
    for group, entries in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in entries.items()]
        lines.append("")
    scripts = project.get("scripts", {})
    if scripts:
        lines.append("[console_scripts]")
        lines += [f"{name} = {value}" for name, value in scripts.items()]
    (target / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for name in ("sources", "sinks"):
        link = ROOT / "cuptistream" / name
        if not link.exists():
            link.symlink_to(ROOT / name, target_is_directory=True)
    (target / "METADATA").write_text("Metadata-Version: 2.1\nName: cuptistream\nVersion: 0\n")


if __name__ == "__main__":
    main()
