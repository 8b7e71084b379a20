"""Start-up cost of the node install's hook (``cuptistream node install``) to every Python process.

    python bench/node_hook.py [--rounds 40]

Makes fresh virtualenvs of this interpreter (``python -m venv --without-pip``): ``bare`` without
the hook, ``hooked`` with it (and its probe runtime in a temporary ``--root``). Each round starts
``python -c pass`` once per variant, alternating the order, and times it from fork to exit:

- ``bare``: no hook;
- ``hooked``: the hook, no node config on the host (``CUPTISTREAM_NODE_CONFIG`` names a file that
  does not exist): the case of every process on a node without a collector;
- ``armed`` (with ``--armed``): a node config naming a collector, ``start: cuda``: the trigger is
  armed in a process that never uses CUDA.

Then it times the hook's line itself in one process (``timeit``, no node config), which process
start-up noise hides. Prints median [min..max] of each variant and of the per-round difference to
``bare`` in ms, and the line's cost in µs; the last lines repeat these rows. ``--out`` (default
``bench/out/node_hook.json``) keeps every number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spread import spread, spread_text

ROOT = Path(__file__).resolve().parent.parent


def _venv(folder: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return str(folder / "bin" / "python")


def _time_once(python: str, env: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run([python, "-c", "pass"], env=env, capture_output=True, text=True)
    elapsed = (time.perf_counter() - began) * 1e3
    if done.returncode != 0 or done.stderr:
        raise SystemExit(f"node_hook.py: `{python} -c pass` failed: {done.stderr.strip()}")
    return elapsed


def _line_cost_us(hook_file: Path, env: dict[str, str], number: int) -> float:
    """The hook line, executed ``number`` times in a process that has run it once at start-up."""
    code = (
        "import os, sys, timeit; line = open(sys.argv[1]).read(); "
        f"print(timeit.timeit(lambda: exec(line, {{}}), number={number}) / {number} * 1e6)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(hook_file)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"node_hook.py: timing the hook line failed: {done.stderr.strip()}")
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--armed", action="store_true", help="also time processes with a node config")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "node_hook.json")
    args = parser.parse_args()

    from cuptistream.node.hook import HOOK_FILE

    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        bare, hooked = _venv(work / "bare"), _venv(work / "hooked")
        cli = [sys.executable, "-m", "cuptistream.cli", "node"]
        subprocess.run([*cli, "install", "--python", hooked, "--root", str(work / "root")], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        base = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_") and k != "PYTHONPATH"}
        off = {**base, "CUPTISTREAM_NODE_CONFIG": str(work / "absent.yaml")}
        variants = {"bare": (bare, off), "hooked": (hooked, off)}
        if args.armed:
            probes = work / "probes.json"
            probes.write_text(json.dumps({"sources": [{"type": "activity"}], "sinks": [{"type": "null"}]}))
            node = work / "node.yaml"
            node.write_text(f"collector: {work / 'c.sock'}\nconfig: {probes}\nstart: cuda\n")
            variants["armed"] = (hooked, {**base, "CUPTISTREAM_NODE_CONFIG": str(node)})
        times: dict[str, list[float]] = {name: [] for name in variants}
        for python, env in variants.values():
            _time_once(python, env)  # warm the page cache
        for round_ in range(args.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                times[name].append(_time_once(*variants[name]))
        site = subprocess.run([hooked, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        line_us = [_line_cost_us(Path(site) / HOOK_FILE, off, 20000) for _ in range(5)]

    rows = [f"python -c pass, {name}: {spread_text(values, '.2f')} ms" for name, values in times.items()]
    differences = {}
    for name in variants:
        if name != "bare":
            differences[name] = [a - b for a, b in zip(times[name], times["bare"], strict=True)]
            rows.append(f"{name} - bare per round: {spread_text(differences[name], '+.2f')} ms "
                        f"over {args.rounds} rounds")  # fmt: skip
    rows.append(f"the hook line without a node config: {spread_text(line_us, '.2f')} us (5 x 20000 runs)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "times_ms": times, "differences_ms": differences, "line_us": line_us,
        "summary": {name: spread(values) for name, values in {**times, **differences}.items()},
    }  # fmt: skip
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
