"""Run by Python at start-up in every process of a program that ``cuptistream run`` started: this
folder is on ``PYTHONPATH`` and the environment names the collector, so subprocesses, spawned and
forked workers and the Pythons a shell script starts all come here.

It only arms a trigger, with the standard library: the probe starts when the process first
initializes CUDA (``torch.cuda``'s lazy init, ``cuda.bindings``' ``cuInit``, importing ``cupy`` or
``cuda.core``), or
at once with ``CUPTISTREAM_PROBE_START=process``. A process that never touches CUDA pays for one
import hook and imports nothing of cuptistream. Then the ``sitecustomize`` this one shadows runs.
"""

from __future__ import annotations

import _thread
import importlib.machinery
import os
import sys

# Start-up cost matters in every process of the program: no ``typing``, ``threading`` or
# ``importlib.util`` unless needed (the names below are for the type checker only).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

_COLLECTOR = "CUPTISTREAM_COLLECTOR"
_START = "CUPTISTREAM_PROBE_START"


class _Trigger:
    """Starts the probe once per process; never after a fork from a process that used CUDA (the
    child cannot use CUDA, and the parent's probe belongs to the parent).

    Other threads that reach CUDA while the probe starts wait until it has: their CUDA work would
    precede it, untraced, and the activity source would find a context made before it and have to
    assume CUDA graphs it never saw (no detaching between budget windows). The starting thread's
    own CUDA calls pass (the lock is re-entrant and ``fired`` is set)."""

    def __init__(self) -> None:
        self.lock = _thread.RLock()
        self.fired = False  # the start has begun
        self.started = False  # ... and ended, whatever came of it

    def fire(self, why: str) -> None:
        with self.lock:
            if self.fired:
                return
            self.fired = True
            try:
                self._start()
            finally:
                self.started = True

    def _start(self) -> None:
        try:
            from cuptistream.probe.bootstrap import start_from_environment
        except Exception as error:  # not installed for this interpreter, or broken: run on without
            print(f"cuptistream: telemetry is off for pid {os.getpid()} ({sys.executable}): "
                  f"cannot import cuptistream: {error}", file=sys.stderr, flush=True)  # fmt: skip
            return
        start_from_environment()

    def after_fork_in_child(self) -> None:
        self.lock = _thread.RLock()  # another thread may have held it at the fork
        if self.fired:
            bootstrap = sys.modules.get("cuptistream.probe.bootstrap")
            if bootstrap is not None:
                bootstrap.forget_inherited_probe()


_trigger = _Trigger()


def _after_torch_cuda(module: Any) -> None:
    original = module._lazy_init

    def _lazy_init() -> None:  # torch calls it (from Python and C++) before any CUDA work
        if not _trigger.started:
            _trigger.fire("torch.cuda")
        original()

    module._lazy_init = _lazy_init


def _after_cuda_bindings(module: Any) -> None:
    original = module.cuInit

    def cuInit(flags: int) -> Any:  # the driver's name: callers look it up on the module
        if not _trigger.started:
            _trigger.fire("cuda.bindings")
        return original(flags)

    module.cuInit = cuInit


def _after_import(module: ModuleType) -> None:
    _trigger.fire(module.__name__)


# Module name -> what to do once it has been imported.
_WATCHED: dict[str, Callable[[Any], None]] = {
    "torch.cuda": _after_torch_cuda,
    "cuda.bindings.driver": _after_cuda_bindings,
    "cupy": _after_import,
    # cuda.core calls cuInit from compiled code, past the Python ``cuda.bindings.driver.cuInit``.
    "cuda.core": _after_import,
}


def _arm() -> None:
    os.register_at_fork(after_in_child=_trigger.after_fork_in_child)
    if os.environ.get(_START) == "process":
        _trigger.fire("process start")
    else:
        from _cuptistream_import_hooks import PostImportHooks  # beside this file, on PYTHONPATH

        sys.meta_path.insert(0, PostImportHooks(_WATCHED, done=lambda: _trigger.fired))


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get(_COLLECTOR):
    _arm()
_run_shadowed()
