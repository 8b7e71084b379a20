"""Strings that activity records point to (kernel, marker and cache-path names), resolved once each.

Records carry ``const char *`` pointers into CUPTI's memory in the observed process. The collector
reads them from that process once per distinct pointer (``cuptistream.collector.names``);
``TableNames`` serves a captured pointer → string table (replay); ``demangle`` wraps libstdc++'s
``__cxa_demangle``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Protocol

from cuptistream.cupti.library import libc_free


class Names(Protocol):
    def __call__(self, pointer: int) -> str: ...


class TableNames:
    """Serves strings from a pointer → string table (a captured fixture)."""

    def __init__(self, table: dict[int, str]) -> None:
        self.table = table
        self.missing = 0

    def __call__(self, pointer: int) -> str:
        if not pointer:
            return ""
        text = self.table.get(pointer)
        if text is None:
            self.missing += 1
            return f"<unresolved 0x{pointer:x}>"
        return text


@cache
def _cxa_demangle() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    path = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    fn = lib.__cxa_demangle
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_void_p
    return fn


@cache
def demangle(name: str) -> str:
    """The demangled form of an Itanium C++ name; the name itself where it is not mangled."""
    fn = _cxa_demangle()
    if fn is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int(0)
    out = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return name
    try:
        return ctypes.string_at(out).decode("utf-8", "replace")
    finally:
        libc_free(out)
