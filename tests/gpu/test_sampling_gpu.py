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


def _line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


@pytest.mark.gpu
def test_sass_to_source_maps_the_captured_hot_spots_to_their_lines(tmp_path: Path) -> None:
    """The real cuptiGetSassToSourceCorrelation (it needs libcuda) on the committed H200 cubin."""
    sys.path.insert(0, str(WORKLOADS))
    from sampling_common import KERNELS

    from cuptistream.cupti.cubin_api import CubinLines

    fixtures = Path(__file__).parents[1] / "fixtures" / "sampling"
    lines = CubinLines((fixtures / "kernels_a_h200.cubin").read_bytes())
    gather, fma = lines.line("strided", 0x500), lines.line("dep_chain", 0x100)
    assert gather is not None and gather.line == _line_of(KERNELS, "acc += in[j]")
    assert fma is not None and fma.line == _line_of(KERNELS, "a = a * b + c")

    from tests.test_source_lines import _batch, _cubin_dir, _recording

    recording = _recording(tmp_path, [_batch()])
    result = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "source-lines", str(recording), "--cubins", str(_cubin_dir(tmp_path))],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    hottest = result.stdout.splitlines()[1]
    assert f":{gather.line} " in hottest and "strided" in hottest and "long_scoreboard" in hottest, (
        result.stdout
    )
