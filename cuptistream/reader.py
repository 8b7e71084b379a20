"""The public reader: the events in files written by the file sink (or a crashed writer's leftovers).

    from cuptistream.events import Kernel
    from cuptistream.reader import read

    reader = read("cuptistream-out")              # a directory of segments, or one file
    kernels = [e for e in reader if isinstance(e, Kernel)]
    for batch in reader.batches():                # or whole Batches, with resource and clock
        ...
    reader.torn_tails                             # [] unless a writer died mid-write

``read`` handles all three formats by suffix: ``.msgpack.zst``, ``.jsonl.zst`` and ``.jsonl``, each
optionally followed by ``.tmp`` (a segment still being written, or left by a killed writer).
A directory is read in name order, which is write order for each writing process.

A file that ends inside a frame or batch (a writer killed mid-write) has a *torn tail*. Every
complete batch before it is returned; the tail is recorded in ``Reader.torn_tails`` and reported
with ``warnings.warn(TornTailWarning(...))``, or raised as ``TornTailError`` with ``strict=True``.
A file that is not ours raises ``UserError`` with one line naming it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import msgspec

from cuptistream import jsonl
from cuptistream.codec import decode_batch
from cuptistream.errors import UserError
from cuptistream.events import AnyEvent, Batch
from cuptistream.framing import TornTail, iter_frames
from cuptistream.segments import TEMP_SUFFIX

__all__ = ["SUFFIXES", "Reader", "TornTail", "TornTailError", "TornTailWarning", "read"]

SUFFIXES = (".msgpack.zst", ".jsonl.zst", ".jsonl")


class TornTailWarning(UserWarning):
    """A file ended inside a frame or batch; the complete ones before it were read."""

    def __init__(self, tail: TornTail) -> None:
        super().__init__(tail.describe())
        self.tail = tail


class TornTailError(UserError):
    """Raised instead of ``TornTailWarning`` when reading with ``strict=True``."""

    def __init__(self, tail: TornTail) -> None:
        super().__init__(tail.describe())
        self.tail = tail


def _format(path: Path) -> str | None:
    name = path.name.removesuffix(TEMP_SUFFIX)
    return next((suffix for suffix in SUFFIXES if name.endswith(suffix)), None)


class Reader:
    """Iterates the events (or, with ``batches()``, the Batches) of ``files`` in order.

    Each pass reads the files again; ``torn_tails`` holds the tails found by the latest pass.
    """

    def __init__(self, files: list[Path], *, strict: bool = False) -> None:
        self.files = files
        self.strict = strict
        self.torn_tails: list[TornTail] = []

    def __iter__(self) -> Iterator[AnyEvent]:
        for batch in self.batches():
            yield from batch.events

    def batches(self) -> Iterator[Batch]:
        self.torn_tails = []
        for path in self.files:
            yield from self._read_file(path)

    def _torn(self, tail: TornTail) -> None:
        if self.strict:
            raise TornTailError(tail)
        self.torn_tails.append(tail)
        warnings.warn(TornTailWarning(tail), stacklevel=3)

    def _read_file(self, path: Path) -> Iterator[Batch]:
        fmt = _format(path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise UserError(f"{path}: cannot read: {error.strerror}") from None
        if fmt == ".jsonl":
            yield from self._read_jsonl(path, data)
            return
        for index, item in enumerate(iter_frames(data, str(path))):
            if isinstance(item, TornTail):
                if item.offset == 0 and not data.startswith(b"\x28\xb5\x2f\xfd"):
                    raise UserError(f"{path}: not a cuptistream file (it does not start with a zstd frame)")
                self._torn(item)
                return
            if fmt == ".jsonl.zst":
                yield from self._read_jsonl(path, item, frame=index)
                continue
            try:
                yield decode_batch(item)
            except msgspec.DecodeError as error:
                raise UserError(f"{path}: frame {index} is not a cuptistream batch ({error})") from None

    def _read_jsonl(self, path: Path, data: bytes, frame: int | None = None) -> Iterator[Batch]:
        where = f"{path}" if frame is None else f"{path}: frame {frame}"
        try:
            for item in jsonl.iter_batches(data):
                if isinstance(item, jsonl.Incomplete):
                    if frame is not None:  # a complete frame always holds whole batches
                        raise UserError(f"{where}: ends inside a batch; not a cuptistream file")
                    self._torn(TornTail(str(path), item.offset, len(data) - item.offset))
                    return
                yield item
        except jsonl.JsonlError as error:
            raise UserError(f"{where}: {error}; not a cuptistream file") from None


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if p.is_file() and _format(p)), key=lambda p: p.name)
        if not files:
            raise UserError(
                f"{path}: no cuptistream files here (expected names ending in {', '.join(SUFFIXES)})"
            )
        return files
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if not _format(path):
        raise UserError(f"{path}: not a cuptistream file (expected a name ending in {', '.join(SUFFIXES)})")
    return [path]


def read(path: str | Path, *, strict: bool = False) -> Reader:
    """Open a file or a directory of segments for reading. Raises ``UserError`` if there is
    nothing of ours there; reading raises ``UserError`` on a file that is not ours."""
    return Reader(_files(Path(path)), strict=strict)
