"""Property-based fuzzing of recordings: truncation, bit flips, overwrites, garbage, foreign frames and
decompression bombs, in any mix. Whatever the damage, reading never raises, never returns a batch
that was not written, returns every frame the damage did not touch, and accounts for every byte of
the file as an intact frame or a reported damaged range. Settings: helpers/fuzzing.py."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
from helpers.batchgen import batch_bytes
from helpers.fuzzing import FUZZ
from helpers.zstd_craft import rle_frame
from hypothesis import given
from hypothesis import strategies as st

from cuptistream.recording.codec import encode_batch_object
from cuptistream.recording.framing import Damage, Frame, FrameEncoder, scan_frames
from cuptistream.recording.reader import Reader

pytestmark = pytest.mark.slow  # scripts/test.sh --all and CI run it

LIMIT = 1 << 20  # max_frame_bytes for these tests: bombs go far past it, batches stay far below
ENCODER = FrameEncoder(level=1)
# Batches of 0..6 events, written once: Hypothesis picks among them.
BATCHES = [batch_bytes(seq, seq % 7, kinds=True) for seq in range(12)]
FRAMES = [ENCODER.frame(b) for b in BATCHES]


@dataclass
class Piece:
    data: bytes
    batch: int | None  # the index of the batch if the piece is an intact frame


def damaged_frame(draw: st.DrawFn, frame: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "cut", "overwrite", "insert"]))
    data = bytearray(frame)
    if kind == "flip":
        for position in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
            data[position] ^= 1 << draw(st.integers(0, 7))
    elif kind == "cut":
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif kind == "overwrite":
        start = draw(st.integers(0, len(data) - 1))
        data[start : start + draw(st.integers(1, 64))] = draw(st.binary(min_size=1, max_size=64))
    else:
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=64))
    return bytes(data)


def hostile_piece(draw: st.DrawFn) -> bytes:
    """Bytes between frames: garbage, a frame that is not a batch, a bomb, frame magic."""
    kind = draw(st.sampled_from(["garbage", "foreign", "bomb", "magic"]))
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=200))
    if kind == "foreign":
        return ENCODER.frame(draw(st.binary(max_size=100)))
    if kind == "bomb":
        size = draw(st.integers(LIMIT + 1, 1 << 32))
        return rle_frame(min(size, 64 * LIMIT), declare=draw(st.booleans()))
    return b"\x28\xb5\x2f\xfd" + draw(st.binary(max_size=20))


@st.composite
def recordings(draw: st.DrawFn) -> list[Piece]:
    pieces: list[Piece] = []
    for index in draw(st.lists(st.integers(0, len(FRAMES) - 1), max_size=8)):
        if draw(st.integers(0, 5)) == 0:
            pieces.append(Piece(hostile_piece(draw), None))
        if draw(st.integers(0, 3)) == 0:
            pieces.append(Piece(damaged_frame(draw, FRAMES[index]), None))
        else:
            pieces.append(Piece(FRAMES[index], index))
    if draw(st.booleans()):
        pieces.append(Piece(hostile_piece(draw), None))
    return pieces


def expected_batches(pieces: list[Piece], cut: int | None) -> list[int]:
    """The batches of intact frames that end before ``cut`` (where the file was truncated)."""
    kept, offset = [], 0
    for piece in pieces:
        offset += len(piece.data)
        if piece.batch is not None and (cut is None or offset <= cut):
            kept.append(piece.batch)
    return kept


@FUZZ
@given(pieces=recordings(), cut_at=st.none() | st.floats(0, 1))
def test_damaged_recordings_keep_every_intact_frame(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[Piece], cut_at: float | None
) -> None:
    data = b"".join(p.data for p in pieces)
    cut = None if cut_at is None else int(len(data) * cut_at)
    data = data if cut is None else data[:cut]

    # The scanner: frames and damage tile the file exactly, in order; no payload over the bound.
    position, batch_bytes_total = 0, 0
    for item in scan_frames(data, max_frame_bytes=LIMIT):
        assert item.offset == position
        position += item.length
        if isinstance(item, Frame):
            assert len(item.payload) <= LIMIT
            batch_bytes_total += item.length if item.payload in BATCHES else 0
        else:
            assert item.length > 0
    assert position == len(data)

    # The reader, from a real file: the intact frames' batches, in order, and nothing else.
    path = tmp_path_factory.mktemp("fuzz") / "r.msgpack.zst"
    path.write_bytes(data)
    reader = Reader([path], max_frame_bytes=LIMIT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [encode_batch_object(b) for b in reader.batches()]
    want = expected_batches(pieces, cut)
    assert _subsequence([BATCHES[i] for i in want], got)  # every intact frame is recovered...
    assert all(b in BATCHES for b in got)  # ...and nothing that was not written comes back
    # Every corruption is reported: each byte is in a frame read as a batch or in a reported range.
    assert sum(d.length for d in reader.damage) + batch_bytes_total == len(data)
    assert all(d.path == str(path) and "\n" not in d.describe() for d in reader.damage)


def _subsequence(needed: list[bytes], got: list[bytes]) -> bool:
    """``needed`` appears in ``got`` in order (damaged frames may still yield their batch: a flip of
    zstd's unused header bit changes nothing)."""
    remaining = iter(got)
    return all(any(item == candidate for candidate in remaining) for item in needed)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    position = 0
    for item in scan_frames(data, max_frame_bytes=LIMIT):
        assert item.offset == position
        position += item.length
    assert position == len(data)


@FUZZ
@given(
    payloads=st.lists(st.binary(max_size=3000), max_size=6),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=3),
)
def test_a_flipped_frame_never_returns_changed_bytes(
    payloads: list[bytes], flips: list[tuple[float, int]]
) -> None:
    """Any payload, any flipped bits: every frame returned is byte-exact a written payload."""
    data = bytearray(b"".join(ENCODER.frame(p) for p in payloads))
    if not data:
        return
    for where, bit in flips:
        data[int(where * len(data))] ^= 1 << bit
    for item in scan_frames(bytes(data), max_frame_bytes=LIMIT):
        assert isinstance(item, Damage) or item.payload in payloads
