"""The pm_sampling source's metric choice, on the real host metric library (libnvperf_host, shipped
with nvidia-cuda-cupti): no GPU and no driver needed, nothing stood in for."""

from __future__ import annotations

import pytest

from cuptistream.cupti import perfworks
from cuptistream.cupti.pm_metrics import DEFAULT_FIELDS, default_metrics, resolve_metrics
from cuptistream.errors import ConfigError

PCT = ".avg.pct_of_peak_sustained_elapsed"


def test_the_chips_of_the_fleet_are_known() -> None:
    chips = perfworks.supported_chips()
    assert {"GH100", "GA100", "GB100"} <= set(chips)


def test_hopper_default_holds_every_dcgm_field_but_fp16_in_one_pass() -> None:
    choice = default_metrics("GH100")
    assert choice.fields == {
        "gr_engine_active": "gr__cycles_active" + PCT,
        "sm_active": "sm__cycles_active" + PCT,
        "sm_occupancy": "sm__warps_active_realtime" + PCT,
        "tensor_active": "sm__pipe_tensor_cycles_active_realtime" + PCT,
        "tensor_hmma_active": "sm__pipe_tensor_op_hmma_cycles_active_realtime" + PCT,
        "tensor_imma_active": "sm__pipe_tensor_op_imma_cycles_active_realtime" + PCT,
        "tensor_dmma_active": "smsp__pipe_tensor_op_dmma_cycles_active_realtime" + PCT,
        "fp64_active": "sm__pipe_fp64_cycles_active_realtime" + PCT,
        "fp32_active": "sm__pipe_fma_cycles_active" + PCT,
        "dram_active": "dram__cycles_active" + PCT,
        "pcie_rx_bytes": "pcie__read_bytes.sum.per_second",
        "pcie_tx_bytes": "pcie__write_bytes.sum.per_second",
        "nvlink_rx_bytes": "nvlrx__bytes.sum.per_second",
        "nvlink_tx_bytes": "nvltx__bytes.sum.per_second",
    }
    with perfworks.ChipMetrics("GH100") as chip:
        assert chip.passes(choice.metrics) == 1
        # fp16 is left out because it does not fit beside the rest, not because Hopper lacks it.
        fp16 = dict(DEFAULT_FIELDS)["fp16_active"][0]
        assert chip.exists(fp16) and chip.passes([*choice.metrics, fp16]) > 1


@pytest.mark.parametrize("chip", ["GA100", "GB100", "AD102"])
def test_other_chips_get_their_own_single_pass_set(chip: str) -> None:
    choice = default_metrics(chip)
    assert {"sm_active", "dram_active", "pcie_rx_bytes"} <= set(choice.fields)
    with perfworks.ChipMetrics(chip) as catalog:
        assert catalog.passes(choice.metrics) == 1
    if chip == "GA100":  # Ampere has no *_realtime tensor counters: the profiler's stand in
        assert choice.fields["tensor_active"] == "sm__pipe_tensor_cycles_active" + PCT
    if chip == "AD102":  # no NVLink on Ada
        assert "nvlink_rx_bytes" not in choice.fields


def test_a_configured_list_is_checked_on_the_chip() -> None:
    names = ["sm__cycles_active.avg", "dram__throughput" + PCT]
    assert resolve_metrics(names, "GH100").metrics == names


def test_an_unknown_metric_is_one_line_with_close_matches() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_metrics(["sm__cycles_activ" + PCT], "GH100")
    message = str(caught.value)
    assert "\n" not in message and "not a metric on GH100" in message
    assert "close matches: sm__cycles_active" + PCT in message


def test_a_list_one_pass_cannot_hold_is_refused_naming_what_fits() -> None:
    many = [*default_metrics("GH100").metrics, "l1tex__data_pipe_lsu_wavefronts.sum", "lts__t_sectors.sum",
            "sm__inst_executed.sum", "dram__bytes_read.sum", "l1tex__t_requests.sum"]  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        resolve_metrics(many, "GH100")
    message = str(caught.value)
    assert "\n" not in message and "passes on GH100 and PM sampling takes one" in message


def test_an_empty_list_and_an_unknown_chip_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="list at least one metric"):
        resolve_metrics([], "GH100")
    with pytest.raises(ConfigError, match="'GX999' is not known to this CUPTI"):
        default_metrics("GX999")
