"""The shipped ClickHouse schema and queries at fleet size: load rate, then each query's time over
more than 100 M rows, in chDB (ClickHouse in process, the dev extra's ``chdb-core``).

The rows are cuptistream's own: the GPU recording of ``tests/fixtures/stacks`` (full mode, ~123 k
rows: kernels, API calls, memsets, statistics, ...) written as the Kafka ``value_format: jsonl``
rows and inserted through the schema's landing table and routing views (``tests/helpers/clickhouse.py``).

* **Load rate**: ``--load-copies`` copies of those rows (each under its own host and pid) inserted as
  JSONEachRow, rows per second through parsing and routing.
* **Fleet**: every table is then copied inside the engine into ``--jobs`` jobs of 8 ranks (one host
  each, ranks 0-7, jobs an hour apart), rank 5 of every job running its GPU work 5 % longer, so
  the slow-rank query has a rank to find in each job. That is rows = 123 k x 8 x jobs (104 jobs:
  ~103 M).
* **Queries**: each shipped query (``cuptistream/warehouse/clickhouse/queries``) for every job over
  the whole span and for one job, ``--rounds`` times; median [min..max] seconds. Then
  ``slow_ranks`` for every job once more under ``max_memory_usage`` (``--memory-limit-gb``), and
  job by job: its rows must equal the every-job rows, and flag rank 5 in every job.

    python bench/warehouse.py                   # 104 jobs, ~103 M rows
    python bench/warehouse.py --jobs 4 --rounds 1   # a quick look

Results go to ``--out`` (default ``bench/out/warehouse.json``); the last lines are the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helpers.clickhouse import Warehouse

ROOT = Path(__file__).resolve().parent.parent
RANKS = 8
SLOW_RANK = 5
HOUR_NS = 3_600_000_000_000
# Tables with per-process rows that the fleet copies (the others hold a few rows of one process).
_TIME_COLUMNS = ("start", "end", "timestamp", "interval_start", "interval_end", "since", "until")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=104, help="jobs of 8 ranks in the fleet (default 104)")
    parser.add_argument("--load-copies", type=int, default=8, help="copies of the rows timed as JSON inserts")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each query")
    parser.add_argument("--memory-limit-gb", type=float, default=3.5,
                        help="max_memory_usage for one more run of slow_ranks for every job (default 3.5)")  # fmt: skip
    parser.add_argument("--recording", default=str(ROOT / "tests" / "fixtures" / "stacks"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "warehouse.json"))
    args = parser.parse_args()
    if args.jobs < 1 or args.load_copies < 1 or args.rounds < 1:
        parser.error("--jobs, --load-copies and --rounds must be at least 1")

    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from helpers.clickhouse import Warehouse, recording_rows

    from cuptistream.warehouse.clickhouse_ddl import QUERIES, query_text

    rows = list(recording_rows([Path(args.recording)]))
    per_copy = sum(chunk.count(b"\n") for chunk in rows)
    load = Warehouse()
    began = time.perf_counter()
    loaded = load.insert(_renamed(chunk, copy) for copy in range(args.load_copies) for chunk in rows)
    load_s = time.perf_counter() - began
    load.close()

    fleet = Warehouse()
    fleet.insert(rows)
    tables = [r["name"] for r in fleet.sql("SELECT name FROM system.tables WHERE database = currentDatabase() "
                                           "AND engine = 'MergeTree'")]  # fmt: skip
    began = time.perf_counter()
    for table in tables:
        _copy_to_fleet(fleet, table, args.jobs)
    fleet_s = time.perf_counter() - began
    print(f"fleet built in {fleet_s:.0f} s", file=sys.stderr, flush=True)
    total = sum(int(r["rows"]) for r in fleet.sql(
        "SELECT sum(rows) AS rows FROM system.parts WHERE database = currentDatabase() AND active"))  # fmt: skip
    span = fleet.sql("SELECT min(start) AS since, max(start) + INTERVAL 1 HOUR AS until FROM kernel")[0]
    timings: dict[str, dict[str, list[float]]] = {}
    answers: dict[str, int] = {}
    failures: dict[str, str] = {}
    for name in QUERIES:
        for scope, job in (("fleet", ""), ("one job", "job-7")):
            params = {"job": job, "since": span["since"], "until": span["until"], "top": 20, "interval_s": 10}
            times: list[float] = []
            for _ in range(args.rounds):
                began = time.perf_counter()
                try:
                    result = fleet.query(name, **params)
                except Exception as error:  # the engine's answer (a memory limit) is the result
                    failures[f"{name} ({scope})"] = str(error).split("\n")[0][:300]
                    break
                times.append(time.perf_counter() - began)
            else:
                answers[f"{name} ({scope})"] = len(result)
            timings.setdefault(name, {})[scope] = times
            print(
                f"{name} ({scope}): {times or failures.get(f'{name} ({scope})')}", file=sys.stderr, flush=True
            )
    params = {"since": span["since"], "until": span["until"], "top": 20, "interval_s": 10}
    limit = int(args.memory_limit_gb * 1e9)
    try:  # every job at once again, within a memory limit
        every_job = fleet.sql(query_text("slow_ranks"), {"job": "", **params}, f"max_memory_usage = {limit}")
        within_limit = "ok"
    except Exception as error:
        every_job, within_limit = [], "refused: " + str(error).split("\n")[0][:300]
    print(
        f"slow_ranks (fleet) within {args.memory_limit_gb:g} GB: {within_limit}", file=sys.stderr, flush=True
    )
    flagged_jobs = 0
    job_by_job: list[dict[str, object]] = []
    for job in sorted(f"job-{j}" for j in range(args.jobs)):  # what the query for every job must give
        slow = fleet.query("slow_ranks", job=job, **params)
        flagged_jobs += any(row["rank"] == f"rank {SLOW_RANK}" for row in slow)
        job_by_job += slow
    fleet.close()

    result = {
        "rows_per_copy": per_copy, "load_rows": loaded, "load_s": load_s, "load_rows_per_s": loaded / load_s,
        "jobs": args.jobs, "ranks": RANKS, "fleet_rows": total, "fleet_copy_s": fleet_s,
        "queries": timings, "answer_rows": answers, "failures": failures, "jobs_with_rank_5_flagged": flagged_jobs,
        "slow_ranks_every_job_within": {"memory_limit_gb": args.memory_limit_gb, "result": within_limit},
        "slow_ranks_every_job_equals_job_by_job": every_job == job_by_job,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"load: {loaded:,} jsonl rows in {load_s:.1f} s = {loaded / load_s:,.0f} rows/s")
    print(f"fleet: {total:,} rows ({args.jobs} jobs x {RANKS} ranks), copied in the engine in {fleet_s:.1f} s; "
          f"slow_ranks flags rank {SLOW_RANK} in {flagged_jobs} of {args.jobs} jobs")  # fmt: skip
    print(f"slow_ranks for every job within max_memory_usage {args.memory_limit_gb:g} GB: {within_limit}; "
          f"its rows equal the job-by-job rows: {every_job == job_by_job}")  # fmt: skip
    for name, scopes in timings.items():
        print(f"{name}: " + "; ".join(
            f"{scope} {_spread(times)} s" if times else f"{scope} failed: {failures[f'{name} ({scope})']}"
            for scope, times in scopes.items()
        ))  # fmt: skip


def _renamed(chunk: bytes, copy: int) -> bytes:
    """The rows of another process: its own host, so the copies do not collapse into one."""
    return chunk.replace(b'"host":"', b'"host":"copy%d-' % copy)


def _copy_to_fleet(fleet: Warehouse, table: str, jobs: int) -> None:
    """Replace ``table``'s rows by ``jobs`` x 8 copies: job j's rank r on host node-j, pid 1000 + r,
    an hour later per job; rank 5's GPU work 5 % longer."""
    columns = [r["name"] for r in fleet.sql(f"DESCRIBE TABLE `{table}`")]
    copies = jobs * RANKS
    job = "concat('job-', toString(intDiv(number, 8)))"
    shift = f"toInt64(intDiv(number, 8)) * {HOUR_NS}"
    replace = {
        "job": job,
        "host": "concat('node-', toString(intDiv(number, 8)))",
        "pid": "toUInt32(1000 + number % 8)",
        "rank": "toNullable(toUInt32(number % 8))",
        "world_size": "toNullable(toUInt32(8))",
        "session_id": f"concat('session-', {job})",
        "attributes": f"mapUpdate(attributes, map('job', {job}))",
    }
    slowed = f"if(number % 8 = {SLOW_RANK}, intDiv(duration_ns * 105, 100), duration_ns)"
    if "duration_ns" in columns:
        replace["duration_ns"] = slowed
    for column in _TIME_COLUMNS:
        if column in columns:
            extra = (
                f" + toInt64({slowed} - duration_ns)" if column == "end" and "duration_ns" in columns else ""
            )
            replace[column] = (
                f"fromUnixTimestamp64Nano(toUnixTimestamp64Nano(`{column}`) + {shift}{extra}, 'UTC')"
            )
    select = ", ".join(f"{replace[c]} AS `{c}`" if c in replace else f"`{c}`" for c in columns)
    fleet.execute(f"CREATE TABLE `{table}_fleet` AS `{table}`")
    fleet.execute(
        f"INSERT INTO `{table}_fleet` SELECT {select} FROM `{table}` AS src, numbers({copies}) AS copy "
        "SETTINGS max_partitions_per_insert_block = 10000"
    )
    fleet.execute(f"EXCHANGE TABLES `{table}` AND `{table}_fleet`")
    fleet.execute(f"DROP TABLE `{table}_fleet`")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


if __name__ == "__main__":
    main()
