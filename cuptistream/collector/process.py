"""A collector in its own process, started for one session (``cuptistream.session(...)``).

It runs ``cuptistream collector --until-idle`` in a new process session (a Ctrl-C meant for the
program does not cut its drain short), waits for its one ``listening`` line, and at the end reads
the ``ShutdownReport`` it writes as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import msgspec

from cuptistream.config import Config
from cuptistream.errors import UserError
from cuptistream.pipeline.core import ShutdownReport


def write_config(config: Config, directory: str) -> str:
    """The config as JSON (valid YAML) in ``directory``, mode 0600, for another process to load."""
    if not config.raw:
        raise UserError(
            "session: this Config was built in code, without YAML; pass the YAML path or dict, "
            "sinks=[...] for an embedded collector, or collector= a running collector's socket"
        )
    path = os.path.join(directory, "config.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(config.raw, out)
    return path


class CollectorProcess:
    def __init__(self, config: Config, session_id: str, *, quiet: bool = False) -> None:
        self.directory = tempfile.mkdtemp(prefix="cuptistream-")
        self.address = os.path.join(self.directory, "collector.sock")
        self.report_path = os.path.join(self.directory, "report.json")
        command = [
            sys.executable, "-m", "cuptistream.cli", "collector", "-c", write_config(config, self.directory),
            "--socket", self.address, "--session-id", session_id, "--until-idle",
            "--report-json", self.report_path, *(["--quiet"] if quiet else []),
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("listening"):
            code = self.process.wait()
            self.cleanup()
            raise UserError(f"the collector process did not start (exit code {code}); its error is above")

    def wait(self, timeout: float) -> ShutdownReport | None:
        """The collector's report once it has drained (None if it did not finish in ``timeout``)."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        try:
            with open(self.report_path, "rb") as data:
                return msgspec.json.decode(data.read(), type=ShutdownReport)
        except (OSError, msgspec.DecodeError):
            return None
        finally:
            self.cleanup()

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
