"""The ``callbacks`` source's config: the domains and API functions it traces, and how it buffers."""

from __future__ import annotations

from typing import Literal

import msgspec

from cuptistream.config import Duration, SourceConfig, require_at_least, require_positive
from cuptistream.cupti import api_functions

CallbackDomainName = Literal["resource", "synchronize", "nvtx", "runtime", "driver"]

# Launches, copies, sets and synchronizations: what a performance engineer reads first, at a
# fraction of the cost of every API call: each traced call costs the launching thread a callback.
DEFAULT_RUNTIME_API = [
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaGraphLaunch",
    "cudaMemcpy", "cudaMemcpyAsync", "cudaMemset", "cudaMemsetAsync",
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
]  # fmt: skip
DEFAULT_DRIVER_API = [
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
    "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyAsync",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
]  # fmt: skip


class CallbacksConfig(SourceConfig):
    domains: list[CallbackDomainName] = msgspec.field(
        default_factory=lambda: ["resource", "synchronize", "nvtx"]
    )
    # API functions traced when "runtime" / "driver" is in ``domains``: patterns (globs) over CUPTI's
    # function names, the rule of ``cupti.api_functions`` that the activity source uses too.
    runtime_api: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_RUNTIME_API))
    driver_api: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_DRIVER_API))
    flush_interval: Duration = Duration(0.5)  # how often the worker hands records to the pipeline
    max_buffered: int = 1_000_000  # records held between hand-offs; beyond that they are dropped
    chunk_events: int = 4096  # events per hand-off
    nvtx_injection: bool = True  # set NVTX_INJECTION64_PATH to libcupti when nvtx is enabled

    def __post_init__(self) -> None:
        for domain, patterns in (("runtime", self.runtime_api), ("driver", self.driver_api)):
            if domain in self.domains:
                api_functions.check_patterns(domain, patterns)
        require_positive("flush_interval", self.flush_interval)
        require_at_least("max_buffered", self.max_buffered, 1)
        require_at_least("chunk_events", self.chunk_events, 1)
