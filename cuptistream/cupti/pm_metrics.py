"""Which hardware counters the ``pm_sampling`` source reads on a chip: by default the equivalents of
DCGM's profiling fields, as many as one PM sampling pass holds; or a configured list, checked.

The default is chosen field by field, in ``DEFAULT_FIELDS`` order: a field takes the first of its
metrics that this chip has and that still fits in one pass beside the fields before it; a field
none of whose metrics fits is left out (so the list differs per chip, and says so in the events'
``metrics``). Hopper and later have ``*_realtime`` counters made for sampling; older chips get the
profiler's counters where those fit. All of it is host work (``perfworks``): no GPU, no driver.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from cuptistream.cupti.perfworks import ChipMetrics, UnknownChipError, supported_chips
from cuptistream.errors import ConfigError

_PCT = ".avg.pct_of_peak_sustained_elapsed"

# DCGM profiling field -> the metrics that stand for it, best first. Percentages of the peak over the
# sample; bytes per second for the links (independent of the sampling interval).
DEFAULT_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gr_engine_active", ("gr__cycles_active" + _PCT,)),
    ("sm_active", ("sm__cycles_active" + _PCT,)),
    ("sm_occupancy", ("sm__warps_active_realtime" + _PCT, "sm__warps_active" + _PCT)),
    ("tensor_active", ("sm__pipe_tensor_cycles_active_realtime" + _PCT,
                       "sm__pipe_tensor_cycles_active" + _PCT)),
    ("tensor_hmma_active", ("sm__pipe_tensor_op_hmma_cycles_active_realtime" + _PCT,
                            "sm__pipe_tensor_op_hmma_cycles_active" + _PCT)),
    ("tensor_imma_active", ("sm__pipe_tensor_op_imma_cycles_active_realtime" + _PCT,
                            "sm__pipe_tensor_op_imma_cycles_active" + _PCT)),
    ("tensor_dmma_active", ("smsp__pipe_tensor_op_dmma_cycles_active_realtime" + _PCT,
                            "sm__pipe_tensor_op_dmma_cycles_active" + _PCT)),
    ("fp64_active", ("sm__pipe_fp64_cycles_active_realtime" + _PCT, "sm__pipe_fp64_cycles_active" + _PCT)),
    ("fp32_active", ("sm__pipe_fma_cycles_active" + _PCT, "sm__inst_executed_pipe_fmaheavy_realtime" + _PCT)),
    ("fp16_active", ("sm__inst_executed_pipe_fma_type_fp16" + _PCT,)),
    ("dram_active", ("dram__cycles_active" + _PCT,)),
    ("pcie_rx_bytes", ("pcie__read_bytes.sum.per_second",)),
    ("pcie_tx_bytes", ("pcie__write_bytes.sum.per_second",)),
    ("nvlink_rx_bytes", ("nvlrx__bytes.sum.per_second",)),
    ("nvlink_tx_bytes", ("nvltx__bytes.sum.per_second",)),
)  # fmt: skip


_FIELD_OF = {metric: field for field, metrics in DEFAULT_FIELDS for metric in metrics}


def field_of(metric: str) -> str | None:
    """The DCGM profiling field ``metric`` stands for in the default set; None for any other metric.
    NVML's GPM metrics are named after their field (``gpm__<field>.<unit>``, ``cuptistream.nvml.gpm``)."""
    if metric.startswith("gpm__"):
        return metric[len("gpm__") :].split(".", 1)[0]
    return _FIELD_OF.get(metric)


def unit_of(metric: str) -> str:
    """The unit of a metric's values, from its name: ``%`` of peak, ``B/s``, or "" (its own)."""
    if ".pct_of_peak_" in metric:
        return "%"
    if metric.endswith(".per_second") and "bytes" in metric:
        return "B/s"
    return ""


@dataclass(frozen=True)
class MetricChoice:
    chip: str
    metrics: list[str]
    fields: dict[str, str]  # DCGM field -> the metric that stands for it (the default set only)


def default_metrics(chip: str) -> MetricChoice:
    """The default set for ``chip`` (see the module's docstring). ConfigError: a chip the installed
    CUPTI does not know."""
    with _chip(chip) as catalog:
        taken = catalog.fit_alternatives([names for _, names in DEFAULT_FIELDS])
    fields = {field: name for (field, _), name in zip(DEFAULT_FIELDS, taken, strict=True) if name}
    return MetricChoice(chip, list(fields.values()), fields)


def resolve_metrics(wanted: Sequence[str], chip: str, key: str = "pm_sampling.metrics") -> MetricChoice:
    """``wanted`` checked on ``chip``: ConfigError for an empty list, an unknown name (with close
    matches) or a list that one pass cannot hold (PM sampling takes one pass)."""
    if not wanted:
        raise ConfigError(f"{key}: list at least one metric, or leave it out for the default set")
    with _chip(chip) as catalog:
        for name in wanted:
            if not catalog.exists(name):
                close = difflib.get_close_matches(name, catalog.names(), n=5, cutoff=0.6)
                hint = (
                    f"; close matches: {', '.join(close)}"
                    if close
                    else "; see the metric names in docs/config.md"
                )
                raise ConfigError(f"{key}: {name!r} is not a metric on {chip}{hint}")
        passes = catalog.passes(wanted)
        if passes != 1:
            fit = catalog.fit_one_pass(wanted)
            raise ConfigError(
                f"{key}: these {len(wanted)} metrics need {passes} passes on {chip} and PM sampling takes "
                f"one; drop some (the first {len(fit)} that fit together: {', '.join(fit)})"
            )
        return MetricChoice(chip, list(wanted), {})


def choose_metrics(wanted: Sequence[str] | None, chip: str) -> MetricChoice:
    """The configured list checked on ``chip``, or the default set where none is configured."""
    return default_metrics(chip) if wanted is None else resolve_metrics(wanted, chip)


def _chip(chip: str) -> ChipMetrics:
    try:
        return ChipMetrics(chip)
    except UnknownChipError:
        known = ", ".join(supported_chips())
        raise ConfigError(
            f"pm_sampling: chip {chip!r} is not known to this CUPTI ({known}); "
            "install a newer nvidia-cuda-cupti"
        ) from None
