"""Start-up cost of cuptistream's boot hook in processes that never use CUDA.

    python3 bench/startup.py [--rounds 40] [--code "pass"] [--code "import torch"]

Under ``cuptistream run`` every Python process of the program loads ``boot/sitecustomize.py``,
which arms the probe's CUDA trigger. A CPU-only worker (a data loader, a launcher) should not
notice. Each round starts ``python -c CODE`` once per variant, in alternating order, and times the
process from fork to exit:

- ``bare``: the environment without cuptistream;
- ``hooked``: what ``cuptistream run`` gives the program (boot dir on ``PYTHONPATH``, collector and
  config variables, ``probe.start: cuda``); the collector address points nowhere, so a trigger
  that fired by mistake would show as a one-line error on stderr, which fails the run.

Prints per code the wall milliseconds of each variant (median [min..max]) and the per-round ratio
hooked/bare (median [min..max]); the last lines repeat these rows. ``--out`` (default
``bench/out/startup.json``) keeps every number as JSON.
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

from spread import spread_text

from cuptistream.probe.bootstrap import BOOT_DIR, ENV_PROBE_CONFIG, ENV_PROBE_START

ENV_COLLECTOR = "CUPTISTREAM_COLLECTOR"


def environments(config: Path) -> dict[str, dict[str, str]]:
    bare = {k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_")}
    pythonpath = os.pathsep.join(p for p in (str(BOOT_DIR), bare.get("PYTHONPATH", "")) if p)
    hooked = {
        **bare, "PYTHONPATH": pythonpath, ENV_COLLECTOR: "/nonexistent/cuptistream.sock",
        ENV_PROBE_CONFIG: str(config), ENV_PROBE_START: "cuda",
    }  # fmt: skip
    return {"bare": bare, "hooked": hooked}


def time_once(code: str, env: dict[str, str]) -> float:
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    elapsed = (time.perf_counter() - began) * 1e3
    if result.returncode != 0 or result.stderr:
        raise SystemExit(f"startup.py: `python -c {code!r}` failed: {result.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--code", action="append", help='Python code to start (default: "pass")')
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "startup.json")
    args = parser.parse_args()
    codes = args.code or ["pass"]
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "cfg.json"
        config.write_text(json.dumps({"sources": [{"type": "activity"}], "sinks": [{"type": "null"}]}))
        envs = environments(config)
        results: dict[str, dict[str, list[float]]] = {}
        rows = []
        for code in codes:
            times: dict[str, list[float]] = {name: [] for name in envs}
            for env in envs.values():
                time_once(code, env)  # warm the page cache
            for round_ in range(args.rounds):
                order = list(envs) if round_ % 2 == 0 else list(reversed(envs))
                for name in order:
                    times[name].append(time_once(code, envs[name]))
            ratios = [h / b for h, b in zip(times["hooked"], times["bare"], strict=True)]
            results[code] = {**times, "ratio": ratios}
            rows.append(f"python -c {code!r}: bare {spread_text(times['bare'], '.1f')} ms, "
                        f"hooked {spread_text(times['hooked'], '.1f')} ms, "
                        f"hooked/bare {spread_text(ratios, '.3f')} over {args.rounds} rounds")  # fmt: skip
            print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results))
    print(f"wrote {args.out}")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
