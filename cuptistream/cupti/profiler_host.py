"""CUPTI's profiler host object, through cupti-python's low-level binding: the config image of a
metric list (PM sampling's, or the range profiler's with the passes it needs), and the metric values
of a sample or range of a counter data image.

Not ``cupti.profiler_host.ProfilerHost``: cupti-python 13.4 passes its own, larger
``CUpti_Profiler_Host_Initialize_Params`` size, which a CUPTI 13.0 refuses with
``CUPTI_ERROR_INVALID_PARAMETER``, and it lets the metric-name array go before CUPTI reads it. Here
each params struct says the size of the fields it sets (CUPTI reads no further: the same call works on
older and newer CUPTIs), and every buffer CUPTI reads is held in a name across the call.

Failure modes: ``ValueError`` for a metric name the chip lacks; ``cupti.cupti.cuptiError`` for
anything else (a chip the installed CUPTI does not know, a sample the image does not hold).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

# ``CUpti_Profiler_Host_Initialize_Params`` up to ``pHostObject`` (CUPTI 13.0's STRUCT_SIZE): later
# CUPTIs append fields we leave unset.
_INITIALIZE_PARAMS_SIZE = 48
PROFILER_TYPES = {"range_profiler": 0, "pm_sampling": 1}  # CUpti_ProfilerType


def sized(cls: Any, size: int) -> Any:
    """A new cupti-python params struct whose ``struct_size`` says ``size``."""
    params = cls()
    params.struct_size = size
    return params


def _module(c: Any) -> Any:
    if c is None:
        from cupti import cupti

        return cupti
    return c


def initialize_profiler(c: Any = None) -> None:
    """``cuptiProfilerInitialize``: before anything of PM sampling or the range profiler. ``c``:
    cupti-python's ``cupti.cupti`` (a stand-in, in tests without a GPU)."""
    c = _module(c)
    params = sized(c.ProfilerInitializeParams, c.PROFILER_INITIALIZE_PARAMS_STRUCT_SIZE)
    c.profiler_initialize(params.ptr)  # held in a name: ``.ptr`` of a temporary is freed memory


def deinitialize_profiler(c: Any = None) -> None:
    c = _module(c)
    params = sized(c.ProfilerDeInitializeParams, c.PROFILER_DEINITIALIZE_PARAMS_STRUCT_SIZE)
    c.profiler_deinitialize(params.ptr)


def chip_name(device: int, c: Any = None) -> str:
    """The chip of CUDA device ``device`` ("GH100") as the host calls name it; after
    ``initialize_profiler``."""
    c = _module(c)
    params = sized(c.DeviceGetChipNameParams, c.DEVICE_GET_CHIP_NAME_PARAMS_STRUCT_SIZE)
    params.device_index = device
    c.device_get_chip_name(params.ptr)
    return str(params.p_chip_name or "")


class ProfilerHost:
    """One chip's host object for one profiler (``PROFILER_TYPES``): ``config_image``, ``passes``
    and ``evaluate``; ``close()`` frees it."""

    def __init__(self, chip: str, profiler: str = "pm_sampling") -> None:
        from cupti import cupti

        self._c = cupti
        self.chip = chip
        init = sized(cupti.ProfilerHostInitializeParams, _INITIALIZE_PARAMS_SIZE)
        init.profiler_type = PROFILER_TYPES[profiler]
        init.p_chip_name = chip
        init.p_counter_availability_image = 0
        cupti.profiler_host_initialize(init.ptr)
        self._object: int | None = init.p_host_object
        self._names: dict[tuple[str, ...], ctypes.Array[ctypes.c_char_p]] = {}  # evaluate's, per list

    def config_image(self, metrics: Sequence[str]) -> np.ndarray:
        """The config image SetConfig takes for ``metrics``."""
        c = self._c
        names = name_array(metrics)
        add = sized(
            c.ProfilerHostConfigAddMetricsParams, c.PROFILER_HOST_CONFIG_ADD_METRICS_PARAMS_STRUCT_SIZE
        )
        add.p_host_object = self._object
        add.pp_metric_names = ctypes.addressof(names)
        add.num_metrics = len(metrics)
        self._call(c.profiler_host_config_add_metrics, add, metrics)
        size = sized(
            c.ProfilerHostGetConfigImageSizeParams, c.PROFILER_HOST_GET_CONFIG_IMAGE_SIZE_PARAMS_STRUCT_SIZE
        )
        size.p_host_object = self._object
        c.profiler_host_get_config_image_size(size.ptr)
        image = np.zeros(size.config_image_size, dtype=np.uint8)
        get = sized(c.ProfilerHostGetConfigImageParams, c.PROFILER_HOST_GET_CONFIG_IMAGE_PARAMS_STRUCT_SIZE)
        get.p_host_object = self._object
        get.p_config_image = image.ctypes.data
        get.config_image_size = len(image)
        c.profiler_host_get_config_image(get.ptr)
        return image

    def passes(self, config_image: np.ndarray) -> int:
        """How many passes (kernel replays, for the range profiler) ``config_image`` takes."""
        c = self._c
        params = sized(
            c.ProfilerHostGetNumOfPassesParams, c.PROFILER_HOST_GET_NUM_OF_PASSES_PARAMS_STRUCT_SIZE
        )
        params.config_image_size = len(config_image)
        params.p_config_image = config_image.ctypes.data
        c.profiler_host_get_num_of_passes(params.ptr)
        return int(params.num_of_passes)

    def evaluate(self, image: np.ndarray, metrics: Sequence[str], sample: int) -> np.ndarray:
        """The values of ``metrics`` in sample (or range) ``sample`` of the counter data ``image``."""
        c = self._c
        names = self._names.get(key := tuple(metrics))
        if names is None:  # built once per list: evaluate runs for every sample
            names = self._names[key] = name_array(metrics)
        values = np.zeros(len(metrics), dtype=np.float64)
        params = sized(
            c.ProfilerHostEvaluateToGpuValuesParams, c.PROFILER_HOST_EVALUATE_TO_GPU_VALUES_PARAMS_STRUCT_SIZE
        )
        params.p_host_object = self._object
        params.p_counter_data_image = image.ctypes.data
        params.counter_data_image_size = len(image)
        params.pp_metric_names = ctypes.addressof(names)
        params.num_metrics = len(metrics)
        params.range_index = sample
        params.p_metric_values = values.ctypes.data
        self._call(c.profiler_host_evaluate_to_gpu_values, params, metrics)
        return values

    def close(self) -> None:
        """Free the host object; safe to call more than once."""
        if self._object is not None:
            c = self._c
            params = sized(c.ProfilerHostDeinitializeParams, c.PROFILER_HOST_DEINITIALIZE_PARAMS_STRUCT_SIZE)
            params.p_host_object, self._object = self._object, None
            c.profiler_host_deinitialize(params.ptr)

    def _call(self, function: Any, params: Any, metrics: Sequence[str]) -> None:
        try:
            function(params.ptr)
        except self._c.cuptiError as error:
            if getattr(error, "status", None) == self._c.Result.ERROR_INVALID_METRIC_NAME:
                raise ValueError(f"a metric of {list(metrics)} is not a metric on {self.chip}") from None
            raise


def name_array(metrics: Sequence[str]) -> ctypes.Array[ctypes.c_char_p]:
    """The C array of ``metrics``' names; it keeps the strings alive as long as it lives itself, so
    hold it in a name until CUPTI has read ``ctypes.addressof`` of it."""
    return (ctypes.c_char_p * len(metrics))(*(name.encode() for name in metrics))
