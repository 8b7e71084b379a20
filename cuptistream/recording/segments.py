"""Segment files: an append-only directory of files that rotate by size and age.

A ``SegmentWriter`` appends payloads (each compressed into its own zstd frame, see ``framing``) to
``<final name>.tmp`` and renames the file to its final name when it rotates or closes, so a final
name always means "complete". A crashed writer leaves its ``.tmp`` behind; every complete frame in
it can still be read (``framing.iter_frames`` reports the torn tail).

File names sort in write order: ``{prefix}-{origin}-{start_unix_ms}-{index:06d}{suffix}``, where
``origin`` is ``{host}-{pid}`` of the process whose data it is (``rank{N}-{host}-{pid}`` in a
distributed job), ``start_unix_ms`` is when the writer was created and ``index`` counts its segments
from 0.

fsync policy:

- ``never``: leave it to the OS.
- ``batch``: fsync after every append, so each acknowledged write survives a power loss.
- ``rotate``: fsync once before each rename.

Wherever the policy is not ``never``, the directory is fsynced after a rename so the new name is
durable too. The writer is plain blocking code: callers in trio run it in ``trio.to_thread``. It is
not thread-safe; use one writer from one thread at a time.

A writer holds an ``flock`` on its ``.tmp`` while it writes, so ``seal_orphans`` (run by the next
file sink or Kafka spool on the directory, and by ``cuptistream repair``) finishes the ``.tmp`` files
of killed writers and never those of live ones, in this process or another.

The Kafka sink reuses it as its spool: ``list_segments`` lists finished segments in write order and
``delete_segment`` removes one once it has been replayed.

``prepare_directory`` is the one place output directories are created and checked: created with
mode 0700 (whatever the umask), and a symlinked or foreign-owned directory refused unless allowed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from cuptistream.errors import SinkUnavailableError
from cuptistream.recording.framing import FrameEncoder

FsyncPolicy = Literal["never", "batch", "rotate"]
TEMP_SUFFIX = ".tmp"


DIRECTORY_MODE = 0o700


def parse_directory_mode(value: int | str) -> int:
    """Permission bits for created directories, from an int or an octal string such as "0750".
    Raises ValueError (one line) unless the owner keeps rwx (without it nobody can write there)."""
    try:
        mode = int(value, 8) if isinstance(value, str) else value
    except ValueError:
        mode = -1
    if isinstance(mode, bool) or not 0 <= mode <= 0o777 or mode & 0o700 != 0o700:
        expected = 'permission bits from 0o700 to 0o777 such as "0750"'
        raise ValueError(f"directory_mode: expected {expected}, got {value!r}")
    return mode


def prepare_directory(
    directory: str | Path,
    *,
    key: str,
    mode: int = DIRECTORY_MODE,
    allow_symlink: bool = False,
    allow_foreign_owner: bool = False,
) -> Path:
    """Create ``directory`` (and missing parents) with ``mode``, or check the one that is there.

    Refused, each with one line naming ``key`` (the config key that chose the directory): a
    directory that is a symbolic link unless ``allow_symlink`` (another user could point it
    anywhere), one owned by another user unless ``allow_foreign_owner`` (its owner can read, replace
    or plant files in it), and anything that is not a directory. An existing directory keeps its
    mode. Raises ``SinkUnavailableError``; returns the absolute path.
    """
    path = Path(os.path.abspath(directory))
    try:
        try:
            os.makedirs(path.parent, exist_ok=True)
            os.mkdir(path, mode)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(fd, mode)  # exact, whatever the umask
            finally:
                os.close(fd)
        except FileExistsError:
            pass
        info = os.lstat(path)
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        reason = getattr(error, "strerror", None) or error
        message = f"{key}: cannot write to {path}: {reason}; choose another directory"
        raise SinkUnavailableError(message) from None
    if stat.S_ISLNK(info.st_mode):
        if not allow_symlink:
            raise SinkUnavailableError(
                f"{key}: {path} is a symbolic link (to {os.readlink(path)}); "
                "give the real directory, or set allow_symlink: true"
            )
        try:
            info = os.stat(path)
        except OSError as error:
            raise SinkUnavailableError(f"{key}: {path} is a broken symbolic link: {error.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise SinkUnavailableError(f"{key}: {path} is not a directory; choose a directory")
    if info.st_uid != os.geteuid() and not allow_foreign_owner:
        raise SinkUnavailableError(
            f"{key}: {path} belongs to another user (uid {info.st_uid}); "
            "use a directory of your own, or set allow_foreign_owner: true"
        )
    return path


def safe_host(host: str | None = None) -> str:
    """A host name (default: this one's), reduced to characters that are safe in a file name."""
    short = (host if host is not None else socket.gethostname()).split(".")[0] or "localhost"
    return "".join(c if c.isalnum() or c in "_" else "_" for c in short)


def segment_key(path: Path, suffix: str) -> tuple[int, int, str]:
    """Sort key in write order across writers: (start_unix_ms, index, name).

    Plain name order is write order for one writer; across restarts the pid (part of the name) is
    not monotonic, so a spool replays by the writer's start time first.
    """
    name = path.name.removesuffix(TEMP_SUFFIX).removesuffix(suffix)
    parts = name.rsplit("-", 2)
    try:
        return int(parts[-2]), int(parts[-1]), path.name
    except (IndexError, ValueError):
        return 0, 0, path.name


def list_segments(
    directory: str | Path, prefix: str, suffix: str, *, include_temp: bool = False
) -> list[Path]:
    """Finished segments (and, with ``include_temp``, live or orphaned ``.tmp`` ones) in write order."""
    found = []
    for entry in Path(directory).iterdir():
        name = entry.name
        if not name.startswith(prefix + "-") or not entry.is_file():
            continue
        if name.endswith(suffix) or (include_temp and name.endswith(suffix + TEMP_SUFFIX)):
            found.append(entry)
    return sorted(found, key=lambda p: segment_key(p, suffix))


def delete_segment(path: str | Path) -> None:
    """Remove a segment that has been replayed. A segment already gone is not an error."""
    Path(path).unlink(missing_ok=True)


def seal_orphans(directory: str | Path, prefix: str, suffix: str, *, keep: Path | None = None) -> list[Path]:
    """Rename ``.tmp`` files left by a killed writer to their final names and return the new paths.

    A live writer holds an ``flock`` on its ``.tmp`` for as long as it writes, so files of writers in
    other processes (another collector on the same directory) are left alone, as is ``keep``.
    Empty ``.tmp`` files are left too: a writer creates its file an instant before it locks it.
    A sealed file may end in a torn tail; readers keep every complete frame and report the rest.
    """
    sealed = []
    for path in list_segments(directory, prefix, suffix, include_temp=True):
        if path.name.endswith(TEMP_SUFFIX) and path != keep and (final := seal_if_orphan(path)):
            sealed.append(final)
    return sealed


def seal_if_orphan(path: Path) -> Path | None:
    """Rename one ``.tmp`` file to its final name if no writer holds it and it is not empty.
    Returns the final path, or None if it was left alone (or is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # gone (sealed or finished meanwhile), or not a plain file
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # a live writer
        held = os.fstat(fd)
        if held.st_size == 0:
            return None
        try:
            now = os.stat(path, follow_symlinks=False)
            if (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev):
                return None  # renamed by its writer (which then unlocked it) and the name reused
            final = path.with_name(path.name.removesuffix(TEMP_SUFFIX))
            os.replace(path, final)  # under the lock: its writer, if any, is gone
        except FileNotFoundError:
            return None  # its writer renamed it before unlocking it
        return final
    finally:
        os.close(fd)


class SegmentWriter:
    """Appends payloads to rotating segment files in ``directory``.

    ``zstd_level=None`` writes payloads as they are (e.g. plain JSON Lines); otherwise each payload
    becomes one zstd frame. ``rotate_bytes`` and ``rotate_age`` (seconds) of 0 disable that trigger.
    A file is created on the first append after a rotation, so no empty segments appear.
    Raises ``OSError`` from the file system as is; callers turn it into their own errors.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        prefix: str,
        suffix: str,
        rotate_bytes: int = 256 * 1024 * 1024,
        rotate_age: float = 3600.0,
        fsync: FsyncPolicy = "rotate",
        file_mode: int = 0o600,
        zstd_level: int | None = 3,
        origin: str | None = None,
        encoder: FrameEncoder | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        self.suffix = suffix
        self.rotate_bytes = rotate_bytes
        self.rotate_age = rotate_age
        self.fsync = fsync
        self.file_mode = file_mode
        # ``encoder``: one compressor shared by writers that are never used at the same time (the
        # file sink's per-process writers), instead of a zstd context (~3.5 MiB) per process.
        self._encoder = encoder or (FrameEncoder(zstd_level) if zstd_level is not None else None)
        origin = origin or f"{safe_host()}-{os.getpid()}"  # whose data: the file sink names the process
        self._stem = f"{prefix}-{origin}-{time.time_ns() // 1_000_000}"
        self._index = 0
        self._fd: int | None = None
        self._final: Path | None = None
        self._size = 0
        self._opened_at = 0.0
        self.bytes_written = 0  # all segments, after compression
        self.files_finished = 0

    @property
    def temp_path(self) -> Path | None:
        """The file being written now (``<final>.tmp``), or None between segments."""
        return self._final.with_name(self._final.name + TEMP_SUFFIX) if self._final else None

    def append(self, payload: bytes | Sequence[bytes | memoryview]) -> int:
        """Write one payload (one frame; pieces: their concatenation) and return the bytes
        written. Rotates first if due."""
        if self._fd is not None and self._due():
            self.rotate()
        if self._encoder:
            data = self._encoder.frame(payload)
        else:
            data = payload if isinstance(payload, bytes) else b"".join(payload)
        if self._fd is None:
            self._open()
        assert self._fd is not None
        try:
            view = memoryview(data)
            while view:  # os.write may write less than asked (e.g. a signal); finish the frame
                view = view[os.write(self._fd, view) :]
            if self.fsync == "batch":
                os.fsync(self._fd)
        except OSError:
            # Cut off a partial frame (e.g. disk full) so later appends stay readable.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self.bytes_written += len(data)
        if self.rotate_bytes and self._size >= self.rotate_bytes:
            self.rotate()
        return len(data)

    def rotate(self) -> Path | None:
        """Finish the current segment: fsync (by policy), close, rename. Returns its final path."""
        if self._fd is None or self._final is None:
            return None
        temp, final = self.temp_path, self._final
        assert temp is not None
        try:
            if self.fsync != "never":
                os.fsync(self._fd)
            # Renamed before the file is closed: closing drops the lock that keeps sealers away.
            os.replace(temp, final)
        finally:
            os.close(self._fd)
            self._fd, self._final = None, None
        if self.fsync != "never":
            _fsync_directory(self.directory)
        self.files_finished += 1
        return final

    def close(self) -> Path | None:
        """Finish the current segment, if any. The writer may be used again afterwards."""
        return self.rotate()

    def _due(self) -> bool:
        return bool(self.rotate_age) and time.monotonic() - self._opened_at >= self.rotate_age

    def _open(self) -> None:
        final = self.directory / f"{self._stem}-{self._index:06d}{self.suffix}"
        temp = final.with_name(final.name + TEMP_SUFFIX)
        # O_EXCL: never append to someone else's file; the mode is passed here, and fchmod below
        # makes it exact whatever the umask is.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, self.file_mode)
        try:
            os.fchmod(fd, self.file_mode)
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while writing (see seal_orphans); a sealer holds it briefly
        except OSError:
            os.close(fd)
            raise
        self._index += 1
        self._fd, self._final = fd, final
        self._size = 0
        self._opened_at = time.monotonic()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
