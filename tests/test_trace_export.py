"""``cuptistream export`` on the real-GPU fixtures, checked against the Trace Event Format rules:
required fields per ``ph``, matched flow ids (one ``s`` and one ``f`` each, each bound to a slice),
monotonic ``ts`` per track, properly nested slices, and counts from the raw events."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest

from cuptistream import events as ev
from cuptistream.analysis.records import Recording
from cuptistream.analysis.select import Selection, parse_time
from cuptistream.analysis.trace_export import export_trace
from cuptistream.cli import main
from tests.helpers.fixture_recording import Process, processes_fixture, recording_fixture  # noqa: F401 - the fixtures

_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def validate(trace: dict) -> list[dict]:
    """Assert the Trace Event Format rules; returns the events."""
    assert isinstance(trace["traceEvents"], list)
    events = trace["traceEvents"]
    required = {
        "X": {"name", "ph", "ts", "dur", "pid", "tid"},
        "M": {"name", "ph", "pid", "args"},
        "s": {"name", "ph", "ts", "pid", "tid", "id", "cat"},
        "f": {"name", "ph", "ts", "pid", "tid", "id", "cat", "bp"},
        "C": {"name", "ph", "ts", "pid", "args"},
        "i": {"name", "ph", "ts", "pid", "s"},
    }
    last: dict[tuple, float] = {}
    slices: dict[tuple, list[tuple[float, float]]] = collections.defaultdict(list)
    flows: dict[int, dict[str, dict]] = collections.defaultdict(dict)
    for e in events:
        assert e["ph"] in required, e
        missing = required[e["ph"]] - e.keys()
        assert not missing, (missing, e)
        assert isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        track = (e["pid"], e["name"]) if e["ph"] == "C" else (e["pid"], e["tid"])
        assert e["ts"] >= last.get(track, float("-inf")), f"ts goes back on track {track}: {e}"
        last[track] = e["ts"]
        if e["ph"] == "X":
            assert e["dur"] >= 0
            slices[track].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "C":
            assert all(isinstance(v, int | float) for v in e["args"].values())
        elif e["ph"] in "sf":
            assert e["ph"] not in flows[e["id"]], f"flow id {e['id']} has two {e['ph']} events"
            flows[e["id"]][e["ph"]] = e
    for ident, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {ident} is unmatched: {pair}"
        s, f = pair["s"], pair["f"]
        assert s["pid"] == f["pid"] and s["ts"] <= f["ts"]
        # each end is bound to a slice on its track: s inside one, f at the start of one (bp=e)
        assert any(a <= s["ts"] <= b for a, b in slices[(s["pid"], s["tid"])])
        assert any(a == f["ts"] for a, _ in slices[(f["pid"], f["tid"])])
    for track, spans in slices.items():  # slices on one track nest or follow, never cross
        open_ends: list[float] = []
        for start, end in spans:
            while open_ends and open_ends[-1] <= start + 1e-6:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-6, f"slices cross on {track}"
            open_ends.append(end)
    return events


def _expected_flows(processes: list[Process]) -> int:
    total = 0
    for p in processes:
        launches = {a.correlation_id for a in p.events
                    if isinstance(a, ev.ApiCall) and any(w in a.name for w in _LAUNCH_WORDS)}  # fmt: skip
        gpu = [e for e in p.events if isinstance(e, ev.Kernel | ev.Memcpy | ev.Memset | ev.GraphLaunch)]
        total += sum(1 for e in gpu if e.correlation_id in launches)
    return total


def test_trace_follows_the_format_and_matches_raw_events(
    processes: list[Process], recording: Path, tmp_path: Path
) -> None:
    out = tmp_path / "trace.json"
    stats = export_trace(Recording(str(recording)), out)
    events = validate(_load(out))
    assert stats.events == len(events)
    by_cat = collections.Counter(e.get("cat") for e in events if e["ph"] == "X")
    assert by_cat["kernel"] == sum(isinstance(e, ev.Kernel) for p in processes for e in p.events) == 644
    assert by_cat["memcpy"] == sum(isinstance(e, ev.Memcpy) for p in processes for e in p.events)
    assert by_cat["graph_launch"] == 30
    assert by_cat["cuda_runtime"] + by_cat["cuda_driver"] == sum(
        isinstance(e, ev.ApiCall) for p in processes for e in p.events
    )
    assert by_cat["nvtx"] == 6
    assert stats.flows == _expected_flows(processes) > 600
    assert sum(e["ph"] == "s" for e in events) == stats.flows
    # one process per pid, named with its rank; GPU streams and API threads as named tracks
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"rank {p.resource.rank} · {p.resource.process_name} (pid {p.resource.pid}) on h200-fixture"
                     for p in processes}  # fmt: skip
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"GPU 0 · stream 7", "GPU 0 · stream 13", "CUDA API · thread 3462316352"} <= tracks
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert "memcpy HtoD GB/s (GPU 0)" in counters
    assert "lost events: cupti cupti_buffer_dropped" in counters
    # the first cs_exact_kernel launch: its arrow lands on the kernel
    first = min(
        (e for e in events if e["ph"] == "X" and e["name"] == "cs_exact_kernel"), key=lambda e: e["ts"]
    )
    assert any(e["ph"] == "f" and e["ts"] == first["ts"] and e["tid"] == first["tid"] for e in events)


def test_spilled_runs_and_gzip_give_the_same_trace(recording: Path, tmp_path: Path) -> None:
    plain = tmp_path / "a.json"
    export_trace(Recording(str(recording)), plain)
    spilled = tmp_path / "b.json.gz"
    stats = export_trace(Recording(str(recording)), spilled, run_events=300)
    assert stats.runs > 5
    a, b = _load(plain), validate(_load(spilled))
    assert a["traceEvents"] == b
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".cuptistream-export-")]


def test_window_and_rank(processes: list[Process], recording: Path, tmp_path: Path) -> None:
    torch = processes[2]
    off = torch.clock.offset_ns
    kernels = sorted(k.start for k in torch.events if isinstance(k, ev.Kernel))
    low, high = kernels[10] + off, kernels[40] + off
    sel = Selection(ranks=frozenset({2}), since=parse_time("--since", f"@{low / 1e9:.9f}"),
                    until=parse_time("--until", f"@{high / 1e9:.9f}"))  # fmt: skip
    out = tmp_path / "w.json"
    export_trace(Recording(str(recording)), out, sel)
    events = validate(_load(out))
    lo, hi = sel.window(0, [])
    expected = sum(1 for k in torch.events if isinstance(k, ev.Kernel) and lo <= k.start + off < hi)
    assert sum(1 for e in events if e.get("cat") == "kernel") == expected >= 29
    assert {e["pid"] for e in events} == {torch.resource.pid}


def test_cli_export_and_errors(recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json.gz"
    assert main(["export", str(recording), "--format", "chrome-trace", "-o", str(out)]) == 0
    assert "trace events" in capsys.readouterr().err
    validate(_load(out))
    for argv, message in [
        (
            ["export", str(recording), "--format", "svg", "-o", str(out)],
            "expected one of perfetto, chrome-trace",
        ),
        (["export", str(recording), "-o", str(tmp_path / "no" / "t.json")], "cannot write there"),
        (["export", str(recording), "--rank", "9", "-o", str(tmp_path / "e.json")], "nothing to export"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("cuptistream: ") and message in err and err.count("\n") == 1, err
