"""Starting the probe in a program that ``cuptistream run`` started.

``cuptistream run`` puts ``boot/`` on ``PYTHONPATH``; its ``sitecustomize`` calls
``start_from_environment`` before the program's first line. The variables are consumed here, so
processes the program starts are not probed (yet). Telemetry never stops the program: any
failure is one line on stderr, and the program runs on without a probe.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cuptistream.channel.sockets import ENV_COLLECTOR

BOOT_DIR = Path(__file__).resolve().parent / "boot"
ENV_PROBE_CONFIG = "CUPTISTREAM_PROBE_CONFIG"
ENV_QUIET = "CUPTISTREAM_QUIET"


def _forget_boot_dir() -> None:
    boot = str(BOOT_DIR)
    sys.path[:] = [p for p in sys.path if p != boot]
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    if parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        os.environ.pop("PYTHONPATH", None)


def start_from_environment() -> object | None:
    """Start a probe as the environment says; the Probe, or None (with one line on stderr)."""
    address = os.environ.pop(ENV_COLLECTOR, "")
    config_path = os.environ.pop(ENV_PROBE_CONFIG, "")
    quiet = os.environ.pop(ENV_QUIET, "") == "1"
    _forget_boot_dir()
    if not address or not config_path:
        return None
    try:
        from cuptistream.config import load
        from cuptistream.errors import UserError
        from cuptistream.probe.probe import Probe
    except Exception as error:  # a broken install must not stop the program
        print(f"cuptistream: telemetry is off for this process: {error}", file=sys.stderr)
        return None
    session_id = os.environ.get("CUPTISTREAM_SESSION_ID", "")
    try:
        return Probe(load(config_path), address, session_id, quiet=quiet).start()
    except UserError as error:
        print(f"cuptistream: telemetry is off for this process: {error}", file=sys.stderr)
    except Exception as error:
        print(
            f"cuptistream: telemetry is off for this process: {type(error).__name__}: {error}",
            file=sys.stderr,
        )
    return None
