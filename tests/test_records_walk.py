"""What ``records.walk`` does with a real capture that has an unknown or torn record in the middle.

``test_activity_decode`` checks the walk on clean captures and on a three-record buffer; these pin
the rest of its contract on real buffers, the contract any faster walk must keep: which
sizes it asks the learner for, and where; what it leaves in the layouts; which error it raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cuptistream.cupti import capture
from cuptistream.cupti.records import LayoutError, RecordLayouts, walk
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures

UNKNOWN = 3  # a kind none of the captures holds


def _outcome(
    data: bytes, valid: int, sizes: dict[int, int], learned: dict[int, int] | None = None
) -> tuple[Any, dict[int, int], list[tuple[int, int]]]:
    """What the walk returns (or raises), the sizes it leaves, and what it asked the learner."""
    layouts = RecordLayouts(dict(sizes))
    asked: list[tuple[int, int]] = []

    def learn(kind: int, offset: int) -> int | None:
        asked.append((kind, offset))
        return learned.get(kind) if learned is not None else None

    try:
        result: Any = walk(memoryview(data), valid, layouts, learn if learned is not None else None)
    except LayoutError as error:
        result = str(error)
    return result, layouts.sizes, asked


@pytest.fixture(scope="module")
def buffer() -> tuple[bytes, dict[int, int], list[tuple[int, int]]]:
    """exact_counts' buffer (167 KB, 1695 records), its sizes, and its records as (offset, kind)."""
    cap = capture.read(CAPTURES / "exact_counts.cupti")
    data, sizes = bytes(cap.buffers[0].data), dict(cap.struct_sizes)
    assert UNKNOWN not in sizes
    found = walk(memoryview(data), len(data), RecordLayouts(dict(sizes)), None)
    return data, sizes, sorted((offset, kind) for kind, at in found.items() for offset in at)


def _with_kind(data: bytes, offset: int, kind: int) -> bytes:
    patched = bytearray(data)
    patched[offset : offset + 4] = np.int32(kind).tobytes()
    return bytes(patched)


def _deep_in_a_run(records: list[tuple[int, int]]) -> int:
    """The index of a record 100 records into the capture's longest run of one kind (577 kernels):
    where a walk that steps over runs in bulk would be, and must still notice an odd record."""
    start, best, length = 0, (0, 0), 0
    for i, (_, kind) in enumerate(records):
        length = length + 1 if i and kind == records[i - 1][1] else 1
        start = i - length + 1
        best = max(best, (length, start))
    assert best[0] > 150
    return best[1] + 100


@pytest.mark.parametrize("where", ["middle", "deep in a run"])
def test_unknown_kind_in_the_middle_is_learned_there_or_reported(
    buffer: tuple[bytes, dict[int, int], list[tuple[int, int]]], where: str
) -> None:
    data, sizes, records = buffer
    offset, kind = records[len(records) // 2 if where == "middle" else _deep_in_a_run(records)]
    patched = _with_kind(data, offset, UNKNOWN)

    message, left, asked = _outcome(patched, len(patched), sizes)
    assert message == f"no record size known for activity kind {UNKNOWN} at offset {offset}"
    assert left == sizes and asked == []  # no learner: nothing asked, nothing learned

    found, left, asked = _outcome(patched, len(patched), sizes, {UNKNOWN: sizes[kind]})
    assert asked == [(UNKNOWN, offset)] and left == {**sizes, UNKNOWN: sizes[kind]}
    expected: dict[int, list[int]] = {}
    for at, was in records:  # the same records, that one now of the unknown kind
        expected.setdefault(UNKNOWN if at == offset else was, []).append(at)
    assert list(found.items()) == list(expected.items())  # kinds in order of first appearance

    message, left, asked = _outcome(patched, len(patched), sizes, {})  # a learner that cannot tell
    assert message.startswith(f"no record size known for activity kind {UNKNOWN} at offset {offset}")
    assert asked == [(UNKNOWN, offset)] and left == sizes


@pytest.mark.parametrize("where", ["middle", "deep in a run"])
def test_a_header_of_another_size_or_a_torn_end_is_reported(
    buffer: tuple[bytes, dict[int, int], list[tuple[int, int]]], where: str
) -> None:
    data, sizes, records = buffer
    offset, kind = records[len(records) // 2 if where == "middle" else _deep_in_a_run(records)]
    longer = max(sizes, key=sizes.__getitem__)  # steps past the next record's header, into its fields
    assert sizes[longer] > sizes[kind]
    message, left, _ = _outcome(_with_kind(data, offset, longer), len(data), sizes)
    assert isinstance(message, str) and message.startswith("no record size known for activity kind ")
    assert left == sizes

    last = records[-1][0]
    message, _, _ = _outcome(data, last + 8, sizes)  # the last record torn after 8 bytes
    assert message == f"records overrun the buffer: walked to {len(data)}, valid bytes {last + 8}"

    run_end, run_kind = records[_deep_in_a_run(records)]  # a buffer that ends inside a run, mid-record
    message, _, _ = _outcome(data, run_end + 8, sizes)
    walked = run_end + sizes[run_kind]
    assert message == f"records overrun the buffer: walked to {walked}, valid bytes {run_end + 8}"


@pytest.mark.parametrize("shift", [0, 4, 1])  # records at 8-byte, 4-byte and byte offsets
def test_gather_picks_each_record_whole_wherever_it_starts(shift: int) -> None:
    """``gather`` copies rows of machine words, not fields: every record it returns must hold
    exactly the bytes at its offset, for offsets on 8-byte, 4-byte and odd boundaries."""
    from cuptistream.cupti.records import Runs, gather

    dtype = np.dtype({"names": ["kind", "start", "name"], "formats": ["<u4", "<u8", "<u8"],
                      "offsets": [0, 8, 16], "itemsize": 24})  # fmt: skip
    rng = np.random.default_rng(7)
    data = bytearray(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    offsets = [shift + 24 * i + (8 * (i // 3)) for i in range(40)]  # gaps: not one contiguous run
    picked = gather(memoryview(data), Runs.of(offsets, 24), dtype)
    assert picked.dtype == dtype and len(picked) == len(offsets)
    for record, offset in zip(picked, offsets, strict=True):
        assert record.tobytes() == bytes(data[offset : offset + 24])


def test_runs_are_the_walks_records_run_by_run(
    buffer: tuple[bytes, dict[int, int], list[tuple[int, int]]],
) -> None:
    """``walk_runs`` gives each kind's records as maximal runs: expanded, they are ``buffer``'s
    records of that kind; no run starts where the kind's run before it stops (they would be one);
    and ``gather`` over the runs picks the same records as over their offsets one by one."""
    from cuptistream.cupti.records import Runs, gather, walk_runs

    data, sizes, records = buffer
    runs = walk_runs(memoryview(data), len(data), RecordLayouts(dict(sizes)), None)
    assert {kind for _, kind in records} == set(runs)
    many = 0
    for kind, found in runs.items():
        offsets = [offset for offset, k in records if k == kind]
        assert found.offsets() == offsets and len(found) == len(offsets)
        starts, stops = found.bounds[0::2], found.bounds[1::2]
        assert all(stop < start for stop, start in zip(stops, starts[1:], strict=False))
        assert Runs.of(offsets, sizes[kind]).bounds == found.bounds
        many += len(starts) > 1
        dtype = RecordLayouts(dict(sizes)).dtype(kind)
        if dtype is not None:
            picked = gather(memoryview(data), found, dtype[1])
            assert [r.tobytes() for r in picked] == [data[o : o + sizes[kind]] for o in offsets]
    assert many  # the capture's kinds interleave: some kind comes in more than one run
