"""The repository's ``scripts/`` as modules, for the tests that check a generated file is current."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported (its ``main`` is not run)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
