"""``cuptistream export`` of several ranks' recordings (two nodes, the same pid on both, different
CUPTI clocks): one trace, a process track per rank, every event on the Unix clock."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cuptistream import events as ev
from cuptistream.cli import main
from tests.helpers.ranks import rank_processes, write_ranks
from tests.test_trace_export import validate

SHIFT_NS = 987_654_321_123  # rank 1's CUPTI clock reads this much more than rank 0's at the same moment


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list]:
    processes = rank_processes(2, hosts=2, shift_ns={1: SHIFT_NS}, same_pid=True)
    return write_ranks(tmp_path_factory.mktemp("ranks"), processes), processes


def test_one_trace_two_process_tracks_one_clock(two_ranks: tuple[list[Path], list], tmp_path: Path) -> None:
    directories, processes = two_ranks
    out = tmp_path / "trace.json.gz"
    assert main(["export", *map(str, directories), "-o", str(out)]) == 0
    with gzip.open(out, "rt") as handle:
        trace = json.load(handle)
    events = validate(trace)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(names) == 2
    pids = sorted(names)
    assert pids[0] == 7000 and pids[1] > 7000  # the same pid on the other host gets its own track
    assert names[pids[0]] == "rank 0 · torch_train (pid 7000) on node0"
    assert names[pids[1]] == "rank 1 · torch_train (pid 7000) on node1"
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert order == {pids[0]: 0, pids[1]: 1}
    gpu_tids = {e["tid"]: e["pid"] for e in events if e["ph"] == "X" and e.get("cat") == "kernel"}
    assert set(gpu_tids.values()) == set(pids)  # each rank's kernels on its own process's tracks

    # One clock: the same kernel, recorded at the same Unix time by both ranks, has the same ts.
    base = trace["otherData"]["ts_base_unix_ns"]
    kernels = [
        [e for e in events if e["ph"] == "X" and e.get("cat") == "kernel" and e["pid"] == p] for p in pids
    ]
    assert len(kernels[0]) == len(kernels[1]) > 0
    assert [(k["name"], k["ts"], k["dur"]) for k in kernels[0]] == [
        (k["name"], k["ts"], k["dur"]) for k in kernels[1]
    ]
    raw = [e for e in processes[0].events if isinstance(e, ev.Kernel)]
    first = min(raw, key=lambda e: e.start)
    unix = first.start + processes[0].clock.offset_ns
    assert kernels[0][0]["ts"] == pytest.approx((unix - base) / 1000, abs=0.001)
    shifted = [e for e in processes[1].events if isinstance(e, ev.Kernel)]
    assert min(e.start for e in shifted) - first.start == SHIFT_NS  # raw times differ, Unix times agree
    assert base % 1_000_000_000 == 0 and base < unix


def test_export_accepts_a_glob(two_ranks: tuple[list[Path], list], tmp_path: Path) -> None:
    directories, _ = two_ranks
    pattern = str(directories[0].parent.parent / "node*" / "out")
    out = tmp_path / "trace.json"
    assert main(["export", pattern, "-o", str(out)]) == 0
    names = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("name") == "process_name"]
    assert len(names) == 2
