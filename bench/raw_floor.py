"""CPU per activity record of the collector's per-buffer data path today, against a raw-buffer file.

    taskset -c 1 python bench/raw_floor.py [--rounds 5] [--seconds 1] [--captures PATH ...]

What storing CUPTI's activity buffers as they come (zstd over the buffer bytes, decoded only when
the file is read) would save the collector against today's decode, per record end to end. Per
buffer, in this thread's CPU time, three paths over captured buffers (default: W3's 4 MiB buffers,
``tests/fixtures/w3_stream.cupti``, and the shipped ``sources/captures``):

A (today): ``DecodeStream.decode`` as a decode worker runs it (``Decoder.decode_packed`` with the
  stream's statistics observer, then ``Accumulator.buffer_done``), then the chunks cut into batches
  as a lane cuts them (``BatchConfig`` defaults: 8192 events, 4 MiB) and each batch's pieces
  compressed into one zstd level-1 frame with content size and checksum, the way the file sink
  does (``FrameEncoder.frame``, one context shared by all writes; the batch header, ~100 bytes a
  batch, left out).
B (raw): the same stream with ``records: on_demand`` and no window open, so it runs
  ``Decoder.observe`` with the same observer; plus the name pointers not seen before resolved (a
  raw file's string table); plus one zstd level-1 frame of ``bytes(buffer[:valid])``.
W: ``Decoder.observe`` without an observer: the walk and gather alone, B's floor.

Pieces are timed inside each buffer (the statistics: observer and ``buffer_done``; B's name
lookups), each with two reads of the thread's CPU clock, which cost about a microsecond on a VM:
A0 and B0 run A and B without them, timing whole passes only, for honest totals. Each pass over a
data set starts fresh streams, one per capture, as a session does (replayed timestamps never move
on, so a stream kept across passes would fold them into intervals already seen); a small data set
thus pays a session's setup (first statistics tables, first names) on every pass. Each round runs
every path for about ``--seconds``, the order of the paths alternating between rounds; the table
shows ns per record, median [min .. max] over rounds. Every sample goes to ``--out`` (default
``bench/out/raw_floor.json``); the last lines are the headline rows: per data set, A's and B's
whole-pass ns per record and A0/B0 within each round, median [min..max].
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuptistream.channel.messages import OpenStream
from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.collector.decoding import DecodeStream
from cuptistream.config.model import BatchConfig, StatisticsConfig
from cuptistream.cupti import capture
from cuptistream.cupti.names import Names, TableNames
from cuptistream.cupti.records import RecordLayouts, walk
from cuptistream.plugin import Emitter
from cuptistream.recording.codec import Chunk, array_header
from cuptistream.recording.framing import FrameEncoder

ROOT = Path(__file__).resolve().parent.parent
W3 = ROOT / "tests/fixtures/w3_stream.cupti"  # made by bench/capture_stream.py
SHIPPED = ROOT / "sources/captures"
BATCH = BatchConfig()  # the lanes' batch limits
STRING_FIELDS = ("name", "domain", "source", "cache_path")  # records' const char * columns
PATHS = ("A", "B", "W", "A0", "B0")  # A0, B0: A and B without the clock reads inside a pass
now = time.thread_time_ns
Clock = Callable[[], int]


def no_clock() -> int:
    return 0


@dataclass
class DataSet:
    name: str
    captures: list[capture.Capture]
    buffers: list[tuple[int, memoryview]]  # (capture index, a writable copy, as a shared-memory slot is)
    records: int
    nbytes: int


def load(path: Path) -> DataSet:
    files = sorted(path.glob("*.cupti")) if path.is_dir() else [path]
    caps = [capture.read(file) for file in files]
    buffers = [(i, memoryview(bytearray(b.data))) for i, cap in enumerate(caps) for b in cap.buffers]
    count = sum(
        len(offsets)
        for i, view in buffers
        for offsets in walk(view, len(view), RecordLayouts(dict(caps[i].struct_sizes)), None).values()
    )
    return DataSet(path.name, caps, buffers, count, sum(len(view) for _, view in buffers))


class _Sink(Emitter):
    """The decode stream's emitter: keeps the chunks of the buffer being decoded."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    def emit_chunk(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)

    def report_loss(self, stage: str, reason: str, count: int, unit: str = "events") -> None:
        raise AssertionError(f"loss {stage}/{reason}: {count} {unit}")

    def report_error(self, origin: str, message: str, severity: str = "error", result_code: int = 0) -> None:
        raise AssertionError(f"{origin}: {message}")


class NewNames:
    """A raw file's string table: each name pointer the records carry, resolved the first time it
    turns up (a binary search per record against the pointers known so far)."""

    def __init__(self, names: Names) -> None:
        self.names = names
        self.known = np.zeros(0, np.int64)
        self.table: dict[int, str] = {}

    def add(self, records: np.ndarray) -> None:
        for field in STRING_FIELDS:
            if field not in (records.dtype.names or ()):
                continue
            column = records[field]
            known = self.known
            if len(known):
                at = np.minimum(np.searchsorted(known, column), len(known) - 1)
                column = column[known[at] != column]
            if len(column):
                fresh = np.unique(column)
                self.table.update((p, self.names(p)) for p in fresh.tolist() if p)
                self.known = np.union1d(known, fresh)


def _stream(
    cap: capture.Capture, records: str, sink: _Sink, spent: dict[str, int], clock: Clock
) -> DecodeStream:
    """A decode stream wired as a decode worker wires it (statistics on, their defaults), its
    statistics timed into ``spent["stats"]`` with ``clock``."""
    info = OpenStream(
        stream=0, source="bench", device=cap.device, cupti_version=cap.cupti_version,
        struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings), records=records,
    )  # fmt: skip
    stream = DecodeStream(info, os.getpid(), sink, statistics=StatisticsConfig())
    observe, accumulator = stream.decoder.observer, stream.statistics
    assert observe is not None and accumulator is not None
    buffer_done = accumulator.buffer_done

    def timed_observe(kind: int, event: str, records: np.ndarray) -> None:
        start = clock()
        observe(kind, event, records)
        spent["stats"] += clock() - start

    def timed_done() -> list:
        start = clock()
        closed = buffer_done()
        spent["stats"] += clock() - start
        return closed

    stream.decoder.observer = timed_observe
    accumulator.buffer_done = timed_done  # type: ignore[method-assign]
    return stream


def run_a(data: DataSet, spent: dict[str, int], encoder: FrameEncoder, clock: Clock) -> None:
    sink = _Sink()
    streams = [_stream(cap, "all", sink, spent, clock) for cap in data.captures]
    for index, view in data.buffers:
        start = clock()
        streams[index].decode(view, len(view), 0)
        decoded = clock()
        out = sum(len(encoder.frame(pieces)) for pieces in _batches(sink.chunks))
        spent["compress"] += clock() - decoded
        spent["decode"] += decoded - start
        spent["payload_bytes"] += sum(len(chunk.payload) for chunk in sink.chunks)
        spent["out_bytes"] += out
        sink.chunks.clear()


def _batches(chunks: list[Chunk]) -> Iterator[list[bytes | memoryview]]:
    """The pieces of each batch a lane would cut from ``chunks`` (the events' array and payloads)."""
    batch: list[Chunk] = []
    events = nbytes = 0  # the batch's totals, kept as the lane keeps them
    for chunk in chunks:
        if batch and (events + chunk.count > BATCH.max_events or nbytes + chunk.nbytes > BATCH.max_bytes):
            yield [array_header(events), *(c.payload for c in batch)]
            batch, events, nbytes = [], 0, 0
        batch.append(chunk)
        events += chunk.count
        nbytes += chunk.nbytes
    if batch:
        yield [array_header(events), *(c.payload for c in batch)]


def run_b(data: DataSet, spent: dict[str, int], encoder: FrameEncoder, clock: Clock) -> None:
    sink = _Sink()
    streams = [_stream(cap, "on_demand", sink, spent, clock) for cap in data.captures]
    for stream in streams:
        stats, table = stream.decoder.observer, NewNames(stream.names)
        assert stats is not None

        def observer(
            kind: int, event: str, records: np.ndarray, stats: Callable = stats, table: NewNames = table
        ) -> None:
            stats(kind, event, records)
            start = clock()
            table.add(records)
            spent["names"] += clock() - start

        stream.decoder.observer = observer
    for index, view in data.buffers:
        valid = len(view)
        start = clock()
        streams[index].decode(view, valid, 0)
        decoded = clock()
        frame = encoder.frame(bytes(view[:valid]))
        spent["compress"] += clock() - decoded
        spent["decode"] += decoded - start
        spent["out_bytes"] += len(frame)
    assert not sink.chunks and sum(s.records_withheld for s in streams) == data.records


def run_w(data: DataSet, spent: dict[str, int], encoder: FrameEncoder, clock: Clock) -> None:
    decoders = [Decoder(TableNames(c.strings), RecordLayouts(dict(c.struct_sizes))) for c in data.captures]
    for index, view in data.buffers:
        start = clock()
        decoders[index].observe(view, len(view))
        spent["decode"] += clock() - start


RUNS = {"A": run_a, "B": run_b, "W": run_w, "A0": run_a, "B0": run_b}


def measure(path: str, data: DataSet, passes: int, encoder: FrameEncoder) -> dict[str, float]:
    """Per record over ``passes`` passes: ns of each piece and of whole passes, and bytes."""
    pieces = ("pass", "decode", "stats", "names", "compress", "payload_bytes", "out_bytes")
    spent = dict.fromkeys(pieces, 0)
    clock = no_clock if path.endswith("0") else now
    for _ in range(passes):
        start = now()
        RUNS[path](data, spent, encoder, clock)
        spent["pass"] += now() - start
    return {piece: value / (passes * data.records) for piece, value in spent.items()}


ROWS = (  # path, piece, label
    ("A", "decode", "DecodeStream.decode (decode_packed + stats)"),
    ("A", "stats", "  of which statistics"),
    ("A", "compress", "zstd-1 of the batches' pieces"),
    ("A", "total", "total"),
    ("B", "decode", "DecodeStream.decode (observe + stats + names)"),
    ("B", "stats", "  of which statistics"),
    ("B", "names", "  of which new names"),
    ("B", "walk", "  the rest (walk + gather)"),
    ("B", "compress", "zstd-1 of bytes(buffer[:valid])"),
    ("B", "total", "total"),
    ("A0", "pass", "A's total, no clock reads inside (whole passes)"),
    ("B0", "pass", "B's total, no clock reads inside (whole passes)"),
    ("W", "decode", "Decoder.observe, no observer (walk + gather)"),
)


def report(data: DataSet, samples: dict[str, list[dict[str, float]]]) -> None:
    for rows in samples.values():
        for sample in rows:
            sample["total"] = sample["decode"] + sample["compress"]
            sample["walk"] = sample["decode"] - sample["stats"] - sample["names"]
    print(
        f"\n{data.name}: {len(data.buffers)} buffers, {data.records} records, "
        f"{data.nbytes / data.records:.1f} B/record raw"
    )
    print(f"  {'path':4} {'piece':48} {'ns/record':>9}  [min .. max]")
    for path, piece, label in ROWS:
        values = [sample[piece] for sample in samples[path]]
        median = statistics.median(values)
        print(f"  {path:4} {label:48} {median:9.1f}  [{min(values):.1f} .. {max(values):.1f}]")
    a, b = samples["A"][0], samples["B"][0]
    print(
        f"  bytes/record: A msgpack {a['payload_bytes']:.1f} -> zstd {a['out_bytes']:.1f}; "
        f"B raw {data.nbytes / data.records:.1f} -> zstd {b['out_bytes']:.1f}; "
        f"B/A compressed {b['out_bytes'] / a['out_bytes']:.2f}; "
        f"A0/B0 (medians) {_median(samples['A0'], 'pass') / _median(samples['B0'], 'pass'):.2f}"
    )
    ratios = [x["pass"] / y["pass"] for x, y in zip(samples["A0"], samples["B0"], strict=True)]
    print(
        f"  A0/B0 within each round: {statistics.median(ratios):.2f} [{min(ratios):.2f} .. {max(ratios):.2f}]"
    )


def _median(samples: list[dict[str, float]], piece: str) -> float:
    return statistics.median(sample[piece] for sample in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per path and round")
    parser.add_argument("--captures", type=Path, nargs="+", default=[W3, SHIPPED], help="files or folders")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "raw_floor.json")
    args = parser.parse_args()

    encoder = FrameEncoder(level=1)  # the file sink's default level; one context for every write
    sets = [load(path) for path in args.captures]
    passes: dict[tuple[str, str], int] = {}
    for data in sets:
        for path in PATHS:  # a warm-up pass, which also sizes the rounds
            start = now()
            measure(path, data, 1, encoder)
            passes[(data.name, path)] = max(1, math.ceil(args.seconds * 1e9 / max(now() - start, 1)))
    start = now()
    for _ in range(1000):
        now()
    print(f"clock read {(now() - start) / 1000:.0f} ns; {args.rounds} rounds, ~{args.seconds:g} s per path")

    samples: dict[str, dict[str, list[dict[str, float]]]] = {d.name: {p: [] for p in PATHS} for d in sets}
    for round_ in range(args.rounds):
        for data in sets:
            for path in PATHS if round_ % 2 == 0 else reversed(PATHS):
                samples[data.name][path].append(measure(path, data, passes[(data.name, path)], encoder))
    for data in sets:
        report(data, samples[data.name])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(samples))
    print(f"\nwrote {args.out}")
    for data in sets:
        print(headline(data, samples[data.name]))


def headline(data: DataSet, samples: dict[str, list[dict[str, float]]]) -> str:
    def mmm(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}..{max(values):{fmt}}]"

    ratios = [x["pass"] / y["pass"] for x, y in zip(samples["A0"], samples["B0"], strict=True)]
    return (
        f"{data.name}: today (A0) {mmm([s['pass'] for s in samples['A0']], '.0f')} ns/record, "
        f"raw (B0) {mmm([s['pass'] for s in samples['B0']], '.0f')} ns/record, A0/B0 {mmm(ratios, '.2f')}"
    )


if __name__ == "__main__":
    main()
