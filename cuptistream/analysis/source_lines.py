"""Which CUDA source lines the PC samples fall on (``cuptistream source-lines``).

PC-sample events carry (cubin CRC, function, pc offset). With ``cubin_dir`` set, the pc_sampling
source writes every loaded cubin once as ``<crc>.cubin``. This sums the samples of a recording per
PC, maps each PC to its source line with ``cuptiGetSassToSourceCorrelation`` (cubins built with
line info, ``-lineinfo``), and sums again per line, stall reasons included. Offline: it needs the
NVIDIA driver library, not a GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cuptistream.cupti.cubin_api import CubinLines, SourceLine
from cuptistream.cupti.library import CuptiError
from cuptistream.errors import UserError
from cuptistream.events import Event, PcSampleBatch

PcKey = tuple[int, str, int]  # (cubin CRC, function name, pc offset)


class LineLookup(Protocol):
    def line(self, function: str, pc_offset: int) -> SourceLine | None: ...


@dataclass
class LineCost:
    file: str
    line: int
    function: str
    samples: int = 0
    stalls: Counter[str] = field(default_factory=Counter)


@dataclass
class SourceReport:
    lines: list[LineCost]  # most samples first
    total_samples: int
    unmapped_samples: int = 0  # PCs whose cubin is missing, or without line info
    missing_cubins: set[int] = field(default_factory=set)
    failures: Counter[str] = field(default_factory=Counter)  # CUPTI errors, by message


def samples_per_pc(events: Iterable[Event]) -> dict[PcKey, Counter[str]]:
    """Stall-reason counts per PC, summed over every PC-sample batch."""
    totals: dict[PcKey, Counter[str]] = {}
    for event in events:
        if isinstance(event, PcSampleBatch):
            for sample in event.samples:
                key = (sample.cubin_crc, sample.function_name, sample.pc_offset)
                totals.setdefault(key, Counter()).update(sample.stalls)
    return totals


def map_to_lines(
    per_pc: dict[PcKey, Counter[str]],
    cubin_dir: Path,
    open_cubin: Callable[[bytes], LineLookup] = CubinLines,
) -> SourceReport:
    """Per-line costs of ``per_pc``, with the cubins found in ``cubin_dir``."""
    lookups: dict[int, LineLookup | None] = {}
    by_line: dict[tuple[str, int, str], LineCost] = {}
    report = SourceReport(lines=[], total_samples=0)
    for (crc, function, offset), stalls in per_pc.items():
        samples = sum(stalls.values())
        report.total_samples += samples
        if crc not in lookups:
            path = cubin_dir / f"{crc:016x}.cubin"
            lookups[crc] = open_cubin(path.read_bytes()) if path.is_file() else None
        lookup = lookups[crc]
        where = None
        if lookup is None:
            report.missing_cubins.add(crc)
        else:
            try:
                where = lookup.line(function, offset)
            except CuptiError as error:
                report.failures[str(error)] += 1
        if where is None:
            report.unmapped_samples += samples
            continue
        cost = by_line.setdefault(
            (where.file, where.line, function), LineCost(where.file, where.line, function)
        )
        cost.samples += samples
        cost.stalls.update(stalls)
    report.lines = sorted(by_line.values(), key=lambda c: (-c.samples, c.file, c.line))
    return report


def source_report(path: str, cubin_dir: str) -> SourceReport:
    """Read a recording (file-sink file or directory) and map its PC samples to source lines."""
    from cuptistream.recording.reader import read

    directory = Path(cubin_dir)
    if not directory.is_dir():
        raise UserError(
            f"--cubins {cubin_dir}: no such directory; set pc_sampling.cubin_dir in the config so the "
            "source writes the cubins there"
        )
    per_pc = samples_per_pc(read(path))
    if not per_pc:
        raise UserError(f"{path}: no PC samples recorded; enable the pc_sampling source")
    report = map_to_lines(per_pc, directory)
    if not report.lines and report.failures:
        error = report.failures.most_common(1)[0][0]
        raise UserError(
            f"no PC could be mapped to a source line ({error}); the lookup needs the NVIDIA driver "
            "library (libcuda) and cubins built with -lineinfo"
        )
    return report


def short_stall(name: str) -> str:
    """``smsp__pcsamp_warps_issue_stalled_long_scoreboard`` -> ``long_scoreboard``."""
    return name.rsplit("stalled_", 1)[-1] if "stalled_" in name else name.removeprefix("smsp__pcsamp_")


def format_report(report: SourceReport, top: int) -> list[str]:
    out = [f"{'samples':>10} {'share':>6}  {'line':<40} {'function':<24} top stall reasons"]
    total = report.total_samples or 1
    for cost in report.lines[:top]:
        reasons = ", ".join(f"{short_stall(n)} {c}" for n, c in cost.stalls.most_common(3))
        where = f"{Path(cost.file).name}:{cost.line}"
        out.append(
            f"{cost.samples:>10} {cost.samples / total:>6.1%}  {where:<40} {cost.function:<24} {reasons}"
        )
    if report.unmapped_samples:
        why = []
        if report.missing_cubins:
            why.append(f"{len(report.missing_cubins)} cubin(s) not in the cubin directory")
        if report.failures:
            why.append(f"{sum(report.failures.values())} lookup(s) failed")
        detail = f" ({'; '.join(why)})" if why else " (no line info)"
        out.append(
            f"{report.unmapped_samples} of {report.total_samples} samples not mapped to a line{detail}"
        )
    return out
