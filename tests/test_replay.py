"""The replay source: captured H200 buffers through the decoder, the emitter, the real pipeline and
the file sink, with no GPU. Counts are checked against what the GPU run recorded."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import msgspec
import pytest

import cuptistream
from cuptistream.errors import ConfigError, UserError
from cuptistream.events import Kernel
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures
from sources.replay import ReplayConfig, ReplaySource
from tests.gpu.workloads.collect import Collect

FIXTURES = Path(__file__).parent / "fixtures"

EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def _expected_total(loops: int = 1) -> int:
    return loops * sum(sum(e["decoded_events"].values()) for e in EXPECTED.values())


def test_replay_emits_every_captured_event_once_per_loop() -> None:
    sink = Collect()
    source = ReplaySource(ReplayConfig(type="replay", loops=2), sink)
    source.start()
    source.stop()  # a finite replay completes before stop returns
    assert len(sink.events) == _expected_total(loops=2)
    assert source.buffers_sent == 2 * sum(e["buffers"] for e in EXPECTED.values())
    assert sink.errors == []


def test_packed_buffers_carry_every_record_of_every_loop_in_order() -> None:
    """``buffer_size`` joins captured buffers (across loops) into fewer, larger ones, as a busy GPU
    fills the activity source's: the same events, in fewer buffers."""
    loops = 30
    plain, packed = Collect(), Collect()
    for sink, size in ((plain, None), (packed, 1024 * 1024)):
        source = ReplaySource(ReplayConfig(type="replay", loops=loops, buffer_size=size), sink)
        source.start()
        source.stop()
        if size is None:
            sent_plain = source.buffers_sent
        else:
            sent_packed = source.buffers_sent
    assert len(plain.events) == len(packed.events) == _expected_total(loops=loops)

    def counted(events: list) -> collections.Counter[bytes]:  # a buffer's events come out grouped
        return collections.Counter(msgspec.msgpack.encode(event) for event in events)

    assert counted(packed.events) == counted(plain.events)
    assert sent_plain == loops * sum(e["buffers"] for e in EXPECTED.values())
    assert sent_packed < sent_plain / 5  # ~250 KB of captures per loop, 1 MiB buffers


def test_replay_through_session_and_file_sink(tmp_path: Path) -> None:
    cfg = {
        "sources": [{"type": "replay", "path": str(CAPTURES / "exact_counts.cupti")}],
        "sinks": [{"type": "file", "directory": str(tmp_path / "out")}],
    }
    with cuptistream.session(cfg, quiet=True):
        pass
    events = list(cuptistream.read(tmp_path / "out"))
    kernels = collections.Counter(e.name for e in events if isinstance(e, Kernel))
    assert dict(kernels) == EXPECTED["exact_counts"]["kernel_names"]
    types = collections.Counter(type(e).__name__ for e in events)
    for name, count in EXPECTED["exact_counts"]["decoded_events"].items():
        assert types[name] == count


def test_endless_replay_stops_when_asked() -> None:
    sink = Collect()
    source = ReplaySource(ReplayConfig(type="replay", loops=0, interval=0.001), sink)
    source.start()
    source.stop()
    assert source._thread is None
    assert len(sink.events) <= _expected_total(loops=2)


def test_missing_capture_is_one_line_error(tmp_path: Path) -> None:
    source = ReplaySource(ReplayConfig(type="replay", path=str(tmp_path)), Collect())
    with pytest.raises(UserError, match=r"no capture files \(\*\.cupti\)"):
        source.start()
    bad = tmp_path / "bad.cupti"
    bad.write_bytes(b"not zstd")
    with pytest.raises(UserError, match="not a cuptistream capture file"):
        ReplaySource(ReplayConfig(type="replay", path=str(bad)), Collect()).start()


def test_bad_replay_and_activity_config_name_the_key() -> None:
    with pytest.raises(ConfigError, match="buffer_size must be between 64KiB and 256MiB"):
        cuptistream.load_config(
            {"sources": [{"type": "replay", "buffer_size": "1KiB"}], "sinks": [{"type": "null"}]}
        )
    with pytest.raises(ConfigError, match="loops must be 0"):
        cuptistream.load_config({"sources": [{"type": "replay", "loops": -1}], "sinks": [{"type": "null"}]})
    with pytest.raises(ConfigError, match="unknown activity kind 'kernal'"):
        cuptistream.load_config(
            {"sources": [{"type": "activity", "kinds": ["kernal"]}], "sinks": [{"type": "null"}]}
        )
    with pytest.raises(ConfigError, match="runtime_api pattern 'cudaLaunchKernal' matches no"):
        cuptistream.load_config(
            {
                "sources": [{"type": "activity", "runtime_api": ["cudaLaunchKernal"]}],
                "sinks": [{"type": "null"}],
            }
        )


def test_activity_source_without_gpu_is_one_line_no_gpu_error() -> None:
    from cuptistream.cupti.driver import driver_problem
    from cuptistream.errors import NoGpuError
    from sources.activity import ActivitySource, ActivitySourceConfig

    if driver_problem() is None:
        pytest.skip("a GPU is present here")
    with pytest.raises(NoGpuError, match="no NVIDIA driver found") as info:
        ActivitySource(ActivitySourceConfig(type="activity"), Collect()).start()
    assert "\n" not in str(info.value)
    from cuptistream.cupti.kind_support import list_kinds

    with pytest.raises(NoGpuError):
        list_kinds()


def test_replayed_times_land_on_the_capture_date(tmp_path: Path) -> None:
    """Captured timestamps are CUPTI's; the batch clock must map them to the capture's wall-clock date
    (2026-11-21, tests/fixtures/README.md), not add the replay machine's monotonic offset on top."""
    import datetime

    cfg = {
        "sources": [{"type": "replay", "path": str(CAPTURES / "exact_counts.cupti")}],
        "sinks": [{"type": "file", "directory": str(tmp_path / "out")}],
    }
    with cuptistream.session(cfg, quiet=True):
        pass
    day = datetime.datetime(2026, 11, 21, tzinfo=datetime.timezone.utc).timestamp() * 1e9
    kernels = 0
    for batch in cuptistream.read(tmp_path / "out").batches():
        for event in batch.events:
            if isinstance(event, Kernel):
                kernels += 1
                assert day <= event.start + batch.clock.offset_ns < day + 86_400e9, batch.clock
    assert kernels == EXPECTED["exact_counts"]["decoded_events"]["Kernel"]
