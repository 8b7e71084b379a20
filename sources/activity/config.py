"""The activity source's configuration (``sources[].type: activity``): which kinds, buffers, CUPTI
attributes and, in budget mode, windows; every value that cannot work is refused at load."""

from __future__ import annotations

import ctypes
from typing import Any, Literal

import msgspec

from cuptistream.config import Duration, Size, SourceConfig, require_at_least
from cuptistream.cupti import api_functions, kinds

# CUpti_ActivityAttribute: name -> (value, C type of the value)
ATTRIBUTES: dict[str, tuple[int, type[ctypes._SimpleCData[Any]]]] = {
    "device_buffer_size": (0, ctypes.c_size_t),
    "device_buffer_size_cdp": (1, ctypes.c_size_t),
    "device_buffer_pool_limit": (2, ctypes.c_size_t),
    "profiling_semaphore_pool_size": (3, ctypes.c_size_t),
    "profiling_semaphore_pool_limit": (4, ctypes.c_size_t),
    "zeroed_out_buffer": (5, ctypes.c_uint8),
    "device_buffer_pre_allocate_value": (6, ctypes.c_size_t),
    "profiling_semaphore_pre_allocate_value": (7, ctypes.c_size_t),
    "mem_allocation_type_host_pinned": (8, ctypes.c_uint8),
    "per_thread_buffer": (9, ctypes.c_uint8),
    "device_buffer_size_device_graphs": (10, ctypes.c_size_t),
}


STACK_JOIN_KINDS = ("runtime", "driver")  # API records: a launch's thread, time and correlation id


class ActivitySourceConfig(SourceConfig):
    kinds: list[str] = msgspec.field(default_factory=lambda: list(kinds.DEFAULT_KINDS))
    # Patterns (api_functions: globs over CUPTI's function names) of the API calls the runtime/driver
    # kinds record; ["*"]: all.
    runtime_api: list[str] = msgspec.field(default_factory=lambda: list(kinds.DEFAULT_RUNTIME_API))
    driver_api: list[str] = msgspec.field(default_factory=lambda: list(kinds.DEFAULT_DRIVER_API))
    buffer_size: Size = Size(4 * 1024 * 1024)  # one shared-memory buffer handed to CUPTI
    buffer_pool_limit: int = 16  # buffers in the shared pool (memory bound: limit x size)
    device_buffer_size: Size | None = None  # CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE
    device_buffer_pool_limit: int | None = None  # CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_POOL_LIMIT
    # CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER; None leaves CUPTI's default, which is per-thread
    # buffers from CUPTI 13 on (cupti_activity.h) and one shared set before.
    per_thread_buffers: bool | None = None
    attributes: dict[str, int] = {}  # any other attribute by name, see ATTRIBUTES
    flush_period: Duration = Duration(0.0)  # cuptiActivityFlushPeriod; 0 leaves CUPTI's heuristics
    flush_interval: Duration = Duration(1.0)  # our own cuptiActivityFlushAll(0); 0 turns it off
    demangle: bool = False  # add demangled_name to kernels
    detach: bool = True  # cuptiFinalize at stop when no other CUPTI user remains
    capture: str = ""  # also write the raw buffers to this capture file (fixtures, replay)
    # "full": every record, continuously; "budget": the kinds in windows under overhead.budget.
    mode: Literal["full", "budget"] = "full"
    window: Duration = Duration(0.2)  # budget mode: the longest window
    min_window: Duration = Duration(0.02)  # ... the shortest (windows shorten past max_pause)
    max_pause: Duration = Duration(5.0)  # ... the longest pause, so every statistics interval sees windows
    pause: Duration = Duration(10.0)  # ... the pause between windows when overhead.budget is off
    # Budget mode: "job" opens the windows of every rank of a job (RANK/WORLD_SIZE, SLURM, MPI) at the
    # same moments, so no rank is traced while its peers wait for it; "none": phases of its own.
    align: Literal["job", "none"] = "job"
    continuous: list[str] = []  # budget mode: kinds also traced between windows
    # Budget mode: what its windows trace; [] = the GPU-work kinds among ``kinds`` (what the
    # statistics need). API kinds cost a per-cbid filter pass at each window's start (milliseconds
    # during which the program's launches wait), so they belong to on-demand windows.
    window_kinds: list[str] = []
    # "all": the raw records go to the sinks; "on_demand": only those of on-demand windows (the
    # collector's statistics still see every record).
    records: Literal["all", "on_demand"] = "all"
    # Budget mode, between windows: "attach" (CUPTI numbers every API call, so the statistics' call
    # counts come from whole cycles; ``continuous`` kinds need it) or "detach" (cuptiFinalize after
    # each window, attach at the next: the launch path runs untouched between windows, until the
    # process makes a CUDA graph).
    between_windows: Literal["detach", "attach"] = "attach"

    def __post_init__(self) -> None:
        # Messages start with the key (the caller adds "sources[N]: "), so each names its key path.
        unknown = [(i, k) for i, k in enumerate(self.kinds) if k not in kinds.KINDS]
        if unknown:
            index, kind = unknown[0]
            raise ValueError(
                f"kinds[{index}]: unknown activity kind {kind!r} (known: {', '.join(sorted(kinds.KINDS))})"
            )
        for key in self.attributes:
            if key not in ATTRIBUTES:
                raise ValueError(
                    f"attributes.{key}: unknown CUPTI activity attribute (known: {', '.join(ATTRIBUTES)})"
                )
        api_functions.check_patterns("runtime", self.runtime_api)
        api_functions.check_patterns("driver", self.driver_api)
        if self.buffer_size < 64 * 1024:
            raise ValueError("buffer_size must be at least 64KiB")
        for key in ("device_buffer_size", "device_buffer_pool_limit"):
            if (value := getattr(self, key)) is not None:
                require_at_least(key, value, 1)
        for key in ("continuous", "window_kinds"):
            outside = [k for k in getattr(self, key) if k not in self.kinds]
            if outside:
                raise ValueError(f"{key}: {outside[0]!r} is not in kinds; add it to kinds or remove it here")
        if self.continuous and self.mode != "budget":
            raise ValueError("continuous applies to mode: budget only; remove it or set mode: budget")
        if self.between_windows == "detach" and (self.continuous or not self.detach):
            raise ValueError(
                "between_windows: detach leaves CUPTI between windows, which continuous kinds and "
                "detach: false need; set between_windows: attach, or remove continuous / detach: false"
            )
        if not 0 < self.min_window <= self.window:
            raise ValueError("min_window must be above 0 and at most window")
        if self.max_pause < self.window or self.pause <= 0:
            raise ValueError("max_pause must be at least window, and pause above 0")
        if self.buffer_pool_limit < 2:
            raise ValueError(
                "buffer_pool_limit must be at least 2 (CUPTI fills one while the collector reads another)"
            )

    @property
    def joins_stacks(self) -> bool:
        """Whether its API records can join its GPU work to the launching stacks."""
        return any(k in self.kinds for k in STACK_JOIN_KINDS)

    def stacks_problem(self, modes: list[str]) -> str | None:
        """Why the session's ``stacks`` (taken in ``modes``) cannot work with this source, or None."""
        if self.enabled and self.mode in modes and not self.joins_stacks:
            return (
                f"stacks are taken in mode {self.mode}, which needs the runtime or driver kind to join "
                f"GPU work to its launch; add runtime to kinds, or leave {self.mode} out of stacks.modes"
            )
        return None

    @property
    def detaches_between_windows(self) -> bool:
        """Budget mode whose windows attach CUPTI afresh."""
        return self.mode == "budget" and self.between_windows == "detach"


def attribute_values(cfg: ActivitySourceConfig) -> dict[str, int]:
    """The CUPTI activity attributes ``cfg`` sets, by ``ATTRIBUTES`` name; those it leaves out keep
    CUPTI's defaults. The named keys win over the same attribute in ``attributes``."""
    values: dict[str, int] = dict(cfg.attributes)
    if cfg.device_buffer_size is not None:
        values["device_buffer_size"] = int(cfg.device_buffer_size)
    if cfg.device_buffer_pool_limit is not None:
        values["device_buffer_pool_limit"] = cfg.device_buffer_pool_limit
    if cfg.per_thread_buffers is not None:
        values["per_thread_buffer"] = int(cfg.per_thread_buffers)
    return values
