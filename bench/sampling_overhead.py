"""PC sampling and SASS metrics cost on a torch training loop, measured in interleaved windows.

Run on the GPU machine (needs torch and cupti-python)::

    python bench/sampling_overhead.py --window 60 --rounds 3 --conditions base,both,pcs_serialized
    python bench/sampling_overhead.py --workload mlp --conditions both,both,both,both,both --steady 80
    python bench/sampling_overhead.py --soak 630 --conditions both     # one long session

The result JSON goes to ``--out`` (default ``bench/out/sampling_overhead.json``); the last lines
printed are the headline rows, median [min..max] per condition.

One process trains an MLP (1024-2048-2048-1024, batch 256, Adam) the whole time. Each window runs
one condition inside a ``cuptistream.session`` (file sink, so the pipeline's own cost counts too),
and every condition window sits between two ``base`` windows (B X B Y B X ...). Steps/s is counted
per window, excluding the session's start and stop. Per condition: median, min and max steps/s,
and of its ratios to the mean of the two neighbouring base windows (the machine drifts by more
than the costs measured here, and the neighbours' mean cancels slow drift). A watchdog thread dumps
all stacks and exits with 3 if no step completes for 30 s (a hung launch path).

Use windows as long as the sources' longest period (60 s: one SASS window and three PC sampling
windows each at the defaults, as in a long run) so each window sees the steady state.

``--soak S`` instead runs one session of the first condition for S seconds and reports steps/s per
10 s bucket, and from the files the sink wrote: every Loss event and Error event, by reason.

``--steady S`` runs one governed session of S seconds per condition and values it by the time lost
around its windows (``bench/lost_time.py``), per session and over the long run (lost seconds per
window over the cycle the governor planned). ``--sass-at T`` opens the first SASS window T seconds
into each session, so that every session holds one (its cycle is tens of minutes); ``--pc-at T``
does the same for PC sampling.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lost_time import excess, long_run_total, window_cost

if TYPE_CHECKING:  # torch and cuptistream are imported where used: --help needs neither
    from cuptistream.overhead import WindowCost

PC_SAMPLING: dict[str, Any] = {"type": "pc_sampling"}
# No initial delay: the program is warm before the first window, and with it the first SASS window
# would land at a random point of the first pause, as in a long run (an initial delay makes short
# windows see fewer SASS windows than a long run does).
SASS: dict[str, Any] = {"type": "sass", "initial_delay": 0}
CONDITIONS: dict[str, list[dict[str, Any]]] = {
    "base": [],
    "pcs": [PC_SAMPLING],
    "sass": [SASS],
    "both": [PC_SAMPLING, SASS],  # under the default overhead.budget (1%)
    "both_0.5pct": [PC_SAMPLING, SASS],
    "both_5pct": [PC_SAMPLING, SASS],
    "both_ungoverned": [PC_SAMPLING, SASS],  # overhead.budget: off, the sources' own duty cycles
    "pcs_5pct": [PC_SAMPLING],
    "sass_5pct": [SASS],
    "pcs_serialized": [{**PC_SAMPLING, "mode": "serialized"}],
    "pcs_start_stop": [{**PC_SAMPLING, "duty_cycle": {"method": "start_stop"}}],
    "pcs_enable_disable": [{**PC_SAMPLING, "duty_cycle": {"method": "enable_disable"}}],
    "pcs_always": [{**PC_SAMPLING, "duty_cycle": {"on": 1, "off": 0}}],
    "sass_often": [{**SASS, "period": 10, "initial_delay": 2}],
    # Calibration: both sources on fixed duty cycles (no budget), a SASS window every 10 s, so a
    # session holds enough SASS windows to compare their measured lost time with what the governor
    # charges for them (lost_s_by_source against charged_s_by_source).
    "both_calibrate": [PC_SAMPLING, {**SASS, "period": 10, "initial_delay": 2}],
    "sass_calibrate": [{**SASS, "period": 10, "initial_delay": 2}],
    "both_calibrate_ed": [
        {**PC_SAMPLING, "duty_cycle": {"method": "enable_disable"}},
        {**SASS, "period": 10, "initial_delay": 2},
    ],
    # Diagnostics: what a source costs while it collects nothing. The PC sampling ones close their
    # first (10 ms) window and never open another; sass_idle never opens a window.
    "pcs_idle": [{**PC_SAMPLING, "duty_cycle": {"on": 0.01, "off": 1e6}}],
    "pcs_idle_disabled": [
        {**PC_SAMPLING, "duty_cycle": {"on": 0.01, "off": 1e6, "method": "enable_disable"}}
    ],
    "sass_idle": [{**SASS, "initial_delay": 1e6}],
}


BUDGETS: dict[str, str | bool] = {
    "both_0.5pct": "0.5%", "both_5pct": "5%", "both_ungoverned": False, "both_calibrate": False,
    "sass_calibrate": False, "both_calibrate_ed": False,
    "pcs_5pct": "5%", "sass_5pct": "5%",
}  # fmt: skip


class Trainer:
    def __init__(self, workload: str = "mlp") -> None:
        import torch

        torch.manual_seed(0)
        self.tiny = torch.zeros(1024, device="cuda") if workload == "tiny" else None
        self.model: torch.nn.Module
        if workload == "transformer":  # bench/workloads.py W4: 4 encoder layers, AdamW
            layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True)
            self.model = torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).cuda()
            self.x = torch.randn(16, 256, 512, device="cuda")
            self.y = torch.zeros(16, 256, 512, device="cuda")
        else:
            self.model = torch.nn.Sequential(
                torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                torch.nn.Linear(2048, 1024),
            ).cuda()  # fmt: skip
            self.x = torch.randn(256, 1024, device="cuda")
            self.y = torch.randn(256, 1024, device="cuda")
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.last_step = time.monotonic()

    def step(self) -> None:
        import torch

        if self.tiny is not None:  # one small kernel per step: the per-launch cost, nothing else
            self.tiny.add_(1)
            return
        self.opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
        self.opt.step()

    def run_for(self, seconds: float) -> tuple[int, float]:
        import torch

        """Steps done in ``seconds`` (synchronizing every 10 steps) and the time they took. Each
        block of 10 steps is kept in ``blocks`` as (end time, duration)."""
        t0 = time.monotonic()
        steps = 0
        self.blocks: list[tuple[float, float]] = []
        began = t0
        while began - t0 < seconds:
            for _ in range(10):
                self.step()
            torch.cuda.synchronize()
            steps += 10
            ended = time.monotonic()
            self.blocks.append((ended, ended - began))
            self.last_step = began = ended
        return steps, time.monotonic() - t0


def session_config(name: str, directory: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "sources": [{**s, "name": s["type"]} for s in CONDITIONS[name]],
        "sinks": [{"type": "file", "directory": directory, "format": "msgpack"}],
    }
    if name in BUDGETS:
        config["overhead"] = {"budget": BUDGETS[name]}
    return config


def watch(trainer: Trainer) -> None:
    def run() -> None:
        while True:
            time.sleep(1)
            if time.monotonic() - trainer.last_step > 30:
                print(json.dumps({"wedged": True}), flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    threading.Thread(target=run, daemon=True).start()


def thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process, by Python thread name (CUPTI's own by kernel name)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid), comm)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    delta = {name: round(after[name] - before.get(name, 0.0), 2) for name in after}
    return {name: seconds for name, seconds in sorted(delta.items(), key=lambda kv: -kv[1]) if seconds > 0}


def summarize_files(directory: str) -> dict[str, Any]:
    from cuptistream.events import Error, Loss, PcSampleBatch, SassMetricBatch
    from cuptistream.recording.reader import read

    losses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    samples = 0
    sass_records = 0
    for event in read(directory):
        kinds[type(event).__name__] += 1
        if isinstance(event, Loss):
            losses[f"{event.stage}/{event.reason} ({event.unit})"] += event.count
        elif isinstance(event, Error):
            errors[f"{event.severity}: {event.message[:160]}"] += 1
        elif isinstance(event, PcSampleBatch):
            samples += event.total_samples
        elif isinstance(event, SassMetricBatch):
            sass_records += len(event.records)
    return {
        "events": dict(kinds), "pc_samples": samples, "sass_records": sass_records,
        "losses": dict(losses), "errors": dict(errors),
    }  # fmt: skip


def _rounded(cost: WindowCost) -> dict[str, float]:
    return {
        "open_s": round(cost.open_s, 3), "elapsed_s": round(cost.elapsed_s, 3),
        "host_s": round(cost.host_s, 4), "gpu_s": round(cost.gpu_s, 4),
    }  # fmt: skip


def run_window(trainer: Trainer, name: str, window: float, directory: str) -> tuple[float, dict[str, Any]]:
    """One window of ``name`` in its own session: steps/s and what the sources and sinks saw."""
    import cuptistream

    t0 = time.monotonic()
    with cuptistream.session(session_config(name, directory), quiet=True) as s:
        started = time.monotonic() - t0
        cpu0 = thread_cpu()
        steps, took = trainer.run_for(window)
        cpu = cpu_delta(cpu0, thread_cpu())
        t1 = time.monotonic()
    stopped = time.monotonic() - t1
    throttles = s.governor.throttles if s.governor else ()
    # A window's span runs from its first control call to its report (SASS flushes after closing).
    measured = [(t.source, closed, c) for t in throttles for closed, c in t.history]
    windows = [(closed, max(c.open_s, c.elapsed_s)) for _, closed, c in measured]
    governed = {t.source: [(closed, _rounded(c)) for closed, c in t.history] for t in throttles}
    lost, per_window = window_cost(trainer.blocks, windows)
    lost_by_source: Counter[str] = Counter()
    for (source, _, _), seconds in zip(measured, per_window, strict=True):
        lost_by_source[source] += seconds
    detail = {
        "excess": round(excess(trainer.blocks), 5),
        "window_cost": round(lost, 5),
        "lost_s_per_window": [round(x, 4) for x in per_window],
        "lost_s_by_source": {k: round(v, 4) for k, v in lost_by_source.items()},
        "charged_s_by_source": {
            t.source: round(sum(c.total_s for _, c in t.history), 4) for t in throttles
        },
        "windows_measured": governed,
        "spans": windows,
        # The plans in force at the end (the decision events announce only moves of over 10%).
        "plans": {
            t.source: {"window_s": t.plan.window_s, "pause_s": round(t.plan.pause_s, 3),
                       "unit_cost": round(t.unit_cost, 4), "windows": t.windows}
            for t in throttles
        },
        "start_s": round(started, 3), "stop_s": round(stopped, 3), "cpu_s": cpu,
        "source_stats": {src.name: getattr(src, "stats", None) for src in s.sources},
        **summarize_files(directory), "report": s.report.summary() if s.report else None,
    }  # fmt: skip
    return steps / took, detail


def interleaved(trainer: Trainer, names: list[str], window: float, rounds: int, root: str) -> dict[str, Any]:
    """Every condition window sits between two ``base`` windows (B X B Y B X ...), so each gets a
    ratio to the mean of its neighbours: slow drift of the machine cancels out of it."""
    others = [name for name in names if name != "base"]
    order = [name for _ in range(rounds) for other in others for name in ("base", other)] + ["base"]
    rates: list[float] = []
    excesses: list[float] = []
    window_costs: dict[str, list[float]] = {name: [] for name in others}
    per_minute: dict[str, list[tuple[float, float]]] = {name: [] for name in others}
    for i, name in enumerate(order):
        rate, detail = run_window(trainer, name, window, os.path.join(root, f"{i:03d}-{name}"))
        rates.append(rate)
        excesses.append(detail["excess"])
        if name != "base":
            window_costs[name].append(detail["window_cost"])
        if name != "base":
            minutes = window / 60
            per_minute[name].append((detail["pc_samples"] / minutes, detail["sass_records"] / minutes))
        print(json.dumps({"window": i, "condition": name, "steps_per_s": round(rate, 1), **detail})[:2500],
              flush=True)  # fmt: skip
    by_name: dict[str, list[float]] = {name: [] for name in ["base", *others]}
    ratios: dict[str, list[float]] = {name: [] for name in others}
    costs: dict[str, list[float]] = {name: [] for name in others}
    for i, name in enumerate(order):
        by_name[name].append(rates[i])
        if name != "base":
            ratios[name].append(rates[i] / ((rates[i - 1] + rates[i + 1]) / 2))
            costs[name].append(excesses[i] - (excesses[i - 1] + excesses[i + 1]) / 2)
    table: dict[str, dict[str, float]] = {}
    for name, v in by_name.items():
        row = {"median": round(statistics.median(v), 1), "min": round(min(v), 1), "max": round(max(v), 1)}
        if name in ratios:
            r = ratios[name]
            row["ratio_median"] = round(statistics.median(r), 4)
            row["ratio_min"] = round(min(r), 4)
            row["ratio_max"] = round(max(r), 4)
            w = window_costs[name]
            row["window_cost_median"] = round(statistics.median(w), 5)
            row["window_cost_min"] = round(min(w), 5)
            row["window_cost_max"] = round(max(w), 5)
            c = costs[name]
            row["paired_cost_median"] = round(statistics.median(c), 5)
            row["paired_cost_min"] = round(min(c), 5)
            row["paired_cost_max"] = round(max(c), 5)
            row["pc_samples_per_min"] = round(statistics.median(p for p, _ in per_minute[name]))
            row["sass_records_per_min"] = round(statistics.median(q for _, q in per_minute[name]))
        table[name] = row
    return {
        "window_s": window,
        "rounds": rounds,
        "order": order,
        "table": table,
        "rates": rates,
        "ratios": ratios,
        "excess": excesses,
        "paired_costs": costs,
        "window_costs": window_costs,
    }


def soak(trainer: Trainer, name: str, seconds: float, root: str) -> dict[str, Any]:
    import cuptistream

    directory = os.path.join(root, f"soak-{name}")
    buckets: list[float] = []
    with cuptistream.session(session_config(name, directory), quiet=True) as s:
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


def _by_source(sessions: list[dict[str, Any]], key: str) -> dict[str, float]:
    """``key``'s per-source numbers summed over ``sessions``."""
    total: Counter[str] = Counter()
    for session in sessions:
        total.update(session[key])
    return {source: round(value, 4) for source, value in total.items()}


def steady(trainer: Trainer, names: list[str], seconds: float, root: str) -> dict[str, Any]:
    """One governed session of ``seconds`` per name in ``names`` (repeat a name for several ratios),
    each valued by the time lost around its windows (``window_cost``); then one base session half as
    long with pretend windows at random times, whose value is the estimator's own noise (what it
    reads where nothing happened). Per condition: median, min and max over its sessions."""
    sessions: list[dict[str, Any]] = []
    per_session: list[list[tuple[float, float]]] = []
    for name in names:
        rate, detail = run_window(
            trainer, name, seconds, os.path.join(root, f"steady-{name}-{time.monotonic_ns()}")
        )
        print(json.dumps({"steady": name, "steps_per_s": round(rate, 1), **detail})[:4000], flush=True)
        windows = detail["spans"]
        per_session.append(windows)
        minutes = seconds / 60
        sessions.append({
            "condition": name, "seconds": seconds, "steps_per_s": round(rate, 1),
            "window_cost": detail["window_cost"], "windows": len(windows),
            "windows_by_source": {k: len(v) for k, v in detail["windows_measured"].items()},
            "lost_s_per_window": detail["lost_s_per_window"], "lost_s_by_source": detail["lost_s_by_source"],
            "charged_s_by_source": detail["charged_s_by_source"],
            "windows_measured": detail["windows_measured"],
            "pc_samples_per_min": round(detail["pc_samples"] / minutes),
            "sass_records_per_min": round(detail["sass_records"] / minutes),
            "plans": detail["plans"], "losses": detail["losses"], "errors": detail["errors"],
        })  # fmt: skip
        sessions[-1]["long_run_cost"] = long_run_total(sessions[-1])
    base_rate, _ = run_window(
        trainer, "base", seconds / 2, os.path.join(root, f"steady-base-{time.monotonic_ns()}")
    )
    blocks = trainer.blocks
    span = blocks[-1][0] - blocks[0][0] if blocks else 0.0
    most = max(per_session, key=len, default=[])
    pretend = [(blocks[0][0] + random.uniform(2.0, max(2.0, span - 2.0)), w) for _, w in most][
        : len(most) // 2 + 1
    ]
    null, _ = window_cost(blocks, pretend)
    summary: dict[str, Any] = {}
    for name in dict.fromkeys(names):
        mine = [x for x in sessions if x["condition"] == name]
        costs = [x["window_cost"] for x in mine]
        # The mean too: a costly but rare window (SASS) lands in few sessions, and the median hides it.
        summary[name] = {
            "sessions": len(costs), "window_cost_median": statistics.median(costs),
            "window_cost_min": min(costs), "window_cost_max": max(costs),
            "window_cost_mean": round(statistics.fmean(costs), 5),
            "windows_by_source": _by_source(mine, "windows_by_source"),
            "lost_s_by_source": _by_source(mine, "lost_s_by_source"),
            "charged_s_by_source": _by_source(mine, "charged_s_by_source"),
            "pc_samples_per_min_median": statistics.median(x["pc_samples_per_min"] for x in mine),
            "sass_records_per_min_median": statistics.median(x["sass_records_per_min"] for x in mine),
        }  # fmt: skip
        long = [x["long_run_cost"] for x in mine if x["long_run_cost"] is not None]
        if long:  # sessions in which every governed source had a window
            summary[name].update({
                "long_run_sessions": len(long), "long_run_cost_median": statistics.median(long),
                "long_run_cost_min": min(long), "long_run_cost_max": max(long),
            })  # fmt: skip
    print(json.dumps({"null_window_cost": round(null, 5), "summary": summary}), flush=True)
    return {
        "sessions": sessions, "base_steps_per_s": round(base_rate, 1),
        "null_window_cost": round(null, 5), "null_windows": len(pretend), "summary": summary,
    }  # fmt: skip


def place_first_windows(at: dict[str, float]) -> None:
    """Fix the phase of the named sources' cycles: the first window of source ``name`` opens
    ``at[name]`` seconds into each session; nothing else changes. A governed SASS cycle lasts tens
    of minutes (PC sampling's, minutes at 0.5%), so at a random phase most sessions hold no window
    of it and say nothing of its cost; with this each holds one, and ``long_run_total`` charges it
    over the cycle the governor planned after measuring it."""
    from cuptistream.overhead import Throttle

    random_phase = Throttle.first_delay

    def first_delay(self: Throttle) -> float:
        return at[self.source] if self.source in at else random_phase(self)

    Throttle.first_delay = first_delay  # type: ignore[method-assign]


def rows(result: dict[str, Any]) -> list[str]:
    """The headline rows: per condition, steps/s against the neighbouring base windows (interleaved)
    or the time lost around its windows (``--steady``), median [min..max]."""
    if "steady" in result:
        out = []
        for name, row in result["steady"]["summary"].items():
            text = (f"{name}: lost time {100 * row['window_cost_median']:+.2f}% "
                    f"[{100 * row['window_cost_min']:+.2f}..{100 * row['window_cost_max']:+.2f}] "
                    f"over {row['sessions']} sessions")  # fmt: skip
            if "long_run_cost_median" in row:
                text += f", long run {100 * row['long_run_cost_median']:+.2f}%"
            out.append(text)
        return [*out, f"null (pretend windows): {100 * result['steady']['null_window_cost']:+.2f}%"]
    if "table" in result:
        return [
            f"{name} / base: steps/s {row['ratio_median']:.3f} [{row['ratio_min']:.3f}..{row['ratio_max']:.3f}]"
            for name, row in result["table"].items()
            if "ratio_median" in row
        ]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conditions", default="base,both,pcs_serialized")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workload", choices=["mlp", "transformer", "tiny"], default="mlp",
                        help="mlp or transformer: a training step; tiny: one 1024-float add per step")  # fmt: skip
    parser.add_argument("--soak", type=float, default=0.0, help="one session of the first condition")
    parser.add_argument("--steady", type=float, default=0.0,
                        help="one governed session per condition (repeat one for several) of this many seconds: time lost around its windows")  # fmt: skip
    parser.add_argument("--sass-at", type=float, default=None,
                        help="open the first SASS window this many seconds into each session (default: a random point of its first pause)")  # fmt: skip
    parser.add_argument("--pc-at", type=float, default=None, help="the same for PC sampling's first window")
    parser.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent / "out" / "sampling_overhead.json"),
        help="the result JSON (default bench/out/sampling_overhead.json)",
    )
    parser.add_argument("--keep", default="", help="sink directories go here (default: a temp dir)")
    args = parser.parse_args()
    names = args.conditions.split(",")
    unknown = [n for n in names if n not in CONDITIONS]
    if unknown:
        sys.exit(f"unknown condition {unknown[0]!r}; choose from {', '.join(CONDITIONS)}")
    # Keep CUPTI attached between windows, as a long-running process would: no cuptiFinalize (and
    # no re-attach) at each window's end.
    import torch

    from cuptistream.cupti import driver

    driver.acquire("bench")
    phases = {"sass": args.sass_at, "pc_sampling": args.pc_at}
    place_first_windows({source: at for source, at in phases.items() if at is not None})
    faulthandler.enable()  # a crash in CUPTI or the driver prints every thread's stack
    trainer = Trainer(args.workload)
    for _ in range(50):
        trainer.step()
    torch.cuda.synchronize()
    watch(trainer)
    root = args.keep or tempfile.mkdtemp(prefix="cs-overhead-")
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "workload": args.workload,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    if args.soak:
        result = {**meta, "soak": soak(trainer, names[0], args.soak, root)}
    elif args.steady:
        result = {**meta, "steady": steady(trainer, names, args.steady, root)}
    else:
        result = {**meta, **interleaved(trainer, names, args.window, args.rounds, root)}
    text = json.dumps(result, indent=1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}", flush=True)
    for line in rows(result):
        print(line, flush=True)


if __name__ == "__main__":
    main()
