"""``CallbackSource``: registers the recorder's handlers with CUPTI's subscriber and hands what they
record to the emitter in chunks from a worker thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cuptistream.config import SourceConfig
from cuptistream.cupti import api_functions, subscriber
from cuptistream.cupti.driver import enable_nvtx_injection
from cuptistream.cupti.subscriber import Domain, Registration
from cuptistream.plugin import Source

from .builder import EventBuilder
from .config import CallbacksConfig
from .ids import CuptiIds
from .recorder import Recorder
from .structs import RESOURCE_CBIDS


class CallbackSource(Source):
    config_type = CallbacksConfig
    config: CallbacksConfig

    def __init__(self, config: SourceConfig, emitter: Any, *, cupti: Any = None, ids: CuptiIds | None = None,
                 sub: subscriber.Subscriber | None = None) -> None:  # fmt: skip
        super().__init__(config, emitter)
        self._cupti = cupti
        self._ids = ids
        self._subscriber = sub or subscriber.get()
        self._registrations: list[Registration] = []
        self._wanted: list[tuple[int, Callable[[int, int, Any], None], int | None]] = []
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._drain_lock = threading.Lock()
        self._reported_drops = 0
        self._reported_handler_errors = 0
        self.recorder: Recorder | None = None

    def start(self) -> None:
        cfg = self.config
        cupti = self._cupti or _import_cupti()
        ids = self._ids or CuptiIds(cupti)
        api_names = self._api_names()
        recorder = self.recorder = Recorder(ids, cfg.max_buffered)
        self._builder = EventBuilder(recorder, api_names)
        if "nvtx" in cfg.domains and cfg.nvtx_injection:
            enable_nvtx_injection()
        wanted: list[tuple[int, Callable[[int, int, Any], None], int | None]] = []
        if "resource" in cfg.domains:  # only the cbids it turns into events, not the whole domain
            wanted += [(Domain.RESOURCE, recorder.on_resource, cbid) for cbid in sorted(RESOURCE_CBIDS)]
        if "synchronize" in cfg.domains:
            wanted.append((Domain.SYNCHRONIZE, recorder.on_synchronize, None))
        if "nvtx" in cfg.domains:
            wanted.append((Domain.NVTX, recorder.on_nvtx, None))
        wanted += [(domain, recorder.on_api, cbid) for domain, cbid in sorted(api_names)]
        self._wanted = wanted
        self._register()
        self.clock = ids.now
        self._thread = threading.Thread(target=self._run, name=f"cuptistream-{self.name}", daemon=True)
        self._thread.start()

    def _api_names(self) -> dict[tuple[int, int], str]:
        """(domain, cbid) → function name of every API function to trace."""
        cfg = self.config
        names: dict[tuple[int, int], str] = {}
        for domain_name, domain, patterns in (
            ("runtime", Domain.RUNTIME_API, cfg.runtime_api),
            ("driver", Domain.DRIVER_API, cfg.driver_api),
        ):
            if domain_name in cfg.domains:
                all_names = api_functions.api_names(domain_name)
                for cbid in api_functions.select_cbids(domain_name, patterns):
                    names[(int(domain), cbid)] = all_names[cbid]
        return names

    def _run(self) -> None:
        while not self._stopping.wait(self.config.flush_interval):
            self.flush()

    def flush(self) -> None:
        """Hand everything recorded so far to the emitter. Never raises: failures become Error events."""
        recorder = self.recorder
        if recorder is None:
            return
        with self._drain_lock:
            try:
                while True:
                    records = recorder.take(self.config.chunk_events)
                    if not records:
                        break
                    self.emitter.emit(self._builder.build(records))
                self._report_counts(recorder)
            except Exception as error:
                self.emitter.report_error(f"source:{self.name}", f"callback worker failed: {error}")

    def _report_counts(self, recorder: Recorder) -> None:
        dropped = recorder.dropped
        if dropped > self._reported_drops:
            self.emitter.report_loss(f"source:{self.name}", "buffer_full", dropped - self._reported_drops)
            self._reported_drops = dropped
        errors = self._subscriber.handler_errors()
        if errors > self._reported_handler_errors:
            self.emitter.report_error(
                f"source:{self.name}",
                f"{errors - self._reported_handler_errors} CUPTI callback(s) failed and were skipped; "
                f"first: {self._subscriber.last_handler_error()}",
            )
            self._reported_handler_errors = errors

    def _register(self) -> None:
        try:
            for domain_id, handler, one in self._wanted:
                self._registrations.append(self._subscriber.register(domain_id, handler, one))
        except BaseException:
            self._unregister()
            raise

    def pause(self) -> None:
        """Let another tool have CUPTI's subscriber (``cuptistream.probe.coexist``); what was
        recorded is handed over."""
        self._unregister()
        self.flush()

    def resume(self) -> None:
        """Register again. Raises ``SubscriberBusy`` while the other tool keeps the subscriber."""
        if not self._registrations:
            self._register()

    def _unregister(self) -> None:
        for reg in self._registrations:
            reg.remove()
        self._registrations.clear()

    def stop(self) -> None:
        self._unregister()  # no callbacks after this, so the last drain is complete
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()


def _import_cupti() -> Any:
    from cuptistream.cupti.subscriber import CuptiUnavailable

    try:
        from cupti import cupti
    except ImportError as error:
        raise CuptiUnavailable(
            f"cupti-python is not installed ({error}); `pip install cupti-python`"
        ) from None
    return cupti
