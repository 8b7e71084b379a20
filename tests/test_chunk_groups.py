"""A decode worker's reply is one block of memory that its chunks are views into: the memory budget
counts the whole block, its extra bytes too, until the last chunk leaves the pipeline, whichever way
each one leaves (delivered, refused, evicted, counted lost). Real Intake; the lanes' ``release`` is
called as a lane calls it."""

from __future__ import annotations

import threading

from cuptistream.pipeline.intake import Intake
from cuptistream.recording.codec import Chunk, ChunkGroup


def _reply(sizes: list[int], block: int) -> list[Chunk]:
    """Chunks of ``sizes`` bytes, views into one block of ``block`` bytes, as ``RemoteStream`` makes."""
    data = memoryview(bytearray(block))
    group = ChunkGroup(len(sizes), block)
    chunks, at = [], 0
    for size in sizes:
        chunks.append(Chunk(data[at : at + size], 1, group=group))
        at += size
    return chunks


def _intake(policy: str = "drop_newest", budget: int = 1 << 20) -> Intake:
    return Intake(budget, policy, lambda: 0)  # type: ignore[arg-type]


def test_the_block_counts_until_its_last_chunk_is_let_go() -> None:
    intake = _intake()
    a, b, c = _reply([100, 200, 300], block=1000)
    for chunk in (a, b, c):
        intake.emit_chunk(chunk)
    assert intake.held_bytes == 1000  # the 600 bytes of events and the block's other 400
    taken, _ = intake.take(lanes=1)
    assert taken == [a, b, c] and intake.held_bytes == 1000
    intake.release(a)
    intake.release(b)
    assert intake.held_bytes == 1000, "c still keeps the whole block"
    intake.release(c)
    assert intake.held_bytes == 0


def test_a_block_needs_room_for_all_of_it_and_its_other_chunks_none() -> None:
    intake = _intake("drop_newest", budget=1000)
    for chunk in _reply([300, 300], block=600):
        intake.emit_chunk(chunk)
    assert intake.held_bytes == 600
    for chunk in _reply([200, 200], block=500):  # 500 more is over 1000: refused, both
        intake.emit_chunk(chunk)
    assert intake.losses["intake", "queue_full", "events"] == 2
    assert intake.held_bytes == 600
    big = _reply([100, 900], block=1000)
    intake.take(lanes=1)
    intake.emit_chunk(big[0])  # the lanes still hold 600: no room for 1000 either
    assert intake.held_bytes == 600
    intake.emit_chunk(big[1])  # the block's first chunk was refused, so it still needs its room
    assert intake.losses["intake", "queue_full", "events"] == 4


def test_under_block_the_rest_of_a_counted_block_never_waits() -> None:
    intake = _intake("block", budget=600)
    first, second = _reply([300, 300], block=700)  # over the budget: let in only into an empty pipeline
    done = threading.Event()

    def emit() -> None:
        intake.emit_chunk(first)
        intake.emit_chunk(second)  # needs no room: waiting here would wait on itself
        done.set()

    thread = threading.Thread(target=emit, daemon=True)
    thread.start()
    assert done.wait(5), "the second chunk of a counted block waited for room"
    assert intake.held_bytes == 700
    (other,) = _reply([100], block=100)
    blocked = threading.Thread(target=intake.emit_chunk, args=(other,), daemon=True)
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive(), "a new block went in over the budget"
    taken, _ = intake.take(lanes=1)
    intake.release(taken[0])
    blocked.join(0.2)
    assert blocked.is_alive(), "half a block let go frees none of it"
    intake.release(taken[1])
    blocked.join(5)
    assert not blocked.is_alive() and intake.held_bytes == 100


def test_evicting_part_of_a_block_frees_nothing_so_drop_oldest_evicts_it_all() -> None:
    intake = _intake("drop_oldest", budget=600)
    a, b = _reply([300, 300], block=600)
    intake.emit_chunk(a)
    intake.emit_chunk(b)
    assert intake.held_bytes == 600
    (other,) = _reply([300], block=300)
    intake.emit_chunk(other)  # evicting a alone frees no memory (b keeps the block): b goes too
    assert intake.losses["intake", "queue_full", "events"] == 2
    assert intake.held_bytes == 300
    taken, _ = intake.take(lanes=0)  # counted lost, as a shutdown's leftovers are
    assert taken == [other]
    assert intake.held_bytes == 0


def test_a_chunk_alone_counts_its_own_bytes() -> None:
    intake = _intake()
    chunk = Chunk(b"x" * 100, 1)
    intake.emit_chunk(chunk)
    intake.take(lanes=2)
    chunk.holders -= 1  # the first lane let go; the last one calls release
    intake.release(chunk)
    assert intake.held_bytes == 0
