"""Runs a device-session driver (``bench/gpu_session.sh``, ``bench/multigpu_session.sh``) on a
machine with no GPU: a copy of the files it uses in a temporary tree (its ``setup`` links
``sources/`` and ``sinks/`` into ``cuptistream/``, which must not happen in the checkout), and a
fake interpreter that runs Python for the plumbing (``tests/gpu/entry_points.py``, ``-c``) and, for
a bench, prints the lines the driver's summary picks out, after ``FAKE_BENCH_SLEEP`` seconds (and,
for ``fanin.py``, writes ``FAKE_BENCH_BIG`` bytes into its results)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = r"""#!/usr/bin/env bash
out=
for ((i = 1; i <= $#; i++)); do [ "${!i}" = --out ] && { j=$((i + 1)); out=${!j}; }; done
workload=
for ((i = 1; i <= $#; i++)); do [ "${!i}" = --workloads ] && { j=$((i + 1)); workload=${!j}; }; done
case "${1:-}" in
    bench/*)
        echo "fake bench: $*"
        trap 'kill $! 2>/dev/null; exit 143' TERM  # cut at its limit: no sleep left behind
        sleep "${FAKE_BENCH_SLEEP:-0}" & wait $!
        case $1 in
            bench/budget_lost_time.py) echo "$workload session 0: cost +0.100%"; echo "$workload: cost +0.100% [+0.1 .. +0.1]" ;;
            bench/budget_accuracy.py) echo "$workload budget recording over 660 s: 100 bytes, 1.00 MB per GPU-hour (bound 2: within)" ;;
            bench/overhead_gpu.py) echo; echo "wrote $out; 30 of 30 processes ok"; echo "| W1 | table |" ;;
            bench/fanin.py) echo '{"probes": 16, "delivered_events_per_s": 5, "ignored": 1, "check": {"in_equals_disk_plus_drops": true}}'
                            echo "fanin: results in $out"
                            # FAKE_BENCH_BIG=BYTES: a recording too big to come back, as a cut run leaves one
                            [ -n "${FAKE_BENCH_BIG:-}" ] && mkdir -p "$out/n16" && head -c "$FAKE_BENCH_BIG" /dev/zero > "$out/n16/big" ;;
        esac
        if [ -n "$out" ] && [ "$1" != bench/fanin.py ]; then echo '{}' > "$out"; fi ;;
    *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def copy_tree(tmp: Path) -> Path:
    tree = tmp / "tree"
    (tree / "bench").mkdir(parents=True)
    (tree / "tests" / "gpu").mkdir(parents=True)
    (tree / "cuptistream").mkdir()
    for script in (ROOT / "bench").glob("*.sh"):
        shutil.copy2(script, tree / "bench" / script.name)
    shutil.copy2(ROOT / "tests" / "gpu" / "entry_points.py", tree / "tests" / "gpu" / "entry_points.py")
    shutil.copy2(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def run_driver(tmp: Path, script: str, *args: str, dry: bool, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs ``bench/<script> ARGS`` in a copied tree with MIN_GPUS=0; OUT, RESULTS, SHIM, SITE and
    STATE under ``tmp``; ``DRY_RUN=1`` if ``dry``, else the fake interpreter."""
    tree = copy_tree(tmp)
    fake = tmp / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp / "out").mkdir()
    full_env = {
        **os.environ,
        "MIN_GPUS": "0",
        "PYTHON": sys.executable if dry else str(fake),
        "REAL_PYTHON": sys.executable,
        "OUT": str(tmp / "out"),
        "RESULTS": str(tmp / "results"),
        "SHIM": str(tmp / "shim"),
        "SITE": str(tmp / "site"),
        "STATE": str(tmp / "state"),
        **({"DRY_RUN": "1"} if dry else {}),
        **env,
    }
    full_env.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", str(tree / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
    )


def check_parses_and_names_its_steps(script: Path, steps: str) -> None:
    """``bash -n`` accepts ``script``, and an unknown step is refused with exit 2 and a line that
    lists its steps (``steps``: how that list begins)."""
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0
    done = subprocess.run(["bash", str(script), "nonsense"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert f"unknown step nonsense (steps: {steps}" in done.stderr
