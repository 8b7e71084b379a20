"""The public reader: the events in files written by the file sink (or a crashed writer's leftovers).

    from cuptistream.events import Kernel
    from cuptistream.recording.reader import read

    reader = read("cuptistream-out")              # a directory of segments, or one file
    kernels = [e for e in reader if isinstance(e, Kernel)]
    for batch in reader.batches():                # or whole Batches, with resource and clock
        ...
    reader.damage                                 # [] unless a file was torn, corrupt or not ours

``read`` handles all three formats by suffix: ``.msgpack.zst``, ``.jsonl.zst`` and ``.jsonl``, each
optionally followed by ``.tmp`` (a segment still being written, or left by a killed writer).
A directory is read in name order, which is write order for each writing process.

Damage never stops the reader: a file that ends inside a frame (a writer killed mid-write: a *torn
tail*), a frame whose checksum does not match, bytes that are not a frame, a frame that would
decompress past ``max_frame_bytes``, a frame that is not a batch, a file that is not ours or cannot
be read: each is recorded in ``Reader.damage`` with its file and offset, reported with
``warnings.warn(DamageWarning(...))`` (or raised as ``DamageError`` with ``strict=True``), and
reading goes on with the next intact frame and the next file. Memory stays within about one frame.
Only a single file given by name that holds nothing of ours raises ``UserError``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from cuptistream.errors import DamageError as DamageError
from cuptistream.errors import UserError
from cuptistream.events import AnyEvent, Batch
from cuptistream.recording import jsonl
from cuptistream.recording.codec import decode_batch
from cuptistream.recording.framing import MAX_FRAME_BYTES, TORN, Damage, Frame, TornTail, scan_frames
from cuptistream.recording.segments import TEMP_SUFFIX

__all__ = [
    "MAX_FRAME_BYTES", "SUFFIXES", "Damage", "DamageError", "DamageWarning", "Reader", "TornTail",
    "TornTailError", "TornTailWarning", "read",
]  # fmt: skip

SUFFIXES = (".msgpack.zst", ".jsonl.zst", ".jsonl")
NOT_OURS = "not a cuptistream file"


class DamageWarning(UserWarning):
    """Part of a file held no intact batch; every intact one around it was read."""

    def __init__(self, damage: Damage) -> None:
        super().__init__(damage.describe())
        self.damage = damage
        self.tail = damage  # the name from before checksums


TornTailWarning = DamageWarning  # the names from before checksums, when torn tails were all it found
TornTailError = DamageError


def file_format(path: Path) -> str | None:
    name = path.name.removesuffix(TEMP_SUFFIX)
    return next((suffix for suffix in SUFFIXES if name.endswith(suffix)), None)


class Reader:
    """Iterates the events (or, with ``batches()``, the Batches) of ``files`` in order.

    Each pass reads the files again; ``damage`` holds what the latest pass skipped.
    ``refuse_foreign``: raise ``UserError`` for a file with nothing of ours in it instead of
    recording it as damage (for a single file the user named).
    """

    def __init__(
        self,
        files: list[Path],
        *,
        strict: bool = False,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        refuse_foreign: bool = False,
    ) -> None:
        self.files = files
        self.strict = strict
        self.max_frame_bytes = max_frame_bytes
        self.refuse_foreign = refuse_foreign
        self.damage: list[Damage] = []

    @property
    def torn_tails(self) -> list[Damage]:
        """Everything ``damage`` holds (torn tails and corruption alike), by its earlier name."""
        return self.damage

    def __iter__(self) -> Iterator[AnyEvent]:
        for batch in self.batches():
            yield from batch.events

    def batches(self) -> Iterator[Batch]:
        self.damage = []
        for path in self.files:
            yield from self._read_file(path)

    def _read_file(self, path: Path) -> Iterator[Batch]:
        fmt = file_format(path)
        found: list[Damage] = []
        count = 0
        try:
            with path.open("rb") as handle:
                if fmt == ".jsonl":
                    batches = _jsonl_file(path, handle.read(), found)
                else:
                    batches = _frames_file(path, handle, fmt == ".jsonl.zst", self.max_frame_bytes, found)
                for batch in batches:
                    self._report(found)  # as found: a caller that stops early has seen what it read
                    count += 1
                    yield batch
        except OSError as error:
            found.append(Damage(str(path), 0, 0, f"cannot read: {error.strerror or error}"))
        if count == 0 and found and found[0].offset == 0 and found[0].problem.startswith(_FOREIGN):
            found[:] = [self._foreign(path, found)]
        self._report(found)

    def _foreign(self, path: Path, found: list[Damage]) -> Damage:
        """Nothing of ours came out of the file: one report for the whole of it."""
        first, last = found[0], found[-1]
        problem = first.problem
        if not problem.startswith("cannot read"):
            problem = f"{NOT_OURS} ({problem.split(': ')[0]})"
        if self.refuse_foreign:
            raise UserError(f"{path}: {problem}")
        return Damage(first.path, 0, last.offset + last.length, problem)

    def _report(self, found: list[Damage]) -> None:
        for damage in found:
            if self.strict:
                raise DamageError(damage)
            self.damage.append(damage)
            warnings.warn(DamageWarning(damage), stacklevel=4)
        found.clear()


# Problems at the start of a file that yielded nothing: the file is not a recording at all.
_FOREIGN = ("not a zstd frame", "not a cuptistream batch", "not cuptistream JSON Lines", "cannot read")


def _frames_file(
    path: Path, handle: BinaryIO, jsonl_frames: bool, max_frame_bytes: int, found: list[Damage]
) -> Iterator[Batch]:
    for item in scan_frames(handle, str(path), max_frame_bytes=max_frame_bytes):
        if isinstance(item, Damage):
            found.append(item)
            continue
        yield from _frame_batches(path, item, jsonl_frames, found)


def _frame_batches(path: Path, frame: Frame, jsonl_frames: bool, found: list[Damage]) -> Iterator[Batch]:
    if not jsonl_frames:
        try:
            batch = decode_batch(frame.payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            found.append(Damage(str(path), frame.offset, frame.length, f"not a cuptistream batch: {error}"))
            return
        yield batch
        return
    # A frame's JSON Lines are validated whole before any batch of it is handed out.
    batches: list[Batch] = []
    try:
        for item in jsonl.iter_batches(frame.payload):
            if isinstance(item, jsonl.Incomplete):  # a complete frame always holds whole batches
                raise jsonl.JsonlError("ends inside a batch")
            batches.append(item)
    except jsonl.JsonlError as error:
        found.append(Damage(str(path), frame.offset, frame.length, f"not cuptistream JSON Lines: {error}"))
        return
    yield from batches


def _jsonl_file(path: Path, data: bytes, found: list[Damage]) -> Iterator[Batch]:
    """Plain JSON Lines: every batch up to the first that is torn or not ours."""
    lines = 0  # lines of the batches read so far, to say where a bad one starts
    try:
        for item in jsonl.iter_batches(data):
            if isinstance(item, jsonl.Incomplete):
                found.append(Damage(str(path), item.offset, len(data) - item.offset, TORN))
                return
            lines += 1 + len(item.events)
            yield item
    except jsonl.JsonlError as error:
        offset = 0
        for _ in range(lines):
            offset = data.index(b"\n", offset) + 1
        found.append(Damage(str(path), offset, len(data) - offset, f"not cuptistream JSON Lines: {error}"))


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if p.is_file() and file_format(p)), key=lambda p: p.name)
        if not files:
            raise UserError(
                f"{path}: no cuptistream files here (expected names ending in {', '.join(SUFFIXES)})"
            )
        return files
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if not file_format(path):
        raise UserError(f"{path}: {NOT_OURS} (expected a name ending in {', '.join(SUFFIXES)})")
    return [path]


def read(path: str | Path, *, strict: bool = False, max_frame_bytes: int = MAX_FRAME_BYTES) -> Reader:
    """Open a file or a directory of segments for reading. Raises ``UserError`` if there is
    nothing of ours there. Reading records damage and goes on (see the module docstring); a single
    file given by name that holds nothing of ours raises ``UserError`` when read.

    ``max_frame_bytes``: frames that decompress to more are skipped as damage (a bomb guard).
    """
    target = Path(path)
    files = _files(target)
    return Reader(files, strict=strict, max_frame_bytes=max_frame_bytes, refuse_foreign=not target.is_dir())
