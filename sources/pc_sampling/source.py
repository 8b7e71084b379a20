"""``PcSamplingSource``: starts and stops PC sampling, builds the parts that attach contexts, keep the
schedule, drain and adapt, and hands them CUPTI's resource callbacks (contexts and modules)."""

from __future__ import annotations

import threading
from typing import Any

from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.cupti.contexts import (
    CONTEXT_CREATED,
    CONTEXT_DESTROY_STARTING,
    MODULE_LOADED,
    MODULE_UNLOAD_STARTING,
    active_primary_contexts,
    current_context,
    module_data,
)
from cuptistream.cupti.cubin_archive import CubinArchive
from cuptistream.events import ResourceChange
from cuptistream.overhead import Governor

from ..cupti_worker import CuptiWorkerSource
from .adapt import Adaptation
from .attach import Contexts
from .config import PcSamplingConfig
from .context import SampledContext
from .drain import Drains
from .schedule import Schedule
from .windows import Windows


class PcSamplingSource(CuptiWorkerSource):
    config_type = PcSamplingConfig
    config: PcSamplingConfig
    label = "PC sampling"
    _governor: Governor | None = None

    def use_governor(self, governor: Governor) -> None:
        self._governor = governor

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        from cuptistream.cupti import driver

        driver.require_gpu()
        self._start()

    def _start(self) -> None:
        self._sampled: dict[int, SampledContext] = {}  # ctx -> its state: attach adds, detach removes
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._cubins = CubinArchive(self.config.cubin_dir)
        # Counters, and seconds spent in GetData and in decoding (what the bench reads to see the cost).
        self.stats: dict[str, float] = {
            "batches": 0, "samples": 0, "dropped": 0, "pcs": 0, "get_data_calls": 0,
            "get_data_s": 0.0, "decode_s": 0.0, "launch_actions": 0, "launch_action_s": 0.0,
            "function_names": 0, "control_s": 0.0, "windows": 0,
        }  # fmt: skip
        self._windows = Windows(self.config, self._governor, self.name, self.stats, self._now)
        self._hold_cupti(float(self.config.watchdog_timeout))
        # The parts share the sampled contexts, the counters, the watchdog and the worker's wake-up.
        self._adaptation = Adaptation(self.config, self.emitter, self._origin)
        self._drains = Drains(
            self._sampled, self._adaptation, self.stats, self.emitter, self._now,
            self._watchdog, self._watched, self._wake,
        )  # fmt: skip
        self._contexts = Contexts(
            self.config, self._sampled, self._windows, self._adaptation, self._drains, self.emitter,
            self._origin, self._watchdog, self._watched, self._wake,
        )  # fmt: skip
        self._schedule = Schedule(
            self._contexts, self._windows, self._adaptation, self._drains, self._cubins, self.stats,
            self.emitter, self._origin, self._watchdog, self._watched, self._stopping, self._wake,
        )  # fmt: skip
        try:
            if self.config.control == "launch":
                self._schedule.control_from_launches()
            self._register_resource_callbacks(
                [
                    (CONTEXT_CREATED, self._on_context_created),
                    (CONTEXT_DESTROY_STARTING, self._on_context_destroy),
                    (MODULE_LOADED, self._on_module_loaded),
                    (MODULE_UNLOAD_STARTING, self._on_module_unload),
                ]
            )
            for ctx in {current_context(), *active_primary_contexts()} - {0}:
                self._contexts.attach(ctx)
        except BaseException:
            self._release()
            raise
        self._start_worker(self._schedule.run)

    def flush(self) -> None:
        for state in list(self._sampled.values()):
            self._drains.drain(state)
        self._drains.decode_filled()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=float(self.config.watchdog_timeout))
        if self._schedule.hook is not None:
            self._schedule.hook.disarm()
        for state in list(self._sampled.values()):
            self._contexts.detach(state)
        self._drains.decode_filled()
        self._cubins.write()
        self._release()

    def _release(self) -> None:
        if self._schedule.hook is not None:
            self._schedule.hook.disarm()
        super()._release()

    # --- resource callbacks (application thread, inside the CUDA call) -------------------------

    def _on_context_created(self, domain: int, cbid: int, data: Any) -> None:
        if not self._stopping.is_set():
            self._contexts.attach(int(data.context))

    def _on_context_destroy(self, domain: int, cbid: int, data: Any) -> None:
        state = self._sampled.get(int(data.context))
        if state is not None:
            self._contexts.detach(state)

    def _on_module_loaded(self, domain: int, cbid: int, data: Any) -> None:
        self._module_event("module_load", data)

    def _on_module_unload(self, domain: int, cbid: int, data: Any) -> None:
        # Continuous mode: drain before the module goes, so no PC is attributed to a later module
        # loaded at the same address (guide §2.10.4).
        state = self._sampled.get(int(data.context))
        if state is not None:
            self._drains.drain(state)
        self._module_event("module_unload", data)

    def _module_event(self, operation: str, data: Any) -> None:
        module_id, size, cubin = module_data(int(data.resource_descriptor))
        crc = 0
        if cubin and size:
            try:
                crc = pcs.cubin_crc_at(cubin, size)
            except pcs.CuptiError as error:
                self.emitter.report_error(self._origin, f"cubin CRC: {error}", severity="warning")
            self._cubins.keep(crc, cubin, size)
        state = self._sampled.get(int(data.context))
        self.emitter.emit(
            [
                ResourceChange(
                    operation=operation,
                    timestamp=self._now(),
                    device_id=state.device_id if state else 0,
                    context_id=state.context_id if state else 0,
                    module_id=module_id,
                    cubin_crc=crc,
                    cubin_size=size,
                )
            ]
        )
