"""GPU acceptance: torch.profiler on one rank of a torchrun job under ``cuptistream run``.

Needs two GPUs or more; on fewer it skips (the one-process version is
``tests/gpu/test_coexist_gpu.py``, whose workload and constants this reuses). Two ranks, a GPU each,
``tests/gpu/workloads/profiler_coexist.py --ddp``: the seeded MLP, every step ending with a NCCL
all-reduce of a gradient, so the ranks run in lockstep; rank 0 runs torch.profiler on its schedule
API (3 cycles), rank 1 the same steps with no profiler. Three jobs:

1. ``torchrun`` alone: what rank 0's profiler records with no cuptistream;
2. ``cuptistream run -c configs/default.yaml -- torchrun ...``: rank 0's profiler records exactly
   those kernels, name for name; rank 0's recording has one ``cupti_yield`` per cycle; rank 1's has
   none, and its kernels are exactly those it records in job 3 (its probe never stepped aside);
3. the same under ``cuptistream run`` with nobody profiling: rank 1's kernels, name for name.

With ``CUPTISTREAM_GPU_RESULTS=DIR`` the counts go to ``DIR/coexist_torchrun.json``.
"""

from __future__ import annotations

import collections
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream.events import CuptiYield, Kernel
from tests.gpu.test_coexist_gpu import CLI, DEFAULT, HANG_S, WORKLOAD, _record
from tests.gpu.test_compare_gpu import _torchrun

pytestmark = pytest.mark.gpu
WORLD = 2  # rank 0 profiles, rank 1 does not; more ranks would add nothing


@pytest.fixture(scope="module")
def gpus() -> int:
    torch = pytest.importorskip("torch")
    count = torch.cuda.device_count()
    if count < WORLD:
        pytest.skip(f"needs {WORLD} or more GPUs, this machine has {count}")
    return count


def _job(tmp: Path, order: str, *, under_run: bool) -> tuple[dict[int, dict[str, Any]], Path, str]:
    """``profiler_coexist.py --ddp ORDER`` on two ranks (under ``cuptistream run`` into ``tmp/rec``):
    each rank's result, the recording, and stderr's tail."""
    tmp.mkdir(parents=True, exist_ok=True)
    out, recording = tmp / "out.json", tmp / "rec"
    command = [
        *_torchrun(),
        "--standalone",
        f"--nproc_per_node={WORLD}",
        str(WORKLOAD),
        order,
        str(out),
        "--ddp",
    ]
    if under_run:
        command = [*CLI, "run", "-c", str(DEFAULT), "-o", str(recording), "--", *command]
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=2 * HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = {r: json.loads((tmp / f"out.rank{r}.json").read_text()) for r in range(WORLD)}
    return ranks, recording, done.stderr[-2000:]


def by_rank(recording: Path) -> dict[int, dict[str, Any]]:
    """Per rank of the recording: kernel counts by name, ``cupti_yield`` spans, kernel start times."""
    out: dict[int, dict[str, Any]] = collections.defaultdict(
        lambda: {"kernels": collections.Counter(), "yields": [], "starts": []}
    )
    for batch in cuptistream.read(recording).batches():
        if batch.resource.rank is None:
            continue  # the collector's own accounting
        row = out[batch.resource.rank]
        for e in batch.events:
            if isinstance(e, Kernel):
                row["kernels"][e.name] += 1
                row["starts"].append(e.start)
            elif isinstance(e, CuptiYield):
                row["yields"].append(e)
    return dict(out)


def largest_gap_ms(starts: list[int]) -> float:
    """The longest time between two kernel starts in a row (ms): a probe that stopped recording
    shows as a gap the length of what it missed."""
    ordered = sorted(starts)
    return max((b - a for a, b in itertools.pairwise(ordered)), default=0) / 1e6


def test_profiler_on_rank_0_only_and_rank_1_untouched(gpus: int, tmp_path: Path) -> None:
    alone, _, _ = _job(tmp_path / "alone", "alone", under_run=False)
    under, recording, stderr = _job(tmp_path / "under", "alone", under_run=True)
    _, quiet_recording, _ = _job(tmp_path / "quiet", "no-profiler", under_run=True)
    ranks, quiet = by_rank(recording), by_rank(quiet_recording)
    assert sorted(ranks) == sorted(quiet) == list(range(WORLD)), (sorted(ranks), sorted(quiet))
    profiler_rank, other = ranks[0], ranks[1]
    _record(
        "torchrun",
        {"gpus": gpus, "profiler_alone": alone[0]["total"], "profiler_under_run": under[0]["total"],
         "cycles": under[0]["cycles"], "rank0_yields": len(profiler_rank["yields"]),
         "rank0_spans_ms": [round((y.end - y.start) / 1e6, 1) for y in profiler_rank["yields"]],
         "rank0_kernels_recorded": sum(profiler_rank["kernels"].values()),
         "rank1_yields": len(other["yields"]), "rank1_kernels": sum(other["kernels"].values()),
         "rank1_kernels_nobody_profiling": sum(quiet[1]["kernels"].values()),
         "rank1_largest_gap_ms": largest_gap_ms(other["starts"]),
         "rank1_largest_gap_ms_nobody_profiling": largest_gap_ms(quiet[1]["starts"]),
         "rank1_names_differing": {n: (other["kernels"][n], quiet[1]["kernels"][n])
                                   for n in set(other["kernels"]) | set(quiet[1]["kernels"])
                                   if other["kernels"][n] != quiet[1]["kernels"][n]},
         "stderr": stderr},
    )  # fmt: skip
    assert alone[0]["cycles"] == under[0]["cycles"] == 3 and alone[0]["total"] > 0
    assert under[0]["kernels"] == alone[0]["kernels"], "rank 0's profiler must see every kernel it sees alone"
    assert alone[1]["total"] == under[1]["total"] == 0  # rank 1 never profiled
    assert len(profiler_rank["yields"]) == 3, "one yield event per profiler cycle on rank 0"
    assert all(y.tool == "torch.profiler" for y in profiler_rank["yields"])
    assert other["yields"] == [], "rank 1's probe has nothing to step aside for"
    assert other["kernels"] == quiet[1]["kernels"], "rank 1 records what it records with nobody profiling"
    nccl = sum(c for name, c in other["kernels"].items() if "nccl" in name.lower())
    assert nccl >= under[1]["steps"], (nccl, under[1]["steps"])  # an all-reduce every step
