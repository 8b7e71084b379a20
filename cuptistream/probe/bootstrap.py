"""Starting the probe in a process of a program that ``cuptistream run`` started.

``cuptistream run`` puts ``boot/`` on ``PYTHONPATH`` and names the collector and the config in the
environment; ``boot/sitecustomize.py`` calls ``start_from_environment`` when the process first
initializes CUDA. The variables stay set, so every process the program starts is probed the same
way, into the same collector. Telemetry never stops the program: any failure is one line on stderr,
and the program runs on without a probe.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

from cuptistream.channel.sockets import ENV_COLLECTOR

BOOT_DIR = Path(__file__).resolve().parent / "boot"
ENV_PROBE_CONFIG = "CUPTISTREAM_PROBE_CONFIG"
ENV_PROBE_START = "CUPTISTREAM_PROBE_START"  # "cuda" (default): at CUDA init; "process": at start-up
ENV_QUIET = "CUPTISTREAM_QUIET"

_probe: object | None = None  # this process's Probe, once started


def _off(message: str) -> None:
    print(f"cuptistream: telemetry is off for pid {os.getpid()}: {message}", file=sys.stderr, flush=True)


def start_from_environment() -> object | None:
    """Start a probe as the environment says; the Probe, or None (with one line on stderr)."""
    address = os.environ.get(ENV_COLLECTOR, "")
    config_path = os.environ.get(ENV_PROBE_CONFIG, "")
    if not address or not config_path:
        return None
    session_id = os.environ.get("CUPTISTREAM_SESSION_ID", "")
    return start(address, config_path, session_id, quiet=os.environ.get(ENV_QUIET, "") == "1")


def start(address: str, config_path: str, session_id: str = "", *, quiet: bool = False) -> object | None:
    """Start a probe that takes ``config_path``'s sources and feeds the collector at ``address``;
    the Probe, or None (with one line on stderr). The node hook calls this directly: its processes
    keep their environment as it was."""
    global _probe
    try:
        from cuptistream.config import load
        from cuptistream.errors import UserError
        from cuptistream.probe.probe import Probe
    except Exception as error:  # a broken install must not stop the program
        _off(str(error))
        return None
    try:
        _probe = Probe(load(config_path), address, session_id, quiet=quiet).start()
    except UserError as error:
        _off(str(error))
    except Exception as error:
        _off(f"{type(error).__name__}: {error}")
    return _probe


def forget_inherited_probe() -> None:
    """In a child forked from a probed process: the parent's probe is not ours. Never stop it
    from here (that would hang up the parent's connection); undo what it set in this process."""
    global _probe
    probe, _probe = _probe, None
    if probe is not None:
        from cuptistream.probe.probe import Probe

        assert isinstance(probe, Probe)
        atexit.unregister(probe.stop)
        probe.forget_after_fork()
