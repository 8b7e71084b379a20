"""Capture the PM sampling fixture on a GPU machine (see tests/fixtures/README.md).

    python -m tests.gpu.capture_pm OUT_DIR

Samples device 0 with the default metric set of its chip while a bf16 GEMM loop and then an
elementwise loop run (about a second each), decodes once, and writes what CUPTI handed back:
``pm_<chip>.counterdata`` (the counter data image, raw bytes) and ``pm_<chip>.json`` (chip, metrics,
interval, per sample its start and end, and the values cupti-python's host evaluator read from the
image in the live process: the oracle the CPU tests compare their own evaluation against).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from cuptistream.cupti.pm_metrics import default_metrics
from cuptistream.cupti.pm_sampling_api import PmSamplingSession

INTERVAL_NS = 20_000_000  # the source's default interval
HARDWARE_BUFFER = 64 << 20


def _loop(seconds: float, step: object) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            step()  # type: ignore[operator]
        torch.cuda.synchronize()


def main(out: Path) -> None:
    torch.cuda.init()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256 << 20, device="cuda")
    torch.cuda.synchronize()
    session = PmSamplingSession(0)
    chip = session.enable()
    metrics = default_metrics(chip).metrics
    metrics = session.configure(metrics, INTERVAL_NS, HARDWARE_BUFFER)  # those CUPTI samples
    session.start()
    try:
        _loop(1.0, lambda: a @ a)
        _loop(1.0, lambda: x.mul_(1.0001))
        time.sleep(0.1)
    finally:
        session.stop()
    decoded = session.decode(200)
    session.disable()
    assert decoded.image is not None and decoded.starts, "no samples decoded"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pm_{chip}.counterdata").write_bytes(decoded.image.tobytes())
    device = torch.cuda.get_device_name(0)
    summary = {
        "chip": chip,
        "device": device,
        "captured": time.strftime("%Y-%m-%d"),
        "metrics": metrics,
        "interval_ns": INTERVAL_NS,
        "starts": decoded.starts,
        "ends": decoded.ends,
        "values": decoded.values,
        "overflow": decoded.overflow,
        "stop_reason": decoded.stop_reason,
    }
    (out / f"pm_{chip}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{chip} ({device}): {len(decoded.starts)} samples of {len(metrics)} metrics, "
          f"image {decoded.image.nbytes} bytes")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
