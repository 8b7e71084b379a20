"""The ClickHouse warehouse schema and queries (cuptistream/warehouse) on a real ClickHouse engine in
process (chDB), loaded with the jsonl rows cuptistream writes for Kafka (``recording.rows``) from
recordings of the replayed real-GPU captures: the shipped schema is current, every event type lands
in its table, every shipped query runs, and the answers equal ``cuptistream compare``'s and
``summary``'s on the same recordings.

The schema's landing table is a Kafka engine table; chDB has no broker, so ``tests/helpers/clickhouse``
creates it with the Null engine and the rows go through the same materialized views."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cuptistream.cli import main
from cuptistream.warehouse import QUERIES, SCHEMA, query_text
from tests.helpers.clickhouse import SCHEMA_PATH, Warehouse, batch_rows, recording_rows
from tests.helpers.fixture_recording import batches, fixture_processes, write_recording
from tests.helpers.pm_kernel_recording import pm_kernel_processes, write_pm_kernel_recording
from tests.helpers.pm_recording import CLOCK, pm_processes, write_pm_recording
from tests.helpers.rank_stats import statistics_only
from tests.helpers.ranks import Scale, biggest_kernel, rank_processes, replayed, write_ranks
from tests.helpers.scripts import script

ROOT = Path(__file__).resolve().parent.parent
SLOW_RANK = 5
SECOND = 1_000_000_000
SPAN = {"since": "2000-01-01 00:00:00", "until": "2200-01-01 00:00:00"}


def _script() -> Any:
    return script("clickhouse_schema")


def test_the_shipped_schema_is_current() -> None:
    assert SCHEMA_PATH == ROOT / "cuptistream" / "warehouse" / SCHEMA
    assert SCHEMA_PATH.read_text() == _script().render(), (
        "cuptistream/warehouse/clickhouse/schema.sql is stale: run scripts/clickhouse_schema.py"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--records-ttl-days", "-1"], "--records-ttl-days -1: give 0 (keep for ever) or a number of days"),
        (["--topic", "a'b"], '--topic "a\'b": give a non-empty value without quotes or backslashes'),
        (["-o", "/nonexistent/dir/schema.sql"], "cannot write /nonexistent/dir/schema.sql"),
    ],
)
def test_the_script_says_what_is_wrong_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _script().main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_script_writes_a_schema_for_a_given_broker_and_retention(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _script().main(["--broker", "k1:9092,k2:9092", "--topic", "gpu.rows", "--records-ttl-days", "0",
                           "-o", "-"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "kafka_broker_list = 'k1:9092,k2:9092'" in text and "kafka_topic_list = 'gpu.rows'" in text
    assert "INTERVAL 14 DAY" not in text and "-- kernel:" in text  # records kept for ever
    assert "TTL toDateTime(`interval_start`) + INTERVAL 400 DAY" in text


@pytest.fixture(scope="module")
def warehouse() -> Iterator[Warehouse]:
    """The fixture recording's processes (every capture, PC samples, SASS, losses, an error)."""
    store = Warehouse()
    yield store
    store.close()


def test_every_event_type_lands_in_its_table(warehouse: Warehouse) -> None:
    rows = b"".join(batch_rows(batches(fixture_processes())))
    assert warehouse.insert([rows]) == rows.count(b"\n")
    sent = Counter(json.loads(line)["type"] for line in rows.splitlines())
    assert len(sent) > 10
    for tag, count in sent.items():
        assert warehouse.sql(f"SELECT count() AS n FROM `{tag}`") == [{"n": count}], tag
    kernel = warehouse.sql("SELECT * FROM kernel ORDER BY start LIMIT 1")[0]
    assert kernel["job"] == "fixture" and kernel["rank"] == 0 and kernel["device_uuid"] == "GPU-fixture-0"
    assert kernel["duration_ns"] > 0 and kernel["grid"] == [8, 1, 1]
    assert warehouse.sql("SELECT samples[1].stalls AS s FROM pc_samples")[0]["s"]
    # The Kafka engine table of the shipped schema is valid ClickHouse (chDB parses it; no broker to run it).
    kafka = SCHEMA_PATH.read_text().split(";\n")[0].split("\n\n\n")[-1]
    assert "ENGINE = Kafka" in kafka
    escaped = kafka.replace("\\", "\\\\").replace("\n", "\\n")  # a parameter's text is escaped as in TSV
    assert warehouse.sql("SELECT formatQuerySingleLine({q:String}) AS q", {"q": escaped})[0]["q"].startswith(
        "CREATE"
    )


def test_losses_equal_the_summary(warehouse: Warehouse, tmp_path: Path) -> None:
    summary = _summary(write_recording(tmp_path / "out", fixture_processes()), tmp_path)
    expected = {
        (r["stage"], r["reason"], r["unit"]): (r["events"], r["count"]) for r in summary["losses"]["rows"]
    }
    got = {(r["stage"], r["reason"], r["unit"]): (r["reports"], r["count"])
           for r in warehouse.query("losses", job="", **SPAN)}  # fmt: skip
    assert got == expected and got


def _summary(path: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "summary.json"
    assert main(["summary", str(path), "--mangled", "--format", "json", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def _compare(root: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "compare.json"
    assert (
        main(["compare", str(root / "node*" / "out"), "--mangled", "--format", "json", "-o", str(out)]) == 0
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def slow_kernel() -> str:
    return biggest_kernel(replayed()[0])


def _ranks(root: Path, job: str, scale: Scale | None, statistics: bool) -> Path:
    processes = rank_processes(8, scale=scale)
    if statistics:  # always-on: 1 s statistics, a budget window over the first 60 % of the capture
        processes = [statistics_only(p, SECOND, 0.6) for p in processes]
    write_ranks(root, processes)
    return root


@pytest.fixture(scope="module")
def jobs(
    tmp_path_factory: pytest.TempPathFactory, slow_kernel: str
) -> Iterator[tuple[Warehouse, dict[str, Path]]]:
    """One warehouse with four jobs of 8 ranks (records or statistics, one rank slowed or none) and
    a job of PM sampling attributed to kernels."""
    root = tmp_path_factory.mktemp("jobs")
    slow = Scale(SLOW_RANK, slow_kernel, 1.3)
    paths = {
        "slowed": _ranks(root / "slowed", "slowed", slow, False),
        "even": _ranks(root / "even", "even", None, False),
        "budget_slowed": _ranks(root / "budget_slowed", "budget_slowed", slow, True),
        "budget_even": _ranks(root / "budget_even", "budget_even", None, True),
    }
    store = Warehouse()
    for job, path in paths.items():
        store.insert(_as_job(recording_rows(sorted(path.glob("node*/out"))), job))
    store.insert(_as_job(batch_rows(batches(pm_kernel_processes())), "pm"))  # PM sampling of two hosts
    yield store, paths
    store.close()


def _as_job(chunks: Iterator[bytes], job: str) -> Iterator[bytes]:
    """Rows of one job: ``session.attributes: {job: ...}`` (the recordings were written without)."""
    for chunk in chunks:
        assert b'"attributes"' not in chunk  # empty: left out
        yield chunk.replace(b"}\n", b',"attributes":{"job":"' + job.encode() + b'"}}\n')


def _flags(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        mine = out.setdefault(row["rank"], {"metrics": {}, "longer": row["kernels_longer"],
                                            "shorter": row["kernels_shorter"]})  # fmt: skip
        mine["metrics"][row["metric"]] = row
    return out


@pytest.mark.parametrize("job", ["slowed", "even", "budget_slowed", "budget_even"])
def test_slow_ranks_flag_what_compare_flags(
    jobs: tuple[Warehouse, dict[str, Path]], job: str, tmp_path: Path
) -> None:
    store, paths = jobs
    expected = _compare(paths[job], tmp_path)
    got = _flags(store.query("slow_ranks", job=job, interval_s=10, top=5, **SPAN))
    assert sorted(got) == [o["rank"] for o in expected["outliers"]]
    if job.endswith("slowed"):
        assert sorted(got) == [f"rank {SLOW_RANK}"]
    for outlier in expected["outliers"]:
        mine = got[outlier["rank"]]
        assert sorted(mine["metrics"]) == sorted(m["metric"] for m in outlier["metrics"])
        for metric in outlier["metrics"]:
            row = mine["metrics"][metric["metric"]]
            assert row["direction"] == metric["direction"] and row["z"] == metric["z"]
            assert row["value"] == pytest.approx(metric["value"]) and row["median"] == pytest.approx(
                metric["median"]
            )
            assert row["mad"] == pytest.approx(metric["mad"]) and row["relative"] == metric["relative"]
        assert [k[0] for k in mine["longer"]] == [k["name"] for k in outlier["kernels_longer"]]
        assert [k[3] for k in mine["longer"]] == [k["diff_ns"] for k in outlier["kernels_longer"]]
        assert [k[0] for k in mine["shorter"]] == [k["name"] for k in outlier["kernels_shorter"]]
        assert (
            mine["metrics"][outlier["metrics"][0]["metric"]]["flagged_intervals"]
            == outlier["flagged_intervals"]
        )


def test_slow_ranks_of_every_job_at_once(jobs: tuple[Warehouse, dict[str, Path]]) -> None:
    store, paths = jobs
    rows = store.query("slow_ranks", job="", interval_s=10, top=5, **SPAN)
    assert {(r["job"], r["rank"]) for r in rows} == {("budget_slowed", f"rank {SLOW_RANK}"),
                                                     ("slowed", f"rank {SLOW_RANK}")}  # fmt: skip
    # Row for row what the query gives job by job (so what compare gives, tested above), in its order.
    by_job = [
        row
        for job in sorted(paths)
        for row in store.query("slow_ranks", job=job, interval_s=10, top=5, **SPAN)
    ]
    assert rows == by_job


@pytest.mark.parametrize("job", ["slowed", "budget_slowed"])
def test_top_kernels_and_busy_equal_the_summary(
    jobs: tuple[Warehouse, dict[str, Path]], job: str, tmp_path: Path
) -> None:
    store, paths = jobs
    summary = _summary(paths[job] / "node0" / "out", tmp_path)  # ranks 0-3
    host = {"job": job, **SPAN}
    node0 = store.sql(
        query_text("top_kernels").replace("AND ({job:String} = '' OR job = {job:String})",
                                          "AND job = {job:String} AND host = 'node0'"),
        {**host, "top": 1000},
    )  # fmt: skip
    kernels = summary["kernels"]["rows"]
    if job == "slowed":  # raw records: count and total to the nanosecond
        assert {(r["name"], r["count"], r["total_ns"]) for r in node0} == {
            (r["name"], r["count"], r["total_ns"]) for r in kernels
        }
    else:  # statistics: the measured and the estimated sums
        assert {
            (r["name"], r["count"], r["total_ns"], r["estimated_count"], r["estimated_total_ns"])
            for r in node0
        } == {
            (r["name"], r["count"], r["total_ns"], r["estimated_count"], r["estimated_total_ns"])
            for r in kernels
        }
        busy = {r["pid"]: r for r in store.query("gpu_busy", **host) if r["host"] == "node0"}
        rows = summary["gpu_busy"]["rows"]
        assert len(rows) == len(busy) == 4
        for row in rows:
            mine = busy[row["pid"]]
            assert (mine["busy_ns"], mine["traced_ns"], mine["kernel_ns"], mine["nccl_ns"]) == (
                row["busy_ns"], row["span_ns"], row["kernel_ns"], row["nccl_ns"]
            )  # fmt: skip
            assert 0 < mine["coverage"] < 1 and mine["estimated"]
    assert [r["name"] for r in node0][:5] == [r["name"] for r in kernels][:5]


def test_every_shipped_query_runs(jobs: tuple[Warehouse, dict[str, Path]]) -> None:
    store, _ = jobs
    shipped = sorted(p.stem for p in (SCHEMA_PATH.parent / "queries").glob("*.sql"))
    assert shipped == sorted(QUERIES)
    params = {"job": "", "interval_s": 10, "top": 10, **SPAN}
    for name in QUERIES:
        text = query_text(name)
        used = {p.split(":")[0] for p in text.split("{")[1:] if ":" in p.split("}")[0]}
        rows = store.sql(text, {k: v for k, v in params.items() if k in used})
        assert rows or name in ("losses", "gpu_time_by_code"), name


def _hardware_rows(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], tuple[int, int, float, float]]:
    return {(r["host"], r["device_id" if "device_id" in r else "device"], r["metric"]):
            (r["intervals"], r["samples"], r["mean"], r["p95"]) for r in rows}  # fmt: skip


def _same_figures(got: dict[Any, tuple[Any, ...]], expected: dict[Any, tuple[Any, ...]]) -> None:
    assert sorted(got) == sorted(expected) and got
    for key, (intervals, samples, mean, p95) in expected.items():
        assert got[key][:2] == (intervals, samples), key
        assert got[key][2] == pytest.approx(mean, rel=1e-9, abs=1e-9), key
        assert got[key][3] == pytest.approx(p95, rel=1e-9, abs=1e-9), key


def test_hw_utilization_equals_the_summary(tmp_path: Path) -> None:
    """PM sampling of two H100 hosts (idle, a GEMM loop, idle): the query's mean and p95 per host,
    GPU and metric are the summary's hw_utilization table, over the whole run and over a window."""
    store = Warehouse()
    try:
        store.insert(_as_job(batch_rows(batches(pm_processes())), "gemm"))
        store.insert(_as_job(batch_rows(batches(pm_processes())), "other"))  # a second job, left out by job
        recording = write_pm_recording(tmp_path / "out")
        summary = _summary(recording, tmp_path)
        expected = _hardware_rows(summary["hw_utilization"]["rows"])
        _same_figures(_hardware_rows(store.query("hw_utilization", job="gemm", **SPAN)), expected)
        sm = expected[("h100-a", 0, "sm__cycles_active.avg.pct_of_peak_sustained_elapsed")]
        assert 55 < sm[2] < 65 and sm[3] > 90
        both = _hardware_rows(store.query("hw_utilization", job="", **SPAN))
        assert both[("h100-a", 0, "sm__cycles_active.avg.pct_of_peak_sustained_elapsed")][:2] == (8, 3000)

        low, high = (t * SECOND + CLOCK.offset_ns for t in (7_010, 7_030))  # the two intervals of the work
        window = _summary_args(
            recording, tmp_path, "--since", f"@{low / 1e9:.9f}", "--until", f"@{high / 1e9:.9f}"
        )
        span = {"since": _datetime(low), "until": _datetime(high)}
        got = _hardware_rows(store.query("hw_utilization", job="gemm", **span))
        _same_figures(got, _hardware_rows(window["hw_utilization"]["rows"]))
        assert {v[0] for v in got.values()} == {2}
    finally:
        store.close()


def _summary_args(path: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "window.json"
    assert main(["summary", str(path), "--format", "json", "-o", str(out), *args]) == 0
    return json.loads(out.read_text())


def _datetime(unix_ns: int) -> str:
    import datetime

    seconds, ns = divmod(unix_ns, SECOND)
    day = datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{day}.{ns:09d}"


def test_hw_utilization_leaves_out_what_cupti_could_not_evaluate(tmp_path: Path) -> None:
    """An interval in which no sample had a value for a metric carries null for it (JSON has no
    NaN): the query leaves that interval out of the metric's figures, as summary does, instead of
    reading it as 0."""
    from cuptistream import events as ev

    processes = pm_processes()
    sm = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
    stats = [e for e in processes[0].events if isinstance(e, ev.PmStats)]
    busy = max(stats, key=lambda s: s.mean[s.metrics.index(sm)] or 0.0)  # an interval of the work
    at = busy.metrics.index(sm)
    for column in (busy.mean, busy.p5, busy.p50, busy.p95):
        column[at] = None
    store = Warehouse()
    try:
        store.insert(_as_job(batch_rows(batches(processes)), "gemm"))
        got = _hardware_rows(store.query("hw_utilization", job="gemm", **SPAN))
        recording = write_recording(tmp_path / "out", processes, batch_events=7)
        expected = _hardware_rows(_summary(recording, tmp_path)["hw_utilization"]["rows"])
        _same_figures(got, expected)
        intervals, samples, mean, _ = got[("h100-a", 0, sm)]
        assert (intervals, samples) == (3, 1500 - busy.samples) and mean < 55  # read as 0, or whole: 55-65
    finally:
        store.close()


def _kernel_rows(
    rows: list[dict[str, Any]],
) -> dict[tuple[str, int, str, str], tuple[int, int, int, float, float, float | None]]:
    """(host, device, name, metric) -> (intervals, kernel_ns, covered_ns, covered_share, own_share,
    mean): the query's rows, or the summary's table with one row per metric."""
    out = {}
    for r in rows:
        device = r["device_id" if "device_id" in r else "device"]
        means = r["means"] if "means" in r else {r["metric"]: r["mean"]}
        for metric, mean in means.items():
            out[(r["host"], device, r["name"], metric)] = (
                r["intervals"], r["kernel_ns"], r["covered_ns"], r["covered_share"], r["own_share"], mean
            )  # fmt: skip
    return out


def _same_kernel_figures(got: dict[Any, tuple[Any, ...]], expected: dict[Any, tuple[Any, ...]]) -> None:
    assert sorted(got) == sorted(expected) and got
    for key, want in expected.items():
        assert got[key][:3] == want[:3], key
        assert got[key][3:] == pytest.approx(want[3:], rel=1e-9, abs=1e-9), key


def test_kernel_utilization_equals_the_summary(tmp_path: Path) -> None:
    """PM samples attributed to a GEMM and an elementwise kernel on two H100 hosts: the query's
    figures per host, GPU, kernel name and metric are the summary's kernel_hw_utilization table,
    over the whole run and over a window."""
    from cuptistream import events as ev

    processes = pm_kernel_processes()
    # An interval in which CUPTI gave no SM active value: left out of that metric's mean, not read as 0.
    sm = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
    first = next(e for e in processes[0].events if isinstance(e, ev.PmKernelStats) and e.covered_share == 1)
    first.mean[first.metrics.index(sm)] = None
    store = Warehouse()
    try:
        store.insert(_as_job(batch_rows(batches(processes)), "gemm"))
        store.insert(_as_job(batch_rows(batches(pm_processes())), "other"))  # no kernels: left out by job
        recording = write_recording(tmp_path / "out", processes, batch_events=7)
        expected = _kernel_rows(_summary(recording, tmp_path)["kernel_hw_utilization"]["rows"])
        got = _kernel_rows(store.query("kernel_utilization", job="gemm", **SPAN))
        _same_kernel_figures(got, expected)
        assert len({k[2] for k in got}) == 2 and len(got) == 2 * 2 * 14
        assert got[("h100-a", 0, first.name, sm)][0] == 3  # the interval without a value still counts
        assert _kernel_rows(store.query("kernel_utilization", job="", **SPAN)) == got

        low, high = (t * SECOND + CLOCK.offset_ns for t in (7_010, 7_030))  # the two intervals of the work
        window = _summary_args(
            recording, tmp_path, "--mangled", "--since", f"@{low / 1e9:.9f}", "--until", f"@{high / 1e9:.9f}"
        )
        span = {"since": _datetime(low), "until": _datetime(high)}
        got = _kernel_rows(store.query("kernel_utilization", job="gemm", **span))
        _same_kernel_figures(got, _kernel_rows(window["kernel_hw_utilization"]["rows"]))
        assert {v[0] for v in got.values()} == {2}
    finally:
        store.close()


def test_kernel_utilization_reads_the_recording_the_summary_reads(tmp_path: Path) -> None:
    """The same through a file-sink recording's jsonl rows (what the Kafka sink sends)."""
    recording = write_pm_kernel_recording(tmp_path / "out")
    store = Warehouse()
    try:
        store.insert(_as_job(recording_rows([recording]), "gemm"))
        expected = _kernel_rows(_summary(recording, tmp_path)["kernel_hw_utilization"]["rows"])
        _same_kernel_figures(_kernel_rows(store.query("kernel_utilization", job="gemm", **SPAN)), expected)
    finally:
        store.close()
