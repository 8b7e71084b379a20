"""One device's PM sampling session through cupti-python's binding of ``cupti_pmsampling.h``.

cupti-python's own ``cupti.pm_sampling.Collector`` hides what the decode said (why it stopped, and
whether the hardware buffer overflowed) and evaluates with a new host object per decode; this keeps
the same calls, in the same order, and hands both back. Config images and evaluation use ``profiler_host``.

Failure modes: ``CountersHeld`` when another client holds the device's counters (it may let go:
retry) and ``NoCounterPermission`` when the user may not read them (it will not change while the
process runs), both ``CountersUnavailable`` with CUPTI's code (``unavailable``); ``ValueError`` when
SetConfig refuses the configuration (more than one pass, or an interval or trigger the chip lacks);
``cupti.cupti.cuptiError`` for anything else. Every call needs the CUDA driver.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuptistream.cupti.profiler_host import (
    ProfilerHost,
    chip_name,
    deinitialize_profiler,
    initialize_profiler,
    name_array,
    sized,
)
from cuptistream.errors import UserError

DEFAULT_MAX_SAMPLES = 1000  # per decode; a full counter data image is decoded again at once


class CountersUnavailable(UserError):
    """PM sampling cannot be enabled on the device: its counters are taken, or not ours to read."""

    def __init__(self, message: str, code: int) -> None:
        self.code = code
        super().__init__(message)


class CountersHeld(CountersUnavailable):
    """Another client (a profiler in this or another process) holds the device's counters."""


class NoCounterPermission(CountersUnavailable):
    """The driver lets only admins read performance counters (``ERR_NVGPUCTRPERM``)."""


# CUptiResult values (cupti_result.h) that mean the counters are not to be had. The codes, not
# cupti-python's enum, so that a stand-in without CUPTI fails with the same ones.
ERROR_INVALID_OPERATION = 7  # cuptiPmSamplingEnable: "PM sampling is already enabled on the device"
ERROR_HARDWARE_BUSY = 26  # "The performance monitoring hardware is in use by other client"
ERROR_INSUFFICIENT_PRIVILEGES = 35  # cuptiPmSamplingEnable: not the privileges to profile
HELD = {
    ERROR_INVALID_OPERATION: "CUPTI_ERROR_INVALID_OPERATION",
    ERROR_HARDWARE_BUSY: "CUPTI_ERROR_HARDWARE_BUSY",
}


def unavailable(device: int, code: int) -> CountersUnavailable | None:
    """What CUPTI's ``code`` from Enable or Start means for the device's counters (None: neither)."""
    if code == ERROR_INSUFFICIENT_PRIVILEGES:
        return NoCounterPermission(
            f"PM sampling on device {device}: no permission to read GPU performance counters "
            "(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, ERR_NVGPUCTRPERM)",
            code,
        )
    if code in HELD:
        return CountersHeld(
            f"PM sampling on device {device}: its performance counters are in use by another client "
            f"({HELD[code]})",
            code,
        )
    return None


@dataclass
class Decoded:
    """What one ``decode`` got: per sample its start and end (CUPTI clock ns) and per metric its values."""

    starts: list[int]
    ends: list[int]
    values: list[list[float]]  # metric-major
    overflow: bool  # the hardware buffer filled up since the last decode: samples were not recorded
    stop_reason: str  # "end_of_records", "counter_data_full" (decode again) or "other"
    image: np.ndarray | None = None  # the counter data image the values came from
    failed: int = 0  # samples the device did not give since the last decode (NVML's GPM)
    failure: str = ""  # why, as the last failed one said


class PmSamplingSession:
    """Enable, configure, start, decode, stop and disable PM sampling on one device."""

    def __init__(self, device: int) -> None:
        from cupti import cupti

        self._c = cupti
        self.device = device
        self._object: int | None = None
        self._initialized = False
        self._metrics: list[str] = []
        self._host: Any = None
        self._config: np.ndarray | None = None  # SetConfig's image: CUPTI reads it until Disable
        self.chip = ""

    def enable(self) -> str:
        """Initialize the profiler, read the chip's name and enable PM sampling; returns the chip.
        Failed, it leaves nothing initialized, so that it can be called again."""
        c = self._c
        try:
            initialize_profiler(c)
            self._initialized = True
            self.chip = chip_name(self.device, c)
            enable = sized(c.PmSamplingEnableParams, c.PM_SAMPLING_ENABLE_PARAMS_STRUCT_SIZE)
            enable.device_index = self.device
            c.pm_sampling_enable(enable.ptr)
        except c.cuptiError as error:
            self.disable()
            raise unavailable(self.device, int(error.status)) or error from None
        self._object = enable.p_pm_sampling_object
        return self.chip

    def configure(self, metrics: list[str], interval_ns: int, hardware_buffer_bytes: int) -> list[str]:
        """SetConfig with a GPU-time trigger; ValueError where CUPTI refuses it. Returns the metrics
        configured: those of ``metrics`` CUPTI's PM sampling takes (see ``_config_image``), and where
        SetConfig refuses the list (more than one pass: the host library's count is not what the
        device's CUPTI finds), as many as it takes, each added in order if SetConfig still takes the
        list with it."""
        host, image, wanted = self._config_image(metrics)
        try:
            self._set_config(image, interval_ns, hardware_buffer_bytes)
        except self._c.cuptiError as error:
            host.close()
            if not self._refused(error):
                raise

            def configured(names: list[str]) -> tuple[ProfilerHost, np.ndarray]:
                return self._configured(names, interval_ns, hardware_buffer_bytes)

            fitted = self._fit(wanted, configured, self._refused)
            if fitted is None:
                raise ValueError(
                    f"CUPTI refused the PM sampling config on {self.chip}: an interval below the "
                    "hardware's minimum, or a GPU-time trigger this chip lacks (Turing, GA100)"
                ) from None
            host, image, taken = fitted
            if taken[-1] != wanted[-1]:  # the last SetConfig was a refused one: apply the fit again
                self._set_config(image, interval_ns, hardware_buffer_bytes)
            wanted = taken
        self._metrics = list(wanted)
        self._host = host  # kept for evaluation: one host object per session
        return self._metrics

    def _set_config(self, image: np.ndarray, interval_ns: int, hardware_buffer_bytes: int) -> None:
        c = self._c
        params = sized(c.PmSamplingSetConfigParams, c.PM_SAMPLING_SET_CONFIG_PARAMS_STRUCT_SIZE)
        params.p_pm_sampling_object = self._object
        params.config_size = len(image)
        params.p_config = image.ctypes.data
        params.hardware_buffer_size = hardware_buffer_bytes
        params.sampling_interval = interval_ns
        params.trigger_mode = c.PmSamplingTriggerMode.GPU_TIME_INTERVAL
        params.hw_buffer_append_mode = c.PmSamplingHardwareBufferAppendMode.KEEP_OLDEST
        c.pm_sampling_set_config(params.ptr)
        self._config = image  # CUPTI keeps the pointer, not a copy: freed, Start and Decode read garbage

    def _configured(
        self, metrics: list[str], interval_ns: int, hardware_buffer_bytes: int
    ) -> tuple[ProfilerHost, np.ndarray]:
        """``_host_with`` whose image SetConfig took; the host is closed if either fails."""
        host, image = self._host_with(metrics)
        try:
            self._set_config(image, interval_ns, hardware_buffer_bytes)
        except BaseException:
            host.close()
            raise
        return host, image

    def _refused(self, error: Any) -> bool:
        """A refusal of the list (as opposed to a failure of the session)."""
        result = self._c.Result
        return bool(error.status in (result.ERROR_NOT_SUPPORTED, result.ERROR_INVALID_PARAMETER))

    def _config_image(self, metrics: list[str]) -> tuple[ProfilerHost, np.ndarray, list[str]]:
        """A host object with the config image of ``metrics``. Where CUPTI's PM sampling refuses the
        list with INVALID_PARAMETER (it does for counters the metric library offers but PM sampling
        cannot sample, e.g. ``sm__pipe_tensor_op_hmma_cycles_active`` on an H100), the image of those
        it takes, each added in order if CUPTI still takes the list with it."""

        def refused(error: Any) -> bool:
            return bool(error.status == self._c.Result.ERROR_INVALID_PARAMETER)

        try:
            return (*self._host_with(metrics), list(metrics))
        except self._c.cuptiError as error:
            if not refused(error):
                raise
        fitted = self._fit(metrics, self._host_with, refused)
        if fitted is None:
            raise ValueError(f"CUPTI's PM sampling on {self.chip} takes none of {', '.join(metrics)}")
        return fitted

    def _fit(
        self,
        metrics: list[str],
        trial: Callable[[list[str]], tuple[ProfilerHost, np.ndarray]],
        refused: Callable[[Any], bool],
    ) -> tuple[ProfilerHost, np.ndarray, list[str]] | None:
        """The longest in-order selection of ``metrics`` that ``trial`` takes (each metric added if
        ``trial`` still takes the list with it; an error ``refused`` names is a refusal, any other
        is raised), with the host and image of the last trial taken; None where it takes none.
        ``trial`` closes what it made when it fails."""
        taken: list[str] = []
        best: tuple[ProfilerHost, np.ndarray] | None = None
        for metric in metrics:
            try:
                attempt = trial([*taken, metric])
            except self._c.cuptiError as error:
                if not refused(error):
                    if best is not None:
                        best[0].close()
                    raise
                continue
            if best is not None:
                best[0].close()
            best = attempt
            taken.append(metric)
        return None if best is None else (*best, taken)

    def _host_with(self, metrics: list[str]) -> tuple[ProfilerHost, np.ndarray]:
        """A host object and the config image of ``metrics``; the host is closed if that fails."""
        host = ProfilerHost(self.chip)
        try:
            return host, host.config_image(metrics)
        except BaseException:
            host.close()
            raise

    def start(self) -> None:
        c = self._c
        params = sized(c.PmSamplingStartParams, c.PM_SAMPLING_START_PARAMS_STRUCT_SIZE)
        params.p_pm_sampling_object = self._object
        try:
            c.pm_sampling_start(params.ptr)
        except c.cuptiError as error:  # where the driver finds the counters taken only at Start
            # At Start, INVALID_OPERATION is our own misuse (not enabled, or started twice), not a holder.
            code = int(error.status)
            held = unavailable(self.device, code) if code != ERROR_INVALID_OPERATION else None
            raise held or error from None

    def stop(self) -> None:
        c = self._c
        params = sized(c.PmSamplingStopParams, c.PM_SAMPLING_STOP_PARAMS_STRUCT_SIZE)
        params.p_pm_sampling_object = self._object
        c.pm_sampling_stop(params.ptr)

    def decode(self, max_samples: int = DEFAULT_MAX_SAMPLES) -> Decoded:
        """Move what the hardware buffer holds into a fresh counter data image and evaluate it."""
        c = self._c
        image = self._counter_data_image(max_samples)
        params = sized(c.PmSamplingDecodeDataParams, c.PM_SAMPLING_DECODE_DATA_PARAMS_STRUCT_SIZE)
        params.p_pm_sampling_object = self._object
        params.p_counter_data_image = image.ctypes.data
        params.counter_data_image_size = len(image)
        overflow = False
        try:
            c.pm_sampling_decode_data(params.ptr)
            overflow = bool(params.overflow)
        except c.cuptiError as error:
            if error.status != c.Result.ERROR_OUT_OF_MEMORY:  # CUPTI's code for an overflowed buffer
                raise
            overflow = True
        stop = {
            int(c.PmSamplingDecodeStopReason.END_OF_RECORDS): "end_of_records",
            int(c.PmSamplingDecodeStopReason.COUNTER_DATA_FULL): "counter_data_full",
        }.get(int(params.decode_stop_reason), "other")
        info = sized(
            c.PmSamplingGetCounterDataInfoParams, c.PM_SAMPLING_GET_COUNTER_DATA_INFO_PARAMS_STRUCT_SIZE
        )
        info.p_counter_data_image = image.ctypes.data
        info.counter_data_image_size = len(image)
        c.pm_sampling_get_counter_data_info(info.ptr)
        starts, ends = [], []
        values = np.empty((len(self._metrics), info.num_completed_samples), dtype=np.float64)
        for index in range(info.num_completed_samples):
            sample = sized(
                c.PmSamplingCounterDataGetSampleInfoParams,
                c.PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE,
            )
            sample.p_pm_sampling_object = self._object
            sample.p_counter_data_image = image.ctypes.data
            sample.counter_data_image_size = len(image)
            sample.sample_index = index
            c.pm_sampling_counter_data_get_sample_info(sample.ptr)
            starts.append(int(sample.start_timestamp))
            ends.append(int(sample.end_timestamp))
            values[:, index] = self._host.evaluate(image, self._metrics, index)
        return Decoded(starts, ends, values.tolist(), overflow, stop, image)

    def _counter_data_image(self, max_samples: int) -> np.ndarray:
        c = self._c
        names = name_array(self._metrics)  # held until CUPTI has read it
        size = sized(
            c.PmSamplingGetCounterDataSizeParams, c.PM_SAMPLING_GET_COUNTER_DATA_SIZE_PARAMS_STRUCT_SIZE
        )
        size.p_pm_sampling_object = self._object
        size.p_metric_names = ctypes.addressof(names)
        size.num_metrics = len(self._metrics)
        size.max_samples = max_samples
        c.pm_sampling_get_counter_data_size(size.ptr)
        image = np.zeros(size.counter_data_size, dtype=np.uint8)
        init = sized(
            c.PmSamplingCounterDataImageInitializeParams,
            c.PM_SAMPLING_COUNTER_DATA_IMAGE_INITIALIZE_PARAMS_STRUCT_SIZE,
        )
        init.p_pm_sampling_object = self._object
        init.counter_data_size = len(image)
        init.p_counter_data = image.ctypes.data
        c.pm_sampling_counter_data_image_initialize(init.ptr)
        return image

    def disable(self) -> None:
        """Disable PM sampling and deinitialize the profiler; safe to call more than once."""
        c = self._c
        if self._host is not None:
            self._host.close()
            self._host = None
        if self._object is not None:
            params = sized(c.PmSamplingDisableParams, c.PM_SAMPLING_DISABLE_PARAMS_STRUCT_SIZE)
            params.p_pm_sampling_object = self._object
            self._object = None
            c.pm_sampling_disable(params.ptr)
        self._config = None
        if self._initialized:
            self._initialized = False
            deinitialize_profiler(c)
