"""Every time a sink emits is Unix-epoch ns, whatever the source: a real session
per source feeds the file sink, the OTLP sink (the real receiver) and the Kafka sink with
``value_format: jsonl`` (a real tansu broker), and every time read back lands within an hour of when
the data was captured.

* ``replay``, and the ``activity`` decoder it shares: the committed H200 captures
  (sources/captures/*.cupti, 2026-11-21). The capture time is read from the captures themselves
  (their CUPTI timestamps are on the Unix clock), independently of any sink.
* ``synthetic``: generated now, so now is the capture time.

The live ``activity``, ``callbacks``, ``state``, ``pc_sampling`` and ``sass`` sources need a GPU to
run: tests/gpu/test_clocks_gpu.py runs each under ``cuptistream run`` into the same three sinks (the
committed sampling fixtures hold samples without times: the source stamps them when it drains, so
there is nothing in them for a sink to date). The readers are shared: tests/clock_times.py.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

from kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture

import cuptistream
from cuptistream.events import Kernel
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures
from tests.clock_times import HOUR, file_times, kafka_times, otlp_times, sinks_config
from tests.otlp_receiver import OtlpReceiver

CAPTURE_DAY = datetime.datetime(2026, 11, 21, tzinfo=datetime.timezone.utc)


def run_session(source: dict[str, Any], out: Path, receiver: OtlpReceiver, broker: TansuBroker) -> None:
    cfg = {"sources": [source], "sinks": sinks_config(out, receiver.endpoint, broker.bootstrap, "clock")}
    with cuptistream.session(cfg, quiet=True):
        pass


def sink_times(out: Path, receiver: OtlpReceiver, broker: TansuBroker) -> dict[str, list[int]]:
    """Kernel times as each sink delivered them, in epoch ns (start, end per kernel)."""
    return {
        "file": file_times(out).get("kernel", []),
        "otlp": otlp_times(receiver).get("span:kernel", []),
        "kafka jsonl": kafka_times(broker.bootstrap, "clock").get("kernel", []),
    }


def assert_near(times: dict[str, list[int]], reference: int, kernels: int) -> None:
    for sink, values in times.items():
        assert len(values) == 2 * kernels, f"{sink}: {len(values) // 2} kernels, expected {kernels}"
        worst = max(abs(t - reference) for t in values)
        assert worst < HOUR, f"{sink}: a time {worst / 1e9:.0f} s away from the capture"


def test_replayed_captures_are_dated_when_they_were_captured(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    from tests.test_otlp_fixtures import replayed_events

    captured = [e.start for e in replayed_events() if isinstance(e, Kernel)]  # the captures' own times
    reference = min(captured)
    assert CAPTURE_DAY.timestamp() * 1e9 <= reference < CAPTURE_DAY.timestamp() * 1e9 + 24 * HOUR
    with OtlpReceiver() as receiver:
        run_session({"type": "replay", "path": str(CAPTURES)}, tmp_path / "out", receiver, kafka_broker)
        times = sink_times(tmp_path / "out", receiver, kafka_broker)
    assert_near(times, reference, len(captured))
    assert sorted(times["otlp"][::2]) == sorted(times["kafka jsonl"][::2]) == sorted(times["file"][::2])


def test_synthetic_events_are_dated_now(kafka_broker: TansuBroker, tmp_path: Path) -> None:
    now = time.time_ns()
    with OtlpReceiver() as receiver:
        run_session({"type": "synthetic", "events": 2000}, tmp_path / "out", receiver, kafka_broker)
        times = sink_times(tmp_path / "out", receiver, kafka_broker)
    assert_near(times, now, 2000)


def test_the_sampling_and_state_sources_give_the_probe_their_clock(monkeypatch: Any) -> None:
    """pc_sampling, sass and state stamp their events on CUPTI's clock (``cuptiGetTimestamp``), so
    each must give the probe that clock: a session of one of them alone had no clock reading, and its
    batches paired the monotonic clock with the Unix clock (times ~56 years late)."""
    from cuptistream.cupti import driver
    from cuptistream.sources.cupti_worker import CuptiWorkerSource
    from cuptistream.sources.state import StateConfig, StateSource
    from tests.test_callbacks import MemoryEmitter
    from tests.test_callbacks_subscriber import FakeCupti

    class Worker(CuptiWorkerSource):  # what pc_sampling and sass share
        label = "test"

        def start(self) -> None:
            self._hold_cupti(30.0)

        def stop(self) -> None:
            self._release()

    monkeypatch.setattr(driver, "acquire", lambda name: None)
    monkeypatch.setattr(driver, "release", lambda name, finalize=True: None)
    from cuptistream.config import SourceConfig
    from cuptistream.cupti.subscriber import Subscriber

    worker = Worker(SourceConfig(type="pc_sampling"), MemoryEmitter())
    state = StateSource(StateConfig(type="state"), MemoryEmitter(), sub=Subscriber(FakeCupti()))
    for source in (worker, state):
        assert source.clock is None
        source.start()
        assert source.clock is driver.timestamp
        source.stop()
