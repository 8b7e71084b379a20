"""The collector's statistics end to end: ``cuptistream run`` with the replay source into the file
sink, read back; the same events as Kafka ``jsonl`` rows (schema-valid, epoch times, read back)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import jsonschema
import pytest

import cuptistream
from cuptistream.events import ActivityStats, GpuStats, Kernel, Memcpy
from cuptistream.recording.rows import decode_rows, encode_rows
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURE_DIR  # shipped real-GPU captures

if TYPE_CHECKING:
    from cuptistream.collector.collector import Collector
    from cuptistream.config import Config
    from cuptistream.cupti.capture import Capture
    from cuptistream.probe.emitter import ProbeEmitter
    from cuptistream.probe.link import ProbeLink

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SCHEMA = json.loads((ROOT / "docs" / "events.schema.json").read_text())


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("stats")
    cfg = {
        "sources": [{"type": "replay", "path": str(CAPTURE_DIR)}],
        "statistics": {"interval": "1s", "max_names": 4},
        "sinks": [{"type": "file", "directory": str(tmp / "out")}],
    }
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp / "cfg.json"), "--", sys.executable, "-c", "0"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp / "out"


def test_run_writes_statistics_that_add_up_to_the_raw_records(recording: Path) -> None:
    events = list(cuptistream.read(recording))
    kernels = [e for e in events if isinstance(e, Kernel)]
    stats = [e for e in events if isinstance(e, ActivityStats)]
    gpu = [e for e in events if isinstance(e, GpuStats)]
    assert kernels and stats and gpu
    by_interval = collections.Counter(e.end // 10**9 * 10**9 for e in kernels)
    counted = collections.Counter()
    for s in stats:
        if s.category == "kernel":
            counted[s.interval_start] += s.count
            assert s.interval_end - s.interval_start == 10**9 and s.interval_start % 10**9 == 0
    assert counted == by_interval  # every kernel once, in the interval it ended in
    names = collections.Counter((s.interval_start, s.category) for s in stats)
    assert max(names.values()) <= 5 and any(s.name == "other" for s in stats)  # 4 names + other
    copies = [e for e in events if isinstance(e, Memcpy)]
    assert sum(s.bytes for s in stats if s.category == "memcpy") == sum(c.bytes for c in copies)
    assert sum(g.kernels for g in gpu) == len(kernels) and all(0 <= g.busy_fraction <= 1 for g in gpu)


def test_statistics_travel_as_jsonl_rows(recording: Path) -> None:
    batches = [
        b for b in cuptistream.read(recording).batches() if any(isinstance(e, GpuStats) for e in b.events)
    ]
    assert batches
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for batch in batches:
        offset = batch.clock.offset_ns
        want = [e for e in batch.events if isinstance(e, (ActivityStats, GpuStats))]
        starts = [e.interval_start + offset for e in want]
        data = encode_rows(batch)
        rows = [json.loads(line) for line in data.splitlines()]
        stat_rows = [r for r in rows if r["type"] in ("activity_stats", "gpu_stats")]
        assert all(validator.is_valid(r) for r in stat_rows)
        assert [r["interval_start"] for r in stat_rows] == starts  # epoch ns, like every row time
        assert all(r["interval_end"] - r["interval_start"] == 10**9 for r in stat_rows)
        back = [e for e in decode_rows(data).events if isinstance(e, (ActivityStats, GpuStats))]
        assert back == want  # the histograms included (encode_rows shifted ``want``'s times too)


@pytest.mark.parametrize("lean", [True, False])
def test_summary_of_a_recording_without_raw_records_reads_the_statistics(tmp_path: Path, lean: bool) -> None:
    from cuptistream import events as ev
    from cuptistream.analysis.records import Recording
    from cuptistream.analysis.summary import summarize
    from cuptistream.channel.messages import OpenStream, TraceSpan
    from cuptistream.collector.decoding import DecodeStream
    from cuptistream.config.model import StatisticsConfig
    from cuptistream.cupti import capture
    from tests.gpu.workloads.collect import Collect
    from tests.helpers.fixture_recording import Process, write_recording

    processes, raw_kernels, stats_events = [], collections.Counter(), []
    for index, name in enumerate(["exact_counts", "torch_train"]):
        cap = capture.read(CAPTURE_DIR / f"{name}.cupti")
        info = OpenStream(stream=0, source="replay", struct_sizes=dict(cap.struct_sizes),
                          strings=dict(cap.strings), records="on_demand")  # fmt: skip
        sink = Collect()
        stream = DecodeStream(info, 0, sink, statistics=StatisticsConfig(interval=1.0))
        # exact_counts in a budget-mode window of 0.2 s (estimates); torch_train traced throughout
        first = min(_kernel_starts(cap))
        if index == 0:  # (its one buffer arrives after the window closed: coverage is what counts)
            stream.trace_span(TraceSpan(stream=0, window=1, start=first, kinds=["concurrent_kernel"]))
            stream.trace_span(
                TraceSpan(
                    stream=0, window=1, start=first, end=first + 200_000_000, kinds=["concurrent_kernel"]
                )
            )
        for buf in cap.buffers:  # records: on_demand, no on-demand window: statistics only
            data = bytearray(buf.data)
            stream.decode(memoryview(data), len(data), 0)
        stream.close()
        assert not any(isinstance(e, (Kernel, Memcpy)) for e in sink.events)  # statistics only
        stats_events += sink.events
        resource = ev.Resource(host="h", pid=4200 + index, process_name=name, command_line=[])
        processes.append(
            Process(resource, cap.clock or ev.ClockSync(cupti_ns=0, unix_ns=0), list(sink.events))
        )
    recording = write_recording(tmp_path / "rec", processes)
    report = summarize(Recording(str(recording), lean=lean), top=None, mangled=True)
    assert report.meta["gpu_tables_from"] == "statistics"
    kernels = report.table("kernels").as_dicts()
    for st in stats_events:
        if isinstance(st, ActivityStats) and st.category == "kernel":
            raw_kernels[st.name] += st.count
    assert {r["name"]: r["count"] for r in kernels} == dict(raw_kernels)
    assert {r["name"] for r in kernels if r["estimated"]} == {"cs_exact_kernel"}  # the windowed one
    assert "estimated" in report.table("kernels").title
    by_name = collections.defaultdict(list)
    for st in stats_events:
        if isinstance(st, ActivityStats) and st.category == "kernel":
            by_name[st.name].append(st)
    for r in kernels:
        assert r["estimated"] == any(st.estimated for st in by_name[r["name"]])
        assert r["estimated_total_ns"] == sum(st.estimated_total_ns for st in by_name[r["name"]])
    assert [r["estimated_total_ns"] for r in kernels] == sorted(
        (r["estimated_total_ns"] for r in kernels), reverse=True
    )
    gpu = [e for e in stats_events if isinstance(e, GpuStats)]
    busy = report.table("gpu_busy").as_dicts()
    assert sum(r["busy_ns"] for r in busy) == sum(g.busy_ns for g in gpu) > 0
    assert sum(r["span_ns"] for r in busy) == sum(g.traced_ns for g in gpu)
    memory = {(r["operation"], r["kind"]): r for r in report.table("memory").as_dicts()}
    copied = sum(s.bytes for s in stats_events if isinstance(s, ActivityStats) and s.category == "memcpy")
    assert sum(r["bytes"] for k, r in memory.items() if k[0].startswith("memcpy")) == copied > 0


class ProbeOnCapture(NamedTuple):
    collector: Collector
    link: ProbeLink
    emitter: ProbeEmitter
    capture: Capture


def _probe_on_exact_counts(config: Config, tmp_path: Path, name: str) -> ProbeOnCapture:
    """A started collector listening on ``tmp_path/c.sock`` and a probe (its real link, connected, and
    emitter) ready to publish the ``exact_counts`` capture's buffers: the tests differ only after this."""
    from cuptistream.collector.collector import Collector
    from cuptistream.cupti import capture
    from cuptistream.probe.emitter import ProbeEmitter
    from cuptistream.probe.link import ProbeLink

    collector = Collector(config).start()
    collector.listen(str(tmp_path / "c.sock"))
    cap = capture.read(CAPTURE_DIR / "exact_counts.cupti")
    resource = cuptistream.events.Resource(host="h", pid=os.getpid(), process_name="p", command_line=[])
    link = ProbeLink(str(tmp_path / "c.sock"), name, resource)
    emitter = ProbeEmitter(link, 1 << 20, "drop_newest", 1 << 20, 2, lambda: None)
    link.connect()
    return ProbeOnCapture(collector, link, emitter, cap)


def test_the_collector_answers_a_closed_trace_span_with_window_records(tmp_path: Path) -> None:
    """A probe (its real link and emitter) publishes a capture's buffers inside a trace window; the
    collector drains them before the close, answers on the socket, and its statistics cover the span."""
    import select
    import time

    from cuptistream.channel import messages, sockets
    from cuptistream.config import load

    config = load(
        {"statistics": {"interval": "1s"}, "sinks": [{"type": "file", "directory": str(tmp_path / "out")}]}
    )
    collector, link, emitter, cap = _probe_on_exact_counts(config, tmp_path, "span-test")
    stream = messages.OpenStream(
        stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings)
    )
    outlet = emitter.open_activity_stream(stream, 1 << 20, len(cap.buffers) + 1)
    start = int(min(r for r in _kernel_starts(cap)))
    link.post(
        messages.TraceSpan(stream=outlet.stream, window=4, start=start, kinds=["concurrent_kernel"]), wait=5
    )
    for buf in cap.buffers:
        slot = outlet.pool.take()
        assert slot is not None
        outlet.pool.view(slot, len(buf.data))[:] = buf.data
        outlet.pool.publish(slot, 1, outlet.stream, len(buf.data), buf.dropped)  # no Ready: the close drains
    end = start + 500_000_000
    link.post(
        messages.TraceSpan(stream=outlet.stream, window=4, start=start, end=end, kinds=["concurrent_kernel"]),
        wait=5,
    )
    sock = link._sock
    assert sock is not None
    deadline = time.monotonic() + 10
    reply = None
    while reply is None and time.monotonic() < deadline:
        if select.select([sock], [], [], 0.2)[0]:
            received = sockets.receive(sock)
            assert received is not None
            if isinstance(received[0], messages.WindowRecords):
                reply = received[0]
    assert reply is not None and (reply.stream, reply.window) == (outlet.stream, 4)
    expected = json.loads((FIXTURES / "expected.json").read_text())["exact_counts"]
    kernels = reply.records["kernel"] + reply.records["graph_kernel"]  # graph nodes priced apart
    assert kernels == expected["decoded_events"]["Kernel"] and reply.records["memcpy"] == 8
    assert reply.records["graph_kernel"] == sum(
        1 for e in _decoded(cap) if isinstance(e, Kernel) and e.graph_id
    )
    link.close()
    collector.wait_idle(10)
    collector.finish()
    events = list(cuptistream.read(tmp_path / "out"))
    kernel_ns = sum(e.end - e.start for e in events if isinstance(e, Kernel))
    assert reply.kernel_ns == kernel_ns > 0
    stats = [e for e in events if isinstance(e, ActivityStats)]
    # Kernels were traced from the span's start for 0.5 s, copies not at all; the kernels that ended
    # in later intervals (the graph's, 3 s on) fell in no traced time and are not in the statistics.
    assert stats and {s.category for s in stats} == {"kernel"}
    covered = (end // 10**9 + 1) * 10**9
    in_traced = [e for e in events if isinstance(e, Kernel) and e.end < covered]
    assert 0 < len(in_traced) < expected["decoded_events"]["Kernel"]
    assert sum(s.count for s in stats) == len(in_traced)
    first = min(s.interval_start for s in stats)
    assert next(s.traced_ns for s in stats if s.interval_start == first) == min(end, first + 10**9) - start


def _kernel_starts(cap: object) -> list[int]:
    from cuptistream.collector.buffer_decoder import Decoder
    from cuptistream.cupti.names import TableNames
    from cuptistream.cupti.records import RecordLayouts

    decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)))  # type: ignore[attr-defined]
    return [
        int(r["start"].min())
        for b in cap.buffers  # type: ignore[attr-defined]
        for _, e, r in decoder._records(b.data, len(b.data), None)
        if e in ("kernel", "memcpy")
    ]


def _decoded(cap: object) -> list[object]:
    from cuptistream.collector.buffer_decoder import Decoder
    from cuptistream.cupti.names import TableNames
    from cuptistream.cupti.records import RecordLayouts

    decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)))  # type: ignore[attr-defined]
    return [e for b in cap.buffers for e in decoder.decode(b.data, len(b.data))]  # type: ignore[attr-defined]


def test_records_on_demand_are_withheld_and_counted_in_the_report(tmp_path: Path) -> None:
    """``records: on_demand`` outside an on-demand window: the collector decodes every record for the
    statistics, writes none as raw events, and its shutdown report says how many it withheld."""
    from cuptistream.channel import messages
    from cuptistream.config import load

    config = load({"sinks": [{"type": "file", "directory": str(tmp_path / "out")}]})
    collector, link, emitter, cap = _probe_on_exact_counts(config, tmp_path, "withheld-test")
    stream = messages.OpenStream(
        stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings),
        records="on_demand",
    )  # fmt: skip
    outlet = emitter.open_activity_stream(stream, 1 << 20, len(cap.buffers) + 1)
    for buf in cap.buffers:
        assert outlet.write(buf.data, buf.dropped, timeout=10)
    assert outlet.wait_consumed(10)
    link.close()
    collector.wait_idle(10)
    report = collector.finish()
    assert report is not None
    events = list(cuptistream.read(tmp_path / "out"))
    decoded = len(_decoded(cap))
    assert not any(isinstance(e, (Kernel, Memcpy)) for e in events)
    assert any(isinstance(e, ActivityStats) for e in events)
    assert report.activity_records_withheld == report.activity_records >= decoded > 0
