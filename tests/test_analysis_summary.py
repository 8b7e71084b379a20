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
from pathlib import Path

import numpy as np
import pytest

from cuptistream import events as ev
from cuptistream.analysis.records import Recording
from cuptistream.analysis.select import Selection, parse_time
from cuptistream.analysis.summary import IntervalUnion, summarize
from cuptistream.cli import main
from tests.helpers.fixture_recording import FIXTURES, Process, fixture_processes, write_recording


@pytest.fixture(scope="module")
def processes() -> list[Process]:
    return fixture_processes()


@pytest.fixture(scope="module")
def recording(processes: list[Process], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_recording(tmp_path_factory.mktemp("rec") / "out", processes, batch_events=100)


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
def test_kernels_match_raw_events_and_cupti_counts(processes: list[Process], recording: Path, lean: bool) -> None:
    report = summarize(Recording(str(recording), lean=lean), top=None)
    rows = {r["name"]: r for r in report.table("kernels").as_dicts()}
    durations: dict[str, list[int]] = collections.defaultdict(list)
    for k in _all(processes, ev.Kernel):
        durations[k.name].append(k.end - k.start)
    assert set(rows) == set(durations)
    grand = sum(sum(d) for d in durations.values())
    for name, ds in durations.items():
        row = rows[name]
        assert (row["count"], row["total_ns"], row["min_ns"], row["max_ns"]) == (len(ds), sum(ds), min(ds), max(ds))
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
        per_stream = collections.Counter()
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
    gpu = [e for e in torch.events if isinstance(e, ev.Kernel | ev.Memcpy | ev.Memset) and low_c <= e.start < high_c]
    assert busy == _union_length([(o.start, min(o.end, high_c)) for o in gpu])


def test_relative_window_starts_at_the_first_batch(processes: list[Process], recording: Path) -> None:
    torch = processes[2]
    first = min(e.start for e in torch.events[:100] if isinstance(e, ev.ApiCall | ev.NvtxRange | ev.Kernel))
    sel = Selection(ranks=frozenset({2}), since=parse_time("--since", "3ms"), until=parse_time("--until", "+5ms"))
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


def test_cli_formats_and_one_line_errors(recording: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
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
