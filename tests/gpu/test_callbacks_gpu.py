"""GPU acceptance for the callbacks and state sources: known NVTX, API, module and stream activity
comes back as events. Runs on a GPU machine only.

The workload runs in a fresh process (CUPTI's subscriber is process-wide) and reports what it did;
the events come back through the file sink and the public reader.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream.events import ApiCall, Error, NvtxMarker, NvtxRange, ResourceChange, Synchronization

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Any]]:
    out = tmp_path_factory.mktemp("callbacks")
    env = dict(os.environ)
    env.pop("NVTX_INJECTION64_PATH", None)  # the source must set it itself
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "tests.gpu.workloads.callbacks_workload", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    did = json.loads(proc.stdout.strip().splitlines()[-1])
    dump = os.environ.get("CALLBACKS_GPU_DUMP")
    if dump:
        Path(dump).write_text(json.dumps({"did": did, "stderr": proc.stderr[-4000:]}, indent=1))
    return did, list(cuptistream.read(out / "events"))


def test_sources_started(run: tuple[dict[str, Any], list[Any]]) -> None:
    did, _ = run
    assert did["failed_sources"] == {}
    assert did["nvtx_injection"].endswith(".so") or ".so." in did["nvtx_injection"]


def test_nested_nvtx_ranges_exact(run: tuple[dict[str, Any], list[Any]]) -> None:
    did, events = run
    ranges = [e for e in events if isinstance(e, NvtxRange)]
    levels = collections.Counter((r.name, r.depth) for r in ranges if r.name.startswith("level"))
    assert levels == {(f"level{k}", k): did["R"] for k in range(did["K"])}
    assert all(r.start < r.end for r in ranges)
    assert len({r.thread_id for r in ranges}) == 1
    (startend,) = [r for r in ranges if r.name == "startend"]
    assert startend.range_id != 0 and startend.depth == 0
    assert [m.name for m in events if isinstance(m, NvtxMarker)] == ["marker"]
    # Nesting: each level-k range lies inside a level-(k-1) range.
    outer = sorted((r.start, r.end) for r in ranges if r.name == "level0")
    for r in ranges:
        if r.name.startswith("level") and r.depth > 0:
            assert any(s <= r.start and r.end <= e for s, e in outer)


def test_selected_api_calls_with_entry_before_exit(run: tuple[dict[str, Any], list[Any]]) -> None:
    did, events = run
    calls = [e for e in events if isinstance(e, ApiCall)]
    names = collections.Counter(c.name for c in calls)
    assert names["cudaDeviceSynchronize"] == did["S"] + 1
    assert names["cudaLaunchKernel"] >= did["N"]
    assert names["cuModuleLoadData"] == 1 and names["cuModuleUnload"] == 1
    # CUPTI 12 names the destroy callback cuStreamDestroy_v2, CUPTI 13 cuStreamDestroy.
    destroys = names["cuStreamDestroy"] + names["cuStreamDestroy_v2"]
    assert names["cuStreamCreate"] == 1 and destroys == 1
    assert set(names) <= {"cudaLaunchKernel", "cudaDeviceSynchronize", "cuModuleLoadData", "cuModuleUnload",
                          "cuStreamCreate", "cuStreamDestroy", "cuStreamDestroy_v2"}  # fmt: skip
    assert all(c.start <= c.end and c.return_value == 0 for c in calls)
    assert sum(c.start < c.end for c in calls) >= 0.99 * len(calls)


def test_resource_and_synchronize_events(run: tuple[dict[str, Any], list[Any]]) -> None:
    did, events = run
    resources = [e for e in events if isinstance(e, ResourceChange)]
    ops = collections.Counter(r.operation for r in resources)
    assert ops["stream_create"] >= 1 and ops["stream_destroy"] >= 1
    ours = [r for r in resources if r.operation == "module_load" and r.cubin_size == did["cubin_size"]]
    assert len(ours) == 1 and ours[0].cubin_crc != 0
    unloads = [r for r in resources if r.operation == "module_unload" and r.module_id == ours[0].module_id]
    assert len(unloads) == 1 and unloads[0].cubin_crc == ours[0].cubin_crc
    syncs = [e for e in events if isinstance(e, Synchronization) and e.sync_type == "context_synchronize"]
    assert len(syncs) >= did["S"]


def test_subscriber_busy_and_release(run: tuple[dict[str, Any], list[Any]]) -> None:
    did, _ = run
    assert "'CUPTI for cuptistream'" in did["second_subscriber"] or "cuptistream" in did["second_subscriber"]
    assert did["again_failed"] == {}
    # Held by another tool: the source stands by (docs/coexistence.md) instead of being disabled.
    assert did["busy_failed"] == {} and "callbacks" in did["busy_standby"]


def test_forced_cupti_error_is_reported_and_program_continues(run: tuple[dict[str, Any], list[Any]]) -> None:
    did, events = run
    assert any("kind 9999:" in f and "accepted" not in f for f in did["forced"])
    errors = [e for e in events if isinstance(e, Error)]
    assert not [e for e in errors if e.origin.startswith("source:")], errors  # no callback failed
    # Invalid kinds are refused by the API call itself and CUPTI raises no state callback for them,
    # so any cupti_state Error here must be well formed.
    assert all(e.severity in ("fatal", "error", "warning") for e in errors if e.origin == "cupti_state")
