"""A third-party source written from docs/architecture.md ("Writing a source") alone
(tests/plugins/third_party_source/): installed with pip, it imports only ``cuptistream.plugin``,
registers under ``cuptistream.sources``, its keys are checked, and ``cuptistream run`` records what
it emits."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.plugin_install import install_plugin

import cuptistream
from cuptistream.events import Activity

PACKAGE = Path(__file__).resolve().parent / "plugins" / "third_party_source"
CLI = [sys.executable, "-m", "cuptistream.cli"]


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return install_plugin(PACKAGE, tmp_path_factory.mktemp("source-plugin"))


def _config(tmp_path: Path, source: str) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"sources:\n  - {source}\nsinks:\n  - {{type: file, directory: {tmp_path / 'out'}}}\n")
    return cfg


def test_the_plugins_import_only_the_contract() -> None:
    for package in ("third_party_source/loadavg_source", "third_party_sink/csv_gpu_sink"):
        tree = ast.parse((PACKAGE.parent / package / "__init__.py").read_text())
        ours = {
            node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cuptistream")
        }  # fmt: skip
        assert ours == {"cuptistream.plugin"}, (package, ours)


def test_the_source_plugin_is_checked_and_recorded(plugin_env: dict[str, str], tmp_path: Path) -> None:
    bad = _config(tmp_path, "{type: loadavg, interval: 0s}")
    result = subprocess.run(
        [*CLI, "validate", str(bad)], capture_output=True, text=True, env=plugin_env, timeout=60
    )
    assert result.returncode != 0 and "sources[0]: interval must be positive" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    cfg = _config(tmp_path, "{type: loadavg, interval: 20ms, samples: 5}")
    result = subprocess.run(
        [*CLI, "run", "-c", str(cfg), "--", sys.executable, "-c", "import time; time.sleep(1)"],
        capture_output=True, text=True, env=plugin_env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    samples = [
        e for e in cuptistream.read(tmp_path / "out") if isinstance(e, Activity) and e.kind == "loadavg"
    ]
    assert len(samples) == 5
    assert all(isinstance(s.fields["load1"], float) and s.fields["load1"] >= 0 for s in samples)
