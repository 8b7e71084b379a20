"""A third-party sink written from docs/architecture.md alone (tests/plugins/third_party_sink/) works:
installed with pip (offline, into a temporary target) it registers under ``cuptistream.sinks``, its
keys are validated with the shared ones, and a real ``cuptistream run`` delivers to it."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent / "plugins" / "third_party_sink"
CLI = [sys.executable, "-m", "cuptistream.cli"]


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process that has the plug-in installed (and nothing else changed)."""
    work = tmp_path_factory.mktemp("plugin")
    source = work / "src"
    shutil.copytree(PACKAGE, source)  # the build writes build/ and *.egg-info next to the sources
    target = work / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        # Offline, without build isolation, an old setuptools has no bdist_wheel (the `wheel` package
        # is missing): install as pip would, from the same pyproject.toml: package + dist-info.
        assert "bdist_wheel" in result.stderr, result.stderr
        _install_by_hand(source, target)
    assert list(target.glob("csv_gpu_sink-*.dist-info")), "the plug-in's metadata is not installed"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(target), env.get("PYTHONPATH", "")] if p)
    env.pop("CUPTISTREAM_COLLECTOR", None)
    return env


def _install_by_hand(source: Path, target: Path) -> None:
    """What ``pip install --target`` leaves: the package, and a dist-info with its entry points."""
    import tomllib

    project = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for package in ["csv_gpu_sink"]:
        shutil.copytree(source / package, target / package)
    info = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n", encoding="utf-8"
    )
    lines = []
    for group, points in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (info / "RECORD").write_text("", encoding="utf-8")


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
        [sys.executable, "-c", "from cuptistream import registry; print(registry.available(registry.SINK_GROUP))"],
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
