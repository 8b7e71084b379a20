"""Threads that each take a piece of memory, fill it with their own byte and read it back: any other
byte means two threads were handed the same memory at once (``ReplyMaps``, ``ReplySlots``)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def overlapping_writes(
    take: Callable[[], memoryview | None], threads: int = 8, rounds: int = 100
) -> list[str]:
    """What went wrong: one line per round in which a thread found another's bytes in its piece.
    ``take`` returns a writable piece for the calling thread, or None (nothing free: skipped)."""
    errors: list[str] = []

    def work(tag: int) -> None:
        for _ in range(rounds):
            view = take()
            if view is None:
                continue
            view[:] = bytes([tag]) * len(view)
            if view.tobytes() != bytes([tag]) * len(view):
                errors.append(f"thread {tag}: another thread wrote into its piece")
            del view

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return errors
