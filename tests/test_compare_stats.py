"""``cuptistream compare`` on recordings of the always-on mode: 8 ranks with the collector's statistics
only (``tests/helpers/rank_stats.py``: the replayed real-GPU capture folded by the collector's own
``Accumulator``), one rank's kernel slowed or none; estimates marked; the same answer as raw records;
raw and statistics ranks mixed; statistics intervals summed into compare intervals, or refused; the
statistics' Kafka rows, read and followed; a budget gap; the collector's decode path end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture

from cuptistream.cli import main
from cuptistream.cupti.names import demangle
from tests.helpers.compare_follow import follow_until_outlier
from tests.helpers.rank_stats import statistics_only
from tests.helpers.ranks import Scale, biggest_kernel, rank_processes, replayed, write_ranks

SLOW_RANK = 5
if TYPE_CHECKING:
    from cuptistream.analysis.compare import CompareResult, IntervalResult

SECOND = 1_000_000_000


@pytest.fixture(scope="module")
def slow_kernel() -> str:
    return biggest_kernel(replayed()[0])


def _write(
    root: Path,
    scale: Scale | None,
    interval_ns: int,
    traced: float | None,
    raw: frozenset[int] = frozenset(),
    keep_raw: bool = False,
) -> Path:
    processes = rank_processes(8, scale=scale)
    write_ranks(
        root,
        [
            p if p.resource.rank in raw else statistics_only(p, interval_ns, traced, keep_raw)
            for p in processes
        ],
    )
    return root


@pytest.fixture(scope="module")
def budget_slowed(tmp_path_factory: pytest.TempPathFactory, slow_kernel: str) -> Path:
    """Budget mode: 1 s statistics, a trace window over the first 60 % of the capture."""
    return _write(tmp_path_factory.mktemp("budget_slowed"), Scale(SLOW_RANK, slow_kernel, 1.3), SECOND, 0.6)


@pytest.fixture(scope="module")
def budget_even(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("budget_even"), None, SECOND, 0.6)


def _json(args: list[str], tmp_path: Path) -> dict:
    out = tmp_path / "compare.json"
    assert main(["compare", *args, "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def test_statistics_only_flags_the_slowed_rank_and_says_they_are_estimates(
    budget_slowed: Path, slow_kernel: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _json([str(budget_slowed / "node*" / "out")], tmp_path)
    total = result["total"]
    assert [r["rank"] for r in total["ranks"]] == [f"rank {i}" for i in range(8)]
    for row in total["ranks"]:
        match = re.fullmatch(r"statistics \(estimated, traced (\d+\.\d)%\)", row["basis"])
        assert match and 0 < float(match.group(1)) < 100, row["basis"]
        assert 0 < row["busy_fraction"] <= 1 and row["kernels"] > 0 and row["compute_ns"] > 0
        assert row["nccl_ns"] == 0 and row["hosts"] == [f"node{row['rank_id'] // 4}"]
    assert result["meta"]["statistics_interval_ns"] == SECOND
    rows = {r["rank_id"]: r for r in total["ranks"]}
    shown = demangle(slow_kernel)
    assert rows[SLOW_RANK]["top_kernels"][shown] == pytest.approx(
        1.3 * rows[0]["top_kernels"][shown], rel=0.01
    )
    assert all(rows[r]["compute_ns"] == rows[0]["compute_ns"] for r in rows if r != SLOW_RANK)

    assert [o["rank"] for o in result["outliers"]] == [f"rank {SLOW_RANK}"]
    outlier = result["outliers"][0]
    compute = next(m for m in outlier["metrics"] if m["metric"] == "compute_ns")
    assert compute["direction"] == "high" and compute["mad"] == 0
    assert {m["metric"] for m in outlier["metrics"]} <= {"compute_ns", "busy_fraction"}
    assert outlier["cause"].startswith("straggler: more compute-kernel time")
    assert outlier["kernels_longer"][0]["name"] == shown and len(outlier["kernels_longer"]) == 1
    assert outlier["kernels_shorter"] == []

    assert main(["compare", str(budget_slowed / "node*" / "out")]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("from the collector's statistics"))
    assert (
        "rank 0, rank 1" in line
        and "estimated, traced" in line
        and "1.000 s intervals summed into 10.000 s" in line
    )
    assert f"rank {SLOW_RANK}: straggler" in text


def test_statistics_only_flags_none_when_no_rank_is_slowed(budget_even: Path, tmp_path: Path) -> None:
    result = _json([str(budget_even / "node0" / "out"), str(budget_even / "node1" / "out")], tmp_path)
    assert len(result["total"]["ranks"]) == 8
    assert all(r["basis"].startswith("statistics (estimated") for r in result["total"]["ranks"])
    assert result["outliers"] == [] and result["total"]["flags"] == []
    assert all(interval["flags"] == [] for interval in result["intervals"])


def test_raw_records_and_statistics_give_the_same_answer(
    tmp_path_factory: pytest.TempPathFactory, slow_kernel: str, tmp_path: Path
) -> None:
    """Traced throughout (``full`` with statistics): the statistics measure, and agree with the
    records on every metric but busy's denominator; mixed, the raw ranks keep their records."""
    scale = Scale(SLOW_RANK, slow_kernel, 1.3)
    raw = _write(tmp_path_factory.mktemp("raw"), scale, SECOND, None, raw=frozenset(range(8)))
    stats = _write(tmp_path_factory.mktemp("stats"), scale, SECOND, None)
    mixed = _write(tmp_path_factory.mktemp("mixed"), scale, SECOND, None, raw=frozenset({0, 1, 2, 3}))
    by = {name: _json([str(root / "node*" / "out")], tmp_path) for name, root in
          (("raw", raw), ("stats", stats), ("mixed", mixed))}  # fmt: skip
    assert {r["basis"] for r in by["raw"]["total"]["ranks"]} == {"records"}
    assert {r["basis"] for r in by["stats"]["total"]["ranks"]} == {"statistics (measured)"}
    assert [r["basis"] for r in by["mixed"]["total"]["ranks"]] == ["records"] * 4 + [
        "statistics (measured)"
    ] * 4
    assert by["raw"]["meta"]["statistics_interval_ns"] is None
    keys = ("compute_ns", "nccl_ns", "copy_ns", "copy_bytes", "kernels", "busy_ns", "top_kernels")
    for name in ("stats", "mixed"):
        for want, got in zip(by["raw"]["total"]["ranks"], by[name]["total"]["ranks"], strict=True):
            assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
        outliers = by[name]["outliers"]
        assert (
            [o["rank"] for o in outliers]
            == [o["rank"] for o in by["raw"]["outliers"]]
            == [f"rank {SLOW_RANK}"]
        )
        assert outliers[0]["kernels_longer"] == by["raw"]["outliers"][0]["kernels_longer"]
        assert outliers[0]["kernels_longer"][0]["name"] == demangle(slow_kernel)


def test_statistics_intervals_sum_into_compare_intervals_or_are_refused(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _write(tmp_path_factory.mktemp("ms"), None, 2_000_000, None)  # 2 ms statistics intervals
    source = str(root / "node*" / "out")
    result = _json([source, "--interval", "4ms"], tmp_path)
    assert result["meta"]["statistics_interval_ns"] == 2_000_000 and len(result["intervals"]) >= 2
    for rank in range(8):
        per_interval = [r for iv in result["intervals"] for r in iv["ranks"] if r["rank_id"] == rank]
        whole = result["total"]["ranks"][rank]
        for key in ("compute_ns", "kernels", "copy_bytes", "busy_ns"):
            assert sum(r[key] for r in per_interval) == whole[key] > 0
    for interval, why in (("1ms", "does not hold whole statistics intervals of 0.002s"), ("3ms", "multiple")):
        assert main(["compare", source, "--interval", interval, "-o", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1 and "Traceback" not in err


def test_full_recordings_with_statistics_compare_on_records_at_any_interval(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """A ``full`` recording holds raw records and statistics; it is compared on the records, so
    statistics intervals that do not nest in ``--interval`` are no error (H100 run, 10 s statistics,
    ``--interval 5s``). Refused as soon as one rank has only statistics."""
    both = _write(tmp_path_factory.mktemp("both"), None, 2_000_000, None, keep_raw=True)
    result = _json([str(both / "node*" / "out"), "--interval", "3ms"], tmp_path)
    assert {r["basis"] for r in result["total"]["ranks"]} == {"records"}
    assert result["meta"]["statistics_interval_ns"] is None and len(result["intervals"]) >= 2
    mixed = _write(tmp_path_factory.mktemp("mixed_ms"), None, 2_000_000, None, keep_raw=True)
    only = _write(tmp_path_factory.mktemp("only_ms"), None, 2_000_000, None)
    args = [str(mixed / "node0" / "out"), str(only / "node1" / "out"), "--interval", "3ms"]
    assert main(["compare", *args, "-o", str(tmp_path / "x")]) == 2


def _send_rows(bootstrap: str, topic: str, slow_kernel: str) -> None:
    """The 8 statistics-only ranks as the Kafka sink's ``jsonl`` rows (epoch times, full Structs)."""
    from kafka import KafkaProducer

    from cuptistream.recording.rows import encode_rows
    from tests.helpers.fixture_recording import batches

    processes = [
        statistics_only(p, SECOND, 0.6) for p in rank_processes(8, scale=Scale(SLOW_RANK, slow_kernel, 1.3))
    ]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for batch in batches(processes, 200):
        producer.send(topic, encode_rows(batch), headers=[("content-type", b"application/x-ndjson")])
    producer.flush()
    producer.close()


def test_statistics_rows_on_a_kafka_topic_read_and_followed(
    kafka_broker: TansuBroker, slow_kernel: str, tmp_path: Path
) -> None:
    """The same verdict from the statistics' Kafka rows, read to the end and with ``--follow``."""
    _send_rows(kafka_broker.bootstrap, "stats", slow_kernel)
    url = f"kafka://{kafka_broker.bootstrap}/stats"
    result = _json([url], tmp_path)
    assert [o["rank"] for o in result["outliers"]] == [f"rank {SLOW_RANK}"]
    assert result["outliers"][0]["kernels_longer"][0]["name"] == demangle(slow_kernel)
    assert all(r["basis"].startswith("statistics (estimated") for r in result["total"]["ranks"])

    run = follow_until_outlier(url)  # the interval closes once the Unix clock is past it (a 2026 capture)
    seen = run.until_outlier + run.after
    assert run.code == 0, run.stderr
    assert any(f"rank {SLOW_RANK} became an outlier: straggler" in line for line in seen), seen
    assert any(line.startswith("from the collector's statistics, not raw records") for line in seen), seen


def test_a_budget_gap_is_left_out_of_its_interval_and_scaled_over_in_the_whole_span() -> None:
    """The collector emits no statistics for an interval it traced none of: that rank is left out of
    that interval's comparison (not counted as idle), and its whole span is scaled over the gap."""
    from cuptistream import events as ev
    from cuptistream.analysis.compare import Comparer
    from cuptistream.analysis.compare_read import GpuWork
    from cuptistream.analysis.compare_stats import StatsWork

    results: list[IntervalResult] = []
    comparer = Comparer(results.append, interval_ns=SECOND)
    empty = np.empty(0, np.int64)
    for step in range(20):
        start, end = step * SECOND, (step + 1) * SECOND
        for rank in range(4):
            if rank == 1 and step == 7:
                continue  # no trace window fell in this interval on rank 1
            stats = StatsWork(
                kernels=[(start, end, "gemm", 1000, 100_000_000, 5_000_000, True)],
                copies=[(start, end, 10_000_000, 1 << 20)],
                gpu=[(start, end, 120_000_000, True)],
            )
            resource = ev.Resource(host="h", pid=100 + rank, process_name="p", command_line=[], rank=rank)
            work = GpuWork(resource, start, empty, empty, [], empty, empty, empty, empty, empty, [], stats)
            comparer.advance(start)
            comparer.add_work(work)
    result = comparer.finish()
    assert result.outliers == [] and all(r.flags == [] for r in results)
    assert [len(r.rows) for r in results] == [4] * 7 + [3] + [4] * 12
    rows = {r["rank_id"]: r for r in result.total.rows}
    assert (
        rows[1]["basis"]
        == "statistics (estimated, traced 5.0%; statistics in 19 of 20 intervals, gaps scaled)"
    )
    assert rows[0]["basis"] == "statistics (estimated, traced 5.0%)"
    for key in ("compute_ns", "copy_ns", "copy_bytes", "kernels", "busy_ns"):
        assert rows[1][key] == rows[0][key], key
    assert rows[0]["compute_ns"] == 20 * 100_000_000 and result.statistics_interval_ns == SECOND


def test_statistics_from_the_collectors_decode_path(tmp_path: Path) -> None:
    """The statistics as the collector's decode stream writes them under ``records: on_demand`` (no
    raw record kept) for 8 identical ranks: read, marked measured, no flags, and the same totals as
    the raw records of the same capture."""
    from cuptistream import events as ev
    from cuptistream.channel.messages import OpenStream
    from cuptistream.collector.decoding import DecodeStream
    from cuptistream.config.model import StatisticsConfig
    from cuptistream.cupti import capture
    from tests.gpu.workloads.collect import Collect
    from tests.helpers.fixture_recording import Process
    from tests.helpers.ranks import CAPTURE

    cap = capture.read(CAPTURE)
    info = OpenStream(stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings),
                      records="on_demand")  # fmt: skip
    sink = Collect()
    stream = DecodeStream(info, 0, sink, statistics=StatisticsConfig(interval=1.0))
    for buf in cap.buffers:
        data = bytearray(buf.data)
        stream.decode(memoryview(data), len(data), 0)
    stream.close()
    stats = [e for e in sink.events if isinstance(e, (ev.ActivityStats, ev.GpuStats))]
    assert stats and not any(isinstance(e, (ev.Kernel, ev.Memcpy, ev.Memset)) for e in sink.events)
    raw = rank_processes(8)
    write_ranks(tmp_path / "stats", [Process(p.resource, p.clock, stats) for p in raw])
    write_ranks(tmp_path / "raw", raw)
    got = _json([str(tmp_path / "stats" / "node*" / "out")], tmp_path)
    want = _json([str(tmp_path / "raw" / "node*" / "out")], tmp_path)
    assert got["outliers"] == [] and got["total"]["flags"] == []
    assert {r["basis"] for r in got["total"]["ranks"]} == {"statistics (measured)"}
    keys = ("compute_ns", "nccl_ns", "copy_ns", "copy_bytes", "kernels", "busy_ns", "top_kernels")
    for g, w in zip(got["total"]["ranks"], want["total"]["ranks"], strict=True):
        assert {k: g[k] for k in keys} == {k: w[k] for k in keys}


def _estimated_ranks(
    busy_ns: dict[tuple[int, int], int], steps: int
) -> tuple[CompareResult, list[IntervalResult]]:
    """Four ranks' estimated statistics over ``steps`` 1-s intervals, the same work on each, with the
    busy time of (rank, step) taken from ``busy_ns`` (900 ms otherwise); the whole span's result and
    the intervals' results."""
    from cuptistream import events as ev
    from cuptistream.analysis.compare import Comparer
    from cuptistream.analysis.compare_read import GpuWork
    from cuptistream.analysis.compare_stats import StatsWork

    results: list[IntervalResult] = []
    comparer = Comparer(results.append, interval_ns=SECOND)
    empty = np.empty(0, np.int64)
    for step in range(steps):
        start, end = step * SECOND, (step + 1) * SECOND
        for rank in range(4):
            stats = StatsWork(
                kernels=[(start, end, "gemm", 1000, 800_000_000, 40_000_000, True)],
                gpu=[(start, end, busy_ns.get((rank, step), 900_000_000), True)],
            )
            resource = ev.Resource(host="h", pid=100 + rank, process_name="p", command_line=[], rank=rank)
            comparer.advance(start)
            comparer.add_work(
                GpuWork(resource, start, empty, empty, [], empty, empty, empty, empty, empty, [], stats)
            )
    return comparer.finish(), results


def test_an_estimated_rank_is_an_outlier_only_where_its_intervals_bear_it_out() -> None:
    """A recorded always-on 4 x H100 run at 5 %: rank 0's estimated busy fraction came out 10 %
    under its peers' in one thinly traced interval (1.7 % of it traced) and 1.5-2 % under in the
    other two, which carried its whole-span busy 4.7 % under the median: flagged, though the same
    rank matched its peers in the full-mode run. One low interval of three does not make an
    outlier; two of three do."""
    one, intervals = _estimated_ranks({(0, 0): 750_000_000}, 3)
    assert [{f.rank for f in r.flags} for r in intervals] == [{"rank 0"}, set(), set()]
    assert one.outliers == [] and one.total.flags == []
    two, intervals = _estimated_ranks({(0, 0): 750_000_000, (0, 2): 850_000_000}, 3)
    assert [o["rank"] for o in two.outliers] == ["rank 0"] and two.outliers[0]["flagged_intervals"] == 2
    assert [(f.rank, f.metric) for f in two.total.flags] == [("rank 0", "busy_fraction")]


RECORDED_4_GPU = [
    Path(__file__).resolve().parent / "fixtures" / "compare" / run
    for run in ("nccl_4_gpus_unaligned", "nccl_4_gpus_aligned")
]


@pytest.mark.parametrize("folder", RECORDED_4_GPU, ids=["unaligned", "aligned"])
def test_the_recorded_4_gpu_always_on_runs_keep_only_the_slowed_rank(folder: Path) -> None:
    """Recorded always-on runs of tests/gpu/test_compare_multigpu.py on 4 x H100 with NCCL, one with
    budget windows at each rank's own phases and one with them aligned across ranks, filtered by
    ``borne_out`` on their recorded interval counts (every rank had a row in every interval): every
    flagged rank other than the slowed one goes, and the slowed one stays wherever it was flagged."""
    from cuptistream.analysis.outliers import borne_out

    paths = sorted(folder.glob("compare_nccl_always-on_slow_rank_*.json"))
    assert len(paths) == 4
    for path in paths:
        recorded = json.loads(path.read_text())
        slow = f"rank {recorded['workload'][0]['slow_rank']}"
        outliers = recorded["compare"]["outliers"]
        kept = [o["rank"] for o in outliers if borne_out(o["flagged_intervals"], o["intervals"])]
        flagged_slow = [o["rank"] for o in outliers if o["rank"] == slow]
        if path.stem.endswith("_0"):
            assert kept == [], path.name
        elif folder.name == "nccl_4_gpus_aligned":  # aligned: the slowed rank, and only it
            assert kept == [slow], (path.name, outliers)
        else:
            assert kept == flagged_slow, (path.name, outliers)
