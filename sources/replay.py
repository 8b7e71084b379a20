"""The replay source: feeds captured CUPTI activity buffers through the same decoder and emitter as
the live activity source. For CI and for trying cuptistream where there is no GPU.

``path`` is a capture file or a directory of them (``*.cupti``); by default the fixtures committed
under ``tests/fixtures/``, which were captured on an H100 (see that folder's README). ``loops``
replays them that many times (0: until stopped); ``interval`` waits between buffers.

``stop()`` finishes a finite replay before it returns, so a short program under ``cuptistream run``
still gets every captured event; an endless one (``loops: 0``) stops at the next buffer.
"""

from __future__ import annotations

import threading
from pathlib import Path

from cuptistream.component import Emitter, Source
from cuptistream.config import Duration, SourceConfig
from cuptistream.cupti import capture
from cuptistream.cupti.decode import Decoder, LayoutError, RecordLayouts
from cuptistream.cupti.names import TableNames
from cuptistream.errors import UserError

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
_EVENTS_PER_EMIT = 8192


class ReplayConfig(SourceConfig):
    path: str = ""  # a capture file or a directory of *.cupti files; "" = the committed fixtures
    loops: int = 1  # 0 = until stopped
    interval: Duration = Duration(0.0)  # pause between buffers
    demangle: bool = False

    def __post_init__(self) -> None:
        if self.loops < 0:
            raise ValueError("loops must be 0 (endless) or more")


def capture_files(path: str) -> list[Path]:
    """The capture files ``path`` names. Raises ``UserError`` when there are none."""
    root = Path(path) if path else DEFAULT_PATH
    files = sorted(root.glob("*.cupti")) if root.is_dir() else [root] if root.is_file() else []
    if not files:
        raise UserError(
            f"replay: no capture files (*.cupti) at {root}; set `path` to a capture file or folder"
        )
    return files


class ReplaySource(Source):
    config_type = ReplayConfig
    config: ReplayConfig

    def __init__(self, config: SourceConfig, emitter: Emitter) -> None:
        super().__init__(config, emitter)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.events_emitted = 0

    def start(self) -> None:
        try:
            self.captures = [capture.read(p) for p in capture_files(self.config.path)]
        except ValueError as error:
            raise UserError(f"replay: {error}") from None
        self._thread = threading.Thread(target=self._run, name=f"cuptistream-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        loop = 0
        while True:
            for cap in self.captures:
                self._replay(cap)
            loop += 1
            finite = self.config.loops > 0
            if (finite and loop >= self.config.loops) or (not finite and self._stopping.is_set()):
                return

    def _replay(self, cap: capture.Capture) -> None:
        # A fresh decoder per pass: each capture is its own session (its own names and open ranges).
        decoder = Decoder(
            TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)), self.config.demangle
        )
        for buf in cap.buffers:
            if buf.dropped:
                self.emitter.report_loss("cupti", "cupti_buffer_dropped", buf.dropped, unit="records")
            try:
                events = decoder.decode(buf.data, len(buf.data))
            except LayoutError as error:
                self.emitter.report_error(f"source:{self.name}", f"{cap.name}: {error}")
                continue
            for i in range(0, len(events), _EVENTS_PER_EMIT):
                self.emitter.emit(events[i : i + _EVENTS_PER_EMIT])
            self.events_emitted += len(events)
            if self.config.interval and self._stopping.wait(self.config.interval) and not self.config.loops:
                return

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
