"""Installs a plug-in package from tests/plugins/ the way a user would (pip, offline, into a target
directory), and gives the environment of a process that has it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def install_plugin(package: Path, work: Path) -> dict[str, str]:
    """``pip install`` ``package`` into ``work/site``; the environment that puts it on the path."""
    source = work / "src"
    shutil.copytree(package, source)  # the build writes build/ and *.egg-info next to the sources
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
    assert list(target.glob("*.dist-info")), "the plug-in's metadata is not installed"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(target), env.get("PYTHONPATH", "")] if p)
    env.pop("CUPTISTREAM_COLLECTOR", None)
    return env


def _install_by_hand(source: Path, target: Path) -> None:
    """What ``pip install --target`` leaves: the packages, and a dist-info with the entry points."""
    import tomllib

    meta = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    for package in meta["tool"]["setuptools"]["packages"]:
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
