"""PC sampling and SASS metrics cost on a torch training loop, measured in interleaved windows.

Run on the GPU machine (needs torch and cupti-python)::

    python bench/sampling_overhead.py --window 30 --rounds 3 --conditions base,both,pcs_serialized
    python bench/sampling_overhead.py --soak 630 --conditions both     # one long session

One process trains an MLP (1024-2048-2048-1024, batch 256, Adam) the whole time. Each window runs
one condition inside a ``cuptistream.session`` (file sink, so the pipeline's own cost counts too);
conditions rotate every window, so slow drift of the machine hits all of them alike. Steps/s is
counted per window, excluding the session's start and stop; the result is the median, min and max
per condition and the ratio of medians to ``base``. A watchdog thread dumps all stacks and exits
with 3 if no step completes for 30 s (a hung launch path).

``--soak S`` instead runs one session of the first condition for S seconds and reports steps/s per
10 s bucket, and from the files the sink wrote: every Loss event and Error event, by reason.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

import cuptistream
from cuptistream.events import Error, Loss, PcSampleBatch, SassMetricBatch
from cuptistream.reader import read

PC_SAMPLING: dict[str, Any] = {"type": "pc_sampling"}
SASS: dict[str, Any] = {"type": "sass"}
CONDITIONS: dict[str, list[dict[str, Any]]] = {
    "base": [],
    "pcs": [PC_SAMPLING],
    "sass": [SASS],
    "both": [PC_SAMPLING, SASS],
    "pcs_serialized": [{**PC_SAMPLING, "mode": "serialized"}],
    "pcs_start_stop": [{**PC_SAMPLING, "duty_cycle": {"method": "start_stop"}}],
    "pcs_enable_disable": [{**PC_SAMPLING, "duty_cycle": {"method": "enable_disable"}}],
    "pcs_always": [{**PC_SAMPLING, "duty_cycle": {"on": 1, "off": 0}}],
    "sass_often": [{**SASS, "period": 10, "initial_delay": 2}],
}


class Trainer:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
            torch.nn.Linear(2048, 1024),
        ).cuda()  # fmt: skip
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(256, 1024, device="cuda")
        self.y = torch.randn(256, 1024, device="cuda")
        self.last_step = time.monotonic()

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
        self.opt.step()

    def run_for(self, seconds: float) -> tuple[int, float]:
        """Steps done in ``seconds`` (synchronizing every 10 steps) and the time they took."""
        t0 = time.monotonic()
        steps = 0
        while time.monotonic() - t0 < seconds:
            for _ in range(10):
                self.step()
            torch.cuda.synchronize()
            steps += 10
            self.last_step = time.monotonic()
        return steps, time.monotonic() - t0


def session_config(sources: list[dict[str, Any]], directory: str) -> dict[str, Any]:
    return {
        "sources": [{**s, "name": s["type"]} for s in sources],
        "sinks": [{"type": "file", "directory": directory, "format": "msgpack"}],
    }


def watch(trainer: Trainer) -> None:
    def run() -> None:
        while True:
            time.sleep(1)
            if time.monotonic() - trainer.last_step > 30:
                print(json.dumps({"wedged": True}), flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    threading.Thread(target=run, daemon=True).start()


def summarize_files(directory: str) -> dict[str, Any]:
    losses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    samples = 0
    for event in read(directory):
        kinds[type(event).__name__] += 1
        if isinstance(event, Loss):
            losses[f"{event.stage}/{event.reason} ({event.unit})"] += event.count
        elif isinstance(event, Error):
            errors[f"{event.severity}: {event.message[:160]}"] += 1
        elif isinstance(event, PcSampleBatch):
            samples += event.total_samples
        elif isinstance(event, SassMetricBatch):
            kinds["sass_records"] += len(event.records)
    return {"events": dict(kinds), "pc_samples": samples, "losses": dict(losses), "errors": dict(errors)}


def interleaved(trainer: Trainer, names: list[str], window: float, rounds: int, root: str) -> dict[str, Any]:
    rates: dict[str, list[float]] = {name: [] for name in names}
    extra: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            directory = os.path.join(root, f"{name}-{r}")
            t0 = time.monotonic()
            with cuptistream.session(session_config(CONDITIONS[name], directory), quiet=True) as s:
                started = time.monotonic() - t0
                steps, took = trainer.run_for(window)
                t1 = time.monotonic()
            stopped = time.monotonic() - t1
            rates[name].append(steps / took)
            files = summarize_files(directory)
            extra[name].append({"start_s": round(started, 3), "stop_s": round(stopped, 3), **files,
                                "report": s.report.summary() if s.report else None})  # fmt: skip
            print(json.dumps({"round": r, "condition": name, "steps_per_s": round(steps / took, 1),
                              **extra[name][-1]})[:1500], flush=True)  # fmt: skip
    base = statistics.median(rates["base"]) if rates.get("base") else None
    table = {
        name: {
            "median": round(statistics.median(v), 1),
            "min": round(min(v), 1),
            "max": round(max(v), 1),
            "ratio_to_base": round(statistics.median(v) / base, 4) if base else None,
        }
        for name, v in rates.items()
    }
    return {"window_s": window, "rounds": rounds, "table": table, "windows": rates}


def soak(trainer: Trainer, name: str, seconds: float, root: str) -> dict[str, Any]:
    directory = os.path.join(root, f"soak-{name}")
    buckets: list[float] = []
    with cuptistream.session(session_config(CONDITIONS[name], directory), quiet=True) as s:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            steps, took = trainer.run_for(10.0)
            buckets.append(steps / took)
            print(json.dumps({"t": len(buckets) * 10, "steps_per_s": round(buckets[-1], 1)}), flush=True)
    files = summarize_files(directory)
    return {
        "condition": name,
        "seconds": seconds,
        "buckets": len(buckets),
        "steps_per_s_median": round(statistics.median(buckets), 1),
        "steps_per_s_min": round(min(buckets), 1),
        "steps_per_s_max": round(max(buckets), 1),
        "report": s.report.summary() if s.report else None,
        "report_losses": s.report.losses if s.report else None,
        **files,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conditions", default="base,both,pcs_serialized")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--soak", type=float, default=0.0, help="one session of the first condition")
    parser.add_argument("--out", default="", help="write the result JSON here")
    parser.add_argument("--keep", default="", help="sink directories go here (default: a temp dir)")
    args = parser.parse_args()
    names = args.conditions.split(",")
    unknown = [n for n in names if n not in CONDITIONS]
    if unknown:
        sys.exit(f"unknown condition {unknown[0]!r}; choose from {', '.join(CONDITIONS)}")
    # Keep CUPTI attached between windows, as a long-running process would: no cuptiFinalize (and
    # no re-attach) at each window's end.
    from cuptistream.cupti import driver

    driver.acquire("bench")
    trainer = Trainer()
    for _ in range(50):
        trainer.step()
    torch.cuda.synchronize()
    watch(trainer)
    root = args.keep or tempfile.mkdtemp(prefix="cs-overhead-")
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    if args.soak:
        result = {**meta, "soak": soak(trainer, names[0], args.soak, root)}
    else:
        result = {**meta, **interleaved(trainer, names, args.window, args.rounds, root)}
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
