"""Finding the records in an activity buffer and viewing them as arrays: the first two steps of
decoding (``decode`` converts them to events).

- *Layouts*: the record size of a kind is not hard-wired to a CUPTI release: it comes from CUPTI
  itself (``cuptiActivityGetStructSize``), from the stride ``cuptiActivityGetNextRecord`` reports, or
  from a fixture's recorded table. The dtype is then the newest one for that kind with exactly that
  size (``choose_dtype``).
- *Walk*: read each record's kind and step by that kind's record size, collecting each kind's runs
  of consecutive records (long runs matched in C; no per-record objects).
- *Gather*: view each kind's records as one numpy structured array (cupti-python's dtypes).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from cuptistream.cupti.kinds import BY_VALUE
from cuptistream.errors import LayoutError as LayoutError


@cache
def choose_dtype(kind: int, size: int) -> tuple[str, np.dtype[Any]] | None:
    """The newest cupti-python dtype for ``kind`` whose size is ``size``, as (record name, dtype)."""
    spec = BY_VALUE.get(kind)
    if spec is None:
        return None
    try:
        from cupti import cupti
    except ImportError:
        return None
    for name in spec.dtypes:
        dtype = getattr(cupti, f"activity_{name}_dtype", None)
        if dtype is not None and dtype.itemsize == size:
            return name, dtype
    return None


SizeLearner = Callable[[int, int], int | None]
"""``learn(kind, offset)`` → the size of the record at ``offset``, or None."""


@dataclass
class RecordLayouts:
    """Record size per kind, learned once per session and shared by every buffer."""

    sizes: dict[int, int] = field(default_factory=dict)

    def dtype(self, kind: int) -> tuple[str, np.dtype[Any]] | None:
        size = self.sizes.get(kind)
        return choose_dtype(kind, size) if size else None


def size_table(layouts: RecordLayouts) -> list[int]:
    """Record size by kind number (0: unknown), for loops that look one up per record."""
    table = [0] * (max(layouts.sizes, default=0) + 1)
    for kind, size in layouts.sizes.items():
        table[kind] = size
    return table


_SHORT_RUNS = 7  # records of a kind in a row before a run match, for a kind not known to run long
_LONG_RUN = 8  # a match of at least this many records: match that kind's next run from its second


@dataclass(slots=True)
class Runs:
    """Where one kind's records lie in a buffer: runs of consecutive records, as a flat list of
    byte bounds ``[start, stop, start, stop, ...]`` (a CUDA graph's kernels come ~50 to a run, so a
    run costs what a record did, and nothing is made per record)."""

    size: int
    bounds: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, offsets: Sequence[int], size: int) -> Runs:
        """The runs of records at ``offsets`` (ascending), ``size`` bytes each."""
        runs = cls(size)
        for offset in offsets:
            if runs.bounds and runs.bounds[-1] == offset:
                runs.bounds[-1] = offset + size
            else:
                runs.bounds += (offset, offset + size)
        return runs

    def __len__(self) -> int:
        b = self.bounds
        return (sum(b[1::2]) - sum(b[0::2])) // self.size

    def offsets(self) -> list[int]:
        """Every record's offset, in order."""
        b, size = self.bounds, self.size
        return [offset for j in range(0, len(b), 2) for offset in range(b[j], b[j + 1], size)]


def walk(
    data: memoryview, valid: int, layouts: RecordLayouts, learn: SizeLearner | None, ends: Sequence[int] = ()
) -> dict[int, list[int]]:
    """Offsets of every record in ``data[:valid]``, grouped by kind: ``walk_runs``, record by record."""
    return {kind: runs.offsets() for kind, runs in walk_runs(data, valid, layouts, learn, ends).items()}


def walk_runs(
    data: memoryview, valid: int, layouts: RecordLayouts, learn: SizeLearner | None, ends: Sequence[int] = ()
) -> dict[int, Runs]:
    """Where every record in ``data[:valid]`` lies, grouped by kind (kinds in the order they first
    appear). ``ends``: where buffers joined into ``data`` end before ``valid``, in order; a record
    must not cross one (``LayoutError``). Learns sizes it does not know through ``learn``.

    From the eighth record of a kind in a row (the second, for a kind whose last matched run was
    long), the rest of the run is matched by a regular expression over the bytes (``_run``), one C
    call: a training loop's kernels come dozens to a run between API records, and record by record
    they would be the largest part of a worker's decode. Buffers whose kinds alternate, or
    come in short runs, are walked record by record."""
    sizes = layouts.sizes
    table = size_table(layouts)
    limit = len(table)
    ints = data[: valid - valid % 4].cast("i")
    found: dict[int, Runs] = {}
    bounds: list[list[int] | None] = [None] * limit  # per kind, its ``Runs.bounds``
    # Per kind, how many in a row before the rest of a run is matched: 7, or 1 while its last
    # matched run was long (a CUDA graph's kernels: matching from the second record saves 6 steps
    # a run); never 1 for kinds in short runs, where a match per run costs more than its steps.
    after = [_SHORT_RUNS] * limit
    offset = 0
    for end in (*ends, valid):
        last = run_start = -1  # the kind of the run being walked, and where it began
        while offset < end:
            kind = ints[offset >> 2]
            size = table[kind] if 0 <= kind < limit else 0
            if not size:
                size = (learn(kind, offset) if learn else None) or 0
                if not size:
                    raise LayoutError(f"no record size known for activity kind {kind} at offset {offset}")
                sizes[kind] = size
                if kind >= limit:
                    grow = kind + 1 - limit
                    table += [0] * grow
                    bounds += [None] * grow
                    after += [_SHORT_RUNS] * grow
                    limit = len(table)
                table[kind] = size
            if kind != last:
                if last >= 0:
                    bounds[last] += (run_start, offset)  # type: ignore[operator]
                if bounds[kind] is None:
                    bounds[kind] = found.setdefault(kind, Runs(size)).bounds
                last = kind
                run_start = offset
            elif (
                offset - run_start >= after[kind] * size
                and size > 4
                and (match := _run(kind, size).match(data, offset, end)) is not None
            ):
                # The eighth of a kind in a row: the rest of its run matched in one C call (~0.5-1
                # us a call, ~30 ns a record, where a step here is ~100-200 ns). No match: the record
                # overruns ``end``, which the step below reports.
                stop = match.end()
                after[kind] = 1 if stop - offset >= _LONG_RUN * size else _SHORT_RUNS
                offset = stop
                continue
            offset += size
        if offset != end:
            raise LayoutError(f"records overrun the buffer: walked to {offset}, valid bytes {end}")
        if last >= 0:
            bounds[last] += (run_start, offset)  # type: ignore[operator]
    return found


@cache
def _run(kind: int, size: int) -> re.Pattern[bytes]:
    """Matches a run of records of ``kind``: its 4 bytes, the rest of a record, repeated."""
    return re.compile(b"(?:" + re.escape(struct.pack("<i", kind)) + b".{%d})+" % (size - 4), re.DOTALL)


def gather(data: memoryview, runs: Runs, dtype: np.dtype[Any]) -> np.ndarray:
    """The records of ``runs`` as one structured array (a view where they are one run)."""
    size = dtype.itemsize
    if len(runs.bounds) == 2:  # one contiguous run: no copy
        start, stop = runs.bounds
        return np.ndarray(((stop - start) // size,), dtype=dtype, buffer=data, offset=start)
    bounds = np.array(runs.bounds, dtype=np.int64).reshape(-1, 2)
    counts = (bounds[:, 1] - bounds[:, 0]) // size
    count = int(counts.sum())
    # Each record's offset: its run's start, plus ``size`` times its place in the run.
    before = np.cumsum(counts) - counts  # records in the runs before each run
    starts = np.repeat(bounds[:, 0] - before * size, counts) + np.arange(count, dtype=np.int64) * size
    # View the buffer as overlapping rows of one record's length, one row starting at every word
    # (8, 4 or 1 bytes: the widest that every offset and the size are multiples of), pick whole
    # rows, then view them as records. Picking through the structured dtype itself copies field by
    # field: ~7x slower for a 216-byte kernel record.
    word = next(w for w in (8, 4, 1) if size % w == 0 and not (bounds[:, 0] % w).any())
    unit = np.dtype(f"<u{word}")
    positions = (len(data) - size) // word + 1
    rows = np.ndarray((positions, size // word), dtype=unit, buffer=data, offset=0, strides=(word, word))
    return rows[starts // word].view(dtype).reshape(count)
