"""Capture the GPM fixture on a GPU machine with NVML's GPM (Hopper or later; see
tests/fixtures/README.md).

    python -m tests.gpu.capture_gpm OUT_DIR

Runs 1.2 s of bf16 GEMMs, then 1.2 s of a memory-bound elementwise loop, between idle spells, under
an ActivitySource with ``capture`` set (the kernel records) and a ``GpmSession`` sampling device 0
every 100 ms on CUPTI's clock, as the ``pm_sampling`` source's NVML backend does. NVML is reached
through a proxy that keeps what it answered. Writes ``gpm_alternating.cupti`` (the kernels) and
``gpm_alternating.json``: the device, the clock reading after each sample, each
``nvmlGpmMetricsGet`` answer as (metric id, value, return code) per metric, and what the session
decoded live (the oracle a CPU test replays NVML's answers against).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import torch

from cuptistream.config import convert
from cuptistream.cupti.clock import cupti_now
from cuptistream.cupti.gpus import visible_devices
from cuptistream.nvml.gpm import GPM_METRICS, GpmSession
from sources.activity import ActivitySource, ActivitySourceConfig
from tests.gpu.workloads.collect import Collect

INTERVAL_NS = 100_000_000
NAME = "gpm_alternating"


class RecordingNvml:
    """``pynvml`` itself, keeping each ``nvmlGpmMetricsGet`` answer."""

    def __init__(self) -> None:
        self.answers: list[list[tuple[int, float, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        try:
            return pynvml.nvmlGpmMetricsGet(request)
        finally:
            slots = request.metrics[: request.numMetrics]
            self.answers.append([(int(s.metricId), float(s.value), int(s.nvmlReturn)) for s in slots])


def _loop(seconds: float, step: Callable[[], object]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            step()
        torch.cuda.synchronize()


def main(out: Path) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256 << 20, device="cuda")
    torch.cuda.synchronize()
    out.mkdir(parents=True, exist_ok=True)
    sink = Collect()
    config = {
        "type": "activity",
        "name": NAME,
        "kinds": ["concurrent_kernel"],
        "capture": str(out / f"{NAME}.cupti"),
    }
    source = ActivitySource(
        convert({**config, "detach": False, "flush_interval": 0}, ActivitySourceConfig), sink
    )
    source.start()
    stamps: list[int] = []

    def clock() -> int:
        stamps.append(cupti_now())
        return stamps[-1]

    nvml = RecordingNvml()
    uuid = next(d.uuid for d in visible_devices() if d.device_id == 0)
    session = GpmSession(uuid, clock, nvml=nvml)
    device = session.enable()
    metrics = session.configure(list(GPM_METRICS), INTERVAL_NS, 0)
    session.start()
    time.sleep(0.5)
    _loop(1.2, lambda: a @ a)
    _loop(1.2, lambda: x.mul_(1.0001))
    time.sleep(0.5)
    session.stop()
    decoded = session.decode()
    session.disable()
    source.stop()
    assert decoded.starts and len(nvml.answers) == len(decoded.starts), (
        len(nvml.answers),
        len(decoded.starts),
    )
    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlShutdown()
    summary = {
        "device": device,
        "driver": driver,
        "captured": time.strftime("%Y-%m-%d"),
        "interval_ns": INTERVAL_NS,
        "metrics": metrics,
        "stamps": stamps,
        "answers": nvml.answers,
        "decoded": {"starts": decoded.starts, "ends": decoded.ends, "values": decoded.values},
        "kernel_events": sum(1 for e in sink.events if type(e).__name__ == "Kernel"),
    }
    (out / f"{NAME}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{device}: {len(decoded.starts)} samples of {len(metrics)} metrics, "
          f"{summary['kernel_events']} kernels, capture {(out / f'{NAME}.cupti').stat().st_size} bytes")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
