"""``cuptistream summary`` on a recording made from the real-GPU fixtures.

Expected values are computed here from the decoded events with plain Python (Counters, sorted
interval sweeps), never with the summary's code, and kernel counts also against ``expected.json``
(CUPTI's own record walk on the GPU).
"""

from __future__ import annotations

import collections
import csv
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cuptistream import events as ev
from cuptistream.analysis.aggregate import IntervalUnion
from cuptistream.analysis.records import Part, Recording
from cuptistream.analysis.select import Selection, parse_ids, parse_time
from cuptistream.analysis.summary import Report, summarize
from cuptistream.cli import main
from tests.helpers.fixture_recording import (  # noqa: F401 - the fixtures
    FIXTURES,
    Process,
    processes_fixture,
    recording_fixture,
    write_recording,
)


def _all(processes: list[Process], cls: type) -> list:
    return [e for p in processes for e in p.events if isinstance(e, cls)]


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


@pytest.mark.parametrize("lean", [False, True])
def test_kernels_match_raw_events_and_cupti_counts(
    processes: list[Process], recording: Path, lean: bool
) -> None:
    report = summarize(Recording(str(recording), lean=lean), top=None, mangled=True)  # names as recorded
    rows = {r["name"]: r for r in report.table("kernels").as_dicts()}
    durations: dict[str, list[int]] = collections.defaultdict(list)
    for k in _all(processes, ev.Kernel):
        durations[k.name].append(k.end - k.start)
    assert set(rows) == set(durations)
    grand = sum(sum(d) for d in durations.values())
    for name, ds in durations.items():
        row = rows[name]
        assert (row["count"], row["total_ns"], row["min_ns"], row["max_ns"]) == (
            len(ds),
            sum(ds),
            min(ds),
            max(ds),
        )
        assert row["share"] == pytest.approx(sum(ds) / grand)
    expected = json.loads((FIXTURES / "expected.json").read_text())
    for name, count in expected["exact_counts"]["kernel_names"].items():
        assert rows[name]["count"] == count  # 500 cs_exact_kernel + 60 graph kernels, CUPTI's walk
    totals = [r["total_ns"] for r in report.table("kernels").as_dicts()]
    assert totals == sorted(totals, reverse=True)


@pytest.mark.parametrize("lean", [False, True])
def test_memory_api_nvtx_match_raw_events(processes: list[Process], recording: Path, lean: bool) -> None:
    report = summarize(Recording(str(recording), lean=lean), top=None)
    copies: collections.Counter = collections.Counter()
    nbytes: collections.Counter = collections.Counter()
    for c in _all(processes, ev.Memcpy):
        key = ("memcpy " + c.copy_kind, f"{c.src_kind} -> {c.dst_kind}")
        copies[key] += 1
        nbytes[key] += c.bytes
    for m in _all(processes, ev.Memset):
        copies[("memset", m.memory_kind)] += 1
        nbytes[("memset", m.memory_kind)] += m.bytes
    got = {(r["operation"], r["kind"]): r for r in report.table("memory").as_dicts()}
    assert {k: r["count"] for k, r in got.items()} == dict(copies)
    assert {k: r["bytes"] for k, r in got.items()} == dict(nbytes)
    # 4 HtoD + 4 DtoH of 128 KiB (exact_counts), 3 pinned round trips of 1 MiB (torch_train)
    assert got[("memcpy HtoD", "pinned -> device")]["bytes"] == 3 * 2**20
    row = got[("memcpy HtoD", "pinned -> device")]
    assert row["gb_per_s"] == pytest.approx(row["bytes"] / row["total_ns"])

    api: collections.Counter = collections.Counter()
    api_ns: collections.Counter = collections.Counter()
    for a in _all(processes, ev.ApiCall):
        api[(a.domain, a.name)] += 1
        api_ns[(a.domain, a.name)] += a.end - a.start
    rows = {(r["domain"], r["name"]): r for r in report.table("api").as_dicts()}
    assert {k: r["count"] for k, r in rows.items()} == dict(api)
    assert {k: r["total_ns"] for k, r in rows.items()} == dict(api_ns)

    nvtx = {r["name"]: r["count"] for r in report.table("nvtx").as_dicts()}
    assert nvtx == dict(collections.Counter(n.name for n in _all(processes, ev.NvtxRange)))
    assert report.meta["events"]["api"] == sum(api.values())


def test_gpu_busy_per_device_and_stream(processes: list[Process], recording: Path) -> None:
    report = summarize(Recording(str(recording), lean=True), top=None)
    devices = {(r["pid"], r["device"]): r for r in report.table("gpu_busy").as_dicts()}
    streams = {(r["pid"], r["stream"]): r for r in report.table("stream_busy").as_dicts()}
    for p in processes:
        ops = [e for e in p.events if isinstance(e, ev.Kernel | ev.Memcpy | ev.Memset)]
        if not ops:
            assert (p.resource.pid, 0) not in devices
            continue
        row = devices[(p.resource.pid, 0)]
        span = max(o.end for o in ops) - min(o.start for o in ops)
        assert row["busy_ns"] == _union_length([(o.start, o.end) for o in ops])
        assert row["span_ns"] == span
        assert row["idle_ns"] == span - row["busy_ns"]
        assert row["process"] == f"rank {p.resource.rank}"
        per_stream: collections.Counter[int] = collections.Counter()
        for o in ops:
            per_stream[o.stream_id] += o.end - o.start
        for stream, busy in per_stream.items():
            assert streams[(p.resource.pid, stream)]["busy_ns"] == busy


def test_sampling_sass_losses_errors(processes: list[Process], recording: Path) -> None:
    report = summarize(Recording(str(recording)), top=None)
    pc = json.loads((FIXTURES / "sampling" / "pc_sampling_h200.json").read_text())["decoded"]
    per_function: collections.Counter = collections.Counter()
    for sample in pc["samples"]:
        per_function[sample["function_name"]] += sum(
            n for r, n in sample["stalls"].items() if not r.endswith("_not_issued")
        )
    functions = {r["function"]: r["samples"] for r in report.table("pc_functions").as_dicts()}
    assert functions == dict(per_function)
    assert sum(functions.values()) == pc["total_samples"] == 148409
    reasons = {r["reason"]: r["samples"] for r in report.table("stall_reasons").as_dicts()}
    assert reasons["long_scoreboard"] == 119580  # the memory-bound `strided` kernel
    assert sum(reasons.values()) == 148409
    sass = report.table("sass").as_dicts()
    # README: 21 records; loop body 528000 each (528 warps x 10 launches x 100 trips), the rest 5280
    values = json.loads((FIXTURES / "sampling" / "sass_h200.json").read_text())["decoded"]
    assert sass == [{"function": "counted", "metric": "smsp__sass_inst_executed",
                     "total": sum(v for r in values for vs in r["values"].values() for v in vs)}]  # fmt: skip
    losses = {(r["stage"], r["reason"]): (r["events"], r["count"]) for r in report.table("losses").as_dicts()}
    assert losses == {("cupti", "cupti_buffer_dropped"): (1, 7), ("intake", "queue_full"): (1, 3)}
    assert report.table("errors").as_dicts() == [
        {"severity": "warning", "origin": "cupti_state", "message": "made-up warning", "count": 1}
    ]


def test_filters_by_rank_pid_device_and_window(processes: list[Process], recording: Path) -> None:
    torch = processes[2]
    assert torch.resource.process_name == "torch_train"
    report = summarize(Recording(str(recording)), Selection(ranks=frozenset({2})), top=None)
    assert [p["pid"] for p in report.meta["processes"]] == [torch.resource.pid]
    kernels = [e for e in torch.events if isinstance(e, ev.Kernel)]
    assert sum(r["count"] for r in report.table("kernels").as_dicts()) == len(kernels)
    by_pid = summarize(Recording(str(recording)), Selection(pids=frozenset({torch.resource.pid})), top=None)
    assert by_pid.table("kernels").rows == report.table("kernels").rows
    other = summarize(Recording(str(recording)), Selection(devices=frozenset({1})), top=None)
    assert other.table("kernels").rows == [] and other.table("gpu_busy").rows == []
    assert other.table("api").rows  # host-side events name no device and are kept

    # An absolute window over the middle of the training steps, in Unix ns.
    off = torch.clock.offset_ns
    starts = sorted(k.start for k in kernels)
    low, high = starts[10] + off, starts[60] + off
    sel = Selection(ranks=frozenset({2}), since=parse_time("--since", f"@{low / 1e9:.9f}"),
                    until=parse_time("--until", f"@{high / 1e9:.9f}"))  # fmt: skip
    windowed = summarize(Recording(str(recording)), sel, top=None)
    low_c, high_c = sel.window(0, [])[0] - off, sel.window(0, [])[1] - off
    inside = [k for k in kernels if low_c <= k.start < high_c]
    assert sum(r["count"] for r in windowed.table("kernels").as_dicts()) == len(inside) >= 49
    busy = windowed.table("gpu_busy").as_dicts()[0]["busy_ns"]
    gpu = [
        e
        for e in torch.events
        if isinstance(e, ev.Kernel | ev.Memcpy | ev.Memset) and low_c <= e.start < high_c
    ]
    assert busy == _union_length([(o.start, min(o.end, high_c)) for o in gpu])


def test_relative_window_starts_at_the_first_batch(processes: list[Process], recording: Path) -> None:
    torch = processes[2]
    first = min(e.start for e in torch.events[:100] if isinstance(e, ev.ApiCall | ev.NvtxRange | ev.Kernel))
    sel = Selection(
        ranks=frozenset({2}), since=parse_time("--since", "3ms"), until=parse_time("--until", "+5ms")
    )
    report = summarize(Recording(str(recording)), sel, top=None)
    calls = [a for a in torch.events if isinstance(a, ev.ApiCall) and 3e6 <= a.start - first < 5e6]
    assert sum(r["count"] for r in report.table("api").as_dicts()) == len(calls) > 0


def test_interval_union_is_exact_with_local_disorder() -> None:
    rng = random.Random(7)
    intervals = []
    t = 0
    for _ in range(20000):
        t += rng.randint(1, 50)
        intervals.append((t, t + rng.randint(1, 120)))
    shuffled = intervals[:]
    for i in range(0, len(shuffled), 64):  # disorder within windows of 64, as buffers interleave
        block = shuffled[i : i + 64]
        rng.shuffle(block)
        shuffled[i : i + 64] = block
    union = IntervalUnion(keep=512)
    for i in range(0, len(shuffled), 1000):
        chunk = np.array(shuffled[i : i + 1000], np.int64)
        union.add(chunk[:, 0].copy(), chunk[:, 1].copy())
    assert union.total_ns == _union_length(intervals)
    assert len(union.starts) <= 512 + 1000


def test_cli_formats_and_one_line_errors(
    recording: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["summary", str(recording), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "== Kernels by total GPU time (top 3 of" in text and "cs_exact_kernel" in text
    assert main(["summary", str(recording), "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    kernel_rows = [r for r in rows if r[0] == "kernels"]
    assert kernel_rows[0][1:3] == ["cs_exact_kernel", "500"]
    out = tmp_path / "s.json"
    assert main(["summary", str(recording), "--format", "json", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kernels"]["rows"][0]["name"] == "cs_exact_kernel"
    assert data["meta"]["events"]["kernel"] == 644

    for argv, message in [
        (["summary", str(tmp_path / "missing")], "no such file or directory"),
        (["summary", str(recording), "--format", "xml"], "--format 'xml': expected one of table, csv, json"),
        (["summary", str(recording), "--since", "yesterday"], "--since 'yesterday': expected a duration"),
        (["summary", str(recording), "--rank", "x"], "--rank 'x': expected non-negative integers"),
        (["summary", str(recording), "--since", "2s", "--until", "1s"], "is not after --since"),
        (["summary", "kafka://nohost"], "expected kafka://host:port/topic"),
        (["summary", str(recording), "--top", "0"], "--top 0: expected a positive number"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("cuptistream: ") and message in err and err.count("\n") == 1, err


def test_torn_tail_is_reported(recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    damaged = tmp_path / "torn"
    damaged.mkdir()
    first = sorted(recording.iterdir())[0]
    data = first.read_bytes()
    (damaged / first.name).write_bytes(data[:-10])
    assert main(["summary", str(damaged), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    losses = json.loads(out)["losses"]["rows"]
    assert any(r["reason"] == "torn_tail" for r in losses)
    assert "torn tail" in err and err.count("\n") == 1


# --- the summary's column path against the per-event one, on random recordings -----------------

_NAMES = ["cudaLaunchKernel", "cuMemAlloc_v2", "shared_name"]  # shared_name: an API call and a kernel


def _synthetic(seed: int) -> list[Process]:
    rng = random.Random(seed)
    processes = []
    for index in range(2):
        t = 10**15 + index * 12345
        events: list[ev.Event] = []
        for i in range(2500):
            t += rng.randint(1, 2000)
            end = t + rng.randint(0, 4000)
            kind = rng.random()
            if kind < 0.5:
                name = rng.choice(_NAMES)
                domain = "runtime" if name.startswith("cuda") else "driver"
                events.append(ev.ApiCall(domain=domain, name=name, cbid=1, start=t, end=end, process_id=1,
                                         thread_id=1, correlation_id=i))  # fmt: skip
            elif kind < 0.7:
                events.append(ev.Kernel(start=t, end=end, name=rng.choice(["k1", "k2", "shared_name"]),
                                        device_id=rng.choice([0, 1]), context_id=1, stream_id=rng.choice([7, 13]),
                                        correlation_id=i))  # fmt: skip
            elif kind < 0.77:
                events.append(ev.Memcpy(start=t, end=end, bytes=rng.randint(1, 10**6), copy_kind="HtoD",
                                        src_kind=rng.choice(["pinned", "pageable"]), dst_kind="device",
                                        device_id=rng.choice([0, 1]), context_id=1, stream_id=7, correlation_id=i))  # fmt: skip
            elif kind < 0.82:
                events.append(ev.Memset(start=t, end=end, bytes=4096, value=0, memory_kind="device", device_id=0,
                                        context_id=1, stream_id=13, correlation_id=i))  # fmt: skip
            elif kind < 0.88:
                events.append(ev.NvtxRange(name=rng.choice(["step", "shared_name"]), start=t, end=end,
                                           thread_id=1, domain=rng.choice(["", "app"])))  # fmt: skip
            else:
                events.append(
                    ev.ExternalCorrelation(external_kind="custom0", external_id=i, correlation_id=i)
                )
        resource = ev.Resource(
            host="synthetic", pid=9000 + index, process_name="p", command_line=["p"], rank=index
        )
        # Process 0 has no clock offset: a window without --until reaches 2**63 ns, past int64.
        clock = ev.ClockSync(cupti_ns=0, unix_ns=0 if index == 0 else 10**9)
        processes.append(Process(resource, clock, events))
    return processes


class _FullStructs:
    """A recording whose batches hold the full Structs (as Kafka and JSON Lines deliver them)."""

    def __init__(self, processes: list[Process], batch_events: int) -> None:
        self.processes, self.batch_events = processes, batch_events
        self.torn_tails: list = []

    def parts(self) -> Iterator[Part]:
        for p in self.processes:
            for i in range(0, len(p.events), self.batch_events):
                yield Part(p.resource, p.clock.offset_ns, p.events[i : i + self.batch_events])


def _tables(report: Report) -> list:
    return [report.meta] + [(t.name, t.rows, t.total_rows) for t in report.tables]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"devices": "1"},
        {"ranks": "1"},
        {"since": "2ms"},
        {"since": "1ms", "until": "+4ms", "devices": "0"},
        {"until": "3ms"},
        {"exact": "yes"},
    ],
)
def test_column_path_matches_per_event_path_and_plain_python(options: dict[str, str], tmp_path: Path) -> None:
    exact = "exact" in options
    processes = _synthetic(11)
    path = write_recording(tmp_path / "rec", processes, batch_events=333)
    if "exact" in options:  # both bounds on an API call's start: the first counts, the last does not
        calls = [e.start + 10**9 for e in processes[1].events if isinstance(e, ev.ApiCall)]
        options = {"since": f"@{calls[100] / 1e9:.9f}", "until": f"@{calls[900] / 1e9:.9f}"}

    def selection() -> Selection:
        return Selection(
            devices=parse_ids("--device", options["devices"]) if "devices" in options else None,
            ranks=parse_ids("--rank", options["ranks"]) if "ranks" in options else None,
            since=parse_time("--since", options["since"]) if "since" in options else None,
            until=parse_time("--until", options["until"]) if "until" in options else None,
        )

    sel = selection()
    columns = summarize(Recording(str(path), lean=True), sel, top=None)
    assert _tables(summarize(_FullStructs(processes, 333), selection(), top=None)) == _tables(columns)  # type: ignore[arg-type]
    assert _tables(summarize(Recording(str(path)), selection(), top=None)) == _tables(columns)

    # And against plain Python over the events, with the window the summary fixed.
    low, high = sel.window(0, []) if sel.timed else (-(2**63), 2**63)
    if exact:
        assert (low, high) == (calls[100], calls[900])
    api: dict[str, list[int]] = collections.defaultdict(list)
    kernels: dict[str, list[int]] = collections.defaultdict(list)
    for p in processes:
        if sel.ranks is not None and p.resource.rank not in sel.ranks:
            continue
        off = p.clock.offset_ns
        for e in p.events:
            if isinstance(e, ev.ApiCall) and low <= e.start + off < high:
                api[e.name].append(e.end - e.start)
            elif (
                isinstance(e, ev.Kernel)
                and low <= e.start + off < high
                and (sel.devices is None or e.device_id in sel.devices)
            ):
                kernels[e.name].append(e.end - e.start)
    for table, expected in (("api", api), ("kernels", kernels)):
        got = {
            r["name"]: (r["count"], r["total_ns"], r["min_ns"], r["max_ns"])
            for r in columns.table(table).as_dicts()
        }
        assert got == {n: (len(d), sum(d), min(d), max(d)) for n, d in expected.items()}, table
    assert "shared_name" in {r["name"] for r in columns.table("api").as_dicts()} or options
    assert columns.meta["events"]["external_correlation"] == sum(
        isinstance(e, ev.ExternalCorrelation) for p in processes for e in p.events
        if sel.ranks is None or p.resource.rank in sel.ranks
    )  # fmt: skip


def test_every_summary_struct_answers_the_three_columns() -> None:
    from cuptistream.analysis.records import FAMILY_KEY, SUMMARY_TYPES

    assert {str(c.__struct_config__.tag) for c in SUMMARY_TYPES} == set(ev.EVENT_TYPES)
    for cls in SUMMARY_TYPES:
        tag = str(cls.__struct_config__.tag)
        assert tag == "api" or cls.summary_key is FAMILY_KEY[tag]  # type: ignore[attr-defined]
        for column in ("start", "end"):
            assert column in cls.__struct_fields__ or getattr(cls, column) == 0, (cls, column)
