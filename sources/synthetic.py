"""A synthetic source: generates Kernel events at a set rate. For tests, benchmarks and dry runs
of a config on a machine without a GPU; it touches no CUDA."""

from __future__ import annotations

import threading
import time

from cuptistream.config import Duration, SourceConfig, require_at_least
from cuptistream.events import Kernel
from cuptistream.plugin import Source


class SyntheticConfig(SourceConfig):
    events: int = 10_000  # total events; 0 means until stopped
    rate: float = 0.0  # events per second; 0 means as fast as possible
    chunk_events: int = 1_000  # events per hand-off
    kernel_names: int = 16  # distinct kernel names to cycle through
    duration: Duration | None = None  # stop generating after this long

    def __post_init__(self) -> None:
        require_at_least("events", self.events, 0)
        require_at_least("rate", self.rate, 0)
        require_at_least("chunk_events", self.chunk_events, 1)
        require_at_least("kernel_names", self.kernel_names, 1)


class SyntheticSource(Source):
    config_type = SyntheticConfig
    traces_cuda = False
    config: SyntheticConfig

    def start(self) -> None:
        self._stopping = threading.Event()
        self.generated = 0
        self._thread = threading.Thread(target=self._run, name=f"cuptistream-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cfg = self.config
        names = [f"synthetic_kernel_{i}" for i in range(max(cfg.kernel_names, 1))]
        began = time.monotonic()
        t = time.monotonic_ns()
        while not self._stopping.is_set():
            if cfg.duration is not None and time.monotonic() - began >= cfg.duration:
                break
            count = (
                cfg.chunk_events if cfg.events == 0 else min(cfg.chunk_events, cfg.events - self.generated)
            )
            if count <= 0:
                break
            base = self.generated
            self.emitter.emit(
                [
                    Kernel(
                        start=t + 1000 * i, end=t + 1000 * i + 500, name=names[(base + i) % len(names)],
                        device_id=0, context_id=1, stream_id=7, correlation_id=base + i + 1,
                        grid=(128, 1, 1), block=(256, 1, 1), registers_per_thread=32,
                    )
                    for i in range(count)
                ]
            )  # fmt: skip
            self.generated += count
            t += 1000 * count
            if cfg.rate > 0:
                ahead = self.generated / cfg.rate - (time.monotonic() - began)
                if ahead > 0:
                    self._stopping.wait(ahead)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the configured number of events has been generated."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        if self.config.events == 0 and self.config.duration is None:
            self._stopping.set()
        self._thread.join()
