"""Run by the attached process's main thread at its next safe point (``inject``), with the standard
library only: this file's text is executed there, not imported, in a namespace of its own.

It claims the attach (the command may have given up meanwhile), puts the node install's probe runtime
at the end of ``sys.path`` and returns: the probe starts on a thread of its own, so the program's
main thread holds the GIL for about a thread start. That thread reports to the command through
the ``status`` file of the attach's folder (one JSON line each: ``started``, ``failed``,
``detached``) and, unless it stays (``stay``), stops the probe at the window's end (``for_s``) or
when the command asks (a ``stop`` file), takes back what it added to ``sys.path`` and
``sys.meta_path``, and ends.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

TYPE_CHECKING = False  # no ``typing`` imported into the program
if TYPE_CHECKING:
    from typing import Any


def _main(params: dict[str, Any], buffer: tuple[int, int] | None) -> None:
    folder = params["folder"]
    try:
        os.rename(os.path.join(folder, "go"), os.path.join(folder, "taken"))
    except OSError:
        return  # the command gave up on this attach, or it runs a second time
    thread = threading.Thread(target=_run, args=(params, buffer), name="cuptistream-attach", daemon=True)
    thread.start()


def _report(folder: str, **fields: Any) -> None:
    try:
        with open(os.path.join(folder, "status"), "a", encoding="utf-8") as status:
            status.write(json.dumps(fields) + "\n")
    except OSError:
        pass  # the command is gone: nobody to tell


def _free(buffer: tuple[int, int] | None) -> None:
    """Unmap the page the command wrote this file's name into (compiled and done with by now), with
    the runtime's C library (imported by then, where cuptistream could be)."""
    if buffer is None:
        return
    try:
        import ctypes

        from cuptistream.cupti.libc import libc

        libc().munmap(ctypes.c_void_p(buffer[0]), ctypes.c_size_t(buffer[1]))
    except Exception:
        pass


def _import_package(runtime: str) -> None:
    """cuptistream itself from the runtime, whatever the program's ``sys.path`` finds first (a
    ``cuptistream`` folder in its working directory); its dependencies come from the program's
    packages first, as under the node hook."""
    if "cuptistream" in sys.modules:
        return  # the program uses cuptistream itself
    import importlib.util

    folder = os.path.join(runtime, "cuptistream")
    spec = importlib.util.spec_from_file_location(
        "cuptistream", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"no cuptistream package in {runtime}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cuptistream"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["cuptistream"]
        raise


def _run(params: dict[str, Any], buffer: tuple[int, int] | None) -> None:
    folder, runtime = params["folder"], params["runtime"]
    added = runtime not in sys.path
    if added:
        sys.path.append(runtime)  # last: the program's own packages come first
    finders = list(sys.meta_path)

    def restore() -> None:
        if added and runtime in sys.path:
            sys.path.remove(runtime)
        # The probe's import hooks (torch.profiler's) go with it.
        sys.meta_path[:] = [
            f for f in sys.meta_path if f in finders or "cuptistream" not in type(f).__module__
        ]

    had_numpy = "numpy" in sys.modules
    try:
        _import_package(runtime)
        from cuptistream.attach.inside import Attached

        attached = Attached.start(params["collector"], params["config"], params["session_id"])
    except BaseException as error:
        restore()
        _report(folder, state="failed", error=f"{type(error).__name__}: {error}")
        return
    finally:
        _free(buffer)
    loaded_numpy = not had_numpy and "numpy" in sys.modules
    failed = attached.failed_sources
    _report(folder, state="started", sources=attached.sources, failed=failed, numpy_loaded=loaded_numpy)
    if params["stay"]:
        return  # the probe stays until the process exits
    window = params["for_s"]  # None: until the command asks
    stop = os.path.join(folder, "stop")
    ends = time.monotonic() + (float(window) if window is not None else float("inf"))
    while (left := ends - time.monotonic()) > 0 and not os.path.exists(stop):
        time.sleep(min(0.1, left))
    try:
        cupti = attached.stop()
    except BaseException as error:
        cupti = f"stop failed: {type(error).__name__}: {error}"
    restore()
    _report(folder, state="detached", cupti=cupti)
