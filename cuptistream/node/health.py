"""What ``node status`` checks: the node config, the probes' config it names, the collector."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from cuptistream.probe.boot._cuptistream_node import (
    DEFAULT_NODE_CONFIG,
    ENV_NODE_CONFIG,
    NodeConfigError,
    read_node_config,
)


def node_config_path() -> str:
    """Where the hook looks: ``$CUPTISTREAM_NODE_CONFIG`` (empty: nowhere), else the default."""
    return os.environ.get(ENV_NODE_CONFIG, DEFAULT_NODE_CONFIG)


@dataclass
class NodeHealth:
    path: str
    configured: bool = False  # the file exists: hooked processes arm their trigger
    problems: list[str] = field(default_factory=list)  # each one line, with its fix
    values: dict[str, str] = field(default_factory=dict)
    reachable: bool = False


def check(path: str | None = None) -> NodeHealth:
    path = node_config_path() if path is None else path
    health = NodeHealth(path)
    if not path or not os.path.exists(path):
        return health
    health.configured = True
    try:
        health.values = read_node_config(path)
    except NodeConfigError as error:
        health.problems.append(f"{error}; fix it, or remove the file to turn the hook off")
        return health
    health.problems += _check_probe_config(health.values["config"], health.values["start"])
    health.reachable = reachable(health.values["collector"])
    return health


def _check_probe_config(path: str, start: str) -> list[str]:
    """The config loads, and its ``probe.start`` (``auto`` resolved as under ``run``) is the node
    config's ``start``: the hook cannot read YAML at start-up, so it goes by the node config."""
    from cuptistream.config import load
    from cuptistream.errors import UserError
    from cuptistream.run.program import probe_start

    try:
        wanted = probe_start(load(path))
    except UserError as error:
        return [f"the probes' config: {error}"]
    if wanted != start:
        return [f"the node config says `start: {start}` but {path} starts its probes at {wanted} "
                f"(probe.start); set `start: {wanted}` in the node config"]  # fmt: skip
    return []


def reachable(socket_path: str) -> bool:
    """Whether a collector accepts connections at ``socket_path`` now: one this user runs is found
    in the collectors' registry (no connection made, so it counts no extra probe); another user's
    is tried with a connection that says nothing and hangs up."""
    from cuptistream.collector import registry

    wanted = os.path.realpath(socket_path)
    if any(os.path.realpath(entry.socket) == wanted for entry in registry.running()):
        return True
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.settimeout(1.0)
    try:
        probe.connect(socket_path)
    except OSError:
        return False
    finally:
        probe.close()
    return True
