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


class ProcessNames:
    """Reads NUL-terminated strings from process ``pid``; ``seen`` holds every string read."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, str] = {}
        self.unresolved = 0
        self.failure: str | None = None  # why reading failed the first time, for one Error event
        self._fd: int | None = None
        try:
            self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            self.failure = self._explain(error)

    def _explain(self, error: OSError) -> str:
        if isinstance(error, PermissionError):
            return (
                f"cannot read kernel names from process {self.pid}: permission denied; run the "
                "collector as the program's parent (cuptistream run) or give it CAP_SYS_PTRACE"
            )
        return f"cannot read kernel names from process {self.pid}: {error.strerror or error}"

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
