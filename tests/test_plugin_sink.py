"""A third-party sink written from docs/architecture.md alone (tests/plugins/third_party_sink/) works:
installed with pip (offline, into a temporary target) it registers under ``cuptistream.sinks``, its
keys are validated with the shared ones, and a real ``cuptistream run`` delivers to it."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.plugin_install import install_plugin

PACKAGE = Path(__file__).resolve().parent / "plugins" / "third_party_sink"
CLI = [sys.executable, "-m", "cuptistream.cli"]


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process that has the plug-in installed (and nothing else changed)."""
    return install_plugin(PACKAGE, tmp_path_factory.mktemp("plugin"))


def _write_config(tmp_path: Path, sink: str) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "sources:\n  - {type: synthetic, events: 5000, rate: 0}\n"
        "pipeline: {stats_interval: 200ms}\n"
        f"sinks:\n  - {sink}\n",
        encoding="utf-8",
    )
    return cfg


def test_the_plugin_registers_and_its_keys_are_checked(plugin_env: dict[str, str], tmp_path: Path) -> None:
    listed = subprocess.run(
        [sys.executable, "-c", "from cuptistream.config import registry; print(registry.available(registry.SINK_GROUP))"],
        capture_output=True, text=True, env=plugin_env, timeout=60,
    )  # fmt: skip
    assert "csv_kernels" in listed.stdout, listed.stderr
    bad = _write_config(tmp_path, "{type: csv_kernels, path: k.csv, colour: red}")
    result = subprocess.run([*CLI, "validate", str(bad)], capture_output=True, text=True,
                            env=plugin_env, timeout=60)  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "cuptistream: sinks[0].colour: unknown key (known keys: name, enabled, queue, batch, retry, timeout, "
        "connect_timeout, path, max_file_bytes)"
    ], result.stderr
    assert "Traceback" not in result.stderr
    shared = _write_config(tmp_path, "{type: csv_kernels, path: k.csv, retry: {max_elapsed: 0}}")
    result = subprocess.run([*CLI, "validate", str(shared)], capture_output=True, text=True,
                            env=plugin_env, timeout=60)  # fmt: skip
    assert result.returncode != 0 and "sinks[0].retry: max_elapsed must be more than 0" in result.stderr


def test_cuptistream_run_delivers_to_the_plugin(plugin_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "kernels.csv"
    cfg = _write_config(tmp_path, f"{{type: csv_kernels, name: csv, path: {out}}}")
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--", sys.executable, "-c", "pass"],
                            capture_output=True, text=True, env=plugin_env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    with out.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 5000
    assert all(int(r["duration_ns"]) >= 0 and int(r["start_unix_ns"]) > 1_600_000_000 * 10**9 for r in rows)
    assert "Traceback" not in result.stderr
    assert "csv: 5" in result.stderr  # the shutdown summary names the plug-in: "csv: N delivered, 0 dropped"
