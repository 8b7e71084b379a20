"""ctypes binding of CUPTI's range profiler (``cupti_range_profiler.h``), which cupti-python does not
bind, and one context's session over it: every kernel launched while it runs is a range of its own
(auto range), replayed by CUPTI as many times as the metrics need passes (kernel replay).

Layouts follow the CUPTI 13.0 header; each ``structSize`` is what its ``*_STRUCT_SIZE`` macro
computes. Config images and evaluation are ``profiler_host``'s (profiler type ``range_profiler``).

Failure modes: ``CuptiError`` (``cupti.library``) naming the call and its ``CUptiResult``; the
counters held by another client (PM sampling, Nsight, DCGM's profiling module) is
``CUPTI_ERROR_HARDWARE_BUSY`` or ``CUPTI_ERROR_INVALID_OPERATION`` at ``enable`` or ``start``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import c_char_p, c_int, c_size_t, c_uint8, c_uint16, c_uint32, c_void_p
from dataclasses import dataclass

import numpy as np

from cuptistream.cupti.library import SizedParams, call
from cuptistream.cupti.profiler_host import ProfilerHost, name_array

AUTO_RANGE = 1  # CUpti_ProfilerRange: CUPTI_AutoRange, a range around each kernel
KERNEL_REPLAY = 2  # CUpti_ProfilerReplayMode: CUPTI_KernelReplay, passes replayed by CUPTI
_DELIMITER = b"/"  # range names are one level deep in auto range: the kernel's name


class _Object(SizedParams):  # Disable, Start, PopRange: only the object
    _fields_ = [("structSize", c_size_t), ("pPriv", c_void_p), ("pRangeProfilerObject", c_void_p)]


class _Enable(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("ctx", c_void_p), ("pRangeProfilerObject", c_void_p),
    ]  # fmt: skip


class _SetConfig(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pRangeProfilerObject", c_void_p),
        ("configSize", c_size_t), ("pConfig", c_void_p), ("counterDataImageSize", c_size_t),
        ("pCounterDataImage", c_void_p), ("range", c_int), ("replayMode", c_int),
        ("maxRangesPerPass", c_size_t), ("numNestingLevels", c_uint16), ("minNestingLevel", c_uint16),
        ("passIndex", c_size_t), ("targetNestingLevel", c_uint16),
    ]  # fmt: skip


class _Stop(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pRangeProfilerObject", c_void_p),
        ("passIndex", c_size_t), ("targetNestingLevel", c_size_t), ("isAllPassSubmitted", c_uint8),
    ]  # fmt: skip


class _Decode(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pRangeProfilerObject", c_void_p),
        ("numOfRangeDropped", c_size_t),
    ]  # fmt: skip


class _CounterDataSize(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pRangeProfilerObject", c_void_p),
        ("pMetricNames", c_void_p), ("numMetrics", c_size_t), ("maxNumOfRanges", c_size_t),
        ("maxNumRangeTreeNodes", c_uint32), ("counterDataSize", c_size_t),
    ]  # fmt: skip


class _ImageInitialize(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pRangeProfilerObject", c_void_p),
        ("counterDataSize", c_size_t), ("pCounterData", c_void_p),
    ]  # fmt: skip


class _CounterDataInfo(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pCounterDataImage", c_void_p),
        ("counterDataImageSize", c_size_t), ("numTotalRanges", c_size_t),
    ]  # fmt: skip


class _RangeInfo(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pCounterDataImage", c_void_p),
        ("counterDataImageSize", c_size_t), ("rangeIndex", c_size_t), ("rangeDelimiter", c_char_p),
        ("rangeName", c_char_p),
    ]  # fmt: skip


@dataclass
class Ranges:
    """What one ``collect`` read: per range (kernel launch, in order) its name and per metric its
    value (metric-major), and how many ranges did not fit in the counter data image."""

    names: list[str]
    values: list[list[float]]
    dropped: int


class RangeProfilerSession:
    """Auto-range, kernel-replay profiling of one context: ``enable``, ``configure``, ``start``,
    ``stop``, ``collect``, ``close``. The config image comes from a ``ProfilerHost`` of the device's
    chip (``range_profiler``), which also evaluates the ranges."""

    def __init__(self, context: int, host: ProfilerHost) -> None:
        self.context = context
        self.host = host
        self._object: int | None = None
        self._metrics: list[str] = []
        self._config: np.ndarray | None = None  # held while CUPTI may read them
        self._image: np.ndarray | None = None

    def enable(self) -> None:
        params = _Enable(ctx=self.context)
        call("cuptiRangeProfilerEnable", params)
        self._object = params.pRangeProfilerObject

    def configure(self, metrics: Sequence[str], max_ranges: int) -> int:
        """SetConfig for ``metrics`` with room for ``max_ranges`` kernel launches; the passes each
        launch will be replayed for."""
        self._metrics = list(metrics)
        self._config = self.host.config_image(self._metrics)
        names = name_array(self._metrics)
        size = _CounterDataSize(
            pRangeProfilerObject=self._object, pMetricNames=ctypes.addressof(names),
            numMetrics=len(self._metrics), maxNumOfRanges=max_ranges, maxNumRangeTreeNodes=max_ranges,
        )  # fmt: skip
        call("cuptiRangeProfilerGetCounterDataSize", size)
        self._image = np.zeros(size.counterDataSize, dtype=np.uint8)
        call(
            "cuptiRangeProfilerCounterDataImageInitialize",
            _ImageInitialize(pRangeProfilerObject=self._object, counterDataSize=len(self._image),
                             pCounterData=self._image.ctypes.data),
        )  # fmt: skip
        call(
            "cuptiRangeProfilerSetConfig",
            _SetConfig(
                pRangeProfilerObject=self._object, configSize=len(self._config),
                pConfig=self._config.ctypes.data, counterDataImageSize=len(self._image),
                pCounterDataImage=self._image.ctypes.data,
                range=AUTO_RANGE, replayMode=KERNEL_REPLAY, maxRangesPerPass=max_ranges,
                numNestingLevels=1, minNestingLevel=1, passIndex=0, targetNestingLevel=1,
            ),
        )  # fmt: skip
        return self.host.passes(self._config)

    def start(self) -> None:
        call("cuptiRangeProfilerStart", _Object(pRangeProfilerObject=self._object))

    def stop(self) -> None:
        call("cuptiRangeProfilerStop", _Stop(pRangeProfilerObject=self._object))

    def collect(self) -> Ranges:
        """Decode what the kernels' passes wrote and evaluate every range (after ``stop``)."""
        assert self._image is not None, "configure first"
        decode = _Decode(pRangeProfilerObject=self._object)
        call("cuptiRangeProfilerDecodeData", decode)
        image = self._image
        info = _CounterDataInfo(pCounterDataImage=image.ctypes.data, counterDataImageSize=len(image))
        call("cuptiRangeProfilerGetCounterDataInfo", info)
        names: list[str] = []
        values = np.empty((len(self._metrics), info.numTotalRanges), dtype=np.float64)
        for index in range(info.numTotalRanges):
            what = _RangeInfo(
                pCounterDataImage=image.ctypes.data, counterDataImageSize=len(image), rangeIndex=index,
                rangeDelimiter=_DELIMITER,
            )  # fmt: skip
            call("cuptiRangeProfilerCounterDataGetRangeInfo", what)
            names.append((what.rangeName or b"").decode(errors="replace"))
            values[:, index] = self.host.evaluate(image, self._metrics, index)
        return Ranges(names, values.tolist(), int(decode.numOfRangeDropped))

    def close(self) -> None:
        """Disable the range profiler on the context; safe to call more than once."""
        if self._object is not None:
            params = _Object(pRangeProfilerObject=self._object)
            self._object = None
            call("cuptiRangeProfilerDisable", params)
