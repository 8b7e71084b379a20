"""Several recordings read as one: directories, files and globs (one per node, say), or Kafka topics.

``open_recordings(specs)`` is what the views read. One spec gives a plain ``Recording``; several give
``Recordings``, which reads each in turn (``parts``), or, for ``cuptistream compare``, as one stream
per writing process (``streams``), so that a caller can merge them by time and keep only the
recent past in memory.

A spec with ``*``, ``?`` or ``[`` that the shell did not expand (quoted, or a path on another node's
mount) is expanded here; a pattern that matches nothing is a ``UserError``.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import msgspec

from cuptistream.analysis.records import Part, Recording
from cuptistream.errors import UserError
from cuptistream.recording.reader import SUFFIXES
from cuptistream.recording.segments import TEMP_SUFFIX


def expand(specs: Sequence[str]) -> list[str]:
    """``specs`` with glob patterns expanded (sorted), duplicates dropped. Raises ``UserError``."""
    out: list[str] = []
    for spec in specs:
        if not spec.startswith("kafka://") and any(c in spec for c in "*?["):
            matches = sorted(glob.glob(spec))
            if not matches:
                raise UserError(f"{spec}: matches no file or directory; check the pattern")
            out.extend(matches)
        else:
            out.append(spec)
    return list(dict.fromkeys(out))


class Recordings(Recording):
    """Several recordings as one ``Recording``: ``parts`` reads them one after the other.

    ``torn_tails`` gathers every file's damage after a pass, as ``Recording`` does.
    """

    def __init__(
        self, specs: Sequence[str], *, lean: bool = False, decoder: msgspec.msgpack.Decoder[Any] | None = None
    ) -> None:  # the base __init__ is not called: each member is its own Recording
        self.spec = ", ".join(specs)
        self.members = [Recording(spec, lean=lean, decoder=decoder) for spec in specs]
        self.files = [f for m in self.members for f in m.files]
        self.torn_tails = []
        self._lean = lean
        self._decoder = decoder

    def parts(self) -> Iterator[Part]:
        self.torn_tails = []
        for member in self.members:
            yield from member.parts()
            self.torn_tails.extend(member.torn_tails)

    def streams(self) -> list[Iterator[Part]]:
        """One iterator per writing process (a file set) or Kafka topic, each in write order."""
        self.torn_tails = []
        out: list[Iterator[Part]] = []
        for member in self.members:
            if not member.files:  # a Kafka topic: one stream
                out.append(self._collect(member))
                continue
            for files in writer_groups(member.files):
                group = [Recording(str(f), lean=self._lean, decoder=self._decoder) for f in files]
                out.append(chain.from_iterable(self._collect(r) for r in group))
        return out

    def _collect(self, recording: Recording) -> Iterator[Part]:
        yield from recording.parts()
        self.torn_tails.extend(recording.torn_tails)


def writer_groups(files: Sequence[Path]) -> list[list[Path]]:
    """Files grouped by the writer that wrote them, each group in write order.

    The file sink names a segment ``{prefix}-{origin}-{start_ms}-{index:06d}{suffix}`` and keeps the
    part before ``-{index}`` for every segment of one writer; a name of another shape is its own group.
    """
    groups: dict[str, list[Path]] = {}
    for path in files:
        name = path.name.removesuffix(TEMP_SUFFIX)
        stem = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        head, _, index = stem.rpartition("-")
        key = str(path.parent / head) if head and index.isdigit() else str(path)
        groups.setdefault(key, []).append(path)
    return list(groups.values())


def open_recordings(
    specs: Sequence[str], *, lean: bool = False, decoder: msgspec.msgpack.Decoder[Any] | None = None
) -> Recording:
    """One ``Recording`` for ``specs`` (after ``expand``). Raises ``UserError`` for a bad spec."""
    expanded = expand(specs)
    if len(expanded) == 1:
        return Recording(expanded[0], lean=lean, decoder=decoder)
    return Recordings(expanded, lean=lean, decoder=decoder)
