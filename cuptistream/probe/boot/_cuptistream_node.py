"""The node hook's second half, with the standard library alone. ``cuptistream node install`` puts
a one-line ``.pth`` file into a Python environment's site-packages; in every process of that
environment the line checks that the node config file exists (one ``stat``) and, only then, puts
this module's folder on ``sys.path`` and calls ``arm``. ``arm`` reads the node config and arms the
probe's trigger (``_cuptistream_trigger``); when it fires, the probe runtime that ``node install``
prepared for this interpreter goes at the end of ``sys.path`` (the job's own packages win) and the
probe starts, feeding the node collector.

Never raises: a problem is one line on stderr and the program runs on without telemetry.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # no ``typing`` at start-up
if TYPE_CHECKING:
    from typing import Any

ENV_NODE_CONFIG = "CUPTISTREAM_NODE_CONFIG"  # set empty: no node hook in this process
DEFAULT_NODE_CONFIG = "/etc/cuptistream/node.yaml"
SUPPORTED = ((3, 10), (3, 14))  # CPython minor versions the probe runtime is built for, inclusive
KEYS = ("collector", "config", "start")
STARTS = ("cuda", "process")


class NodeConfigError(ValueError):
    """The node config file cannot be used; the message names the file, the line and the fix."""


def read_node_config(path: str) -> dict[str, str]:
    """``key: value`` lines (a flat YAML mapping; ``#`` comments, optional quotes): ``collector``
    (the node collector's socket), ``config`` (the probes take its sources and ``probe`` section)
    and optionally ``start`` (``cuda``, the default, or ``process``). Paths are absolute."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise NodeConfigError(f"cannot read node config {path}: {error}") from None
    values: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if not text or text == "---":
            continue
        key, colon, value = text.partition(":")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        where = f"node config {path} line {number}"
        if not colon or key not in KEYS:
            raise NodeConfigError(f"{where}: expected one of {', '.join(KEYS)} as `key: value`")
        if key in values:
            raise NodeConfigError(f"{where}: {key} is given twice; keep one")
        if not value:
            raise NodeConfigError(f"{where}: {key} has no value")
        values[key] = value
    for key in ("collector", "config"):
        if key not in values:
            raise NodeConfigError(f"node config {path}: {key} is missing; add `{key}: /absolute/path`")
        if not os.path.isabs(values[key]):
            raise NodeConfigError(f"node config {path}: {key} must be an absolute path, not {values[key]!r}")
    values.setdefault("start", "cuda")
    if values["start"] not in STARTS:
        raise NodeConfigError(f"node config {path}: start must be cuda or process, not {values['start']!r}")
    return values


def unsupported() -> str | None:
    """Why this interpreter cannot run the probe, or None."""
    version = sys.version_info[:2]
    if sys.implementation.name != "cpython" or not SUPPORTED[0] <= version <= SUPPORTED[1]:
        low, high = (f"{v[0]}.{v[1]}" for v in SUPPORTED)
        name = sys.implementation.name
        return f"{name} {version[0]}.{version[1]} is not supported (CPython {low} to {high})"
    return None


def _off(message: str) -> None:
    print(f"cuptistream: telemetry is off for pid {os.getpid()}: {message}", file=sys.stderr, flush=True)


def arm(node_config: str, runtime: str) -> Any:
    """Arm the trigger as ``node_config`` says; the probe will come from ``runtime`` (the folder
    ``node install`` filled for this interpreter). The trigger, or None when not armed."""
    try:
        problem = unsupported()
        if problem is not None:
            _off(problem)
            return None
        values = read_node_config(node_config)
        collector, config = values["collector"], values["config"]

        def start() -> None:
            if not os.path.exists(collector):
                return  # no node collector now: nothing to feed (`cuptistream node status` says so)
            if not os.path.isdir(runtime):
                fix = f"run `cuptistream node install --python {sys.executable}`"
                _off(f"the probe runtime {runtime} is missing; {fix}")
                return
            if runtime not in sys.path:
                sys.path.append(runtime)  # last: the job's own packages come first
            from cuptistream.probe.bootstrap import start as start_probe

            start_probe(collector, config)

        from _cuptistream_trigger import arm as arm_trigger  # beside this file

        return arm_trigger(start, values["start"])
    except NodeConfigError as error:
        _off(f"{error}; fix it (`cuptistream node status` checks it)")
    except Exception as error:  # never break the program's start-up
        _off(f"node hook failed: {type(error).__name__}: {error}")
    return None
