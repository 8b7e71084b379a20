"""Strings that activity records point to, read from the probe's memory once per distinct pointer.

Records carry ``const char *`` pointers into CUPTI's memory in the observed process. The collector
reads them through ``/proc/PID/mem`` (allowed for the program's parent, and for any collector the
probe names with ``PR_SET_PTRACER``). A pointer read fails once the process is gone (a crash before
its names were seen): such names come out as ``<unresolved 0x...>`` and are counted.
"""

from __future__ import annotations

import os

_PAGE = 4096
_MAX_NAME = 64 * 1024


def open_memory(pid: int) -> tuple[int | None, str | None]:
    """(an fd on ``/proc/PID/mem``, None), or (None, why it cannot be opened: one line)."""
    try:
        return os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC), None
    except OSError as error:
        return None, _explain(pid, error)


def _explain(pid: int, error: OSError) -> str:
    if isinstance(error, PermissionError):
        return (
            f"cannot read kernel names from process {pid}: permission denied; run the "
            "collector as the program's parent (cuptistream run) or give it CAP_SYS_PTRACE"
        )
    return f"cannot read kernel names from process {pid}: {error.strerror or error}"


class ProcessNames:
    """Reads NUL-terminated strings from process ``pid``; ``seen`` holds every string read."""

    def __init__(self, pid: int, opened: tuple[int | None, str | None] | None = None) -> None:
        """``opened``: the ``(fd, failure)`` of ``open_memory(pid)``, done elsewhere (a decode worker
        gets the collector's: an open ``/proc/PID/mem`` stays readable, and only the program's
        parent may open it). This object owns the fd."""
        self.pid = pid
        self.seen: dict[int, str] = {}
        self.unresolved = 0
        self._fd, self.failure = opened if opened is not None else open_memory(pid)

    def _explain(self, error: OSError) -> str:
        return _explain(self.pid, error)

    def _read(self, pointer: int) -> str | None:
        if self._fd is None:
            return None
        parts: list[bytes] = []
        address, total = pointer, 0
        while total < _MAX_NAME:
            want = _PAGE - address % _PAGE  # never cross a page in one read: the next may be unmapped
            try:
                data = os.pread(self._fd, want, address)
            except OSError as error:
                if self.failure is None and not parts:
                    self.failure = self._explain(error)
                break
            if not data:
                break
            end = data.find(b"\0")
            if end >= 0:
                parts.append(data[:end])
                return b"".join(parts).decode("utf-8", "replace")
            parts.append(data)
            address += len(data)
            total += len(data)
        return None

    def __call__(self, pointer: int) -> str:
        if not pointer:
            return ""
        text = self.seen.get(pointer)
        if text is None:
            read = self._read(pointer)
            if read is None:
                self.unresolved += 1
                return f"<unresolved 0x{pointer:x}>"
            self.seen[pointer] = text = read
        return text

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
