"""Hooks on torch.profiler, so that cuptistream steps aside before Kineto takes CUPTI.

``torch.autograd.profiler.profile``, which ``torch.profiler.profile`` drives (its schedule API
included: one prepare, enable and disable per cycle), reaches Kineto through three globals of
``torch.autograd.profiler``, looked up at each call:

- ``_prepare_profiler(config, activities)``: Kineto initializes CUPTI (it subscribes) and, for the
  warm-up steps, registers its buffer callbacks and enables its kinds;
- ``_enable_profiler(config, activities, ...)``: the trace starts (prepares first if needed);
- ``_disable_profiler()``: the trace stops; Kineto has flushed and read its buffers when it returns.

The wrappers call ``yield_to("torch.profiler")`` before the first two when CUDA activities are asked
for, and ``take_back`` after the third. ``torch.cuda.profiler`` (cudaProfilerStart/Stop) needs no hook:
it only marks a capture range for a tool that injected itself at start-up (Nsight Systems), which
the probe finds holding CUPTI when it starts.

Nothing of torch is imported here. The hooks go in when ``torch.autograd.profiler`` is imported:
now, if it is, or after it is (``boot/_cuptistream_import_hooks.py``, which ``sitecustomize`` uses too).

Limit: a profiler that was already warming up (prepared, not yet started) when the hooks went in
is not seen as running; its ``_enable_profiler`` and ``_disable_profiler`` are.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

from cuptistream.probe.boot._cuptistream_import_hooks import PostImportHooks

MODULE = "torch.autograd.profiler"
TOOL = "torch.profiler"
_HOOKED = ("_prepare_profiler", "_enable_profiler", "_disable_profiler")


class Listener(Protocol):
    def yield_to(self, tool: str) -> None: ...
    def take_back(self, tool: str) -> None: ...


_listeners: list[Listener] = []
_lock = threading.Lock()
_tracing = False  # a profiler with CUDA activities is between prepare/enable and disable


def loaded() -> bool:
    """Whether the program has imported torch's profiler (so Kineto may hold CUPTI's subscriber)."""
    return MODULE in sys.modules


def active() -> bool:
    """Whether a torch.profiler trace is running now."""
    module = sys.modules.get(MODULE)
    if module is None:
        return False
    if _tracing or getattr(module, "_is_profiler_enabled", False) is True:
        return True
    try:
        return bool(sys.modules["torch"]._C._autograd._profiler_enabled())
    except Exception:
        return False


def listen(listener: Listener) -> None:
    """Call ``listener`` around every torch.profiler trace from now on; install the hooks if needed."""
    with _lock:
        _listeners.append(listener)
    module = sys.modules.get(MODULE)
    if module is not None:
        install(module)
    elif not any(getattr(finder, "hooks", {}).get(MODULE) is install for finder in sys.meta_path):
        sys.meta_path.insert(0, PostImportHooks({MODULE: install}))


def forget(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def install(module: Any) -> bool:
    """Wrap the module's three profiler functions, once. False where torch lacks one of them."""
    if getattr(module, "_cuptistream_hooked", False):
        return True
    prepare, enable, disable = (getattr(module, name, None) for name in _HOOKED)
    if prepare is None or enable is None or disable is None:
        return False
    module._prepare_profiler = _before(prepare)
    module._enable_profiler = _before(enable)
    module._disable_profiler = _after(disable)
    module._cuptistream_hooked = True
    return True


def _wants_cuda(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    activities = args[1] if len(args) > 1 else kwargs.get("activities", ())
    return any(getattr(activity, "name", "") == "CUDA" for activity in activities or ())


def _notify(event: str) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            getattr(listener, event)(TOOL)
        except Exception:  # telemetry never breaks the user's profiler
            pass


def _before(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(*args: Any, **kwargs: Any) -> Any:
        global _tracing
        if _wants_cuda(args, kwargs):
            _tracing = True
            _notify("yield_to")
        return original(*args, **kwargs)

    hooked.__wrapped__ = original  # type: ignore[attr-defined]
    return hooked


def _after(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(*args: Any, **kwargs: Any) -> Any:
        global _tracing
        try:
            return original(*args, **kwargs)
        finally:
            if _tracing:
                _tracing = False
                _notify("take_back")

    hooked.__wrapped__ = original  # type: ignore[attr-defined]
    return hooked
