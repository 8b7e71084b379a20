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
    first = s["per_window_pc_values"][0]
    assert sum(1 for v in first.values() if v == s["warps_x_launches"] * 100) == 6
    assert all(v in (s["warps_x_launches"], s["warps_x_launches"] * 100) for v in first.values())
    assert s["losses"] == [] and "close matches" in smoke["unknown_metric_message"]


@pytest.mark.gpu
def test_pc_sampling_hot_spots_and_modules(smoke: dict) -> None:
    pc = smoke["pc"]
    assert pc["total_samples"] > 0 and pc["dropped"] == 0
    crc_a, crc_b = smoke["crc"]["A"], smoke["crc"]["B"]
    for crc, function, _ in pc["crc_function_samples"]:
        expected = crc_b if function == "other_module_kernel" else crc_a
        assert crc == expected, f"{function} attributed to the wrong module"
    assert any("one context per GPU" in message for _, _, message in pc["errors"])
