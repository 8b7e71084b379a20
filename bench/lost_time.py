"""What governed sampling windows cost a training loop, read from its step times (no torch here, so
CI tests it): ``window_cost`` and ``excess`` for ``bench/sampling_overhead.py``, and ``long_run``,
which turns a ``--steady`` result into the cost and the samples per minute of a long run.

    python3 bench/lost_time.py bench/out/sampling_overhead.json [more --steady results ...]

Prints one JSON line per session: its condition, the long-run cost of all sources together
(``total``) and, per source, the long-run cost and what it collects per minute.

A steady session is shorter than a governed cycle at low budgets (one PC sampling window per 170 s at
0.5%; one SASS window per tens of minutes), so what one session reads depends on whether a window
fell inside it. ``long_run`` uses what the windows that did fall in cost, per window, and the
cycle the governor planned after them: lost seconds per window / (window + pause).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

# How always-on mode's activity windows are valued (bench/budget_lost_time.py, bench/lost_pooled.py): a
# window's records are flushed and priced before its cost is measured (the span's end), so 0.5 s after
# that covers what is left; the baseline is the untouched blocks' mean (their median reads block-time
# skew as lost time).
ACTIVITY_BEFORE_S, ACTIVITY_AFTER_S, ACTIVITY_BASELINE = 0.2, 0.5, "mean"


def p10(values: list[float]) -> float:
    """The 10th percentile (nearest rank below) of ``values``: a loop's fast floor. W1's blocks flip
    between two speeds for seconds at a time; the floor moves only if the fast speed does."""
    return sorted(values)[len(values) // 10]


def window_cost(
    blocks: list[tuple[float, float]],
    windows: list[tuple[float, float]],
    before: float = 0.2,
    after: float = 2.0,
    radius: float = 5.0,
    baseline: str = "median",
) -> tuple[float, list[float]]:
    """The program's time lost around each sampling window, from the 10-step blocks: for every block
    that overlaps [open - ``before``, close + ``after``], its duration above the median of the
    untouched blocks within ``radius`` seconds of that span. ``windows`` are (close time, seconds open), as the
    governor's throttles keep them. Returns the lost time over the session's time, and the seconds
    lost per window. ``baseline="mean"`` takes the untouched blocks' mean instead: unbiased where
    block times are skewed (a median baseline reads the skew as lost time; W1's blocks on the H100
    read +2 % with no window at all). Drift slower than ``radius`` cancels; so does the step time's own skew, which
    the untouched blocks share."""
    if not blocks:
        return 0.0, []
    spans = [(closed - open_s - before, closed + after) for closed, open_s in windows]
    # The first window whose span each block overlaps, or None: that window's lost time counts it.
    owner = [
        next((k for k, (lo, hi) in enumerate(spans) if end - d < hi and end > lo), None) for end, d in blocks
    ]
    touched = [which is not None for which in owner]
    lost_per_window = [0.0] * len(windows)
    for (_, d), which in zip(blocks, owner, strict=True):
        if which is None:
            continue
        # Untouched blocks within radius of the span (not of the block): a block deep inside a long
        # span (a SASS flush takes up to 15 s) has no untouched block within radius of itself.
        lo, hi = spans[which]
        near = [
            dd
            for (t, dd), hit in zip(blocks, touched, strict=True)
            if not hit and lo - radius <= t <= hi + radius
        ]
        if not near:
            continue
        lost_per_window[which] += d - (
            statistics.fmean(near) if baseline == "mean" else statistics.median(near)
        )
    return sum(lost_per_window) / sum(d for _, d in blocks), lost_per_window


def excess(blocks: list[tuple[float, float]], radius: float = 5.0) -> float:
    """The share of a window's time its blocks spent above their local median (blocks within
    ``radius`` seconds): what short disturbances (a sampling window, a patched kernel) cost, with
    drift slower than ``radius`` cancelled. A window without sampling has some too (the step time's
    skew); ``interleaved`` subtracts its neighbouring base windows' value."""
    if not blocks:
        return 0.0
    times = [t for t, _ in blocks]
    durations = [d for _, d in blocks]
    over = 0.0
    lo = hi = 0
    for i, t in enumerate(times):
        while times[lo] < t - radius:
            lo += 1
        while hi < len(times) and times[hi] <= t + radius:
            hi += 1
        over += durations[i] - statistics.median(durations[lo:hi])
    return over / sum(durations)


# What each source collects, as the session counts it per minute (sources are named by their type).
_COLLECTED = {"pc_sampling": "pc_samples_per_min", "sass": "sass_records_per_min"}


def long_run(session: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per source of one ``--steady`` session: windows seen, seconds lost and charged per window,
    the planned cycle, and the long-run cost (lost per window / cycle), windows per hour and what
    the source collects per minute (PC samples, SASS records: per window, times windows per minute)."""
    out: dict[str, dict[str, float]] = {}
    for source, count in session["windows_by_source"].items():
        plan = session["plans"].get(source)
        if not count or not plan:
            continue
        cycle = plan["window_s"] + plan["pause_s"]
        lost = session["lost_s_by_source"].get(source, 0.0) / count
        charged = session.get("charged_s_by_source", {}).get(source, 0.0) / count  # not in older runs
        out[source] = {
            "windows": count, "lost_s_per_window": round(lost, 4), "charged_s_per_window": round(charged, 4),
            "cycle_s": round(cycle, 1), "long_run_cost": round(lost / cycle, 5),
            "windows_per_hour": round(3600 / cycle, 2),
        }  # fmt: skip
        if _COLLECTED.get(source) in session and "seconds" in session:
            per_window = session[_COLLECTED[source]] * session["seconds"] / 60 / count
            out[source]["collected_per_min"] = round(per_window * 60 / cycle)
    return out


def long_run_total(session: dict[str, Any]) -> float | None:
    """The session's long-run cost, all sources together; None unless every governed source had a
    window in it (a source without one would count as free)."""
    per_source = long_run(session)
    if set(per_source) != set(session["plans"]):
        return None
    return round(sum(x["long_run_cost"] for x in per_source.values()), 5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench/lost_time.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="bench/sampling_overhead.py --steady result files")
    for path in parser.parse_args(argv).results:
        with open(path) as f:
            steady = json.load(f).get("steady")
        if not steady:
            continue
        if not isinstance(steady, dict) or any("windows_by_source" not in x for x in steady["sessions"]):
            # Without each source's windows the cost cannot be split by source.
            print(
                f"{path}: a --steady result without windows per source (an older run); skipped",
                file=sys.stderr,
            )
            continue
        for session in steady["sessions"]:
            total = long_run_total(session)
            print(
                json.dumps(
                    {"file": path, "condition": session["condition"], "total": total, **long_run(session)}
                )
            )


if __name__ == "__main__":
    main()
