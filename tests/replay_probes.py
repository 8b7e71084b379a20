"""Replay probes (real processes) against an in-process collector, for tests that watch or time the
collector's own code from inside its process (a monkeypatched decode, say)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cuptistream
from cuptistream.collector.collector import Collector
from cuptistream.pipeline.core import ShutdownReport

_PROGRAM = (
    "import sys, cuptistream\n"
    "cfg = {'sources': [{'type': 'replay', 'path': sys.argv[2], 'loops': int(sys.argv[3])}], 'sinks': [{'type': 'null'}]}\n"
    "with cuptistream.session(cfg, collector=sys.argv[1], quiet=True): pass\n"
)


def run_replay_probes(
    tmp_path: Path, pipeline: dict[str, Any], capture: Path, loops: int, probes: int = 1
) -> ShutdownReport:
    """``probes`` programs each replay ``capture`` ``loops`` times into one collector of
    ``pipeline`` settings (a null sink), all at once; the collector's report once they are done."""
    config = cuptistream.load_config({"pipeline": pipeline, "sources": [], "sinks": [{"type": "null"}]})
    collector = Collector(config).start()
    sock = str(tmp_path / "c.sock")
    collector.listen(sock)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    report = None
    try:
        running = [
            subprocess.Popen([sys.executable, "-c", _PROGRAM, sock, str(capture), str(loops)], env=env)
            for _ in range(probes)
        ]
        assert [p.wait(120) for p in running] == [0] * probes
    finally:
        report = collector.finish(probe_timeout=30)
    assert report is not None and report.probes == probes
    return report
