"""The private mappings that decode workers' replies land in (``pipeline.worker_replies: mapped``),
reused once nothing reads them.

A reply is megabytes of encoded events. In a mapping of its own, its memory goes back to the system
as soon as the sinks let go of it (glibc's heap keeps such pages). A fresh mapping, though, is
faulted in page by page as the reply lands, which costs several times the socket copy itself
(see docs/performance.md). So mappings are kept and handed out again:

- ``take(length)`` returns a view of ``length`` bytes of an idle mapping, its pages already in,
  or of a new one. "Idle" is checked, not assumed: a mapping that any view still points into (an event
  chunk a sink holds) cannot be resized, and that is the test, so a reply never lands on bytes
  that something still reads.
- Idle mappings beyond ``idle_bytes`` are unmapped at the next ``take``, so what the pool keeps
  resident for later is bounded. Mappings in use are the pipeline's, counted by its memory budget.

Thread-safe: every probe connection's thread takes from the one pool.
"""

from __future__ import annotations

import mmap
import threading

_ROUND = 1 << 20  # sizes are rounded up to whole MiB, so replies of similar size share mappings


def _new(length: int) -> mmap.mmap:
    # MAP_PRIVATE: Python's default anonymous mapping is shared, which only moves the pages from
    # RssAnon to RssShmem.
    size = -(-max(length, 1) // _ROUND) * _ROUND
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def is_idle(mapping: mmap.mmap) -> bool | None:
    """True if no view points into ``mapping``: resizing it (to its own size, which changes
    nothing) is refused with BufferError while any buffer is exported. None if that cannot be told
    (a platform that cannot resize such a mapping, or a closed one): the pool forgets it."""
    try:
        mapping.resize(len(mapping))
    except BufferError:
        return False
    except (OSError, SystemError, ValueError):
        return None
    return True


class ReplyMaps:
    """Mappings for replies; at most ``idle_bytes`` of them kept idle between replies."""

    def __init__(self, idle_bytes: int) -> None:
        self.idle_bytes = idle_bytes
        self._maps: list[mmap.mmap] = []  # handed out; in use or idle
        self._lock = threading.Lock()
        self.reused = 0  # replies that landed in a mapping already faulted in
        self.created = 0

    def take(self, length: int) -> memoryview:
        """A view of ``length`` bytes of a mapping that nothing else points into. The view (and
        every slice of it) keeps the mapping in use until the last one is released. Made under the
        lock, so no other thread can take the same mapping first."""
        with self._lock:
            states = [(m, is_idle(m)) for m in self._maps]
            self._maps = [m for m, state in states if state is not None]
            idle = sorted((m for m, state in states if state), key=len)
            # Not one much larger than the reply: the memory budget counts the whole mapping.
            chosen = next((m for m in idle if length <= len(m) <= 2 * length + _ROUND), None)
            kept = 0
            for mapping in idle:
                if mapping is chosen:
                    continue
                if kept + len(mapping) <= self.idle_bytes:
                    kept += len(mapping)
                else:  # beyond the bound: unmap it now (nothing points into it)
                    self._maps.remove(mapping)
                    mapping.close()
            if chosen is not None:
                self.reused += 1
            else:
                chosen = _new(length)
                self._maps.append(chosen)
                self.created += 1
            return memoryview(chosen)[:length]

    def close(self) -> None:
        """Forget every mapping; idle ones are unmapped now, the others when their last view goes."""
        with self._lock:
            for mapping in self._maps:
                if is_idle(mapping):
                    mapping.close()
            self._maps.clear()
