"""``cuptistream export``: a Trace Event Format (JSON) trace for ui.perfetto.dev and chrome://tracing.

Layout: one process per observed process, keyed by (host, pid) so that the ranks of several nodes
stay apart (a pid seen on two hosts gets a second trace pid above the kernel's pid range), named with
its rank, program and host from the batch's resource and sorted by rank; one track per (device,
stream) for kernels, copies, memsets and graph launches; per thread, one track for CUDA API calls
and one for NVTX; flow arrows from each launching API call to the GPU work with its correlation id
(a graph launch to each of its kernels); counter tracks for copy throughput, for losses and per
device and PM sampling metric (each sample's value from its start); instant events for errors.
Kernel names are demangled unless ``mangled`` (``names``).

One clock: every event is placed at its Unix-epoch time (its CUPTI time plus its own batch's clock
offset), so the recordings of several ranks and hosts, read together, line up: a collective that
ends at the same moment on every rank ends at the same ``ts`` on every track. ``ts`` is in us since
``otherData.ts_base_unix_ns``, 60 s before the first batch's earliest event (a rank whose recording
starts earlier than that would get negative ``ts``).

Streaming: events are encoded as they are read and written out sorted by time, so every track's
``ts`` rises monotonically. Sorting uses bounded memory: past ``run_events`` events, the sorted run
is spilled to a temporary file next to the output, and the runs are merged at the end. Flow arrows
need both ends: the recent launches and unmatched GPU operations are kept in bounded LRU tables
(``pending``); an end that falls out of them gets no arrow.

Stacks: where the recording has the launching threads' stacks (``stacks:``), each API slice gets
its thread's stack in ``args.stack`` (outermost frame first), and the GPU work it launched the same
(a bounded table of recent launches, as for the arrows). That takes a first pass over the recording
(``cuptistream.stacks.index``).
"""

from __future__ import annotations

import gzip
import heapq
import math
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from cuptistream import events as ev
from cuptistream.analysis import records as rec
from cuptistream.analysis.names import DisplayNames
from cuptistream.analysis.select import Selection
from cuptistream.analysis.stacks import index_stacks
from cuptistream.cupti.pm_metrics import field_of, unit_of
from cuptistream.errors import UserError
from cuptistream.stacks.index import NONE_RECORDED, StackIndex

_KEY_BIAS = 1 << 62  # keys are ns since the base plus this, so they are positive fixed-width numbers
_KEY_WIDTH = 20
_SLACK_NS = 60 * 1_000_000_000  # the base sits this far before the first batch's earliest event
_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")  # API calls that put work on a GPU
_PID_SPACE = 1 << 22  # above Linux's largest pid: trace pids for a pid already used on another host

_KIND: dict[type, str] = {}
for _light, _full in [
    (rec.LKernel, ev.Kernel), (rec.LMemcpy, ev.Memcpy), (rec.LMemset, ev.Memset),
    (rec.LGraphLaunch, ev.GraphLaunch), (rec.LApiCall, ev.ApiCall), (rec.LNvtxRange, ev.NvtxRange),
    (rec.LNvtxMarker, ev.NvtxMarker), (rec.LLoss, ev.Loss), (rec.LError, ev.Error),
    (rec.LPmSamples, ev.PmSamples),
]:  # fmt: skip
    _KIND[_light] = _KIND[_full] = str(_light.__struct_config__.tag)


@dataclass
class TraceStats:
    events: int = 0  # trace events written, metadata included
    flows: int = 0  # launch -> GPU work arrows
    runs: int = 0  # sorted runs spilled to disk


@dataclass
class _Process:
    pid: int
    tracks: dict[tuple[Any, ...], int] = field(default_factory=dict)
    lost: dict[tuple[str, str, str], int] = field(default_factory=dict)
    key: tuple[str, int] = ("", 0)  # (host, pid) as recorded
    # correlation id -> its launch's stack, as slice args (recordings with stacks; bounded)
    launch_stacks: OrderedDict[int, list[str]] | None = None
    # correlation id -> GPU slices that came before their API call, held for its stack (bounded)
    held: OrderedDict[int, list[tuple[int, dict[str, Any]]]] = field(default_factory=OrderedDict)


class TraceWriter:
    """Turns batches into sorted trace events written to ``output``."""

    def __init__(
        self, output: str | Path, selection: Selection | None = None, *, run_events: int = 200_000,
        pending: int = 100_000, mangled: bool = False, stacks: StackIndex | None = None,
    ) -> None:  # fmt: skip
        self.output = Path(output)
        self.stacks = stacks if stacks is not None and stacks.has_stacks() else None  # a first pass
        self.display = DisplayNames(mangled)
        self.selection = selection or Selection()
        self.run_events = run_events
        self.pending_limit = pending
        self.stats = TraceStats()
        self.base_ns: int | None = None
        self._lines: list[bytes] = []
        self._runs: list[Path] = []
        self._processes: dict[tuple[str, int], _Process] = {}  # by (host, pid)
        self._pids: set[int] = set()
        self._next_tid = 1
        self._launches: OrderedDict[tuple[int, int], tuple[int, int]] = OrderedDict()  # -> (ts, tid)
        self._orphans: OrderedDict[tuple[int, int], list[tuple[int, int]]] = OrderedDict()
        self._encode = msgspec.json.Encoder().encode
        try:
            self._tmp = tempfile.TemporaryDirectory(prefix=".cuptistream-export-", dir=self.output.parent)
        except OSError as error:
            raise UserError(
                f"{self.output}: cannot write there: {error.strerror}; choose another -o FILE"
            ) from None

    # --- input ----------------------------------------------------------------------------------

    def add(self, part: rec.Part) -> None:
        sel = self.selection
        if not sel.accepts(part.resource):
            return
        off = part.offset_ns
        if self.base_ns is None:
            first = min((_first_time(e) for e in part.events if hasattr(e, "start") or hasattr(e, "starts")),
                        default=0)  # fmt: skip
            self.base_ns = ((first + off - _SLACK_NS) // 1_000_000_000) * 1_000_000_000
        low = high = None
        if sel.timed:
            low, high = sel.window(off, part.events)
        process = self._process(part.resource)
        shift = off - self.base_ns  # CUPTI-clock ns -> ns since the base
        devices = sel.devices
        for event in part.events:
            kind = _KIND.get(event.__class__)
            if kind is None:
                continue
            if kind in ("kernel", "memcpy", "memset", "graph_launch"):
                if devices is not None and event.device_id not in devices:
                    continue
                if low is not None and not low <= event.start + off < high:
                    continue
                self._gpu(process, kind, event, shift)
            elif kind == "api" or kind == "nvtx_range":
                if low is not None and not low <= event.start + off < high:
                    continue
                self._host(process, kind, event, shift)
            elif kind == "nvtx_marker":
                if low is not None and not low <= event.timestamp + off < high:
                    continue
                tid = self._track(process, ("nvtx", event.thread_id), f"NVTX · thread {event.thread_id}", 2)
                self._emit(event.timestamp + shift, {"ph": "i", "s": "t", "name": event.name, "cat": "nvtx",
                                                     "pid": process.pid, "tid": tid})  # fmt: skip
            elif kind == "loss":
                if low is not None and not (event.until >= low and event.since < high):
                    continue
                key = (event.stage, event.reason, event.unit)
                total = process.lost[key] = process.lost.get(key, 0) + event.count
                self._emit(event.until - self.base_ns, {
                    "ph": "C", "name": f"lost {event.unit}: {event.stage} {event.reason}", "pid": process.pid,
                    "args": {"total": total},
                })  # fmt: skip
            elif kind == "pm_samples":
                if devices is None or event.device_id in devices:
                    self._pm_counters(process, event, off, low, high)
            elif kind == "error":
                if low is not None and not low <= event.timestamp + off < high:
                    continue
                tid = self._track(process, ("errors",), "errors", 9)
                self._emit(event.timestamp + shift, {
                    "ph": "i", "s": "p", "name": f"{event.severity}: {event.message}", "cat": "error",
                    "pid": process.pid, "tid": tid, "args": {"origin": event.origin},
                })  # fmt: skip

    def _pm_counters(self, process: _Process, e: Any, off: int, low: int | None, high: int | None) -> None:
        """A counter track per device and PM sampling metric: each sample's value from its start."""
        assert self.base_ns is not None
        for metric, column in zip(e.metrics, e.values, strict=True):
            unit = unit_of(metric)
            name = f"GPU {e.device_id} · {field_of(metric) or metric}" + (f" ({unit})" if unit else "")
            for start, value in zip(e.starts, column, strict=True):
                if value is None or math.isnan(value) or (low is not None and not low <= start + off < high):
                    continue  # a sample CUPTI could not evaluate, or outside the window
                args = {unit or "value": value}
                self._emit(
                    start + off - self.base_ns, {"ph": "C", "name": name, "pid": process.pid, "args": args}
                )

    def _process(self, resource: ev.Resource) -> _Process:
        found = self._processes.get((resource.host, resource.pid))
        if found is not None:
            return found
        pid = resource.pid
        if pid in self._pids:  # the same pid on another host
            pid = _PID_SPACE + len(self._processes)
        self._pids.add(pid)
        process = self._processes[(resource.host, resource.pid)] = _Process(pid)
        process.key = (resource.host, resource.pid)
        if self.stacks is not None:
            process.launch_stacks = OrderedDict()
        who = f"rank {resource.rank} · " if resource.rank is not None else ""
        label = f"{who}{resource.process_name} (pid {resource.pid}) on {resource.host}"
        self._meta({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        order = resource.rank if resource.rank is not None else resource.pid
        self._meta({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": order}})
        return process

    def _track(self, process: _Process, key: tuple[Any, ...], name: str, order: int) -> int:
        tid = process.tracks.get(key)
        if tid is None:
            tid = process.tracks[key] = self._next_tid  # unique across processes: viewers key threads by tid
            self._next_tid += 1
            self._meta(
                {"ph": "M", "name": "thread_name", "pid": process.pid, "tid": tid, "args": {"name": name}}
            )
            self._meta({"ph": "M", "name": "thread_sort_index", "pid": process.pid, "tid": tid,
                        "args": {"sort_index": order * 1_000_000 + tid}})  # fmt: skip
        return tid

    def _gpu(self, process: _Process, kind: str, e: Any, shift: int) -> None:
        tid = self._track(
            process, ("gpu", e.device_id, e.stream_id), f"GPU {e.device_id} · stream {e.stream_id}", 0
        )
        ts = e.start + shift
        dur = max(e.end - e.start, 0)
        if kind == "kernel":
            carried = getattr(e, "demangled_name", None)  # recorded with demangle: true
            name = carried if carried and not self.display.mangled else self.display(e.name)
            args = {"correlation_id": e.correlation_id}
        elif kind == "memcpy":
            name = f"memcpy {e.copy_kind}"
            args = {
                "bytes": e.bytes,
                "src": e.src_kind,
                "dst": e.dst_kind,
                "correlation_id": e.correlation_id,
            }
            rate = e.bytes / dur if dur else 0.0  # bytes/ns == GB/s
            counter = f"memcpy {e.copy_kind} GB/s (GPU {e.device_id})"
            self._emit(ts, {"ph": "C", "name": counter, "pid": process.pid, "args": {"GB/s": round(rate, 3)}})
            self._emit(ts + dur, {"ph": "C", "name": counter, "pid": process.pid, "args": {"GB/s": 0}})
        elif kind == "memset":
            name, args = (
                "memset",
                {"bytes": e.bytes, "memory": e.memory_kind, "correlation_id": e.correlation_id},
            )
        else:
            name, args = f"graph {e.graph_id}", {"graph_id": e.graph_id, "correlation_id": e.correlation_id}
        slice_ = {"ph": "X", "name": name, "cat": kind, "pid": process.pid, "tid": tid, "dur": _us(dur),
                  "args": args}  # fmt: skip
        if process.launch_stacks is None:
            self._emit(ts, slice_)
        elif (stack := process.launch_stacks.get(e.correlation_id)) is not None:
            args["stack"] = stack
            self._emit(ts, slice_)
        else:  # its API call is still to come (another buffer): held until then
            process.held.setdefault(e.correlation_id, []).append((ts, slice_))
            if len(process.held) > self.pending_limit:
                for at, held in process.held.popitem(last=False)[1]:
                    self._emit(at, held)
        self._gpu_end(process.pid, e.correlation_id, ts, tid)

    def _host(self, process: _Process, kind: str, e: Any, shift: int) -> None:
        ts = e.start + shift
        dur = max(e.end - e.start, 0)
        if kind == "api":
            tid = self._track(process, ("api", e.thread_id), f"CUDA API · thread {e.thread_id}", 1)
            args = {"correlation_id": e.correlation_id}
            self._stack(process, e, args)
            cat = f"cuda_{e.domain}"
            self._emit(ts, {"ph": "X", "name": e.name, "cat": cat, "pid": process.pid, "tid": tid,
                            "dur": _us(dur), "args": args})  # fmt: skip
            if any(word in e.name for word in _LAUNCH_WORDS):
                self._launch(process.pid, e.correlation_id, ts, tid)
        else:
            tid = self._track(process, ("nvtx", e.thread_id), f"NVTX · thread {e.thread_id}", 2)
            name = f"{e.domain}: {e.name}" if e.domain else e.name
            self._emit(
                ts, {"ph": "X", "name": name, "cat": "nvtx", "pid": process.pid, "tid": tid, "dur": _us(dur)}
            )

    def _stack(self, process: _Process, api: Any, args: dict[str, Any]) -> None:
        """The API call's thread's Python stack, outermost frame first, on its args, kept for the
        GPU work it launched (which comes after it)."""
        if self.stacks is None or process.launch_stacks is None:
            return
        stack = self.stacks.stack_at(process.key, api.thread_id, api.start)
        if stack == NONE_RECORDED:
            return
        args["stack"] = shown = [frame.label() for frame in self.stacks.frames_of(process.key, stack)]
        process.launch_stacks[api.correlation_id] = shown
        if len(process.launch_stacks) > self.pending_limit:
            process.launch_stacks.popitem(last=False)
        for at, held in process.held.pop(api.correlation_id, ()):
            held["args"]["stack"] = shown
            self._emit(at, held)

    # --- flow arrows ----------------------------------------------------------------------------

    def _launch(self, pid: int, correlation: int, ts: int, tid: int) -> None:
        key = (pid, correlation)
        self._launches[key] = (ts, tid)
        if len(self._launches) > self.pending_limit:
            self._launches.popitem(last=False)
        for gpu_ts, gpu_tid in self._orphans.pop(key, ()):
            self._flow(pid, ts, tid, gpu_ts, gpu_tid)

    def _gpu_end(self, pid: int, correlation: int, ts: int, tid: int) -> None:
        key = (pid, correlation)
        launch = self._launches.get(key)
        if launch is not None:  # kept: a graph launch has many kernels
            self._flow(pid, launch[0], launch[1], ts, tid)
            return
        self._orphans.setdefault(key, []).append((ts, tid))
        if len(self._orphans) > self.pending_limit:
            self._orphans.popitem(last=False)

    def _flow(self, pid: int, api_ts: int, api_tid: int, gpu_ts: int, gpu_tid: int) -> None:
        self.stats.flows += 1
        ident = self.stats.flows
        self._emit(
            api_ts, {"ph": "s", "id": ident, "name": "launch", "cat": "launch", "pid": pid, "tid": api_tid}
        )
        self._emit(gpu_ts, {"ph": "f", "bp": "e", "id": ident, "name": "launch", "cat": "launch", "pid": pid,
                            "tid": gpu_tid})  # fmt: skip

    # --- sorting and writing --------------------------------------------------------------------

    def _meta(self, event: dict[str, Any]) -> None:
        self._lines.append(b"0" * _KEY_WIDTH + self._encode(event))

    def _emit(self, ns: int, event: dict[str, Any]) -> None:
        event["ts"] = _us(ns)
        key = ns + _KEY_BIAS
        self._lines.append(b"%020d" % key + self._encode(event))
        if len(self._lines) >= self.run_events:
            self._spill()

    def _spill(self) -> None:
        self._lines.sort()
        path = Path(self._tmp.name) / f"run-{len(self._runs):05d}"
        with path.open("wb") as out:
            out.write(b"\n".join(self._lines))
            out.write(b"\n")
        self._runs.append(path)
        self._lines = []
        self.stats.runs += 1

    def finish(self) -> TraceStats:
        """Merge the runs into the output file; removes the temporary files."""
        for process in self._processes.values():  # GPU slices whose API call never came
            for held in process.held.values():
                for at, slice_ in held:
                    self._emit(at, slice_)
            process.held.clear()
        try:
            with ExitStack() as stack:
                self._lines.sort()
                runs: list[Iterator[bytes]] = [iter(self._lines)]
                for path in self._runs:
                    runs.append(line.rstrip(b"\n") for line in stack.enter_context(path.open("rb")))
                with _open_output(self.output) as out:
                    self._write(out, heapq.merge(*runs))
        finally:
            self._tmp.cleanup()
        return self.stats

    def _write(self, out: BinaryIO, lines: Iterator[bytes]) -> None:
        out.write(b'{"traceEvents":[\n')
        first = True
        count = 0
        for line in lines:
            if not first:
                out.write(b",\n")
            out.write(line[_KEY_WIDTH:])
            first = False
            count += 1
        other = {
            "source": "cuptistream",
            "ts_base_unix_ns": self.base_ns,
            "ts_unit": "us since ts_base_unix_ns",
        }
        out.write(b'\n],"displayTimeUnit":"ns","otherData":' + self._encode(other) + b"}\n")
        self.stats.events = count


def _first_time(event: Any) -> int:
    starts = getattr(event, "starts", None)
    return (min(starts) if starts else 0) if starts is not None else (event.start or 0)


def _us(ns: int) -> float:
    return ns / 1000  # microseconds; ns since the base stay well inside a double's exact range


def _open_output(path: Path) -> BinaryIO:
    try:
        if path.name.endswith(".gz"):
            return gzip.open(path, "wb", compresslevel=6)  # type: ignore[return-value]
        return path.open("wb")
    except OSError as error:
        raise UserError(f"{path}: cannot write: {error.strerror}; choose another -o FILE") from None


def export_trace(
    recording: rec.Recording,
    output: str | Path,
    selection: Selection | None = None,
    *,
    run_events: int = 200_000,
    mangled: bool = False,
) -> TraceStats:
    """Write ``recording`` (what ``selection`` keeps) as a trace to ``output`` (``.gz``: gzip).
    ``recording`` may be several (``sources.Recordings``): one trace, one clock, a process per rank."""
    stacks = index_stacks(recording, selection)  # a first pass: the threads' stacks, where recorded
    writer = TraceWriter(output, selection, run_events=run_events, mangled=mangled, stacks=stacks)
    try:
        for part in recording.parts():
            writer.add(part)
    except BaseException:
        writer._tmp.cleanup()
        raise
    stats = writer.finish()
    if not stats.events:
        os.unlink(output)
        raise UserError(
            f"{recording.spec}: nothing to export with these filters; widen --since/--until or the ids"
        )
    return stats
