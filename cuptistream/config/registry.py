"""Finds sources and sinks by ``type`` through the entry-point groups ``cuptistream.sources`` and
``cuptistream.sinks``. Our own components register the same way as third-party ones.

Config validation (``config.build``) is the one caller that resolves a ``type``: it keeps the class it
found in the ``Config`` (``enabled_sources()``/``enabled_sinks()``) for the probe and the collector.
This module imports neither ``config`` nor ``component`` (both sit above or beside it: ``config``
imports this, ``component`` imports ``config``), so the classes come back as ``type[Any]``.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from cuptistream.errors import ConfigError

SOURCE_GROUP = "cuptistream.sources"
SINK_GROUP = "cuptistream.sinks"


@cache
def _entry_points(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def available(group: str) -> list[str]:
    return sorted(_entry_points(group))


def _load(group: str, kind: str, path: str) -> type[Any]:
    eps = _entry_points(group)
    if kind not in eps:
        what = "source" if group == SOURCE_GROUP else "sink"
        names = ", ".join(available(group)) or "none installed"
        raise ConfigError(f"{path}.type: unknown {what} {kind!r} (available: {names})")
    try:
        loaded: type[Any] = eps[kind].load()
        return loaded
    except ImportError as error:
        raise ConfigError(
            f"{path}.type: {kind!r} needs a package that is not installed ({error.name}); "
            f"install it with `pip install 'cuptistream[{kind}]'`"
        ) from None


def source_class(kind: str, path: str = "sources[?]") -> type[Any]:
    return _load(SOURCE_GROUP, kind, path)


def sink_class(kind: str, path: str = "sinks[?]") -> type[Any]:
    return _load(SINK_GROUP, kind, path)
