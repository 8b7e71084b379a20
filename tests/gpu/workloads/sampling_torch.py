"""A small torch MLP training loop with the sampling sources on or off; prints one JSON line.

``python tests/gpu/workloads/sampling_torch.py MODE SECONDS`` where MODE is a key of ``CONFIGS``:
``base`` (no sources), PC sampling at defaults or variants, SASS with windows forced often (every
3 s), or ``both``.

Steps/s is recorded per 0.5 s bucket; the result holds the median bucket rate, and for pcs the
medians inside and outside sampling windows. A watchdog thread reports ``wedged`` and exits if no
step completes for 20 s (the launch path hung).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from sampling_common import CollectingEmitter

try:
    from cuptistream.sources import pc_sampling as pc_mod
    from cuptistream.sources import sass as sass_mod
except ImportError:
    from sources import pc_sampling as pc_mod  # type: ignore[no-redef]
    from sources import sass as sass_mod  # type: ignore[no-redef]

import torch

from cuptistream.config import convert

FAST_DUTY = {"on": 1, "off": 2}  # more Start/Stop toggles per run than the defaults
CONFIGS: dict[str, list[tuple[Any, dict[str, Any]]]] = {
    "base": [],
    "pcs": [(pc_mod, {"type": "pc_sampling"})],
    "pcs_fast_duty": [(pc_mod, {"type": "pc_sampling", "duty_cycle": FAST_DUTY})],
    "pcs_always": [(pc_mod, {"type": "pc_sampling", "duty_cycle": {"on": 1, "off": 0}})],
    "pcs_worker_always": [
        (pc_mod, {"type": "pc_sampling", "control": "worker", "duty_cycle": {"on": 1, "off": 0}})
    ],
    "pcs_serialized": [(pc_mod, {"type": "pc_sampling", "mode": "serialized", "duty_cycle": FAST_DUTY})],
    "sass": [(sass_mod, {"type": "sass", "period": 3, "initial_delay": 2})],
    "both": [
        (pc_mod, {"type": "pc_sampling", "duty_cycle": FAST_DUTY}),
        (sass_mod, {"type": "sass", "period": 3, "initial_delay": 2}),
    ],
}


def main() -> None:
    mode, seconds = sys.argv[1], float(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 1024),
    ).cuda()  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(256, 1024, device="cuda"), torch.randn(256, 1024, device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()

    emitter = CollectingEmitter()
    sources = []
    for module, raw in CONFIGS[mode]:
        src_cls = module.PcSamplingSource if module is pc_mod else module.SassMetricsSource
        src = src_cls(convert(raw, src_cls.config_type), emitter)
        src.start()
        sources.append(src)

    last_step = [time.monotonic()]

    def watchdog() -> None:
        while True:
            time.sleep(1)
            if time.monotonic() - last_step[0] > 20:
                print(json.dumps({"mode": mode, "wedged": True, "errors": emitter.errors}), flush=True)
                import faulthandler

                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    buckets: list[tuple[float, bool]] = []
    pcs_src = next((s for s in sources if isinstance(s, pc_mod.PcSamplingSource)), None)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        sampling = bool(pcs_src and any(c.started for c in pcs_src._sampled.values()))
        n = 0
        while time.monotonic() - t0 < 0.5:
            step()
            n += 1
            if n % 10 == 0:
                torch.cuda.synchronize()
                last_step[0] = time.monotonic()
        torch.cuda.synchronize()
        last_step[0] = time.monotonic()
        buckets.append((n / (time.monotonic() - t0), sampling))
    t0 = time.monotonic()
    for src in sources:
        src.stop()
    stop_s = time.monotonic() - t0
    rates = [r for r, _ in buckets]
    on = [r for r, s in buckets if s]
    off = [r for r, s in buckets if not s]
    counts: dict[str, int] = {}
    for e in emitter.events:
        counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
    print(
        json.dumps(
            {
                "mode": mode,
                "steps_per_s_median": statistics.median(rates),
                "steps_per_s_min": min(rates),
                "steps_per_s_max": max(rates),
                "in_window_median": statistics.median(on) if on else None,
                "out_window_median": statistics.median(off) if off else None,
                "buckets": len(rates),
                "stop_s": round(stop_s, 3),
                "events": counts,
                "losses": emitter.losses[:20],
                "errors": emitter.errors[:10],
                "stats": [getattr(s, "stats", {}) for s in sources],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
