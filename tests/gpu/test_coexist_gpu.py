"""GPU acceptance for sharing CUPTI with torch.profiler. Runs on a GPU machine.

- Under ``cuptistream run`` with the default config, torch.profiler on its schedule API records
  exactly the per-kernel-name counts it records with no cuptistream; the recording holds one
  ``cupti_yield`` event per profiler cycle and no kernel inside a yielded span.
- Profiler and session in both orders: every run finishes with exit code 0 within the timeout,
  ``COEXIST_RUNS`` times each (default 10), and the profiler's counts are its counts alone.
- ``cuptistream run`` with ``probe.start: process`` (the probe holds CUPTI before torch loads): the
  same, ``COEXIST_RUNS`` times.

Subprocesses use the installed cuptistream (``pip install`` of the wheel), as a user's program does:
they run in a temporary directory, so that ``python -m`` does not find the checkout's ``cuptistream/``
(which lacks the ``cuptistream.sources`` mapping) first.
With ``CUPTISTREAM_GPU_RESULTS=DIR`` the measurements are written to ``DIR/coexist_*.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream.events import CuptiYield, Kernel

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "tests" / "gpu" / "workloads" / "profiler_coexist.py"
DEFAULT = ROOT / "configs" / "default.yaml"
CLI = [sys.executable, "-m", "cuptistream.cli"]
RUNS = int(os.environ.get("COEXIST_RUNS", "10"))
HANG_S = 150  # a run that takes longer counts as a hang


def _record(name: str, data: dict[str, Any]) -> None:
    if results := os.environ.get("CUPTISTREAM_GPU_RESULTS"):
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / f"coexist_{name}.json").write_text(json.dumps(data, indent=1))


def _workload(
    order: str, out: Path, *, under_run: Path | None = None, config: Path = DEFAULT
) -> dict[str, Any]:
    """Run the workload (under ``cuptistream run`` writing to ``under_run``); its result with rc and time."""
    command = [
        sys.executable,
        str(WORKLOAD),
        order,
        str(out),
        "--config",
        str(config),
        "--record",
        str(out.parent / "rec"),
    ]
    if under_run is not None:
        command = [*CLI, "run", "-c", str(config), "-o", str(under_run), "--", *command]
    began = time.monotonic()
    try:
        done = subprocess.run(command, cwd=out.parent, capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired:
        return {"rc": None, "hung": True, "seconds": HANG_S}
    result: dict[str, Any] = {
        "rc": done.returncode,
        "hung": False,
        "seconds": round(time.monotonic() - began, 2),
    }
    result["stderr_tail"] = done.stderr[-2000:]
    if out.exists():
        result.update(json.loads(out.read_text()))
    return result


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch")
    result = _workload("alone", tmp_path_factory.mktemp("alone") / "alone.json")
    assert result["rc"] == 0, result
    assert result["cycles"] == 3 and result["total"] > 0
    return result


def test_profiler_under_run_records_exactly_what_it_records_alone(
    alone: dict[str, Any], tmp_path: Path
) -> None:
    recording = tmp_path / "rec"
    under = _workload("alone", tmp_path / "under.json", under_run=recording)
    assert under["rc"] == 0, under
    assert under["kernels"] == alone["kernels"], "torch.profiler must see every kernel it sees alone"
    events = list(cuptistream.read(recording))
    yields = [e for e in events if isinstance(e, CuptiYield)]
    kernels = [e for e in events if isinstance(e, Kernel)]
    # Kineto gives CUPTI its own clock at its first trace: records before the first span are on the
    # old clock, so only the later spans are compared with kernel times.
    inside = [k for k in kernels for y in yields[1:] if y.start <= k.start <= y.end]
    _record(
        "under_run",
        {"profiler_alone": alone["total"], "profiler_under_run": under["total"], "cycles": under["cycles"],
         "yield_events": len(yields), "cuptistream_kernels": len(kernels), "kernels_inside_spans": len(inside),
         "spans_ms": [round((y.end - y.start) / 1e6, 1) for y in yields],
         "standby": sorted({s for y in yields for s in y.standby}), "stderr": under["stderr_tail"]},
    )  # fmt: skip
    assert len(yields) == under["cycles"] == 3, "one yield event per profiler cycle"
    assert all(y.tool == "torch.profiler" and y.reason == "tool_started" for y in yields)
    assert kernels, "cuptistream records the kernels outside the spans"
    assert inside == [], "nothing of cuptistream's may be recorded while the profiler holds CUPTI"
    assert kernels[-1].start > yields[-1].end, "tracing resumes after the last cycle"


def _process_start_config(tmp_path: Path) -> Path:
    config = tmp_path / "process-start.yaml"
    config.write_text(DEFAULT.read_text() + "\nprobe:\n  start: process\n")
    return config


def _repeat(tmp_path: Path, cases: list[tuple[str, str, bool, Path]]) -> list[dict[str, Any]]:
    def one(index: int) -> dict[str, Any]:
        label, order, under_run, config = cases[index]
        run_dir = tmp_path / f"case{index}"
        run_dir.mkdir()
        result = _workload(order, run_dir / "out.json", under_run=run_dir / "rec" if under_run else None,
                           config=config)  # fmt: skip
        result["case"] = label
        return result

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, range(len(cases))))


def _summary(results: list[dict[str, Any]], alone: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for label in dict.fromkeys(r["case"] for r in results):
        mine = [r for r in results if r["case"] == label]
        summary[label] = {
            "runs": len(mine),
            "hangs": sum(r["hung"] for r in mine),
            "nonzero_exit": sum(1 for r in mine if r["rc"] not in (0, None)),
            "exit_codes": sorted({r["rc"] for r in mine if r["rc"] not in (0, None)}),
            "counts_equal_alone": sum(1 for r in mine if r.get("kernels") == alone["kernels"]),
            "seconds_max": max(r["seconds"] for r in mine),
        }
    return summary


def test_both_orders_never_hang(alone: dict[str, Any], tmp_path: Path) -> None:
    cases = [
        (order, order, False, DEFAULT) for _ in range(RUNS) for order in ("session-first", "profiler-first")
    ]
    results = _repeat(tmp_path, cases)
    summary = _summary(results, alone)
    _record("orders", {"summary": summary, "failures": [r for r in results if r["rc"] != 0][:3]})
    for label, row in summary.items():
        assert row["hangs"] == 0, (label, row)
        assert row["nonzero_exit"] == 0, (label, row, [r["stderr_tail"] for r in results if r["rc"]][:1])
        assert row["counts_equal_alone"] == row["runs"], (label, row)


def test_run_with_process_start_never_hangs(alone: dict[str, Any], tmp_path: Path) -> None:
    """``cuptistream run`` with ``probe.start: process``: the probe holds CUPTI before torch loads."""
    cases = [("run-process-start", "alone", True, _process_start_config(tmp_path))] * RUNS
    results = _repeat(tmp_path, cases)
    row = _summary(results, alone)["run-process-start"]
    _record("process_start", {"summary": row, "failures": [r for r in results if r["rc"] != 0][:2]})
    assert row["hangs"] == 0, row
    assert row["counts_equal_alone"] == row["runs"], row
    # Before the probe detached CUPTI at exit, Kineto's context-destroy callback aborted the program
    # in CUDA's teardown (exit 134) in 2 to 7 of 10 runs (docs/coexistence.md).
    assert row["nonzero_exit"] == 0, (row, [r["stderr_tail"] for r in results if r["rc"]][:1])
