"""GPU acceptance for the pm_sampling source, under ``cuptistream run`` with kernel and copy tracing
beside it. A bf16 matmul loop between two idle spells: samples come at the configured rate, read SM
and tensor activity high while the matmuls run and low while the GPU idles, line up with the kernel
records on CUPTI's clock, and fold into ``pm_stats``. A memory-bound elementwise loop reads DRAM
busy and the tensor pipes idle; pinned host-to-device copies read PCIe RX at the rate the program
measured. A program that alternates the matmuls with the elementwise loop gets each kernel its own
reading in ``pm_kernel_stats``, close to the reading of its single-kernel run. The NVML backend
(``backend: nvml``, GPM at 100 ms) reads the same loads within the same bounds, and gives the
alternating kernels their own readings with phases of 1.2 s. About a minute and a half on an H100."""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import cuptistream
from cuptistream.cupti.pm_metrics import default_metrics, field_of
from cuptistream.events import Error, Kernel, Loss, Memcpy, PmKernelStats, PmSamples, PmStats
from cuptistream.nvml.gpm import metric_name as gpm_metric_name

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
INTERVAL_MS = 20
INTERVAL_MS_OF = {"cupti": INTERVAL_MS, "nvml": 100}

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


# Four rounds of bf16 matmuls then a memory-bound elementwise loop, each phase as long as the first
# argument says (0.4 s by default): a phase spans about 20 samples at 20 ms (12 at 100 ms with
# 1.2 s), so most samples hold one kernel only.
ALTERNATING = r"""
import sys, time, torch
phase = float(sys.argv[1]) if len(sys.argv) > 1 else 0.4
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
x = torch.randn(64 << 20, device="cuda")
torch.cuda.synchronize()
time.sleep(1.0)
for _ in range(4):
    for body in (lambda: a @ b, lambda: x.mul_(1.0001)):
        began = time.monotonic()
        while time.monotonic() - began < phase:
            for _ in range(10):
                body()
            torch.cuda.synchronize()
time.sleep(0.5)
"""


# ~3 s of a memory-bound in-place multiply over 1 GiB between idle spells, as PROGRAM.
ELEMENTWISE = r"""
import time, torch
x = torch.randn(256 << 20, device="cuda")
torch.cuda.synchronize()
time.sleep(1.5)
began = time.monotonic()
while time.monotonic() - began < 3.0:
    for _ in range(20):
        x.mul_(1.0001)
    torch.cuda.synchronize()
time.sleep(2.0)
"""

# ~3 s of 256 MiB copies from pinned host memory to the device; writes the copies' own rate (bytes
# per second over the loop, timed by the program) to the file named by its first argument.
HOST_TO_DEVICE = r"""
import sys, time, torch
host = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
device = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
device.copy_(host, non_blocking=True)
torch.cuda.synchronize()
time.sleep(1.5)
copies, began = 0, time.perf_counter()
while time.perf_counter() - began < 3.0:
    for _ in range(4):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    copies += 4
rate = copies * host.numel() / (time.perf_counter() - began)
open(sys.argv[1], "w").write(repr(rate))
time.sleep(2.0)
"""


def _run(tmp_path: Path, backend: str, program: str = PROGRAM, *args: str) -> list[Any]:
    pm = {"type": "pm_sampling", "backend": backend, "interval": f"{INTERVAL_MS_OF[backend]}ms"}
    cfg = {
        "sources": [
            {"type": "activity", "kinds": ["concurrent_kernel", "memcpy"]},
            {**pm, "decode_period": "500ms"},
        ],
        "statistics": {"interval": "1s"},
        "sinks": [{"type": "file", "directory": str(tmp_path / "out")}],
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp_path / "cfg.yaml"), "--",
         sys.executable, "-c", program, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=55,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(cuptistream.read(tmp_path / "out"))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[Any]]:
    """Each program's recording, run once for the module (the attribution test reuses the
    single-kernel runs as its reference)."""
    pytest.importorskip("torch")
    runs: dict[tuple[str, ...], list[Any]] = {}

    def record(program: str, *args: str, backend: str = "cupti") -> list[Any]:
        if (backend, program, *args) not in runs:
            runs[(backend, program, *args)] = _run(tmp_path_factory.mktemp("pm"), backend, program, *args)
        return runs[(backend, program, *args)]

    return record


class Phases:
    """A recording's samples, split into those wholly inside its busy phase (the activity records
    after the first idle spell) and those of the idle spell after it."""

    def __init__(
        self,
        events: list[Any],
        busy_kind: type[Kernel] | type[Memcpy] = Kernel,
        interval_ms: int = INTERVAL_MS,
    ) -> None:
        errors = [
            e
            for e in events
            if isinstance(e, Error) and e.origin == "source:pm_sampling" and e.severity != "info"
        ]
        assert not errors, [e.message for e in errors]
        self.batches = [e for e in events if isinstance(e, PmSamples)]
        assert self.batches, "no pm_samples"
        # the default fields sampled on this chip (CUPTI may leave some out: an info line says which)
        self.metrics = self.batches[0].metrics
        self.fields = {str(field_of(name)): name for name in self.metrics}
        assert all(b.metrics == self.metrics for b in self.batches)
        assert self.metrics == list(self.fields.values())
        self.starts = [s for b in self.batches for s in b.starts]
        self.ends = [e for b in self.batches for e in b.ends]
        self.columns = {m: [v for b in self.batches for v in b.values[i]] for i, m in enumerate(self.metrics)}
        records: list[Any] = sorted((r for r in events if isinstance(r, busy_kind)), key=lambda r: r.start)
        gap_at = max(range(1, len(records)), key=lambda i: records[i].start - records[i - 1].end)
        self.busy_from, self.busy_to = records[gap_at].start, max(r.end for r in records[gap_at:])
        assert (self.busy_to - self.busy_from) / 1e9 > 2.5
        self.records = records[gap_at:]
        self.busy = [
            i for i in range(len(self.ends))
            if self.starts[i] >= self.busy_from + 100_000_000 and self.ends[i] <= self.busy_to
        ]  # fmt: skip
        self.idle = [i for i in range(len(self.ends)) if self.starts[i] >= self.busy_to + 200_000_000]
        assert len(self.busy) >= 0.8 * (self.busy_to - self.busy_from) / 1e6 / interval_ms - 10, len(
            self.busy
        )

    def median(self, field: str, rows: list[int]) -> float:
        values = [self.columns[self.fields[field]][i] for i in rows]
        known = [v for v in values if v is not None]
        assert len(known) == len(values), (field, values)
        return statistics.median(known)

    def readings(self, *fields: str) -> dict[str, tuple[float, float]]:
        """Per field, the median over the busy samples and over the idle ones."""
        found = {f: (self.median(f, self.busy), self.median(f, self.idle)) for f in fields}
        print(f"busy/idle medians: {found}")
        return found


def test_counters_follow_a_matmul_loop(recorded: Callable[..., list[Any]]) -> None:
    events = recorded(PROGRAM)
    run = Phases(events)
    losses = [e for e in events if isinstance(e, Loss) and e.stage == "pm_sampling"]
    print(f"chip={run.batches[0].chip} samples={len(run.ends)} batches={len(run.batches)} losses={losses}")

    # The configured rate: consecutive samples INTERVAL_MS apart, none missing over the span.
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(run.starts)]
    assert statistics.median(gaps_ms) == pytest.approx(INTERVAL_MS, rel=0.1), statistics.median(gaps_ms)
    span_ms = (run.ends[-1] - run.starts[0]) / 1e6
    assert len(run.ends) >= 0.9 * span_ms / INTERVAL_MS, (len(run.ends), span_ms)
    assert not losses

    # Samples on CUPTI's clock, as the kernels: high inside the matmuls, low after them.
    assert len(run.idle) >= 50, len(run.idle)
    readings = run.readings("sm_active", "tensor_active", "dram_active")
    assert readings["sm_active"][0] >= 80 and readings["tensor_active"][0] >= 50
    assert readings["sm_active"][1] < 5 and readings["tensor_active"][1] < 2

    # Statistics: per 1 s interval, the same metrics, the samples counted once.
    stats = [e for e in events if isinstance(e, PmStats)]
    assert len(stats) >= 5 and all(s.metrics == run.metrics for s in stats)
    assert sum(s.samples for s in stats) == len(run.ends)
    sm = run.metrics.index(run.fields["sm_active"])
    p50 = [s.p50[sm] for s in stats]
    known = [v for v in p50 if v is not None]
    assert len(known) == len(p50), p50
    assert max(known) >= 80 and min(known) < 5


def test_a_memory_bound_loop_reads_dram_busy_and_tensor_idle(recorded: Callable[..., list[Any]]) -> None:
    run = Phases(recorded(ELEMENTWISE))
    readings = run.readings("sm_active", "tensor_active", "dram_active")
    assert readings["dram_active"][0] >= 50 and readings["tensor_active"][0] < 2
    assert readings["dram_active"][1] < 5


def test_pinned_host_to_device_copies_read_pcie_rx_at_their_rate(
    recorded: Callable[..., list[Any]], tmp_path: Path
) -> None:
    rate_file = tmp_path / "rate"
    run = Phases(recorded(HOST_TO_DEVICE, str(rate_file)), busy_kind=Memcpy)
    assert {r.copy_kind for r in run.records} == {"HtoD"}
    measured = float(rate_file.read_text())
    readings = run.readings("pcie_rx_bytes", "pcie_tx_bytes")
    print(f"copies measured {measured / 1e9:.2f} GB/s")
    assert readings["pcie_rx_bytes"][0] == pytest.approx(measured, rel=0.1)
    assert readings["pcie_tx_bytes"][0] < 0.2 * measured  # the other direction carries little
    assert readings["pcie_rx_bytes"][1] < 0.01 * measured


GEMM_NAMES = ("gemm", "nvjet", "xmma", "cutlass")


def _kernel_reading(events: list[Any], kind: tuple[str, ...], fields: dict[str, str]) -> dict[str, float]:
    """Per field (and the own and covered shares), the overlap-weighted reading of the kernels whose
    names hold one of ``kind``, over every interval's ``pm_kernel_stats``."""
    rows = [e for e in events if isinstance(e, PmKernelStats)]
    mine = [r for r in rows if any(k in r.name.lower() for k in kind)]
    assert mine, (kind, sorted({r.name for r in rows}))
    weight = sum(r.covered_ns for r in mine)
    found = {}
    for field in ("sm_active", "tensor_active", "dram_active"):
        means = [r.mean[r.metrics.index(fields[field])] for r in mine]
        assert None not in means, (field, means)  # every covered kernel name has a reading
        found[field] = (
            sum(m * r.covered_ns for m, r in zip(means, mine, strict=True) if m is not None) / weight
        )
    found["own"] = sum(r.own_share * r.covered_ns for r in mine) / weight
    found["covered"] = weight / sum(r.kernel_ns for r in mine)
    return found


def test_attribution_gives_a_gemm_and_an_elementwise_kernel_their_own_readings(
    recorded: Callable[..., list[Any]],
) -> None:
    events = recorded(ALTERNATING)
    batches = [e for e in events if isinstance(e, PmSamples)]
    assert batches, "no pm_samples"
    fields = default_metrics(batches[0].chip).fields
    gemm = _kernel_reading(events, GEMM_NAMES, fields)
    elementwise = _kernel_reading(events, ("elementwise",), fields)
    alone = {
        "gemm": _kernel_reading(recorded(PROGRAM), GEMM_NAMES, fields),
        "elementwise": _kernel_reading(recorded(ELEMENTWISE), ("elementwise",), fields),
    }
    print(f"alternating: gemm={gemm} elementwise={elementwise}; alone: {alone}")
    _assert_own_readings(gemm, elementwise, alone)


def _assert_own_readings(
    gemm: dict[str, float],
    elementwise: dict[str, float],
    alone: dict[str, dict[str, float]],
    idle_tensor: float = 5,
) -> None:
    assert gemm["tensor_active"] >= 50 and elementwise["tensor_active"] < idle_tensor
    assert gemm["tensor_active"] - elementwise["tensor_active"] >= 40
    assert gemm["own"] > 0.5 and elementwise["own"] > 0.5  # most of each one's samples were its own
    assert gemm["covered"] > 0.9 and elementwise["covered"] > 0.9
    # Each kernel's reading is its own: within 10 points of its single-kernel run.
    for field in ("sm_active", "tensor_active", "dram_active"):
        assert gemm[field] == pytest.approx(alone["gemm"][field], abs=10), field
        assert elementwise[field] == pytest.approx(alone["elementwise"][field], abs=10), field


def test_gpm_reads_the_matmul_and_the_elementwise_loops(recorded: Callable[..., list[Any]]) -> None:
    gemm = Phases(recorded(PROGRAM, backend="nvml"), interval_ms=100)
    assert gemm.metrics[0].startswith("gpm__") and len(gemm.idle) >= 10
    readings = gemm.readings("sm_active", "tensor_active", "tensor_hmma_active", "dram_active")
    assert readings["sm_active"][0] >= 80 and readings["tensor_active"][0] >= 50
    assert readings["tensor_hmma_active"][0] >= 50  # bf16: the HMMA pipe
    assert readings["sm_active"][1] < 5 and readings["tensor_active"][1] < 2
    streaming = Phases(recorded(ELEMENTWISE, backend="nvml"), interval_ms=100)
    readings = streaming.readings("tensor_active", "dram_active")
    assert readings["dram_active"][0] >= 50 and readings["tensor_active"][0] < 2


def test_gpm_reads_pcie_rx_at_the_copies_rate(recorded: Callable[..., list[Any]], tmp_path: Path) -> None:
    rate_file = tmp_path / "rate"
    run = Phases(recorded(HOST_TO_DEVICE, str(rate_file), backend="nvml"), busy_kind=Memcpy, interval_ms=100)
    measured = float(rate_file.read_text())
    readings = run.readings("pcie_rx_bytes", "pcie_tx_bytes")
    print(f"copies measured {measured / 1e9:.2f} GB/s")
    assert readings["pcie_rx_bytes"][0] == pytest.approx(measured, rel=0.1)
    assert readings["pcie_rx_bytes"][1] < 0.01 * measured


def test_gpm_attribution_gives_a_gemm_and_an_elementwise_kernel_their_own_readings(
    recorded: Callable[..., list[Any]],
) -> None:
    # 1.2 s phases: twelve 100 ms samples each, the one at each end shared with the other kernel.
    events = recorded(ALTERNATING, "1.2", backend="nvml")
    fields = {field: gpm_metric_name(field) for field in ("sm_active", "tensor_active", "dram_active")}
    gemm = _kernel_reading(events, GEMM_NAMES, fields)
    elementwise = _kernel_reading(events, ("elementwise",), fields)
    alone = {
        "gemm": _kernel_reading(recorded(PROGRAM, backend="nvml"), GEMM_NAMES, fields),
        "elementwise": _kernel_reading(recorded(ELEMENTWISE, backend="nvml"), ("elementwise",), fields),
    }
    print(f"gpm alternating: gemm={gemm} elementwise={elementwise}; alone: {alone}")
    # The 100 ms sample in which a GEMM phase gives way to an elementwise one holds both, and the
    # elementwise kernels in it get the GEMM's tensor activity: low, within the 10 points below.
    _assert_own_readings(gemm, elementwise, alone, idle_tensor=10)
