"""``cuptistream source-lines``: PC samples summed per CUDA source line.

The samples are the real H200 capture (``fixtures/sampling/pc_sampling_h200.json``) and the cubins
the real ones it was taken with (``kernels_{a,b}_h200.cubin``, named by CRC as the pc_sampling
source's ``cubin_dir`` names them). ``cuptiGetSassToSourceCorrelation`` needs the NVIDIA driver
library, which CI does not have, so the per-PC lookup is a table here (``TableLookup``); the real
call runs in ``tests/gpu/test_sampling_gpu.py``. Without a driver the CLI must say so in one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import cuptistream
from cuptistream.analysis.source_lines import format_report, map_to_lines, samples_per_pc, short_stall
from cuptistream.cupti.cubin_api import SourceLine
from cuptistream.cupti.library import CuptiError
from cuptistream.cupti.sampling_decode import SnapshotMemory, decode_pc_data
from cuptistream.events import PcSampleBatch

FIXTURES = Path(__file__).parent / "fixtures" / "sampling"
CRC_A, CRC_B = 3898954909, 1463088609  # cuptiGetCubinCrc of the two cubins, measured on the H200
CLI = [sys.executable, "-m", "cuptistream.cli"]


def _batch() -> PcSampleBatch:
    capture = json.loads((FIXTURES / "pc_sampling_h200.json").read_text())
    data = decode_pc_data(
        SnapshotMemory.from_json(capture["memory"]), capture["address"],
        {int(k): v for k, v in capture["stall_names"].items()},
    )  # fmt: skip
    return PcSampleBatch(
        timestamp=1, device_id=0, context_id=1, range_id=data.range_id, samples=data.samples,
        total_samples=data.total_samples, non_user_samples=0, dropped_samples=0, hardware_buffer_full=False,
    )  # fmt: skip


def _cubin_dir(tmp_path: Path, crcs: tuple[int, ...] = (CRC_A, CRC_B)) -> Path:
    directory = tmp_path / "cubins"
    directory.mkdir()
    for crc, name in ((CRC_A, "kernels_a_h200.cubin"), (CRC_B, "kernels_b_h200.cubin")):
        if crc in crcs:
            shutil.copy(FIXTURES / name, directory / f"{crc:016x}.cubin")
    return directory


class TableLookup:
    """Stands in for CubinLines (cuptiGetSassToSourceCorrelation needs libcuda, absent in CI):
    the strided loop body is line 11 of the NVRTC source, the FMA loop line 4, as the GPU run showed."""

    opened: list[bytes] = []

    def __init__(self, cubin: bytes) -> None:
        TableLookup.opened.append(cubin)

    def line(self, function: str, pc_offset: int) -> SourceLine | None:
        if function == "strided":
            return SourceLine("kernels.cu", "/src", 11 if pc_offset >= 0x400 else 8)
        if pc_offset < 0x80:
            return None  # no line info for this PC
        if pc_offset >= 0x600:
            raise CuptiError("cuptiGetSassToSourceCorrelation", 999, "CUPTI_ERROR_UNKNOWN")
        return SourceLine("kernels.cu", "/src", 4)


def test_samples_per_pc_sums_stalls_over_batches() -> None:
    batch = _batch()
    per_pc = samples_per_pc([batch, batch])
    assert len(per_pc) == len({(s.cubin_crc, s.function_name, s.pc_offset) for s in batch.samples}) == 127
    assert sum(sum(c.values()) for c in per_pc.values()) == 2 * sum(
        sum(s.stalls.values()) for s in batch.samples
    )
    assert per_pc[(CRC_A, "strided", 0x500)] == Counter(
        {k: 2 * v for k, v in _sample("strided", 0x500).items()}
    )


def _sample(function: str, offset: int) -> dict[str, int]:
    return next(s.stalls for s in _batch().samples if s.function_name == function and s.pc_offset == offset)


def test_lines_group_pcs_and_count_what_could_not_be_mapped(tmp_path: Path) -> None:
    TableLookup.opened = []
    per_pc = samples_per_pc([_batch()])
    report = map_to_lines(per_pc, _cubin_dir(tmp_path), TableLookup)
    assert TableLookup.opened == [(FIXTURES / "kernels_a_h200.cubin").read_bytes()]  # once per CRC
    total = sum(sum(c.values()) for c in per_pc.values())
    assert report.total_samples == total
    strided_11 = next(c for c in report.lines if (c.function, c.line) == ("strided", 11))
    expected = sum(sum(s.values()) for (crc, f, o), s in per_pc.items() if f == "strided" and o >= 0x400)
    assert strided_11.samples == expected
    assert report.lines[0] is strided_11  # the gather dominates the capture
    assert short_stall(strided_11.stalls.most_common(1)[0][0]) == "long_scoreboard"
    # dep_chain: from 0x600 every lookup failed, below 0x80 no line info
    failed = sum(sum(s.values()) for (_, f, o), s in per_pc.items() if f == "dep_chain" and o >= 0x600)
    no_info = sum(sum(s.values()) for (_, f, o), s in per_pc.items() if f == "dep_chain" and o < 0x80)
    assert failed and no_info
    assert report.unmapped_samples == failed + no_info
    assert sum(c.samples for c in report.lines) + report.unmapped_samples == total
    assert sum(report.failures.values()) == sum(1 for (_, f, o) in per_pc if f == "dep_chain" and o >= 0x600)
    assert not report.missing_cubins
    assert {(c.function, c.line) for c in report.lines} == {("strided", 11), ("strided", 8), ("dep_chain", 4)}


def test_a_missing_cubin_is_named_in_the_report(tmp_path: Path) -> None:
    per_pc = samples_per_pc([_batch()])
    report = map_to_lines(per_pc, _cubin_dir(tmp_path, crcs=(CRC_B,)), TableLookup)
    assert report.missing_cubins == {CRC_A} and report.lines == []
    assert report.unmapped_samples == report.total_samples == sum(sum(c.values()) for c in per_pc.values())
    assert format_report(report, top=3)[-1].endswith(
        "not mapped to a line (1 cubin(s) not in the cubin directory)"
    )


def test_report_text_lists_the_hottest_lines_first(tmp_path: Path) -> None:
    report = map_to_lines(samples_per_pc([_batch()]), _cubin_dir(tmp_path), TableLookup)
    text = format_report(report, top=2)
    assert len(text) == 1 + 2 + 1  # header, two lines, the unmapped summary
    assert "kernels.cu:11" in text[1] and "strided" in text[1] and "long_scoreboard" in text[1]
    assert "lookup(s) failed" in text[-1]


def _recording(tmp_path: Path, events: list[PcSampleBatch]) -> Path:
    out = tmp_path / "rec"
    config = {"sources": [], "sinks": [{"type": "file", "directory": str(out)}]}
    with cuptistream.session(config, quiet=True) as session:
        session.emitter.emit(list(events))
    return out


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("no_cubin_dir", "no such directory; set pc_sampling.cubin_dir"),
        ("no_samples", "no PC samples recorded; enable the pc_sampling source"),
        ("no_driver", "the lookup needs the NVIDIA driver library"),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, case: str, needle: str) -> None:
    if case == "no_driver":
        from tests.conftest import HAVE_GPU

        if HAVE_GPU:
            pytest.skip("the driver is present here: tests/gpu covers the real lookup")
    events = [] if case == "no_samples" else [_batch()]
    recording = _recording(tmp_path, events)
    cubins = tmp_path / "none" if case == "no_cubin_dir" else _cubin_dir(tmp_path)
    result = subprocess.run([*CLI, "source-lines", str(recording), "--cubins", str(cubins)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode != 0 and needle in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
