"""Loaded cubins written out once each, by CRC, for offline SASS-to-source mapping.

The module-load callback runs inside the application's CUDA call, so it only copies the bytes
(``keep``); the source's worker thread writes them (``write``) as ``<crc as 16 hex digits>.cubin``,
which is where ``cuptistream source-lines`` looks for them.
"""

from __future__ import annotations

import ctypes
import os


class CubinArchive:
    def __init__(self, directory: str | None) -> None:
        self.directory = directory  # None: keep nothing
        self._seen: set[int] = set()
        self._pending: list[tuple[int, bytes]] = []

    def keep(self, crc: int, address: int, size: int) -> None:
        """Copy the cubin at ``address`` unless one with this CRC was kept before."""
        if self.directory and crc and crc not in self._seen:
            self._seen.add(crc)
            self._pending.append((crc, ctypes.string_at(address, size)))

    def write(self) -> None:
        """Write what ``keep`` copied (atomically: a temp file, then a rename)."""
        pending, self._pending = self._pending, []
        if not pending or not self.directory:
            return
        os.makedirs(self.directory, exist_ok=True)
        for crc, blob in pending:
            path = os.path.join(self.directory, f"{crc:016x}.cubin")
            if not os.path.exists(path):
                tmp = path + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(blob)
                os.replace(tmp, path)
