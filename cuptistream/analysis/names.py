"""How the views show kernel and function names: demangled by default, as recorded with ``--mangled``.

Recordings keep the name CUPTI gave (an Itanium-mangled C++ name for most kernels:
``_ZN2at6native13reduce_kernel...``). The views demangle each distinct name once, when they first
show it, with libstdc++'s ``__cxa_demangle`` (``cuptistream.cupti.names.demangle``); a kernel recorded
with ``demangle: true`` carries ``demangled_name``, which is used as it is. A name that is not mangled,
or that the demangler refuses (or a machine without libstdc++), is shown as recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cuptistream.cupti.names import demangle


class DisplayNames:
    """name as recorded -> name as shown; a cache of one entry per distinct name."""

    def __init__(self, mangled: bool = False) -> None:
        self.mangled = mangled
        self._shown: dict[str, str] = {}

    def learn(self, kernels: Iterable[Any]) -> None:
        """Keep the ``demangled_name`` that kernels carry (recorded with ``demangle: true``)."""
        if self.mangled:
            return
        for kernel in kernels:
            carried = getattr(kernel, "demangled_name", None)
            if carried:
                self._shown.setdefault(kernel.name, carried)

    def __call__(self, name: str) -> str:
        if self.mangled:
            return name
        shown = self._shown.get(name)
        if shown is None:
            shown = self._shown[name] = demangle(name) if name.startswith("_Z") else name
        return shown
