"""The replay source's default captures ship in the wheel: built with ``pip wheel``, installed into a
fresh ``--target`` folder, ``cuptistream run`` with ``type: replay`` (no ``path``) replays them from
the installed package, not from this checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # scripts/test.sh --all and CI run it

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = json.loads((ROOT / "tests" / "fixtures" / "expected.json").read_text())
CAPTURES = sorted(p.name for p in (ROOT / "sources" / "captures").glob("*.cupti"))


def test_replay_from_an_installed_wheel(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # From a copy without build output: setuptools reuses a checkout's build/ and *.egg-info, which
    # would ship a package the package list leaves out.
    source = tmp_path / "source"
    skip = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "node_modules")
    shutil.copytree(ROOT, source, ignore=skip, symlinks=True)
    subprocess.run(
        [*pip, "wheel", "--no-deps", str(source), "-w", str(tmp_path / "wheel")], check=True, timeout=300
    )
    (wheel,) = (tmp_path / "wheel").glob("cuptistream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n for n in names if n.endswith(".cupti")) == [
        f"cuptistream/sources/captures/{c}" for c in CAPTURES
    ]
    assert not any(n.startswith(("tests/", "sources/", "sinks/")) for n in names), (
        "no top-level test or source folders"
    )
    # Every package of the checkout ships (an editable install in this environment would otherwise
    # hide a package missing from pyproject's list when the wheel is used below).
    folders = {"cuptistream": "cuptistream", "sources": "cuptistream/sources", "sinks": "cuptistream/sinks"}
    packages = {
        str(init.parent.relative_to(ROOT)).replace(top, into, 1)
        for top, into in folders.items()
        for init in (ROOT / top).rglob("__init__.py")
    }
    shipped = {n.removesuffix("/__init__.py") for n in names if n.endswith("/__init__.py")}
    assert packages <= shipped, f"packages missing from the wheel: {sorted(packages - shipped)}"

    target = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, timeout=300
    )
    out = tmp_path / "out"
    config = tmp_path / "replay.yaml"
    config.write_text(
        json.dumps({"sources": [{"type": "replay"}], "sinks": [{"type": "file", "directory": str(out)}]})
    )
    # The installed copy first on the path; dependencies come from this environment. Run from a
    # folder without this checkout, so nothing can be found relative to the working directory.
    env = {**os.environ, "PYTHONPATH": str(target)}
    program = "import cuptistream.sources.replay as r; print(r.DEFAULT_PATH)"
    where = subprocess.run(
        [sys.executable, "-c", program], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert Path(where.stdout.strip()) == target / "cuptistream" / "sources" / "captures"
    report = tmp_path / "report.json"
    run = [
        sys.executable,
        "-m",
        "cuptistream.cli",
        "run",
        "-c",
        str(config),
        "--report-json",
        str(report),
        "--quiet",
        "--",
        sys.executable,
        "-c",
        "pass",
    ]
    done = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    read = "import collections, json, sys, cuptistream\n"
    read += "print(json.dumps(collections.Counter(type(e).__name__ for e in cuptistream.read(sys.argv[1]))))"
    counts = json.loads(
        subprocess.run(
            [sys.executable, "-c", read, str(out)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    for name in ("Kernel", "Memcpy", "ApiCall", "GraphLaunch"):
        assert counts.get(name) == sum(e["decoded_events"].get(name, 0) for e in EXPECTED.values()), name
