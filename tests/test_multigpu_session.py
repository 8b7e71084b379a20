"""``bench/multigpu_session.sh`` (issue 32's runs on a multi-GPU host) parses, and refuses an unknown
step before touching anything. What it runs is covered by the benches' and GPU tests' own checks."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "multigpu_session.sh"


def test_the_driver_parses_and_names_its_steps() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True).returncode == 0
    done = subprocess.run(["bash", str(SCRIPT), "nonsense"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "unknown step nonsense (steps: setup lost node compare coexist accuracy fanin" in done.stderr
