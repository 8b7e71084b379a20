"""The replay source: hands captured CUPTI activity buffers to the collector exactly as the live
activity source hands CUPTI's (shared-memory slots, decoded in the collector with the capture's
string table). For CI and for trying cuptistream where there is no GPU.

``path`` is a capture file or a directory of them (``*.cupti``); by default the captures shipped
in the package (``sources/captures/``, installed as ``cuptistream/sources/captures/``), which were
captured on a Hopper GPU (see ``tests/fixtures/README.md``). ``loops``
replays them that many times (0: until stopped); ``interval`` waits between buffers.

``stop()`` finishes a finite replay before it returns, so a short program under ``cuptistream run``
still gets every captured event; an endless one (``loops: 0``) stops at the next buffer.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cuptistream.channel.messages import OpenStream
from cuptistream.channel.outlet import ActivityOutlet
from cuptistream.config import Duration, SourceConfig
from cuptistream.cupti import capture
from cuptistream.errors import UserError
from cuptistream.plugin import Emitter, Source

# Package data (pyproject.toml), so a plain `pip install` replays them; the tests read them here too.
DEFAULT_PATH = Path(__file__).resolve().parent / "captures"
_BUFFERS = 4  # shared-memory slots per capture


class ReplayConfig(SourceConfig):
    path: str = ""  # a capture file or a directory of *.cupti files; "" = the shipped captures
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
    traces_cuda = False
    config: ReplayConfig

    def __init__(self, config: SourceConfig, emitter: Emitter) -> None:
        super().__init__(config, emitter)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.buffers_sent = 0
        self._outlets: list[ActivityOutlet] = []

    def start(self) -> None:
        try:
            self.captures = [capture.read(p) for p in capture_files(self.config.path)]
        except ValueError as error:
            raise UserError(f"replay: {error}") from None
        # The replayed clock: CUPTI's at capture time, paired with the Unix clock as it was then.
        offset = self.captures[0].offset_ns
        self.clock = lambda: time.time_ns() - offset
        for cap in self.captures:  # one decode stream per capture: its own names and NVTX ranges
            stream = OpenStream(
                stream=0, source=self.name, device=cap.device, cupti_version=cap.cupti_version,
                struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings), demangle=self.config.demangle,
            )  # fmt: skip
            size = max((len(b.data) for b in cap.buffers), default=64 * 1024)
            self._outlets.append(self.emitter.open_activity_stream(stream, size + (-size) % 8, _BUFFERS))
        self._thread = threading.Thread(target=self._run, name=f"cuptistream-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        loop = 0
        while True:
            for cap, outlet in zip(self.captures, self._outlets, strict=True):
                if not self._replay(cap, outlet):
                    return
            loop += 1
            finite = self.config.loops > 0
            if (finite and loop >= self.config.loops) or (not finite and self._stopping.is_set()):
                return

    def _replay(self, cap: capture.Capture, outlet: ActivityOutlet) -> bool:
        """Hand over every buffer of one capture; False when an endless replay should stop."""
        for buf in cap.buffers:
            if outlet.write(buf.data, buf.dropped):
                self.buffers_sent += 1
            else:
                self.emitter.report_loss(f"source:{self.name}", "no_free_buffer", 1, unit="buffers")
            if self.config.interval and self._stopping.wait(self.config.interval) and not self.config.loops:
                return False
        return True

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for outlet in self._outlets:
            outlet.close()
