"""Post-import hooks with the standard library alone: after a watched module has executed, call a
function with it. ``sitecustomize`` (to start the probe at CUDA initialization) and
``cuptistream.probe.torch_profiler`` (to hook torch's profiler) both use it.

Under ``cuptistream run`` this file is importable at the top level (``boot/`` is on ``PYTHONPATH``),
so ``sitecustomize`` imports nothing of the ``cuptistream`` package until a watched module loads;
hence a private, unlikely top-level name.
"""

from __future__ import annotations

import importlib.machinery
import sys

TYPE_CHECKING = False  # no ``typing`` at start-up: every Python process of the program imports this
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.abc import Loader
    from types import ModuleType
    from typing import Any


class _HookedLoader:
    """The real loader, plus a call once the module has been executed."""

    def __init__(self, loader: Any, then: Callable[[Any], object]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception as error:  # telemetry never breaks an import
            print(f"cuptistream: cannot watch {module.__name__}: {error}", file=sys.stderr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportHooks:
    """A meta-path finder that wraps only the loaders of the watched modules; any other import costs
    one dict lookup. ``done()`` true: it watches nothing more."""

    def __init__(
        self, hooks: dict[str, Callable[[Any], object]], done: Callable[[], bool] | None = None
    ) -> None:
        self.hooks = hooks
        self._done = done

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        then = self.hooks.get(name)
        if then is None or (self._done is not None and self._done()):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: importlib.machinery.ModuleSpec | None = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    loader: Loader = _HookedLoader(spec.loader, then)  # type: ignore[assignment]
                    spec.loader = loader
                return spec
        return None
