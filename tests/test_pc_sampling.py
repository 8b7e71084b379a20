"""PC sampling: ctypes layouts against the header, decoding of real captured GPU output, config checks.

No GPU here: the layouts are checked by compiling the real header with gcc (the only stub is a
3-line ``cuda.h``), and decoding runs on bytes captured on an H200 (tests/fixtures/sampling/).
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import msgspec
import pytest

from cuptistream.config import convert
from cuptistream.cupti import cubin_api, library
from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.cupti import sass_api as sass
from cuptistream.cupti.sampling_decode import SnapshotMemory, decode_pc_data
from cuptistream.cupti.watchdog import Watchdog
from cuptistream.errors import ConfigError
from cuptistream.sources.pc_sampling import PcSamplingConfig, select_stall_reasons

FIXTURES = Path(__file__).parent / "fixtures" / "sampling"

# (C type, ctypes class, fields to compare)
LAYOUTS = [
    ("CUpti_PCSamplingStallReason", pcs.StallReason),
    ("CUpti_PCSamplingPCData", pcs.PCData),
    ("CUpti_PCSamplingData", pcs.PCSamplingData),
    ("CUpti_PCSamplingConfigurationInfo", pcs.ConfigurationInfo),
    ("CUpti_PCSamplingConfigurationInfoParams", pcs.ConfigurationInfoParams),
    ("CUpti_PCSamplingGetDataParams", pcs.GetDataParams),
    ("CUpti_PCSamplingEnableParams", pcs.ContextParams),
    ("CUpti_PCSamplingGetNumStallReasonsParams", pcs.GetNumStallReasonsParams),
    ("CUpti_PCSamplingGetStallReasonsParams", pcs.GetStallReasonsParams),
    ("CUpti_GetCubinCrcParams", cubin_api.GetCubinCrcParams),
    ("CUpti_GetSassToSourceCorrelationParams", cubin_api.GetSassToSourceCorrelationParams),
    ("CUpti_SassMetrics_MetricDetails", sass.MetricDetails),
    ("CUpti_SassMetrics_GetNumOfMetrics_Params", sass.GetNumOfMetricsParams),
    ("CUpti_SassMetrics_GetMetrics_Params", sass.GetMetricsParams),
    ("CUpti_SassMetrics_GetProperties_Params", sass.GetPropertiesParams),
    ("CUpti_SassMetrics_Config", sass.MetricConfig),
    ("CUpti_SassMetricsSetConfig_Params", sass.SetConfigParams),
    ("CUpti_SassMetricsUnsetConfig_Params", sass.UnsetConfigParams),
    ("CUpti_SassMetricsEnable_Params", sass.EnableParams),
    ("CUpti_SassMetricsDisable_Params", sass.DisableParams),
    ("CUpti_SassMetricsGetDataProperties_Params", sass.GetDataPropertiesParams),
    ("CUpti_SassMetrics_InstanceValue", sass.InstanceValue),
    ("CUpti_SassMetrics_Data", sass.MetricsData),
    ("CUpti_SassMetricsFlushData_Params", sass.FlushDataParams),
    ("CUpti_Device_GetChipName_Params", sass.ChipNameParams),
]

# The header names some union members' inner structs; our flat union members map onto them.
_UNION = {"attributeData": None}


def _header_dir() -> Path | None:
    try:
        import nvidia

        for root in nvidia.__path__:
            include = Path(root) / "cu13" / "include"
            if (include / "cupti_pcsampling.h").exists():
                return include
    except ImportError:
        pass
    return None


@pytest.fixture(scope="module")
def header_layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, int]]:
    include = _header_dir()
    if include is None or shutil.which("gcc") is None:
        pytest.skip("needs gcc and the nvidia-cuda-cupti headers")
    work = tmp_path_factory.mktemp("layout")
    # Only what the CUPTI headers use from cuda.h: opaque handles and a few integer types.
    (work / "cuda.h").write_text(
        "#include <stdint.h>\ntypedef struct CUctx_st *CUcontext; typedef struct CUstream_st *CUstream;\n"
        "typedef int CUdevice; typedef int CUresult; typedef uint64_t CUdeviceptr;\n"
    )
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "cupti_pcsampling.h"',
             '#include "cupti_sass_metrics.h"', '#include "cupti_target.h"', "int main(void) {"]  # fmt: skip
    for ctype, cls in LAYOUTS:
        lines.append(f'printf("{ctype} sizeof %zu\\n", sizeof({ctype}));')
        for name, *_ in cls._fields_:
            if name in _UNION:
                continue
            lines.append(f'printf("{ctype} {name} %zu\\n", offsetof({ctype}, {name}));')
    lines.append("return 0; }")
    (work / "layout.c").write_text("\n".join(lines))
    build = subprocess.run(
        ["gcc", "-I", str(work), "-I", str(include), "-o", str(work / "layout"), str(work / "layout.c")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if build.returncode != 0:
        pytest.fail(f"compiling against the header failed: {build.stderr[-2000:]}")
    out = subprocess.run(
        [str(work / "layout")], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    layouts: dict[str, dict[str, int]] = {}
    for line in out.splitlines():
        ctype, field, value = line.split()
        layouts.setdefault(ctype, {})[field] = int(value)
    return layouts


@pytest.mark.parametrize(("ctype", "cls"), LAYOUTS, ids=[c for c, _ in LAYOUTS])
def test_layout_matches_header(header_layouts: dict[str, dict[str, int]], ctype: str, cls: type) -> None:
    want = header_layouts[ctype]
    assert ctypes.sizeof(cls) == want["sizeof"], f"sizeof({ctype})"
    for name, *_ in cls._fields_:
        if name not in _UNION:
            assert getattr(cls, name).offset == want[name], f"{ctype}.{name}"


def test_layout_known_values_without_compiler() -> None:
    # The same facts as above, fixed, for machines without gcc: array strides CUPTI writes with.
    assert ctypes.sizeof(pcs.PCData) == 64
    assert ctypes.sizeof(pcs.PCSamplingData) == 80
    assert ctypes.sizeof(pcs.ConfigurationInfo) == 32
    assert ctypes.sizeof(sass.MetricsData) == 48
    assert library.params_size(pcs.ConfigurationInfoParams, "pPCSamplingConfigurationInfo") == 40
    assert library.params_size(pcs.ContextParams, "ctx") == 24
    assert library.params_size(sass.FlushDataParams, "numOfInstances") == 40  # the header's macro, not sizeof


def test_libcupti_has_every_symbol_we_bind() -> None:
    # libcupti loads without a driver; resolving symbols needs no GPU.
    for name in (
        "cuptiPCSamplingEnable", "cuptiPCSamplingDisable", "cuptiPCSamplingStart", "cuptiPCSamplingStop",
        "cuptiPCSamplingGetData", "cuptiPCSamplingSetConfigurationAttribute",
        "cuptiPCSamplingGetNumStallReasons", "cuptiPCSamplingGetStallReasons", "cuptiGetCubinCrc",
        "cuptiSassMetricsGetNumOfMetrics", "cuptiSassMetricsGetMetrics", "cuptiSassMetricsSetConfig",
        "cuptiSassMetricsUnsetConfig", "cuptiSassMetricsEnable", "cuptiSassMetricsDisable",
        "cuptiSassMetricsGetDataProperties", "cuptiSassMetricsFlushData", "cuptiDeviceGetChipName",
        "cuptiProfilerInitialize", "cuptiGetSassToSourceCorrelation", "cuptiGetDeviceId", "cuptiGetContextId",
        *(name for name in library._SIGNATURES if name != "cuptiActivityGetStructSize"),  # that one: CUPTI 13
    ):  # fmt: skip
        assert library.function(name) is not None
    with pytest.raises(library.CuptiError) as info:
        library.function("cuptiNoSuchFunction")
    assert info.value.code == library.ERROR_NOT_SUPPORTED
    assert pcs.CuptiError is library.CuptiError  # one error type, whichever module a caller names


def test_sampling_buffer_is_laid_out_for_cupti() -> None:
    buffer = pcs.SamplingBuffer(num_pcs=3, num_stall_reasons=5)
    assert buffer.data.collectNumPcs == 3
    assert buffer.data.size == ctypes.sizeof(pcs.PCSamplingData)
    assert buffer.data.pPcData == ctypes.addressof(buffer.pcs)
    stride = 5 * ctypes.sizeof(pcs.StallReason)
    for i, pc in enumerate(buffer.pcs):  # each PC's reasons: its own slice of one block
        assert pc.stallReason == ctypes.addressof(buffer.reasons) + i * stride
        assert pc.stallReasonCount == 5
    assert ctypes.sizeof(buffer.reasons) == 3 * stride
    buffer.pcs[1].stallReasonCount = 2  # CUPTI overwrites the capacity with the count written
    buffer.data.totalNumPcs = 2
    buffer.reset()
    assert buffer.pcs[1].stallReasonCount == 5 and buffer.data.totalNumPcs == 0


# --- decoding real H200 output ---------------------------------------------------------------


def _pc_fixture() -> dict:
    return json.loads((FIXTURES / "pc_sampling_h200.json").read_text())


def test_decode_captured_pc_sampling_data_exactly() -> None:
    capture = _pc_fixture()
    memory = SnapshotMemory.from_json(capture["memory"])
    stall_names = {int(k): v for k, v in capture["stall_names"].items()}
    data = decode_pc_data(memory, capture["address"], stall_names)
    assert msgspec.to_builtins(data) == capture["decoded"]
    assert data.total_num_pcs == len(data.samples) == 127
    assert data.total_samples == 148409
    assert data.dropped_samples == 0 and not data.hardware_buffer_full
    functions = {s.function_name for s in data.samples}
    assert functions <= {"dep_chain", "strided", "other_module_kernel"}


def test_captured_hot_spots_have_the_expected_stall_reasons() -> None:
    capture = _pc_fixture()
    data = decode_pc_data(
        SnapshotMemory.from_json(capture["memory"]), capture["address"],
        {int(k): v for k, v in capture["stall_names"].items()},
    )  # fmt: skip
    per_function: dict[str, dict[str, int]] = {}
    for sample in data.samples:
        totals = per_function.setdefault(sample.function_name, {})
        for reason, n in sample.stalls.items():
            totals[reason] = totals.get(reason, 0) + n
    # The strided gather waits on memory; the FMA chain on fixed-latency dependencies.
    strided = per_function["strided"]
    assert max(strided, key=strided.__getitem__).endswith("long_scoreboard")
    if "dep_chain" in per_function:
        dep = per_function["dep_chain"]
        assert max(dep, key=dep.__getitem__) == "smsp__pcsamp_warps_issue_stalled_wait"
    # Every PC of the first module carries that module's CRC (computed from the cubin on the GPU).
    crcs = {s.cubin_crc for s in data.samples if s.function_name in ("dep_chain", "strided")}
    assert crcs == {3898954909}


def test_function_names_are_read_once_per_pointer() -> None:
    capture = _pc_fixture()
    memory = SnapshotMemory.from_json(capture["memory"])
    reads: list[int] = []
    original = memory.cstring

    def counting(address: int) -> str:
        reads.append(address)
        return original(address)

    memory.cstring = counting  # type: ignore[method-assign]
    names: dict[int, str] = {}
    data = decode_pc_data(
        memory, capture["address"], {int(k): v for k, v in capture["stall_names"].items()}, names
    )
    assert len(reads) == len(set(reads)) == len(names)
    assert len(reads) < len(data.samples)


def test_snapshot_refuses_addresses_it_did_not_capture() -> None:
    memory = SnapshotMemory(regions={0x1000: b"\0" * 16})
    with pytest.raises(KeyError):
        memory.read(0x2000, 8)
    assert memory.read(0x1008, 8) == b"\0" * 8


# --- config and names ------------------------------------------------------------------------


def test_stall_reasons_by_name_or_unique_part() -> None:
    stall_names = {int(k): v for k, v in _pc_fixture()["stall_names"].items()}
    by_name = {v: k for k, v in stall_names.items()}
    chosen = select_stall_reasons(["long_scoreboard", "smsp__pcsamp_warps_issue_stalled_wait"], stall_names)
    assert chosen == sorted(
        {
            by_name["smsp__pcsamp_warps_issue_stalled_long_scoreboard"],
            by_name["smsp__pcsamp_warps_issue_stalled_wait"],
        }
    )
    assert select_stall_reasons([], stall_names) == sorted(stall_names)
    with pytest.raises(ConfigError, match=r"long_scorebord.*did you mean"):
        select_stall_reasons(["long_scorebord"], stall_names)


def test_config_rejects_out_of_range_period() -> None:
    with pytest.raises(ConfigError, match="sampling_period"):
        convert({"type": "pc_sampling", "sampling_period": 40}, PcSamplingConfig, "sources[0]")
    cfg = convert({"type": "pc_sampling", "duty_cycle": {"on": "500ms", "off": "2s"}}, PcSamplingConfig)
    assert (cfg.duty_cycle.on, cfg.duty_cycle.off) == (0.5, 2.0)


def test_watchdog_reports_a_call_that_does_not_return() -> None:
    fired: list[tuple[str, float]] = []
    done = threading.Event()

    def on_wedged(name: str, seconds: float) -> None:
        fired.append((name, seconds))
        done.set()

    watchdog = Watchdog(0.2, on_wedged)
    try:
        with watchdog.call("fast"):
            pass
        with watchdog.call("cuptiSassMetricsFlushData"):
            assert done.wait(5)
        assert watchdog.wedged.is_set()
        assert fired[0][0] == "cuptiSassMetricsFlushData" and fired[0][1] > 0.2
        time.sleep(0.3)
        assert len(fired) == 1  # reported once
    finally:
        watchdog.close()
