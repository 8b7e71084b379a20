"""GPU acceptance for the pm_sampling source: a bf16 matmul loop between two idle spells, under
``cuptistream run`` with kernel tracing beside it. Samples must come at the configured rate, read SM
and tensor activity high while the matmuls run and low while the GPU idles, line up with the kernel
records on CUPTI's clock, and fold into ``pm_stats``; and a program that alternates the matmuls with
an elementwise loop gets each kernel its own reading in ``pm_kernel_stats``. About 25 s on an H100."""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import cuptistream
from cuptistream.cupti.pm_metrics import default_metrics
from cuptistream.events import Error, Kernel, Loss, PmKernelStats, PmSamples, PmStats

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
INTERVAL_MS = 20

# Idle 1.5 s with a context (sampling starts), ~3 s of 8192^3 bf16 matmuls, idle 2 s.
PROGRAM = r"""
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
time.sleep(1.5)
began = time.monotonic()
while time.monotonic() - began < 3.0:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
time.sleep(2.0)
"""


# Four rounds of ~0.4 s of bf16 matmuls then ~0.4 s of a memory-bound elementwise loop: each phase
# spans about 20 samples, so most samples hold one kernel only.
ALTERNATING = r"""
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
x = torch.randn(64 << 20, device="cuda")
torch.cuda.synchronize()
time.sleep(1.0)
for _ in range(4):
    for body in (lambda: a @ b, lambda: x.mul_(1.0001)):
        began = time.monotonic()
        while time.monotonic() - began < 0.4:
            for _ in range(10):
                body()
            torch.cuda.synchronize()
time.sleep(0.5)
"""


def _run(tmp_path: Path, program: str = PROGRAM) -> list[Any]:
    cfg = {
        "sources": [
            {"type": "activity", "kinds": ["concurrent_kernel"]},
            {"type": "pm_sampling", "interval": f"{INTERVAL_MS}ms", "decode_period": "500ms"},
        ],
        "statistics": {"interval": "1s"},
        "sinks": [{"type": "file", "directory": str(tmp_path / "out")}],
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp_path / "cfg.yaml"), "--",
         sys.executable, "-c", program],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=55,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(cuptistream.read(tmp_path / "out"))


def test_counters_follow_a_matmul_loop(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    events = _run(tmp_path)
    errors = [e for e in events if isinstance(e, Error) and e.origin == "source:pm_sampling"]
    assert not errors, [e.message for e in errors]
    batches = [e for e in events if isinstance(e, PmSamples)]
    assert batches, "no pm_samples"
    chip = batches[0].chip
    fields = default_metrics(chip).fields
    metrics = batches[0].metrics
    assert all(b.metrics == metrics for b in batches) and metrics == list(fields.values())
    starts = [s for b in batches for s in b.starts]
    ends = [e for b in batches for e in b.ends]
    columns = {m: [v for b in batches for v in b.values[i]] for i, m in enumerate(metrics)}
    losses = [e for e in events if isinstance(e, Loss) and e.stage == "pm_sampling"]
    print(f"chip={chip} samples={len(ends)} batches={len(batches)} losses={losses}")

    # The configured rate: consecutive samples INTERVAL_MS apart, none missing over the span.
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(starts)]
    assert statistics.median(gaps_ms) == pytest.approx(INTERVAL_MS, rel=0.1), statistics.median(gaps_ms)
    span_ms = (ends[-1] - starts[0]) / 1e6
    assert len(ends) >= 0.9 * span_ms / INTERVAL_MS, (len(ends), span_ms)
    assert not losses

    # The matmul phase from the kernel records (after the one long gap, the first idle spell).
    kernels = sorted((k for k in events if isinstance(k, Kernel)), key=lambda k: k.start)
    gap_at = max(range(1, len(kernels)), key=lambda i: kernels[i].start - kernels[i - 1].end)
    busy_from, busy_to = kernels[gap_at].start, max(k.end for k in kernels[gap_at:])
    assert (busy_to - busy_from) / 1e9 > 2.5
    # Samples on CUPTI's clock, as the kernels: some lie wholly inside the matmuls, some after them.
    busy = [i for i in range(len(ends)) if starts[i] >= busy_from + 100_000_000 and ends[i] <= busy_to]
    idle = [i for i in range(len(ends)) if starts[i] >= busy_to + 200_000_000]
    assert len(busy) >= 0.8 * (busy_to - busy_from) / 1e6 / INTERVAL_MS - 10, len(busy)
    assert len(idle) >= 50, len(idle)

    def median(field: str, rows: list[int]) -> float:
        return statistics.median(columns[fields[field]][i] for i in rows)

    readings = {f: (median(f, busy), median(f, idle)) for f in ("sm_active", "tensor_active", "dram_active")}
    print(f"busy/idle medians: {readings}")
    assert readings["sm_active"][0] >= 80 and readings["tensor_active"][0] >= 50
    assert readings["sm_active"][1] < 5 and readings["tensor_active"][1] < 2

    # Statistics: per 1 s interval, the same metrics, the samples counted once.
    stats = [e for e in events if isinstance(e, PmStats)]
    assert len(stats) >= 5 and all(s.metrics == metrics for s in stats)
    assert sum(s.samples for s in stats) == len(ends)
    sm = metrics.index(fields["sm_active"])
    assert max(s.p50[sm] for s in stats) >= 80 and min(s.p50[sm] for s in stats) < 5


def test_attribution_gives_a_gemm_and_an_elementwise_kernel_their_own_readings(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    events = _run(tmp_path, ALTERNATING)
    batches = [e for e in events if isinstance(e, PmSamples)]
    assert batches, "no pm_samples"
    fields = default_metrics(batches[0].chip).fields
    rows = [e for e in events if isinstance(e, PmKernelStats)]
    assert rows, "no pm_kernel_stats"

    def reading(kind: tuple[str, ...]) -> tuple[float, float, float]:
        """Tensor active (overlap-weighted over the intervals), own share, covered share."""
        mine = [r for r in rows if any(k in r.name.lower() for k in kind)]
        assert mine, (kind, sorted({r.name for r in rows}))
        weight = sum(r.covered_ns for r in mine)
        tensor = sum(r.mean[r.metrics.index(fields["tensor_active"])] * r.covered_ns for r in mine) / weight
        own = sum(r.own_share * r.covered_ns for r in mine) / weight
        return tensor, own, weight / sum(r.kernel_ns for r in mine)

    gemm = reading(("gemm", "nvjet", "xmma", "cutlass"))
    elementwise = reading(("elementwise",))
    print(f"gemm (tensor, own, covered)={gemm} elementwise={elementwise}")
    assert gemm[0] >= 50 and elementwise[0] < 5 and gemm[0] - elementwise[0] >= 40
    assert gemm[1] > 0.5 and elementwise[1] > 0.5  # most of each one's samples were its own
    assert gemm[2] > 0.9 and elementwise[2] > 0.9
