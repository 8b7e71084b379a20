"""``cuptistream compare --plot DIR``: one PNG per metric, a bar per rank over the whole span.

The median is drawn as a line and flagged ranks in another colour, so the figure shows what the rule
saw. Needs matplotlib (the ``plot`` extra); drawn with ``Figure`` and the Agg canvas, never pyplot.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cuptistream.analysis.compare import CompareResult
from cuptistream.analysis.outliers import METRICS
from cuptistream.analysis.plot import _figure, output_directory, save

_LABELS = {
    "busy_fraction": ("GPU busy", "%", 100.0),
    "compute_ns": ("Compute kernel time", "ms", 1e-6),
    "nccl_ns": ("NCCL kernel time", "ms", 1e-6),
    "copy_ns": ("Copy time", "ms", 1e-6),
    "copy_bytes": ("Bytes copied", "MiB", 1 / 2**20),
    "kernels": ("Kernels", "launches", 1.0),
}


def plot_compare(result: CompareResult, directory: str | Path) -> list[Path]:
    """Write ``compare-<metric>.png`` for each metric to ``directory``; returns the paths."""
    out = output_directory(directory, "--plot DIR")
    rows = result.total.rows
    labels = [r["rank"] for r in rows]
    written = []
    for metric in METRICS:
        title, unit, scale = _LABELS[metric]
        values = np.array([r[metric] for r in rows], np.float64) * scale
        flagged = {f.rank for f in result.total.flags if f.metric == metric}
        figure = _figure(max(6.0, 0.5 * len(rows) + 3), 4.5)
        axes = figure.add_subplot()
        colours = ["tab:red" if label in flagged else "tab:blue" for label in labels]
        axes.bar(range(len(rows)), values, color=colours)
        if len(values):
            axes.axhline(float(np.median(values)), color="grey", linestyle="--", label="median")
            axes.legend(loc="lower right", fontsize="small")
        axes.set_xticks(range(len(rows)), labels, rotation=45 if len(rows) > 8 else 0, fontsize="small")
        axes.set_ylabel(unit)
        axes.set_title(f"{title} per rank (red: flagged)")
        name = f"compare-{metric.removesuffix('_ns').replace('_', '-')}.png"
        written.append(save(figure, out / name, "--plot DIR"))
    return written
