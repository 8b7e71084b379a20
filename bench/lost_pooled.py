"""Always-on mode's lost-time figures pooled over a workload's sessions, with the method's resolution.

One 20-25 s session holds 4-5 budget windows, and a window's lost time reads +-60-100 ms on the
H100's workloads where nothing happened (their block times wander by 10-40 % over seconds). So one
session's cost, and one session's null, move by +-0.6-1 %: the median of five such nulls does not
resolve 0.3 %. Pooled over every window of
every session, the same estimator resolves ``noise * sqrt(windows) / seconds``:

- ``cost``: all sessions' lost seconds over all sessions' seconds (each session's ``window_cost``
  times its time, summed, over the summed time);
- ``null_base``, ``null_gaps``: the two nulls pooled the same way (as many pretend windows as real
  ones, valued like them: ``budget_lost_time.null_in_base`` and ``null_in_gaps``);
- ``noise``: the standard deviation of one window's lost seconds where nothing happened, from pretend
  windows laid one by one every ``DENSE_STEP_S`` across each session's base part (no session yet),
  each as long as that session's real windows on average, each valued alone;
- ``resolution``: ``noise * sqrt(windows) / seconds``, the standard error of the pooled cost and of
  the pooled nulls.

``verdict``: the pooled cost within 1 %, both pooled nulls and the resolution within 0.3 %.

    python bench/lost_pooled.py bench/out/budget_lost_time.json [...]

    python bench/lost_pooled.py --together RUN_CUT_SHORT.partial.json MORE_SESSIONS.json

reads ``budget_lost_time.py``'s results (single-process or DDP: only the raw series and each
session's figures are used; or the ``.partial.json`` a run cut short leaves) and prints one line per
workload (per rank under DDP): the pooled cost, both nulls and the resolution, and the verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

from lost_time import ACTIVITY_AFTER_S as AFTER_S
from lost_time import ACTIVITY_BASELINE as BASELINE
from lost_time import ACTIVITY_BEFORE_S as BEFORE_S
from lost_time import window_cost

DENSE_STEP_S = 1.0
GOAL, NULL_RESOLVED = 0.01, 0.003


def seconds(raw: dict[str, Any]) -> float:
    """A session's timed seconds: the sum of its blocks' durations (what ``window_cost`` divides by)."""
    return float(sum(d for _, d in raw["session"]))


def window_noise(raws: list[dict[str, Any]]) -> tuple[float, int]:
    """The standard deviation of one pretend window's lost seconds over the base parts, and how many
    pretend windows it rests on. A base part shorter than a window's span and 2 s either side has none."""
    lost: list[float] = []
    for raw in raws:
        base = [(end, d) for end, d in raw["base"]]
        if not base or not raw["windows"]:
            continue
        length = statistics.fmean(w for _, w in raw["windows"])
        t = base[0][0] - base[0][1] + 2.0 + BEFORE_S + length  # the first close with 2 s before its span
        while t + AFTER_S + 2.0 <= base[-1][0]:
            _, one = window_cost(base, [(t, length)], BEFORE_S, AFTER_S, baseline=BASELINE)
            lost.extend(one)
            t += DENSE_STEP_S
    return (statistics.pstdev(lost) if len(lost) > 1 else math.nan), len(lost)


def pool(figures: list[dict[str, Any]], raws: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled figures of sessions: ``figures[i]`` holds session i's ``window_cost``, ``null_base``,
    ``null_gaps`` and ``windows`` (fractions of its time, as ``budget_lost_time`` writes them);
    ``raws[i]`` its raw series."""
    times = [seconds(raw) for raw in raws]
    total = sum(times)
    windows = sum(int(f["windows"]) for f in figures)
    noise, pretend = window_noise(raws)

    def pooled(key: str) -> float:
        return sum(f[key] * t for f, t in zip(figures, times, strict=True)) / total if total else math.nan

    resolution = noise * math.sqrt(windows) / total if total and windows else math.nan
    return {
        "sessions": len(figures), "windows": windows, "seconds": round(total, 1),
        "cost": pooled("window_cost"), "null_base": pooled("null_base"), "null_gaps": pooled("null_gaps"),
        "noise_s_per_window": noise, "noise_windows": pretend, "resolution": resolution,
    }  # fmt: skip


def verdict(p: dict[str, Any]) -> dict[str, bool | None]:
    """The pooled cost within 1 %; resolved: both nulls and the resolution within 0.3 %. None where
    no window was measured."""
    if not p["windows"] or math.isnan(p["resolution"]):
        return {"cost_within_goal": None, "resolved": None}
    resolved = all(abs(p[k]) <= NULL_RESOLVED for k in ("null_base", "null_gaps", "resolution"))
    return {"cost_within_goal": p["cost"] <= GOAL, "resolved": resolved}


def pool_results(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``budget_lost_time``'s ``results`` pooled: per workload, or per workload and rank (own
    windows, and ``job``: every rank's windows) under DDP. Sessions without a window are left out."""
    out: dict[str, dict[str, Any]] = {}
    for workload, result in results.items():
        sessions = result.get("sessions", [])
        if sessions and "ranks" in sessions[0]:
            ranks = sorted({str(r["rank"]) for s in sessions for r in s["ranks"]}, key=int)
            for rank in ranks:
                rows = [
                    (s, r) for s in sessions for r in s["ranks"] if str(r["rank"]) == rank and r["windows"]
                ]
                own = pool([r for _, r in rows], [r["raw"] for _, r in rows])
                job = pool([s["job"][rank] for s, _ in rows], [r["raw"] for _, r in rows])
                out[f"{workload} rank {rank}"] = {
                    **own,
                    "verdict": verdict(own),
                    "job": {**job, "verdict": verdict(job)},
                }
        else:
            rows = [s for s in sessions if s.get("windows")]
            own = pool(rows, [s["raw"] for s in rows])
            out[workload] = {**own, "verdict": verdict(own)}
    return out


def line(label: str, p: dict[str, Any]) -> str:
    def pct(value: float) -> str:
        return f"{100 * value:+.3f}%"

    return (
        f"{label}: pooled over {p['sessions']} sessions, {p['windows']} windows, {p['seconds']:.0f} s: "
        f"cost {pct(p['cost'])}, null base {pct(p['null_base'])} gaps {pct(p['null_gaps'])}, resolution "
        f"{100 * p['resolution']:.3f}% (one window +-{1000 * p['noise_s_per_window']:.0f} ms, "
        f"{p['noise_windows']} pretend windows); {verdict(p)}"
    )


def load(path: str) -> dict[str, Any]:
    """A results file's ``results``. A run cut short leaves only its ``.partial.json``: one
    workload's sessions so far."""
    with open(path) as f:
        data = json.load(f)
    return data["results"] if "results" in data else {data["workload"]: {"sessions": data["sessions"]}}


def together(many: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' ``results`` as one: each workload's sessions in the order given. Sessions are
    separate processes, so a run cut short and the one that finished its sessions pool alike."""
    out: dict[str, Any] = {}
    for results in many:
        for workload, result in results.items():
            out.setdefault(workload, {"sessions": []})["sessions"].extend(result.get("sessions", []))
    return out


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/lost_pooled.py", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="RESULTS.json", help="budget_lost_time.py's --out")
    parser.add_argument(
        "--together", action="store_true", help="pool each workload's sessions over all the files"
    )
    options = parser.parse_args(args)
    paths: list[str] = options.paths
    try:
        loaded = [load(p) for p in paths]
    except (OSError, ValueError, KeyError) as error:
        print(
            f"lost_pooled: cannot read a results file ({error!r}); give budget_lost_time.py's --out",
            file=sys.stderr,
        )
        return 2
    runs = (
        [(" + ".join(paths), together(loaded))] if options.together else list(zip(paths, loaded, strict=True))
    )
    for name, results in runs:
        for label, p in pool_results(results).items():
            print(f"{name}: {line(label, p)}")
            if "job" in p:
                every = f"{label}, every rank's windows"
                print(f"{name}: {line(every, p['job'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
