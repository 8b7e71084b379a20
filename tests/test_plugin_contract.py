"""The plug-in contract: ``cuptistream.plugin`` is what a third-party source or sink
imports, its ``__all__`` is pinned here as trio's ``test_exports`` pins trio's; the old import paths
still work for one release; the lane applies every sink's ``retry`` and ``timeout`` keys to ``write``.
"""

from __future__ import annotations

import importlib

import pytest
import trio
from pipeline_helpers import MemorySink

import cuptistream
from cuptistream import plugin
from cuptistream.config import QueueConfig, RetryConfig, SinkConfig
from cuptistream.events import Kernel

CONTRACT = [
    "Batch", "ComponentConfig", "ConfigError", "DeliveryError", "Duration", "Emitter", "Event",
    "OnDemand", "OutgoingBatch", "PermanentSinkError", "RetriesExhausted", "RetryConfig",
    "RetryableError", "Sink", "SinkConfig", "SinkUnavailableError", "Size", "Source", "SourceConfig", "UserError",
    "call_with_retry", "events", "secret_from_env", "sink_where",
]  # fmt: skip


def test_the_contract_exports_exactly_these_names() -> None:
    assert sorted(plugin.__all__) == sorted(CONTRACT)
    for name in plugin.__all__:
        assert getattr(plugin, name) is not None, name


def test_importing_the_contract_does_not_load_the_pipeline() -> None:
    # The probe imports the contract inside the observed program: no trio pipeline there.
    import subprocess
    import sys

    code = "import sys, cuptistream.plugin; print('cuptistream.pipeline.core' in sys.modules, 'trio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("cuptistream.config", "load", "cuptistream.config.model"),
        ("cuptistream.config", "SinkConfig", "cuptistream.config.model"),
        ("cuptistream.pipeline", "Pipeline", "cuptistream.pipeline.core"),
    ],
)
def test_old_import_paths_keep_working(old: str, name: str, new: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


class Flaky(MemorySink):
    """Refuses its first ``failures`` writes with a retryable error, then takes everything. No retry
    code of its own: the lane retries it."""

    def __init__(
        self, failures: int, retry: RetryConfig, timeout: str | None = None, hang: bool = False
    ) -> None:
        super().__init__("flaky", queue=QueueConfig(max_bytes=64 << 20, full_policy="block"))
        self.config = SinkConfig(
            type="memory", name="flaky", queue=self.config.queue, retry=retry,
            timeout=None if timeout is None else plugin.Duration(float(timeout)),
        )  # fmt: skip
        self.failures = failures
        self.hang = hang
        self.attempts = 0

    async def write(self, batch: plugin.OutgoingBatch) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            if self.hang:
                await trio.sleep_forever()  # the lane's timeout ends the attempt
            raise plugin.RetryableError("HTTP 503")
        await super().write(batch)


def _one_batch(sink: Flaky) -> cuptistream.Session:
    config = {
        "pipeline": {"batch": {"max_events": 10_000, "max_latency": "50ms"}, "stats_interval": "10s"},
        "sinks": [{"type": "null"}],
    }
    with cuptistream.session(config, sinks=[sink], quiet=True) as session:
        session.emitter.emit(
            [
                Kernel(start=i, end=i + 1, name="k", device_id=0, context_id=1, stream_id=2, correlation_id=i)
                for i in range(100)
            ]
        )
    return session


FAST = RetryConfig(
    initial_backoff=plugin.Duration(0.01), max_backoff=plugin.Duration(0.02), max_elapsed=plugin.Duration(5.0)
)


def test_the_lane_retries_a_sink_that_raises_retryable_twice() -> None:
    sink = Flaky(failures=2, retry=FAST)
    session = _one_batch(sink)
    assert sink.attempts >= 3
    assert len(sink.kernels()) == 100, "delivered on the third attempt, nothing lost"
    report = session.report
    assert report is not None and report.sinks["flaky"].events_dropped == 0


def test_with_retry_disabled_the_first_failure_loses_the_batch() -> None:
    sink = Flaky(failures=2, retry=RetryConfig(enabled=False))
    session = _one_batch(sink)
    assert sink.kernels() == []
    report = session.report
    assert report is not None and report.sinks["flaky"].events_dropped >= 100
    assert any(key.startswith("sink:flaky/") for key in report.losses)


def test_the_timeout_key_ends_a_hung_attempt_and_the_next_one_delivers() -> None:
    sink = Flaky(failures=1, retry=FAST, timeout="0.2", hang=True)
    session = _one_batch(sink)
    assert sink.attempts >= 2 and len(sink.kernels()) == 100
    assert session.report is not None and session.report.sinks["flaky"].events_dropped == 0
