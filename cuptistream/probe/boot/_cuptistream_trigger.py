"""The probe's trigger, with the standard library alone: start a probe once, when the process first
initializes CUDA (``torch.cuda``'s lazy init, ``cuda.bindings``' ``cuInit``, importing ``cupy`` or
``cuda.core``), or at once. Armed by ``sitecustomize`` under ``cuptistream run`` and by the node
hook (``_cuptistream_node``); what starting means is theirs to say.

Importable at the top level (its folder is on ``sys.path``), so it imports nothing of the
``cuptistream`` package: a process that never touches CUDA pays for one import hook.
"""

from __future__ import annotations

import _thread
import os
import sys

# Start-up cost matters in every process of the program: no ``typing`` or ``threading`` (the names
# below are for the type checker only).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any


class Trigger:
    """Calls ``start`` once per process; never after a fork from a process that used CUDA (the
    child cannot use CUDA, and the parent's probe belongs to the parent).

    Other threads that reach CUDA while the probe starts wait until it has: their CUDA work would
    precede it, untraced, and the activity source would find a context made before it and have to
    assume CUDA graphs it never saw (no detaching between budget windows). The starting thread's
    own CUDA calls pass (the lock is re-entrant and ``fired`` is set)."""

    def __init__(self, start: Callable[[], object]) -> None:
        self.lock = _thread.RLock()
        self.fired = False  # the start has begun
        self.started = False  # ... and ended, whatever came of it
        self._start = start

    def fire(self, why: str) -> None:
        with self.lock:
            if self.fired:
                return
            self.fired = True
            try:
                self._start()
            except Exception as error:  # telemetry never stops the program
                print(f"cuptistream: telemetry is off for pid {os.getpid()}: {error}", file=sys.stderr)
            finally:
                self.started = True

    def after_fork_in_child(self) -> None:
        self.lock = _thread.RLock()  # another thread may have held it at the fork
        if self.fired:
            bootstrap = sys.modules.get("cuptistream.probe.bootstrap")
            if bootstrap is not None:
                bootstrap.forget_inherited_probe()


def _watched(trigger: Trigger) -> dict[str, Callable[[Any], None]]:
    """Module name -> what to do once it has been imported."""

    def after_torch_cuda(module: Any) -> None:
        original = module._lazy_init

        def _lazy_init() -> None:  # torch calls it (from Python and C++) before any CUDA work
            if not trigger.started:
                trigger.fire("torch.cuda")
            original()

        module._lazy_init = _lazy_init

    def after_cuda_bindings(module: Any) -> None:
        original = module.cuInit

        def cuInit(flags: int) -> Any:  # the driver's name: callers look it up on the module
            if not trigger.started:
                trigger.fire("cuda.bindings")
            return original(flags)

        module.cuInit = cuInit

    def after_import(module: ModuleType) -> None:
        trigger.fire(module.__name__)

    return {
        "torch.cuda": after_torch_cuda,
        "cuda.bindings.driver": after_cuda_bindings,
        "cupy": after_import,
        # cuda.core calls cuInit from compiled code, past the Python ``cuda.bindings.driver.cuInit``.
        "cuda.core": after_import,
    }


def arm(start: Callable[[], object], when: str) -> Trigger:
    """``when``: ``process`` starts now, anything else at the first CUDA initialization."""
    trigger = Trigger(start)
    os.register_at_fork(after_in_child=trigger.after_fork_in_child)
    if when == "process":
        trigger.fire("process start")
    else:
        from _cuptistream_import_hooks import PostImportHooks  # beside this file, on sys.path

        sys.meta_path.insert(0, PostImportHooks(_watched(trigger), done=lambda: trigger.fired))
    return trigger
