"""Config validation and the runtime use the same component classes: ``config.build`` resolves each
``type`` through the registry once and keeps the class in the ``Config``; the probe, the collector and
``run``'s ``probe.start: auto`` make components from those, never asking the registry again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream.collector.collector import Collector
from cuptistream.config import load, registry
from cuptistream.run.program import probe_start
from cuptistream.sinks.file import FileSink
from cuptistream.sinks.null import NullSink
from cuptistream.sources.synthetic import SyntheticSource


def _config(tmp_path: Path) -> dict[str, Any]:
    return {
        "sources": [
            {"type": "synthetic", "events": 100},
            {"type": "synthetic", "name": "off", "enabled": False},
        ],
        "sinks": [{"type": "null"}, {"type": "file", "directory": str(tmp_path)}],
    }


def _registry_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(group: str, kind: str, path: str) -> type:
        raise AssertionError(f"the registry was asked again for {kind!r} after validation")

    monkeypatch.setattr(registry, "_load", refuse)


def test_the_config_keeps_the_classes_validation_resolved(tmp_path: Path) -> None:
    cfg = load(_config(tmp_path))
    assert cfg.source_classes == [SyntheticSource, SyntheticSource]
    assert cfg.sink_classes == [NullSink, FileSink]
    assert [(c.name, cls) for c, cls in cfg.enabled_sources()] == [("synthetic", SyntheticSource)]
    assert [cls for _, cls in cfg.enabled_sinks()] == [NullSink, FileSink]


def test_the_runtime_never_asks_the_registry_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load(_config(tmp_path))
    _registry_closed(monkeypatch)
    assert probe_start(cfg) == "process"  # `auto`: no enabled source traces CUDA
    collector = Collector(cfg)
    assert [type(lane.sink) for lane in collector.pipeline.lanes] == [NullSink, FileSink]


def test_a_session_starts_its_sources_from_the_resolved_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load(_config(tmp_path))
    _registry_closed(monkeypatch)
    with cuptistream.session(cfg, sinks=[NullSink(cfg.sinks[0])], quiet=True) as session:
        assert [type(s) for s in session.sources] == [SyntheticSource]
