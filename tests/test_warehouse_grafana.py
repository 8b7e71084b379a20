"""The Grafana dashboard of the warehouse queries (``cuptistream.warehouse.dashboard``): the shipped
JSON is current against the query files, it has what Grafana needs to import it, and every panel's
SQL, with the ClickHouse plugin's time macros and the dashboard's variables put as Grafana and the
plugin put them, gives on chDB the same rows as its shipped query with the same parameters."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from cuptistream import events as ev
from cuptistream.warehouse import QUERIES
from cuptistream.warehouse.dashboard import DASHBOARD, PANELS, PARAMETER, PLUGIN, Panel, dashboard, panel_sql
from tests.helpers.clickhouse import SCHEMA_PATH, Warehouse, batch_rows
from tests.helpers.fixture_recording import Process, batches, fixture_processes
from tests.helpers.pm_kernel_recording import pm_kernel_processes
from tests.helpers.rank_stats import statistics_only
from tests.helpers.ranks import Scale, biggest_kernel, rank_processes, replayed
from tests.helpers.scripts import script

ROOT = SCHEMA_PATH.parents[3]
SHIPPED = ROOT / "cuptistream" / "warehouse" / DASHBOARD
SECOND = 1_000_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
WHOLE = (datetime(2000, 1, 1, tzinfo=timezone.utc), datetime(2200, 1, 1, tzinfo=timezone.utc))
VALUES = {"top": "20", "kernels": "5", "interval_s": "10"}  # the variables' values in these tests
SQLSTRING = re.compile(r"\$\{(\w+):sqlstring\}")


def _script() -> Any:
    return script("grafana_dashboard")


def test_the_shipped_dashboard_is_current() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == _script().render(), (
        "cuptistream/warehouse/grafana/cuptistream-fleet.json is stale: run scripts/grafana_dashboard.py"
    )


def test_the_script_writes_to_stdout_or_says_why_it_cannot(capsys: pytest.CaptureFixture[str]) -> None:
    assert _script().main(["-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["uid"] == "cuptistream-fleet"
    assert _script().main(["-o", "/proc/no/such/dir/d.json"]) == 2
    err = capsys.readouterr().err
    assert "cannot write /proc/no/such/dir/d.json" in err and err.count("\n") == 1, err


def test_the_dashboard_has_what_grafana_needs_to_import_it() -> None:
    model = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert model["uid"] == "cuptistream-fleet" and model["title"] and isinstance(model["schemaVersion"], int)
    assert {"from", "to"} <= set(model["time"])
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert len(variables) == len(model["templating"]["list"])
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == PLUGIN
    assert variables["job"]["type"] == "textbox" and variables["job"]["current"]["value"] == ""
    for variable in variables.values():
        if variable["type"] == "custom":
            values = [o["value"] for o in variable["options"]]
            assert variable["query"].split(",") == values and variable["current"]["value"] in values
            assert [o["value"] for o in variable["options"] if o["selected"]] == [
                variable["current"]["value"]
            ]
    panels = model["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] == "table" and panel["title"] and panel["description"]
        assert panel["datasource"] == {"type": PLUGIN, "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "hwxy") and grid["x"] + grid["w"] <= 24
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}  # fmt: skip
        assert not mine & cells, f"panel {panel['id']} overlaps another"
        cells |= mine
        (target,) = panel["targets"]
        assert target["refId"] == "A" and target["datasource"] == panel["datasource"]
        assert target["editorType"] == "sql" and target["queryType"] == "table" and target["format"] == 1
        sql = target["rawSql"]
        assert not PARAMETER.search(sql), "a ClickHouse query parameter is left in the panel's SQL"
        assert "$__fromTime_ms" in sql and "$__toTime_ms" in sql and "${job:sqlstring}" in sql
        used = set(SQLSTRING.findall(sql))
        assert used <= set(variables), used - set(variables)
        rest = SQLSTRING.sub("", sql).replace("$__fromTime_ms", "").replace("$__toTime_ms", "")
        assert "$" not in rest and "[[" not in rest, "something else Grafana would interpolate"
    queries = [re.findall(r"queries/(\w+)\.sql", p["targets"][0]["rawSql"])[:1] for p in panels]
    assert sorted(queries) == sorted([q] for q in QUERIES)


def test_a_query_parameter_without_a_variable_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"no dashboard variable for \{top:UInt32\}"):
        panel_sql(Panel("top_kernels", "Top kernels", 24, 8))


# --- the panels' answers on chDB ---------------------------------------------------------------


def _job(processes: Iterable[Process], job: str) -> Iterator[ev.Batch]:
    """The processes' events as batches of one job (``session.attributes: {job: ...}``)."""
    for process in processes:
        yield ev.Batch(
            schema_version=ev.SCHEMA_VERSION, session_id=f"{job}-{process.resource.pid}", seq=0,
            resource=process.resource, attributes={"job": job}, clock=process.clock,
            events=process.events,  # type: ignore[arg-type]
        )  # fmt: skip


def _stacks() -> Process:
    """One process's GPU time by code: a stack table and a statistics interval of its stacks."""
    pid = 9100
    table = ev.StackTable(
        process_id=pid, frame_ids=[1, 2, 3, 4], files=["train.py", "model.py", "model.py", "<cuptistream>"],
        functions=["main", "forward", "attention", "[truncated]"], lines=[40, 12, 30, 0],
        stack_ids=[1, 2, 3], stacks=[[1, 2], [1, 2, 3], [1, 4]],
    )  # fmt: skip
    stats = ev.StackStats(
        interval_start=10 * SECOND, interval_end=20 * SECOND, device_id=0, process_id=pid,
        traced_ns=5 * SECOND, stack_ids=[1, 2, 3, -1, -3], gpu_ns=[500, 3000, 200, 50, 7],
        launches=[5, 30, 2, 1, 1], estimated=True, estimated_gpu_ns=[1000, 6000, 400, 100, 14],
        estimated_launches=[10, 60, 4, 2, 2],
    )  # fmt: skip
    resource = ev.Resource(host="node9", pid=pid, process_name="train", command_line=["python", "train.py"])
    clock = ev.ClockSync(cupti_ns=0, unix_ns=1_780_000_000 * SECOND)
    return Process(resource, clock, [table, stats])


@pytest.fixture(scope="module")
def store() -> Iterator[Warehouse]:
    """The fixture recording's processes (losses), 8 ranks with one slowed (raw records, and
    always-on statistics), a process with stacks and two hosts' PM sampling attributed to kernels."""
    slow = Scale(5, biggest_kernel(replayed()[0]), 1.3)
    ranks = rank_processes(8, scale=slow)
    store = Warehouse()
    store.insert(batch_rows(batches(fixture_processes())))
    store.insert(batch_rows(_job(ranks, "slowed")))
    store.insert(batch_rows(_job([statistics_only(p, SECOND, 0.6) for p in ranks], "budget_slowed")))
    store.insert(batch_rows(_job([_stacks()], "stacks")))
    store.insert(batch_rows(_job(pm_kernel_processes(), "pm")))
    yield store
    store.close()


def _ms(at: datetime) -> int:
    return (at - EPOCH) // timedelta(milliseconds=1)


def _grafana(sql: str, span: tuple[datetime, datetime], values: dict[str, str]) -> str:
    """The panel's SQL as the plugin sends it: the macros as the plugin writes them, the variables
    in Grafana's sqlstring format."""
    sql = sql.replace("$__fromTime_ms", f"fromUnixTimestamp64Milli({_ms(span[0])})")
    sql = sql.replace("$__toTime_ms", f"fromUnixTimestamp64Milli({_ms(span[1])})")
    sql = SQLSTRING.sub(lambda m: "'" + values[m.group(1)].replace("'", "''") + "'", sql)
    assert "$" not in sql
    return sql


def _middle(store: Warehouse) -> tuple[datetime, datetime]:
    """A span that cuts the slowed job's kernels in two, to the millisecond."""
    (row,) = store.sql("SELECT toUnixTimestamp64Milli(min(start)) AS lo, toUnixTimestamp64Milli(max(start)) AS hi "
                       "FROM kernel WHERE job = 'slowed'")  # fmt: skip
    middle = (row["lo"] + row["hi"]) // 2
    return EPOCH + timedelta(milliseconds=middle), WHOLE[1]


@pytest.mark.parametrize("panel", PANELS, ids=[p.query for p in PANELS])
def test_every_panel_answers_as_its_query(store: Warehouse, panel: Panel) -> None:
    model = {p["title"]: p for p in dashboard()["panels"]}
    sql = model[panel.title]["targets"][0]["rawSql"]
    middle = _middle(store)
    cases = [("", WHOLE), ("", middle), ("slowed", middle), ("budget_slowed", WHOLE), ("fixture", WHOLE),
             ("stacks", WHOLE), ("pm", WHOLE), ("o'brien", WHOLE)]  # fmt: skip
    answered = 0
    for job, span in cases:
        values = {**VALUES, "job": job}
        params = {name: values[variable] for name, variable in panel.variables.items()}
        expected = store.query(
            panel.query, job=job, since=span[0].strftime("%Y-%m-%d %H:%M:%S.%f"),
            until=span[1].strftime("%Y-%m-%d %H:%M:%S.%f"), **params,
        )  # fmt: skip
        got = store.sql(_grafana(sql, span, values))
        assert got == expected, (panel.query, job, span)
        answered += bool(got)
    assert answered >= 2, f"{panel.query}: too few spans and jobs with rows to compare"
