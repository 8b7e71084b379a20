"""A node collector for the node install's tests: ``cuptistream collector`` on a socket, started and
stopped as a platform's service would, and the node config that points a hook at it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "cuptistream.cli"]


def write_node_config(path: Path, socket_path: Path, config: Path, start: str) -> Path:
    """The node config at ``path``: the collector's socket, the probes' config and when they start."""
    path.write_text(
        f"# the node collector\ncollector: {socket_path}\nconfig: '{config}'  # probes\nstart: {start}\n"
    )
    return path


class Collector:
    """``cuptistream collector`` serving ``config`` on ``socket_path``; ``stop`` ends it with SIGTERM and
    returns its ``--report-json`` report (it must exit 0)."""

    def __init__(self, config: Path, socket_path: Path, report: Path) -> None:
        self.report = report
        self.proc = subprocess.Popen(
            [*CLI, "collector", "-c", str(config), "--socket", str(socket_path), "--report-json", str(report)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), self.proc.stderr.read() if self.proc.stderr else line

    def stop(self) -> dict[str, object]:
        self.proc.send_signal(signal.SIGTERM)
        _, stderr = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, stderr
        report: dict[str, object] = json.loads(self.report.read_text())
        return report
