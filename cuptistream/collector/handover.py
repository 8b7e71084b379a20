"""Moving a ``DecodeStream`` to another process: its whole state as bytes, and back.

When ``auto`` starts another decode worker for a busy one, some of the busy worker's connections
move to it (``worker_pool``). A stream keeps everything it holds across the move: the statistics
of intervals not yet emitted, open trace windows and NVTX ranges, learned record sizes, the name
cache and its counters. So a moved probe's events and statistics are what they would have been
on one worker (``tests/test_decode_moves.py``).

The state is a pickle. It only ever travels between the collector and the decode workers it
started, over their private socket pairs, so nothing untrusted is unpickled. What belongs to the
process rather than the stream stays behind and is supplied where the stream lands: the emitter
and device callback it reports to, and the program's ``/proc/PID/mem`` (its fd cannot be pickled;
the collector opens it again for the new worker). A stream that captures its buffers is not
moved (``movable``): its state is every buffer so far.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import Any

from cuptistream.collector.decoding import DecodeStream
from cuptistream.collector.names import ProcessNames
from cuptistream.plugin import Emitter

_EMITTER, _ON_DEVICES = "emitter", "on_devices"


def movable(stream: DecodeStream) -> bool:
    """Whether ``stream`` can move (``dump``): not while it captures its buffers."""
    return not stream.info.capture


def dump(stream: DecodeStream) -> bytes:
    """``stream``'s state. The stream is spent after this: close its names (``names``) and drop it."""
    names = stream.names

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if obj is stream.emitter:
                return _EMITTER
            if obj is stream._on_devices and obj is not None:  # (None is everywhere in a pickle)
                return _ON_DEVICES
            if obj is names and isinstance(names, ProcessNames):
                return ("names", names.pid, names.seen, names.unresolved, names.failure)
            return None

    out = io.BytesIO()
    Pickler(out, pickle.HIGHEST_PROTOCOL).dump(stream)
    return out.getvalue()


def load(
    state: bytes,
    emitter: Emitter,
    on_devices: Callable[[set[int]], None] | None,
    opened: tuple[int | None, str | None] | None = None,
) -> DecodeStream:
    """The stream ``dump`` gave ``state`` for, reporting to ``emitter`` and ``on_devices`` here.
    ``opened``: ``names.open_memory(pid)`` for a stream that reads the program's memory (its fd is
    the stream's now), None to open it here. Raises what unpickling raises."""

    used: list[ProcessNames] = []

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            if pid == _EMITTER:
                return emitter
            if pid == _ON_DEVICES:
                return on_devices
            if used:  # the stream's names, referred to again (by its decoder, its statistics)
                return used[0]
            _, process, seen, unresolved, failure = pid
            names = ProcessNames(process, opened)
            used.append(names)
            names.seen, names.unresolved = seen, unresolved
            names.failure = names.failure or failure
            return names

    try:
        stream = Unpickler(io.BytesIO(state)).load()
        if not isinstance(stream, DecodeStream):
            raise TypeError(f"a handed-over stream is a {type(stream).__name__}")
    except BaseException:
        for names in used:
            names.close()
        raise
    finally:
        if not used and opened is not None and opened[0] is not None:
            os.close(opened[0])  # a stream with a string table: the fd was not needed
    return stream
