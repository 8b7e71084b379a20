"""Recordings of PM sampling shaped like a real H100 run, for the views of hardware utilization.

Two hosts with one GPU each sample the GH100 default metric set (chosen by the real host library,
``pm_metrics.default_metrics``) every 20 ms for 30 s: 5 s idle, 20 s of a bf16 GEMM loop, 5 s idle.
During the work SM active reads about 90 %, tensor active 40-60 % (host ``h100-b`` a little lower
than ``h100-a``), DRAM active about 35 %, PCIe a few GB/s; idle reads near 0. The samples travel as
the source sends them (one ``PmSamples`` per second of samples) and the collector's ``PmStats`` are
folded from them by the collector's own fold (``statistics.pm_fold``) at 10 s, placed after the
samples that closed them, as the collector emits them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from cuptistream import events as ev
from cuptistream.cupti.pm_metrics import default_metrics
from cuptistream.statistics.pm_fold import PmFold
from tests.helpers.fixture_recording import Process, write_recording

MS = 1_000_000
SECOND = 1_000 * MS
PERIOD = 20 * MS
STATS_INTERVAL = 10 * SECOND
CUPTI_START = 7_003 * SECOND + 400 * MS  # a CUPTI clock that starts mid-interval
CLOCK = ev.ClockSync(cupti_ns=0, unix_ns=1_796_000_000 * SECOND)  # 2026-12
IDLE_S, WORK_S = 5, 20
HOSTS = {"h100-a": 0.0, "h100-b": -6.0}  # host -> tensor active shift in points during the work
CHIP = "GH100"

# field -> (mean during the work, spread, mean while idle); % of peak or bytes per second.
SHAPE: dict[str, tuple[float, float, float]] = {
    "gr_engine_active": (96.0, 1.5, 0.6),
    "sm_active": (90.0, 3.0, 0.3),
    "sm_occupancy": (42.0, 4.0, 0.1),
    "tensor_active": (50.0, 4.0, 0.0),
    "tensor_hmma_active": (50.0, 4.0, 0.0),
    "tensor_imma_active": (0.0, 0.0, 0.0),
    "tensor_dmma_active": (0.0, 0.0, 0.0),
    "fp64_active": (0.0, 0.0, 0.0),
    "fp32_active": (11.0, 2.0, 0.05),
    "dram_active": (35.0, 5.0, 0.2),
    "pcie_rx_bytes": (2.4e9, 2.0e8, 1.5e6),
    "pcie_tx_bytes": (6.0e8, 5.0e7, 1.0e6),
    "nvlink_rx_bytes": (0.0, 0.0, 0.0),
    "nvlink_tx_bytes": (0.0, 0.0, 0.0),
}


def samples_of(host: str, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(metric names, sample starts, values as metrics x samples) of one host's GPU."""
    choice = default_metrics(CHIP)
    fields = list(choice.fields)
    rng = np.random.default_rng(seed)
    count = (2 * IDLE_S + WORK_S) * SECOND // PERIOD
    starts = CUPTI_START + PERIOD * np.arange(count, dtype=np.int64)
    working = (starts >= CUPTI_START + IDLE_S * SECOND) & (starts < CUPTI_START + (IDLE_S + WORK_S) * SECOND)
    values = np.empty((len(fields), count))
    for row, field in enumerate(fields):
        busy, spread, idle = SHAPE[field]
        if field.startswith("tensor") and busy:
            busy += HOSTS[host]
        noise = rng.normal(0.0, spread, count)
        column = np.where(working, busy + noise, idle * rng.uniform(0.5, 1.5, count))
        cap = 100.0 if choice.fields[field].endswith("pct_of_peak_sustained_elapsed") else np.inf
        values[row] = np.clip(column, 0.0, cap)
    return [choice.fields[f] for f in fields], starts, values


def sample_events(metrics: list[str], starts: np.ndarray, values: np.ndarray) -> list[ev.PmSamples]:
    """The samples as the source sends them: one ``PmSamples`` per second of samples."""
    per_event = SECOND // PERIOD
    return [
        ev.PmSamples(
            device_id=0, chip=CHIP, metrics=metrics, starts=starts[first : first + per_event].tolist(),
            ends=(starts[first : first + per_event] + PERIOD).tolist(),
            values=values[:, first : first + per_event].tolist(),
        )
        for first in range(0, len(starts), per_event)
    ]  # fmt: skip


def pm_events(host: str, seed: int) -> list[ev.Event]:
    """One host's PmSamples (a second each) with the PmStats the collector folds from them."""
    metrics, starts, values = samples_of(host, seed)
    fold = PmFold(STATS_INTERVAL)
    out: list[ev.Event] = []
    for samples in sample_events(metrics, starts, values):
        out.append(samples)
        out.extend(fold.add(samples))
    out.extend(fold.close())
    return out


def pm_processes(
    with_stats: bool = True, events_of: Callable[[str, int], list[ev.Event]] = pm_events
) -> list[Process]:
    """One sampling process per host (rank = its index) with ``events_of(host, seed)``;
    ``with_stats`` False: samples only."""
    processes = []
    for index, host in enumerate(HOSTS):
        resource = ev.Resource(
            host=host, pid=7100 + index, process_name="train", command_line=["python", "train.py"],
            rank=index, local_rank=0, world_size=len(HOSTS),
            devices=[ev.DeviceInfo(device_id=0, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-h100-{host}")],
        )  # fmt: skip
        events = events_of(host, index)
        if not with_stats:
            events = [e for e in events if not isinstance(e, ev.PmStats)]
        processes.append(Process(resource, CLOCK, events))
    return processes


def write_pm_recording(directory: Path, with_stats: bool = True) -> Path:
    return write_recording(directory, pm_processes(with_stats), batch_events=7)
