"""Every script in bench/ answers ``--help`` on a machine without a GPU, torch, CUPTI or a broker
(their imports come after the arguments are parsed), and bench/README.md lists every file in bench/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def test_every_bench_script_answers_help_without_torch_or_cupti(tmp_path: Path) -> None:
    # Modules that fail on import shadow torch and cupti, installed or not: --help must not need them.
    for name in ("torch", "cupti"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not for --help')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    scripts = sorted(BENCH.glob("*.py"))
    assert len(scripts) > 10
    running = {
        script.name: subprocess.Popen(
            [sys.executable, str(script), "--help"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script in scripts
    }
    failed = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=120)
        runnable = "__main__" in (BENCH / name).read_text()
        if process.returncode != 0 or (runnable and "usage:" not in out):
            failed[name] = (process.returncode, err.strip().splitlines()[-1:] or out[:200])
    assert not failed, failed


def test_the_readme_lists_every_file_in_bench() -> None:
    readme = (BENCH / "README.md").read_text()
    ignored = {"out", "__pycache__", "README.md"}
    files = [
        path.relative_to(BENCH).as_posix()
        for path in BENCH.rglob("*")
        if path.is_file() and not ignored & set(path.relative_to(BENCH).parts)
    ]
    assert files
    missing = [f for f in files if f"`{f}`" not in readme]
    assert not missing, f"bench/README.md does not list {missing}"
