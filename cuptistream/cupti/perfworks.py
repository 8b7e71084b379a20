"""The host side of NVIDIA's metric library (Perfworks, ``libnvperf_host``) through ctypes: metric names
per chip, and which metrics one PM sampling pass can hold.

CUPTI's profiler host API (``cupti.profiler_host``) wraps this same library, but libcupti will not start
without the CUDA driver library; ``libnvperf_host`` needs neither a driver nor a GPU. So the metric
choice of the ``pm_sampling`` source is made here, from a chip name, on any machine: the same answer on
a node and on a laptop. Layouts follow ``nvperf_host.h`` and ``nvperf_cuda_host.h`` (CUPTI 13), each
``structSize`` as the header's ``*_STRUCT_SIZE`` macro computes it.

Failure modes: ``LibraryNotFoundError`` when ``libnvperf_host`` cannot be loaded; ``PerfworksError``
when a call fails, naming the function and its ``NVPA_Status``; ``UnknownChipError``
for a chip this library does not know.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Sequence
from ctypes import POINTER, Structure, byref, c_char_p, c_int, c_size_t, c_uint8, c_uint16, c_void_p
from functools import cache
from typing import Any

from cuptistream.cupti.library import SizedParams, params_size
from cuptistream.errors import LibraryNotFoundError

NVPA_STATUS_SUCCESS = 0
METRIC_TYPES = {"counter": 0, "ratio": 1, "throughput": 2}  # NVPW_MetricType
# NVPA_ActivityKind per profiler: the range profiler's kernel ranges, PM sampling's realtime samples
ACTIVITY_KINDS = {"range_profiler": 1, "pm_sampling": 2}
_MAX_PASSES = 64  # a pass group this large takes any metric list a chip knows

# The submetric suffixes (``NVPW_Submetric``) a metric name may end in, for the names users type.
SUFFIXES = {
    "counter": ("sum", "avg", "max", "min", "sum.per_second", "avg.pct_of_peak_sustained_elapsed",
                "avg.per_cycle_elapsed", "sum.pct_of_peak_sustained_elapsed",
                "max.pct_of_peak_sustained_elapsed"),
    "ratio": ("pct", "ratio", "max_rate"),
    "throughput": ("avg.pct_of_peak_sustained_elapsed", "max.pct_of_peak_sustained_elapsed",
                   "sum.pct_of_peak_sustained_elapsed"),
}  # fmt: skip


class PerfworksError(RuntimeError):
    """A Perfworks call returned anything but ``NVPA_STATUS_SUCCESS``."""

    def __init__(self, call: str, status: int) -> None:
        self.call, self.status = call, status
        super().__init__(f"{call} failed (NVPA_Status {status})")


class UnknownChipError(ValueError):
    """The chip name is not one this ``libnvperf_host`` supports."""


class _Init(SizedParams):
    _fields_ = [("structSize", c_size_t), ("pPriv", c_void_p)]


class _SupportedChips(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p),
        ("ppChipNames", POINTER(c_char_p)), ("numChipNames", c_size_t),
    ]  # fmt: skip


class _ScratchSize(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pChipName", c_char_p),
        ("pCounterAvailabilityImage", c_void_p), ("scratchBufferSize", c_size_t),
    ]  # fmt: skip


class _EvaluatorInit(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pScratchBuffer", c_void_p),
        ("scratchBufferSize", c_size_t), ("pChipName", c_char_p), ("pCounterAvailabilityImage", c_void_p),
        ("pCounterDataImage", c_void_p), ("counterDataImageSize", c_size_t), ("pMetricsEvaluator", c_void_p),
    ]  # fmt: skip


class _EvaluatorDestroy(SizedParams):
    _fields_ = [("structSize", c_size_t), ("pPriv", c_void_p), ("pMetricsEvaluator", c_void_p)]


class _MetricNames(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pMetricsEvaluator", c_void_p),
        ("metricType", c_uint8), ("pMetricNames", c_void_p), ("pMetricNameBeginIndices", POINTER(c_size_t)),
        ("numMetrics", c_size_t),
    ]  # fmt: skip


class _EvalRequest(Structure):
    _fields_ = [
        ("metricIndex", c_size_t),
        ("metricType", c_uint8),
        ("rollupOp", c_uint8),
        ("submetric", c_uint16),
    ]


class _ToEvalRequest(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pMetricsEvaluator", c_void_p),
        ("pMetricName", c_char_p), ("pMetricEvalRequest", POINTER(_EvalRequest)),
        ("metricEvalRequestStructSize", c_size_t),
    ]  # fmt: skip


class _RawDependencies(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pMetricsEvaluator", c_void_p),
        ("pMetricEvalRequests", POINTER(_EvalRequest)), ("numMetricEvalRequests", c_size_t),
        ("metricEvalRequestStructSize", c_size_t), ("metricEvalRequestStrideSize", c_size_t),
        ("ppRawDependencies", POINTER(c_char_p)), ("numRawDependencies", c_size_t),
        ("ppOptionalRawDependencies", POINTER(c_char_p)), ("numOptionalRawDependencies", c_size_t),
    ]  # fmt: skip


class _SetDeviceAttributes(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pMetricsEvaluator", c_void_p),
        ("pCounterDataImage", c_void_p), ("counterDataImageSize", c_size_t),
    ]  # fmt: skip


class _EvaluateToGpuValues(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pMetricsEvaluator", c_void_p),
        ("pMetricEvalRequests", POINTER(_EvalRequest)), ("numMetricEvalRequests", c_size_t),
        ("metricEvalRequestStructSize", c_size_t), ("metricEvalRequestStrideSize", c_size_t),
        ("pCounterDataImage", c_void_p), ("counterDataImageSize", c_size_t), ("rangeIndex", c_size_t),
        ("isolated", c_uint8), ("pMetricValues", POINTER(ctypes.c_double)),
    ]  # fmt: skip


class _RawRequest(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pMetricName", c_char_p),
        ("isolated", c_uint8), ("keepInstances", c_uint8),
    ]  # fmt: skip


class _ConfigCreate(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("activityKind", c_int), ("pChipName", c_char_p),
        ("pCounterAvailabilityImage", c_void_p), ("pRawMetricsConfig", c_void_p),
    ]  # fmt: skip


class _ConfigOnly(SizedParams):  # Destroy, EndPassGroup
    _fields_ = [("structSize", c_size_t), ("pPriv", c_void_p), ("pRawMetricsConfig", c_void_p)]


class _BeginPassGroup(SizedParams):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pRawMetricsConfig", c_void_p),
        ("maxPassCount", c_size_t),
    ]


class _AddMetrics(SizedParams):
    _fields_ = [
        ("structSize", c_size_t), ("pPriv", c_void_p), ("pRawMetricsConfig", c_void_p),
        ("pRawMetricRequests", POINTER(_RawRequest)), ("numMetricRequests", c_size_t),
    ]  # fmt: skip


class _IsAddPossible(SizedParams):
    _fields_ = [*_AddMetrics._fields_, ("isPossible", c_uint8)]


class _GenerateImage(SizedParams):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pRawMetricsConfig", c_void_p),
        ("mergeAllPassGroups", c_uint8),
    ]


class _NumPasses(SizedParams):
    _fields_ = [
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pRawMetricsConfig", c_void_p),
        ("numPasses", c_size_t),
    ]


# --- loading and calling --------------------------------------------------------------------------


def _candidates() -> list[str]:
    """Next to the libcupti cuptistream uses (CUPTI ships the two together), then the loader's path."""
    found: list[str] = []
    try:
        from cuptistream.cupti.library import libcupti

        folder = os.path.dirname(libcupti()._name)
        found.append(os.path.join(folder, "libnvperf_host.so"))
    except Exception:
        pass
    return [*found, "libnvperf_host.so"]


@cache
def libnvperf_host() -> ctypes.CDLL:
    """The host metric library, initialized once."""
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as error:
            errors.append(str(error))
    else:
        raise LibraryNotFoundError(
            "libnvperf_host cannot be loaded; install `nvidia-cuda-cupti`, which ships it beside libcupti"
            + (f" ({errors[-1]})" if errors else "")
        )
    _call(lib, "NVPW_InitializeHost", _Init())
    return lib


def _call(lib: ctypes.CDLL, name: str, params: Structure) -> None:
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [c_void_p], c_int
    status = fn(byref(params))
    if status != NVPA_STATUS_SUCCESS:
        raise PerfworksError(name, status)


def _nvpw(name: str, params: Structure) -> None:
    _call(libnvperf_host(), name, params)


def supported_chips() -> list[str]:
    """The chip names (``GH100``, ``GB100``, ...) this library can configure and evaluate."""
    params = _SupportedChips()
    _nvpw("NVPW_GetSupportedChipNames", params)
    return [params.ppChipNames[i].decode() for i in range(params.numChipNames)]


# --- one chip's metrics -----------------------------------------------------------------------------


class ChipMetrics:
    """The metrics of one chip: their names, and which of them one PM sampling pass can hold.

    Raises ``UnknownChipError`` for a chip not in ``supported_chips()``. Close it (``close()`` or a
    ``with`` block) to free the evaluator; it holds a scratch buffer of a few MB.
    """

    def __init__(self, chip: str) -> None:
        if chip not in supported_chips():
            raise UnknownChipError(chip)
        self.chip = chip
        self._chip = chip.encode()
        size = _ScratchSize(pChipName=self._chip)
        _nvpw("NVPW_CUDA_MetricsEvaluator_CalculateScratchBufferSize", size)
        self._scratch = ctypes.create_string_buffer(size.scratchBufferSize)
        init = _EvaluatorInit(
            pScratchBuffer=ctypes.addressof(self._scratch),
            scratchBufferSize=size.scratchBufferSize,
            pChipName=self._chip,
        )
        _nvpw("NVPW_CUDA_MetricsEvaluator_Initialize", init)
        self._evaluator: int | None = init.pMetricsEvaluator

    def close(self) -> None:
        if self._evaluator:
            _nvpw("NVPW_MetricsEvaluator_Destroy", _EvaluatorDestroy(pMetricsEvaluator=self._evaluator))
            self._evaluator = None

    def __enter__(self) -> ChipMetrics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def base_names(self, metric_type: str) -> list[str]:
        """The chip's metric names of one type (``counter``, ``ratio``, ``throughput``), without suffix."""
        params = _MetricNames(pMetricsEvaluator=self._evaluator, metricType=METRIC_TYPES[metric_type])
        _nvpw("NVPW_MetricsEvaluator_GetMetricNames", params)
        base = params.pMetricNames or 0
        return [
            ctypes.string_at(base + params.pMetricNameBeginIndices[i]).decode()
            for i in range(params.numMetrics)
        ]

    def names(self) -> list[str]:
        """Every base name with its common suffixes: the names a user is likely to mean."""
        return [f"{base}.{suffix}" for kind, suffixes in SUFFIXES.items() for base in self.base_names(kind)
                for suffix in suffixes]  # fmt: skip

    def _request(self, name: str) -> _EvalRequest | None:
        request = _EvalRequest()
        params = _ToEvalRequest(
            pMetricsEvaluator=self._evaluator, pMetricName=name.encode(),
            pMetricEvalRequest=ctypes.pointer(request),
            metricEvalRequestStructSize=ctypes.sizeof(_EvalRequest),
        )  # fmt: skip
        try:
            _nvpw("NVPW_MetricsEvaluator_ConvertMetricNameToMetricEvalRequest", params)
        except PerfworksError:
            return None
        return request

    def _requests(self, names: Iterable[str]) -> list[_EvalRequest]:
        """The eval request of each name; ValueError names an unknown one."""
        requests = []
        for name in names:
            request = self._request(name)
            if request is None:
                raise ValueError(f"{name!r} is not a metric on {self.chip}")
            requests.append(request)
        return requests

    def exists(self, name: str) -> bool:
        """Whether ``name`` (with its suffix, e.g. ``sm__cycles_active.avg``) is a metric of this chip."""
        return self._request(name) is not None

    def raw_counters(self, names: Iterable[str]) -> list[str]:
        """The raw counters the metrics ``names`` are computed from; ValueError names an unknown one."""
        requests = self._requests(names)
        array = (_EvalRequest * len(requests))(*requests)
        params = _RawDependencies(
            pMetricsEvaluator=self._evaluator, pMetricEvalRequests=array, numMetricEvalRequests=len(requests),
            metricEvalRequestStructSize=ctypes.sizeof(_EvalRequest),
            metricEvalRequestStrideSize=ctypes.sizeof(_EvalRequest),
        )  # fmt: skip
        _nvpw("NVPW_MetricsEvaluator_GetMetricRawDependencies", params)  # first call: the counts
        raw = (c_char_p * max(1, params.numRawDependencies))()
        optional = (c_char_p * max(1, params.numOptionalRawDependencies))()
        params.ppRawDependencies, params.ppOptionalRawDependencies = raw, optional
        _nvpw("NVPW_MetricsEvaluator_GetMetricRawDependencies", params)
        return [(raw[i] or b"").decode() for i in range(params.numRawDependencies)]

    def evaluate(self, image: bytes, names: Sequence[str], samples: int) -> list[list[float]]:
        """The values of the metrics ``names`` in each of the first ``samples`` samples (ranges) of a
        counter data image, metric-major: what CUPTI's host evaluator reads, on a machine without a
        GPU. ValueError names an unknown metric; ``PerfworksError``: an image of another chip, or a
        sample it does not hold."""
        requests = self._requests(names)
        array = (_EvalRequest * len(requests))(*requests)
        data = ctypes.create_string_buffer(image, len(image))
        where = ctypes.addressof(data)
        _nvpw(
            "NVPW_MetricsEvaluator_SetDeviceAttributes",
            _SetDeviceAttributes(pMetricsEvaluator=self._evaluator, pCounterDataImage=where,
                                 counterDataImageSize=len(image)),
        )  # fmt: skip
        values = (ctypes.c_double * len(requests))()
        # The header's NVPW_MetricEvalRequest_STRUCT_SIZE; the stride is the array's.
        request_size = params_size(_EvalRequest, "submetric")
        columns: list[list[float]] = [[] for _ in requests]
        for index in range(samples):
            params = _EvaluateToGpuValues(
                pMetricsEvaluator=self._evaluator, pMetricEvalRequests=array,
                numMetricEvalRequests=len(requests), metricEvalRequestStructSize=request_size,
                metricEvalRequestStrideSize=ctypes.sizeof(_EvalRequest), pCounterDataImage=where,
                counterDataImageSize=len(image), rangeIndex=index, isolated=1, pMetricValues=values,
            )  # fmt: skip
            _nvpw("NVPW_MetricsEvaluator_EvaluateToGpuValues", params)
            for column, value in zip(columns, values, strict=True):
                column.append(float(value))
        return columns

    def passes(self, names: Sequence[str], profiler: str = "pm_sampling") -> int:
        """How many passes ``profiler`` (``ACTIVITY_KINDS``) needs for ``names``: PM sampling takes
        exactly one; the range profiler replays each kernel once per pass."""
        with _SampledConfig(self._chip, _MAX_PASSES, ACTIVITY_KINDS[profiler]) as config:
            config.add(self.raw_counters(names))
            return config.passes()

    def fit_one_pass(self, candidates: Sequence[str]) -> list[str]:
        """Of ``candidates``, in order, those that one pass can hold together: each is kept if it fits
        beside those kept before it; a name this chip lacks is skipped."""
        return [name for name in self.fit_alternatives([(name,) for name in candidates]) if name]

    def fit_alternatives(self, groups: Sequence[Sequence[str]]) -> list[str | None]:
        """Per group, in order, the first of its names that this chip has and that fits in one pass
        beside those taken before it; None where none does."""
        taken: list[str | None] = []
        with _SampledConfig(self._chip, 1) as config:
            for names in groups:
                chosen = None
                for name in names:
                    if self.exists(name) and config.can_add(raw := self.raw_counters([name])):
                        config.add(raw)
                        chosen = name
                        break
                taken.append(chosen)
        return taken


class _SampledConfig:
    """A raw-metrics config (PM sampling's unless ``kind`` says another) with one pass group open."""

    def __init__(self, chip: bytes, max_passes: int, kind: int = ACTIVITY_KINDS["pm_sampling"]) -> None:
        create = _ConfigCreate(activityKind=kind, pChipName=chip)
        _nvpw("NVPW_CUDA_RawMetricsConfig_Create_V2", create)
        self._config = create.pRawMetricsConfig
        _nvpw(
            "NVPW_RawMetricsConfig_BeginPassGroup",
            _BeginPassGroup(pRawMetricsConfig=self._config, maxPassCount=max_passes),
        )
        self._open = True

    def __enter__(self) -> _SampledConfig:
        return self

    def __exit__(self, *exc: object) -> None:
        _nvpw("NVPW_RawMetricsConfig_Destroy", _ConfigOnly(pRawMetricsConfig=self._config))

    @staticmethod
    def _requests(raw: Sequence[str]) -> Any:
        return (_RawRequest * len(raw))(
            *[_RawRequest(pMetricName=name.encode(), keepInstances=1) for name in raw]
        )

    def can_add(self, raw: Sequence[str]) -> bool:
        params = _IsAddPossible(
            pRawMetricsConfig=self._config, pRawMetricRequests=self._requests(raw), numMetricRequests=len(raw)
        )
        _nvpw("NVPW_RawMetricsConfig_IsAddMetricsPossible", params)
        return bool(params.isPossible)

    def add(self, raw: Sequence[str]) -> None:
        requests = self._requests(raw)
        _nvpw(
            "NVPW_RawMetricsConfig_AddMetrics",
            _AddMetrics(
                pRawMetricsConfig=self._config, pRawMetricRequests=requests, numMetricRequests=len(raw)
            ),
        )

    def passes(self) -> int:
        if self._open:
            _nvpw("NVPW_RawMetricsConfig_EndPassGroup", _ConfigOnly(pRawMetricsConfig=self._config))
            self._open = False
        _nvpw(
            "NVPW_RawMetricsConfig_GenerateConfigImage",
            _GenerateImage(pRawMetricsConfig=self._config, mergeAllPassGroups=1),
        )
        params = _NumPasses(pRawMetricsConfig=self._config)
        _nvpw("NVPW_RawMetricsConfig_GetNumPasses_V2", params)
        return int(params.numPasses)
