"""mypy reaches every source and sink by its installed name (``cuptistream.sources.*``/``.sinks.*``).

setuptools maps the top-level ``sources/`` and ``sinks/`` to ``cuptistream.sources``/``.sinks``;
mypy cannot follow that mapping, and an unresolved import is ``Any`` (``ignore_missing_imports``):
a source subclassing ``CuptiWorkerSource`` then inherits from ``Any`` and mypy passes on attribute
errors in it. ``pyproject.toml`` closes the hole with ``mypy_path = ".typecheck"``, whose
``cuptistream/sources`` and ``cuptistream/sinks`` are symlinks to the real folders.

The test copies the tree, plants an attribute error in every module of ``sources/`` and ``sinks/``
(through the module's own installed name) and on every class defined there (a class that inherits
from ``Any`` would let it pass), runs the project's plain ``mypy`` on the copy and expects exactly
the planted errors: the unmodified code passes, and every plant is caught.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"sources": "cuptistream.sources", "sinks": "cuptistream.sinks"}
MISSING = "planted_missing_attribute"
# ctypes' Structure/Union answer any attribute (``__getattr__`` in typeshed): nothing to catch there.
_OPEN_BASES = {"Structure", "Union", "BigEndianStructure", "LittleEndianStructure"}


def _base_names(cls: ast.ClassDef) -> set[str]:
    names = set()
    for base in cls.bases:
        node = base.value if isinstance(base, ast.Subscript) else base
        names.add(node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", ""))
    return names


def _plant(path: Path, module: str) -> list[tuple[int, str]]:
    """Append the plants to ``path``; returns the (line, message) mypy must report for them."""
    tree = ast.parse(path.read_text())
    lines = path.read_text().splitlines()
    plant = [
        "",
        "",
        "def _planted_module_check() -> None:",
        f"    import {module} as _self",
        f"    _self.{MISSING}",
    ]
    expected = [(len(lines) + len(plant), f'Module has no attribute "{MISSING}"')]
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    for cls in classes:
        if _base_names(cls) & _OPEN_BASES or any(
            isinstance(item, ast.FunctionDef) and item.name == "__getattr__" for item in cls.body
        ):
            continue
        plant += ["", "", f"def _planted_{cls.name}(obj: {cls.name}) -> None:", f"    obj.{MISSING}"]
        expected.append((len(lines) + len(plant), f'"{cls.name}" has no attribute "{MISSING}"'))
    path.write_text("\n".join([*lines, *plant]) + "\n")
    return expected


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("cuptistream", "sources", "sinks"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    shutil.copytree(ROOT / ".typecheck", dest / ".typecheck", symlinks=True)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


@pytest.mark.slow
def test_mypy_catches_attribute_errors_planted_in_every_source_and_sink(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    expected: set[tuple[str, int, str]] = set()
    for folder, package in PACKAGES.items():
        for path in sorted((tmp_path / folder).rglob("*.py")):
            relative = path.relative_to(tmp_path / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            module = ".".join([package, *parts])
            shown = Path(".typecheck", "cuptistream", folder, *path.relative_to(tmp_path / folder).parts)
            expected |= {(shown.as_posix(), line, message) for line, message in _plant(path, module)}
    assert len(expected) > 20  # a plant per module and per class

    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--no-error-summary", "--no-pretty"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    reported: set[tuple[str, int, str]] = set()
    others = []
    for line in result.stdout.splitlines():
        match = re.match(r"^(.+?):(\d+): error: (.*?)\s+\[[a-z-]+\]$", line)
        if match and MISSING in line:
            reported.add((match[1], int(match[2]), match[3]))
        elif ": note:" not in line:
            others.append(line)
    assert not others, "mypy fails on the unmodified tree:\n" + "\n".join(others) + result.stderr
    missed = sorted(expected - reported)
    assert not missed, "mypy does not reach these plants (a module or a base class resolves to Any):\n" + (
        "\n".join(f"{path}:{line}: {message}" for path, line, message in missed)
    )
    assert reported == expected
