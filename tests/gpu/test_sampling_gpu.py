"""GPU tests of the pc_sampling and sass sources (run on the GPU test machine; skipped elsewhere).

They run ``workloads/sampling_smoke.py`` in a subprocess (CUPTI state is per process) and assert on
its JSON: hot-spot stall reasons, CRC attribution across module load/unload/load, the second-context
warning, and exact SASS instruction counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).parent / "workloads"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("sampling")
    subprocess.run([sys.executable, str(WORKLOADS / "sampling_smoke.py"), str(out)], check=True, timeout=300)
    return json.loads((out / "smoke.json").read_text())


@pytest.mark.gpu
def test_sass_counts_are_exact(smoke: dict) -> None:
    s = smoke["sass"]
    per_launch = s["warps_x_launches"]  # each instruction once per warp per launch
    assert len(s["per_window_pc_values"]) == 3  # W = 3 windows, a launch outside windows between them
    for window in s["per_window_pc_values"]:
        assert sum(1 for v in window.values() if v == per_launch * 100) == 6  # the 100-trip loop body
        assert all(v in (per_launch, per_launch * 100) for v in window.values())
    assert s["losses"] == [] and "close matches" in smoke["unknown_metric_message"]


@pytest.mark.gpu
def test_module_events_carry_the_crc_of_the_loaded_cubin(smoke: dict) -> None:
    pc = smoke["pc"]
    for name in ("A", "B"):
        loads = [
            m
            for m in pc["modules"]
            if m["operation"] == "module_load" and m["cubin_size"] == smoke["cubin_size"][name]
        ]
        assert loads, f"no module_load event of module {name}'s size"
        assert {m["cubin_crc"] for m in loads} == {smoke["crc"][name]}


@pytest.mark.gpu
def test_pc_sampling_hot_spots_and_modules(smoke: dict) -> None:
    pc = smoke["pc"]
    assert pc["total_samples"] > 0 and pc["dropped"] == 0
    crc_a, crc_b = smoke["crc"]["A"], smoke["crc"]["B"]
    for crc, function, _ in pc["crc_function_samples"]:
        expected = crc_b if function == "other_module_kernel" else crc_a
        assert crc == expected, f"{function} attributed to the wrong module"
    assert any("one context per GPU" in message for _, _, message in pc["errors"])
