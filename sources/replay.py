"""The replay source: hands captured CUPTI activity buffers to the collector exactly as the live
activity source hands CUPTI's (shared-memory slots, decoded in the collector with the capture's
string table). For CI and for trying cuptistream where there is no GPU.

``path`` is a capture file or a directory of them (``*.cupti``); by default the captures shipped
in the package (``sources/captures/``, installed as ``cuptistream/sources/captures/``), which were
captured on a Hopper GPU (see ``tests/fixtures/README.md``). ``loops``
replays them that many times (0: until stopped); ``interval`` waits between buffers.
``buffer_size`` packs the captured buffers back to back into buffers of up to that size (records
stay whole and in order), as CUPTI fills the activity source's ``buffer_size`` on a busy GPU: the
captures' own buffers hold about a thousand records, a full 4 MiB one about thirty times more, so
the collector's per-buffer costs weigh as they do live.

``stop()`` finishes a finite replay before it returns, so a short program under ``cuptistream run``
still gets every captured event; an endless one (``loops: 0``) stops at the next buffer.

It traces on demand (``plugin.OnDemand``, ``cuptistream trace``): ``open_window`` marks the buffers
replayed from now for ``seconds`` as a window of every capture's stream, a ``TraceSpan`` opening it
and one closing it behind its last buffer. Times are the replayed CUPTI clock's.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cuptistream.channel.messages import OpenStream, TraceSpan
from cuptistream.channel.outlet import ActivityOutlet
from cuptistream.config import Duration, Size, SourceConfig
from cuptistream.cupti import capture
from cuptistream.cupti.kinds import BY_VALUE
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
    buffer_size: Size | None = None  # None: each captured buffer as captured; a size: packed into these

    def __post_init__(self) -> None:
        if self.loops < 0:
            raise ValueError("loops must be 0 (endless) or more")
        if self.buffer_size is not None and not 64 * 1024 <= self.buffer_size <= 256 * 1024 * 1024:
            raise ValueError(f"buffer_size must be between 64KiB and 256MiB, got {int(self.buffer_size)}")


def capture_files(path: str) -> list[Path]:
    """The capture files ``path`` names. Raises ``UserError`` when there are none."""
    root = Path(path) if path else DEFAULT_PATH
    files = sorted(root.glob("*.cupti")) if root.is_dir() else [root] if root.is_file() else []
    if not files:
        raise UserError(
            f"replay: no capture files (*.cupti) at {root}; set `path` to a capture file or folder"
        )
    return files


class _Pack:
    """Captured buffers joined into one (``buffer_size``), and the records CUPTI dropped in them."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.nbytes = 0
        self.dropped = 0

    def add(self, data: bytes, dropped: int) -> None:
        self.parts.append(data)
        self.nbytes += len(data)
        self.dropped += dropped

    def take(self) -> tuple[bytes, int]:
        data, dropped = b"".join(self.parts), self.dropped
        self.parts, self.nbytes, self.dropped = [], 0, 0
        return data, dropped


@dataclass
class _Window:
    number: int
    request: int
    start: int  # replayed CUPTI clock, ns
    ends: float  # time.monotonic() when it closes


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
        self._packs: list[_Pack] = []  # per outlet, with ``buffer_size``: the buffer being filled
        self._kinds: list[list[str]] = []  # per outlet: the capture's activity kinds, by name
        # On-demand windows: opened on the probe's control thread, closed on the replay thread.
        self._windows_lock = threading.Lock()
        self._open: list[_Window] = []
        self._windows = 0
        self._finished = False
        self._wake = threading.Event()  # a window opened or the source stops: re-plan the pause

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
            size = max([len(b.data) for b in cap.buffers] + [int(self.config.buffer_size or 0)]) or 64 * 1024
            self._packs.append(_Pack())
            self._outlets.append(self.emitter.open_activity_stream(stream, size + (-size) % 8, _BUFFERS))
            self._kinds.append(
                sorted(BY_VALUE[k].name if k in BY_VALUE else str(k) for k in cap.struct_sizes)
            )
        self._thread = threading.Thread(target=self._run, name=f"cuptistream-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._replay_loops()
            for outlet, pack in zip(self._outlets, self._packs, strict=True):
                self._send(outlet, *pack.take())
        finally:
            self._close_windows(math.inf, finished=True)  # a window still open ends with the replay

    def _replay_loops(self) -> None:
        loop = 0
        while True:
            for cap, outlet, pack in zip(self.captures, self._outlets, self._packs, strict=True):
                if not self._replay(cap, outlet, pack):
                    return
            loop += 1
            finite = self.config.loops > 0
            if (finite and loop >= self.config.loops) or (not finite and self._stopping.is_set()):
                return

    def _replay(self, cap: capture.Capture, outlet: ActivityOutlet, pack: _Pack) -> bool:
        """Hand over every buffer of one capture; False when an endless replay should stop."""
        limit = int(self.config.buffer_size or 0)
        for buf in cap.buffers:
            if not limit or len(buf.data) % 8:  # as captured (records are 8-byte aligned; keep them so)
                self._send(outlet, buf.data, buf.dropped)
            else:
                if pack.nbytes + len(buf.data) > limit:
                    self._send(outlet, *pack.take())
                pack.add(buf.data, buf.dropped)
            self._close_windows(time.monotonic())
            if self.config.interval and self._pause(float(self.config.interval)) and not self.config.loops:
                return False
        return True

    def _send(self, outlet: ActivityOutlet, data: bytes, dropped: int) -> None:
        if not data and not dropped:
            return
        if outlet.write(data, dropped):
            self.buffers_sent += 1
        else:
            self.emitter.report_loss(f"source:{self.name}", "no_free_buffer", 1, unit="buffers")

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` between buffers, closing the windows that end meanwhile (on time, not at
        the next buffer). True: ``stop`` was asked."""
        ends = time.monotonic() + seconds
        while not self._stopping.is_set():
            now = time.monotonic()
            next_close = self._close_windows(now)
            if now >= ends:
                return False
            self._wake.wait(min(ends, next_close) - now)
            self._wake.clear()
        return True

    # --- on demand (``plugin.OnDemand``) ------------------------------------------------------

    def open_window(self, seconds: float, request: int, metrics: str = "") -> int:
        """Mark the buffers replayed from now for ``seconds`` as window ``request`` of every
        capture's stream. Raises ``RuntimeError`` once the replay has finished (nothing to trace),
        or for ``metrics`` (recorded buffers have no kernels to measure)."""
        if metrics:
            raise RuntimeError("a replay has no kernels to measure: --metrics needs the activity source")
        if not 0 < seconds < math.inf:
            raise ValueError(f"a window needs a finite length > 0 s, not {seconds}")
        with self._windows_lock:  # the spans go out under it: an open always precedes its close
            if self._finished or self._thread is None:
                raise RuntimeError("the replay has finished; nothing is left to trace")
            self._windows += 1
            window = _Window(self._windows, request, self._now(), time.monotonic() + seconds)
            self._send_spans(window, end=0)
            self._open.append(window)
        self._wake.set()
        return len(self._outlets)

    def _close_windows(self, now: float, finished: bool = False) -> float:
        """Close the windows that end by ``now`` (a ``time.monotonic()``; inf: all), each behind the
        buffers written so far. Returns when the next one ends (inf: none open). ``finished``: the
        replay ended, and no window opens after these close."""
        with self._windows_lock:
            self._finished = self._finished or finished
            due = [w for w in self._open if w.ends <= now]
            if due:
                end = self._now()
                for window in due:
                    self._open.remove(window)
                    self._send_spans(window, end=max(end, window.start + 1))
            return min((w.ends for w in self._open), default=math.inf)

    def _send_spans(self, window: _Window, end: int) -> None:
        """One ``TraceSpan`` per capture's stream (``end`` 0: the window opens)."""
        for outlet, kinds in zip(self._outlets, self._kinds, strict=True):
            span = TraceSpan(
                stream=0, window=window.number, start=window.start, end=end, kinds=kinds, on_demand=True,
                request=window.request,
            )  # fmt: skip
            outlet.send_trace_span(span)

    def _now(self) -> int:
        clock = self.clock
        return clock() if clock is not None else time.monotonic_ns()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for outlet in self._outlets:
            outlet.close()
