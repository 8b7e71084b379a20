"""SASS metrics: decoding real captured output (H200, exact instruction counts) and metric-name checks."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from cuptistream.config import convert
from cuptistream.cupti.sampling_decode import SnapshotMemory, decode_sass_records
from cuptistream.errors import ConfigError
from cuptistream.sources.sass import SassConfig, resolve_metrics

FIXTURES = Path(__file__).parent / "fixtures" / "sampling"
WARPS, LAUNCHES, TRIPS = 132 * 128 // 32, 10, 100  # how the captured `counted` kernel was run


def _decode() -> tuple[dict, list]:
    capture = json.loads((FIXTURES / "sass_h200.json").read_text())
    records = decode_sass_records(
        SnapshotMemory.from_json(capture["memory"]),
        capture["address"],
        capture["num_records"],
        capture["num_instances"],
        {int(k): v for k, v in capture["metric_names"].items()},
    )
    return capture, records


def test_decode_captured_sass_records_exactly() -> None:
    capture, records = _decode()
    assert msgspec.to_builtins(records) == capture["decoded"]
    assert len(records) == capture["num_records"] == 21
    assert {r.function_name for r in records} == {"counted"}


def test_instruction_counts_are_exact() -> None:
    _, records = _decode()
    counts = {r.pc_offset: r.values["smsp__sass_inst_executed"] for r in records}
    assert all(len(v) == 1 for v in counts.values())  # GPU granularity: one instance
    loop = sorted(pc for pc, (v,) in counts.items() if v == WARPS * LAUNCHES * TRIPS)
    rest = sorted(pc for pc, (v,) in counts.items() if v == WARPS * LAUNCHES)
    assert len(loop) == 6 and loop == list(
        range(loop[0], loop[0] + 6 * 16, 16)
    )  # the 6-instruction loop body
    assert len(loop) + len(rest) == len(counts)  # every other instruction ran once per warp per launch


def test_records_of_one_instruction_merge_across_metrics() -> None:
    # Two records for the same pc (one per metric) become one SassRecord with both metrics.
    capture, _ = _decode()
    memory = SnapshotMemory.from_json(capture["memory"])
    records = decode_sass_records(
        memory, capture["address"], capture["num_records"], capture["num_instances"], {}
    )
    assert all(list(r.values) == [str(next(iter(capture["metric_names"])))] for r in records)


def test_unknown_metric_lists_close_matches() -> None:
    available = {
        "smsp__sass_inst_executed": (1, ""),
        "smsp__sass_inst_executed_op_ld": (2, ""),
        "smsp__sass_thread_inst_executed": (3, ""),
    }
    assert resolve_metrics(["smsp__sass_inst_executed"], available, "GH100") == {
        1: "smsp__sass_inst_executed"
    }
    with pytest.raises(ConfigError) as info:
        resolve_metrics(["smsp__sass_inst_executd"], available, "GH100")
    message = str(info.value)
    assert "not a SASS metric on GH100" in message and "smsp__sass_inst_executed" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="at least one"):
        resolve_metrics([], available, "GH100")


def test_config_defaults_are_duty_cycled() -> None:
    cfg = convert({"type": "sass"}, SassConfig)
    assert cfg.window < cfg.period and cfg.metrics == ["smsp__sass_inst_executed"]
    with pytest.raises(ConfigError, match="granularity"):
        convert({"type": "sass", "granularity": "warp"}, SassConfig, "sources[0]")


def test_room_cupti_left_empty_decodes_to_nothing() -> None:
    """Flush buffers are larger than the records GetDataProperties reported (kernels patched after
    the query add records); the entries CUPTI did not fill are zero and must not become records."""
    from cuptistream.cupti.sampling_decode import _SASS_DATA

    capture, expected = _decode()
    memory = SnapshotMemory.from_json(capture["memory"])
    address, n = capture["address"], capture["num_records"]
    start = next(a for a, blob in memory.regions.items() if a <= address < a + len(blob))
    blob = memory.regions.pop(start)
    end = address + n * _SASS_DATA.size - start
    memory.regions[start] = blob[:end] + bytes(3 * n * _SASS_DATA.size) + blob[end:]
    records = decode_sass_records(
        memory, address, 4 * n, capture["num_instances"],
        {int(k): v for k, v in capture["metric_names"].items()},
    )  # fmt: skip
    assert records == expected


def test_flush_capacity_leaves_room_within_a_bound() -> None:
    from cuptistream.cupti import sass_api

    assert sass_api.flush_capacity(100, 1) == 100 + sass_api.FLUSH_MIN_EXTRA
    assert sass_api.flush_capacity(80_000, 1) == 4 * 80_000
    import ctypes

    per_record = ctypes.sizeof(sass_api.MetricsData) + 132 * ctypes.sizeof(sass_api.InstanceValue)
    big = sass_api.flush_capacity(100_000, 132)  # SM granularity: 132 instances per record
    assert big > 100_000 and big * per_record <= sass_api.FLUSH_MAX_BYTES
    assert sass_api.flush_capacity(10**7, 132) == 10**7  # never fewer than reported
