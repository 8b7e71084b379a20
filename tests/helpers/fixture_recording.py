"""A file-sink recording made from the committed real-GPU fixtures, for the analysis views.

Each activity capture (``sources/captures/*.cupti``) is decoded by the replay source, exactly as the
collector decodes live buffers, and becomes one observed process (its own pid and rank, its capture's
clock). The first process also gets the PC-sampling and SASS results of ``tests/fixtures/sampling``
(decoded from captured CUPTI bytes) and, so the loss and error tables have rows, two losses and an
error that are made up here (the captures had none).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from cuptistream import events as ev
from cuptistream.cupti import capture
from cuptistream.recording.codec import encode_batch_object
from cuptistream.recording.segments import SegmentWriter
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures
from sources.replay import ReplayConfig, ReplaySource
from tests.gpu.workloads.collect import Collect

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

PID_BASE = 4100


@dataclass
class Process:
    resource: ev.Resource
    clock: ev.ClockSync
    events: list[ev.Event]


def _decode(path: Path) -> tuple[list[ev.Event], ev.ClockSync]:
    sink = Collect()
    source = ReplaySource(ReplayConfig(type="replay", path=str(path)), sink)
    source.start()
    source.stop()
    cap = capture.read(path)
    clock = cap.clock or ev.ClockSync(cupti_ns=0, unix_ns=0)
    return list(sink.events), clock


def _sampling(at: int) -> list[ev.Event]:
    pc = json.loads((FIXTURES / "sampling" / "pc_sampling_h200.json").read_text())["decoded"]
    sass = json.loads((FIXTURES / "sampling" / "sass_h200.json").read_text())["decoded"]
    samples = msgspec.convert(pc["samples"], list[ev.PcSample])
    records = msgspec.convert(sass, list[ev.SassRecord])
    return [
        ev.PcSampleBatch(
            timestamp=at, device_id=0, context_id=1, range_id=pc["range_id"], samples=samples,
            total_samples=pc["total_samples"],
        ),
        ev.SassMetricBatch(timestamp=at, device_id=0, context_id=1, records=records),
    ]  # fmt: skip


def fixture_processes() -> list[Process]:
    """The fixture processes, their events in the order the decoder produced them."""
    processes = []
    for index, path in enumerate(sorted(CAPTURES.glob("*.cupti"))):
        events, clock = _decode(path)
        pid = PID_BASE + index
        resource = ev.Resource(
            host="h200-fixture", pid=pid, process_name=path.stem, command_line=["python", path.stem],
            rank=index, local_rank=index, world_size=3,
            devices=[ev.DeviceInfo(device_id=0, name="NVIDIA H200", uuid=f"GPU-fixture-{index}")],
        )  # fmt: skip
        processes.append(Process(resource, clock, events))
    first = processes[0]
    starts = [e.start for e in first.events if isinstance(e, ev.Kernel)]
    at = min(starts) + 1000
    unix = at + first.clock.offset_ns
    first.events.extend(_sampling(at))
    first.events.append(
        ev.Loss(stage="cupti", reason="cupti_buffer_dropped", count=7, since=unix, until=unix + 1)
    )
    first.events.append(ev.Loss(stage="intake", reason="queue_full", count=3, since=unix, until=unix + 2))
    first.events.append(
        ev.Error(severity="warning", origin="cupti_state", message="made-up warning", timestamp=at)
    )
    return processes


def batches(processes: list[Process], batch_events: int = 256) -> Iterator[ev.Batch]:
    for process in processes:
        for seq, i in enumerate(range(0, len(process.events), batch_events)):
            yield ev.Batch(
                schema_version=ev.SCHEMA_VERSION, session_id="fixture", seq=seq, resource=process.resource,
                attributes={}, clock=process.clock, events=process.events[i : i + batch_events],  # type: ignore[arg-type]
            )  # fmt: skip


def write_recording(directory: Path, processes: list[Process], batch_events: int = 256) -> Path:
    """Write the processes' events as the file sink does (one zstd frame per msgpack batch)."""
    directory.mkdir(parents=True, exist_ok=True)
    for process in processes:
        writer = SegmentWriter(
            directory, prefix="cuptistream", suffix=".msgpack.zst", fsync="never",
            origin=f"rank{process.resource.rank}-{process.resource.host}-{process.resource.pid}",
        )  # fmt: skip
        for batch in batches([process], batch_events):
            writer.append(encode_batch_object(batch))
        writer.close()
    return directory


if __name__ == "__main__":  # python -m tests.helpers.fixture_recording OUT_DIR
    import sys

    print(write_recording(Path(sys.argv[1]), fixture_processes()))


# pytest fixtures for the tests of the analysis views; a test module imports them by these names.


@pytest.fixture(scope="module", name="processes")
def processes_fixture() -> list[Process]:
    return fixture_processes()


@pytest.fixture(scope="module", name="recording")
def recording_fixture(processes: list[Process], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixtures' recording, 100 events a batch (many batches, so a selection can skip some)."""
    return write_recording(tmp_path_factory.mktemp("rec") / "out", processes, batch_events=100)
