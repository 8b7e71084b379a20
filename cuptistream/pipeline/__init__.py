"""The collector's trio pipeline, stage by stage: ``intake`` (byte-bounded, full policy) →
``core`` (the distributor and shutdown) → one ``lane`` per sink (queue, batching, retry, health),
with ``connect`` (sinks coming up in the background) and ``resource`` (the process a batch
describes). The retry policy and the health a lane keeps for its sink are ``cuptistream.delivery``;
who sent each chunk is its ``cuptistream.recording.producers.Producer``.

``from cuptistream.pipeline import Pipeline`` works and imports ``core`` only then, so the probe,
which uses ``intake`` alone, never loads trio's pipeline.
"""

from typing import Any

_CORE = frozenset({"CLOSE_AFTER_DEADLINE_S", "Pipeline", "PipelineThread", "ShutdownReport"})


def __getattr__(name: str) -> Any:
    if name in _CORE:
        from cuptistream.pipeline import core

        return getattr(core, name)
    raise AttributeError(f"module 'cuptistream.pipeline' has no attribute {name!r}")
