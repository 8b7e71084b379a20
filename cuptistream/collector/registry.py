"""Where running collectors say where they are, so ``cuptistream trace`` finds them.

Each collector that listens (``cuptistream run``'s, a node ``cuptistream collector``, a session's)
writes one small JSON file, ``<pid>-<session id>.json`` (a process may hold several collectors),
into a directory private to the user:
``$CUPTISTREAM_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/cuptistream``, else
``<tmp>/cuptistream-<uid>``. It removes the file when it stops listening; a file left by a collector
that died is skipped (and removed) by ``running`` because its process is gone. Registering never
fails a collector: without the directory, ``trace`` needs ``--collector SOCKET``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

import msgspec

ENV_RUNTIME_DIR = "CUPTISTREAM_RUNTIME_DIR"


class Entry(msgspec.Struct, kw_only=True):
    pid: int
    socket: str  # where probes connect
    control: str  # where ``cuptistream trace`` connects
    role: str  # "run" (``cuptistream run``'s) or "collector" (``cuptistream collector``)
    label: str = ""  # what it serves, for a listing: the command of a ``run``
    session_id: str = ""
    started: float = 0.0  # Unix time

    def describe(self) -> str:
        what = f" `{self.label}`" if self.label else ""
        return f"pid {self.pid} ({self.role}{what}, socket {self.socket})"


def directory() -> Path:
    if explicit := os.environ.get(ENV_RUNTIME_DIR):
        return Path(explicit)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "cuptistream"
    return Path(tempfile.gettempdir()) / f"cuptistream-{os.getuid()}"


def _private_directory(create: bool) -> Path | None:
    """The directory, if it is ours and private (0700): another user's could list fake collectors."""
    path = directory()
    try:
        if create:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return path


def unusable() -> str:
    """Why the directory exists but is not used (another owner, open to others); "" otherwise."""
    path = directory()
    try:
        info = path.lstat()
    except OSError:
        return ""
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        return f"{path} is not private to this user (owner uid {info.st_uid}, mode {info.st_mode & 0o777:o})"
    return ""


def register(entry: Entry) -> Path | None:
    """Write ``entry``; the file's path, or None where the directory cannot be used."""
    folder = _private_directory(create=True)
    if folder is None:
        return None
    name = f"{entry.pid}-{entry.session_id}.json"
    path = folder / name
    temporary = folder / f".{name}.tmp"
    try:
        temporary.write_bytes(msgspec.json.encode(entry))
        temporary.replace(path)  # whole or absent, for a reader listing at the same moment
    except OSError:
        return None
    return path


def unregister(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running() -> list[Entry]:
    """The registered collectors whose process still runs, oldest first. Files of dead ones go."""
    folder = _private_directory(create=False)
    if folder is None:
        return []
    entries = []
    for path in folder.glob("*.json"):
        try:
            entry = msgspec.json.decode(path.read_bytes(), type=Entry)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            continue
        if _alive(entry.pid) and os.path.exists(entry.control):
            entries.append(entry)
        elif not _alive(entry.pid):
            unregister(path)
    return sorted(entries, key=lambda e: (e.started, e.pid))
