"""``cuptistream plot``: PNG figures of a recording (needs the optional matplotlib: ``[plot]`` extra).

Two streaming passes: the summary's (top kernels, stall reasons, the time range), then one that bins
each stream's busy time over that range. Figures are drawn with ``matplotlib.figure.Figure`` and the
Agg canvas directly, never pyplot, so no display or global backend state is involved. A figure
whose data is absent (no PC samples, say) still gets a PNG that says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cuptistream.analysis import records as rec
from cuptistream.analysis.select import Selection
from cuptistream.analysis.summary import Summarizer
from cuptistream.analysis.summary_report import Report, stall_name
from cuptistream.errors import UserError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_GPU_TAGS = ("kernel", "memcpy", "memset")
_MAX_STREAMS = 12  # lines in the busy figure; the busiest streams
_MAX_REASONS = 8  # stall reasons drawn per function; the rest is "other"


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("plot needs matplotlib; install it with pip install 'cuptistream[plot]'") from None


class BusyTimeline:
    """Busy ns per time bin for each (pid, device, stream), over a range fixed in advance."""

    def __init__(self, first_ns: int, last_ns: int, bins: int, selection: Selection) -> None:
        self.first_ns = first_ns
        self.width = max((last_ns - first_ns + bins - 1) // bins, 1)
        self.bins = bins
        self.selection = selection
        self.busy: dict[tuple[int, int, int], np.ndarray] = {}

    def add(self, part: rec.Part) -> None:
        sel = self.selection
        if not sel.accepts(part.resource):
            return
        low, high = sel.window(part.offset_ns, part.events) if sel.timed else (None, None)
        off = part.offset_ns
        for e in part.events:
            if rec.tag_of(e) not in _GPU_TAGS:
                continue
            if sel.devices is not None and e.device_id not in sel.devices:
                continue
            start, end = e.start + off, e.end + off
            if low is not None and not low <= start < high:
                continue
            if high is not None:
                end = min(end, high)
            self._spread((part.resource.pid, e.device_id, e.stream_id), start, end)

    def _spread(self, key: tuple[int, int, int], start: int, end: int) -> None:
        row = self.busy.get(key)
        if row is None:
            row = self.busy[key] = np.zeros(self.bins, np.int64)
        width, first = self.width, self.first_ns
        b0 = min(max((start - first) // width, 0), self.bins - 1)
        b1 = min(max((end - first) // width, 0), self.bins - 1)
        if b0 == b1:
            row[b0] += max(end - start, 0)
            return
        for b in range(b0, b1 + 1):  # rare: an operation longer than a bin
            lo = max(start, first + b * width)
            hi = min(end, first + (b + 1) * width)
            row[b] += max(hi - lo, 0)


def _figure(width: float = 10.0, height: float = 5.0) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def output_directory(directory: str | Path, option: str) -> Path:
    """``directory``, created if needed. ``UserError`` naming ``option`` where it cannot be."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"{out}: cannot create: {error.strerror}; choose another {option}") from None
    return out


def save(figure: Figure, path: Path, option: str) -> Path:
    """Write ``figure`` as a PNG at ``path``. ``UserError`` naming ``option`` where it cannot."""
    try:
        figure.savefig(path)
    except OSError as error:
        raise UserError(f"{path}: cannot write: {error.strerror}; choose another {option}") from None
    return path


def _empty(figure: Figure, title: str, message: str) -> None:
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def busy_figure(timeline: BusyTimeline, labels: dict[int, str]) -> Figure:
    figure = _figure()
    title = "GPU busy per stream"
    if not timeline.busy:
        _empty(figure, title, "no kernels, copies or memsets in this recording")
        return figure
    axes = figure.add_subplot()
    span = timeline.bins * timeline.width
    unit, scale = ("s", 1e9) if span >= 2e9 else ("ms", 1e6)
    seconds = (np.arange(timeline.bins) + 0.5) * timeline.width / scale
    busiest = sorted(timeline.busy.items(), key=lambda kv: -int(kv[1].sum()))[:_MAX_STREAMS]
    for (pid, device, stream), row in busiest:
        percent = np.minimum(100.0 * row / timeline.width, 100.0)
        axes.step(
            seconds, percent, where="mid", label=f"{labels.get(pid, pid)} · GPU {device} · stream {stream}"
        )
    axes.set_xlabel(f"{unit} since the first event (bins of {timeline.width / 1e6:.3g} ms)")
    axes.set_ylabel("busy %")
    axes.set_ylim(0, 105)
    axes.set_title(title)
    axes.legend(loc="upper right", fontsize="small")
    return figure


def kernels_figure(report: Report, top: int) -> Figure:
    rows = report.table("kernels").rows[:top]
    figure = _figure(10.0, max(3.0, 0.35 * len(rows) + 1.5))
    title = "Top kernels by total GPU time"
    if not rows:
        _empty(figure, title, "no kernels in this recording")
        return figure
    axes = figure.add_subplot()
    names = [_short(str(r[0])) for r in rows][::-1]
    unit, scale = ("ms", 1e6) if rows[0][2] >= 1e6 else ("us", 1e3)
    totals = [r[2] / scale for r in rows][::-1]
    bars = axes.barh(range(len(rows)), totals)
    axes.bar_label(bars, labels=[f"{r[1]}x" for r in rows][::-1], padding=3, fontsize="small")
    axes.set_yticks(range(len(rows)), names, fontsize="small")
    axes.set_xlabel(f"total GPU time ({unit}); labels: launches")
    axes.set_title(title)
    return figure


def stalls_figure(summarizer: Summarizer, top: int) -> Figure:
    functions = sorted(summarizer.samples.items(), key=lambda kv: -kv[1])[:top]
    figure = _figure(10.0, max(3.5, 0.6 * len(functions) + 2.0))
    title = "PC sampling: stall reasons per function"
    if not functions:
        _empty(figure, title, "no PC samples in this recording (pc_sampling source off)")
        return figure
    totals: dict[str, int] = {}
    for name, _ in functions:
        for reason, n in summarizer.stall_functions[name].items():
            totals[reason] = totals.get(reason, 0) + n
    reasons = [r for r, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:_MAX_REASONS]]
    axes = figure.add_subplot()
    left = np.zeros(len(functions))
    names = [f"{_short(summarizer.display(name), 40)}\n{samples} samples" for name, samples in functions]
    for reason in [*reasons, "other"]:
        shares = []
        for name, samples in functions:
            stalls = summarizer.stall_functions[name]
            n = (
                stalls.get(reason, 0)
                if reason != "other"
                else samples - sum(stalls.get(r, 0) for r in reasons)
            )
            shares.append(100.0 * n / samples if samples else 0.0)
        axes.barh(names, shares, left=left, label=stall_name(reason))
        left += np.array(shares)
    axes.invert_yaxis()
    axes.set_xlim(0, 100)
    axes.set_xlabel("share of the function's samples (%)")
    axes.set_title(title)
    figure.legend(loc="outside lower center", fontsize="small", ncols=5)
    return figure


def plot_all(
    recording: rec.Recording, directory: str | Path, selection: Selection | None = None, *, bins: int = 200,
    top: int = 15, mangled: bool = False,
) -> list[Path]:  # fmt: skip
    """Write ``gpu-busy.png``, ``top-kernels.png`` and ``stall-reasons.png`` to ``directory``
    (kernel and function names demangled unless ``mangled``)."""
    require_matplotlib()
    sel = selection or Selection()
    out = output_directory(directory, "-o DIR")
    summarizer = Summarizer(sel, mangled=mangled)
    for part in recording.parts():
        summarizer.add(part)
    report = summarizer.report(top=None)
    figures: list[tuple[str, Any]] = []
    timeline = BusyTimeline(summarizer.first_ns or 0, summarizer.last_ns or 1, bins, sel)
    if summarizer.streams:
        for part in recording.parts():  # second pass: bins need the range the first pass found
            timeline.add(part)
    labels = {pid: summarizer.label(pid) for pid in summarizer.processes}
    figures.append(("gpu-busy.png", busy_figure(timeline, labels)))
    figures.append(("top-kernels.png", kernels_figure(report, top)))
    figures.append(("stall-reasons.png", stalls_figure(summarizer, top)))
    return [save(figure, out / name, "-o DIR") for name, figure in figures]
