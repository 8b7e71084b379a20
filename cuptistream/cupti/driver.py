"""Whether CUDA and CUPTI can run here, CUPTI's clock and version, NVTX injection, and CUPTI's
process-wide attach/detach.

Calls go through ``cupti.library`` (the one libcupti loader, ``call`` and ``CuptiError``).

Failure modes:

- ``NoGpuError`` (one line) when there is no CUDA driver or no GPU. cupti-python raises
  ``NotSupportedError: CUDA driver is not found`` in that case; ``translate_errors`` turns that into
  the same one-line error.
- ``CuptiError`` (``cupti.library``) when a CUPTI call returns a non-success code.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

from cuptistream.cupti import gpus, subscriber
from cuptistream.cupti.library import SUCCESS, CuptiError, call, call_status, libcupti, result_name
from cuptistream.errors import NoGpuError, UserError

NO_GPU_HINT = "run on a machine with an NVIDIA GPU and driver, or use the `replay` source"

FLAG_FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED


@cache
def driver_problem() -> str | None:
    """None when a CUDA driver with at least one GPU is present, else why not (one line)."""
    try:
        libcuda = gpus.libcuda()
    except OSError:
        return f"no NVIDIA driver found (libcuda.so.1 cannot be loaded); {NO_GPU_HINT}"
    if (rc := libcuda.cuInit(0)) != 0:
        return f"the CUDA driver failed to initialise (cuInit returned {rc}); {NO_GPU_HINT}"
    count = ctypes.c_int(0)
    if libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return f"the CUDA driver sees no GPU; {NO_GPU_HINT}"
    return None


def require_gpu() -> None:
    """Raise ``NoGpuError`` unless a driver and a GPU are present."""
    if (problem := driver_problem()) is not None:
        raise NoGpuError(problem)


@contextmanager
def translate_errors() -> Iterator[None]:
    """Turn cupti-python's "CUDA driver is not found" into a one-line ``NoGpuError``."""
    try:
        yield
    except Exception as error:
        if type(error).__name__ == "NotSupportedError" or "driver is not found" in str(error):
            first = str(error).strip().splitlines()[0] if str(error).strip() else "CUDA driver is not found"
            raise NoGpuError(f"CUPTI is unavailable: {first}; {NO_GPU_HINT}") from None
        raise


def cupti_version() -> int:
    """CUPTI's API version (``cuptiGetVersion``): e.g. 130001 for CUDA 13.0, 26 for CUDA 12.8."""
    value = ctypes.c_uint32(0)
    call("cuptiGetVersion", ctypes.byref(value))
    return value.value


def timestamp() -> int:
    """CUPTI's clock in ns (``cuptiGetTimestamp``), the clock every activity record uses."""
    value = ctypes.c_uint64(0)
    call("cuptiGetTimestamp", ctypes.byref(value))
    return value.value


def struct_size(kind: int) -> int | None:
    """The size of the record CUPTI writes for ``kind`` (``cuptiActivityGetStructSize``, CUPTI >= 13),
    or None where this CUPTI cannot say."""
    size = ctypes.c_size_t(0)
    try:
        code = call_status("cuptiActivityGetStructSize", kind, 0, ctypes.byref(size))
    except CuptiError:  # not in this libcupti
        return None
    return size.value if code == SUCCESS and size.value else None


def nvtx_injection_path() -> str:
    """The value for ``NVTX_INJECTION64_PATH``: NVTX calls reach CUPTI (marker kind, NVTX callbacks)
    only when this is set in the environment before the program's first NVTX call."""
    return str(libcupti()._name)


def enable_nvtx_injection() -> str | None:
    """Point ``NVTX_INJECTION64_PATH`` at libcupti unless it is already set. Returns what it set.

    NVTX reads the variable at the program's first NVTX call, so this is in time for calls made
    after it; under ``cuptistream run`` the probe starts before the program's first line.
    """
    if os.environ.get("NVTX_INJECTION64_PATH"):
        return None
    path = nvtx_injection_path()
    os.environ["NVTX_INJECTION64_PATH"] = path
    return path


# --- attach / detach ---------------------------------------------------------------------------
#
# CUPTI attaches lazily on the first call and detaches with cuptiFinalize (guide §2.3.7), which
# tears down *all* CUPTI state in the process. Sources that use CUPTI bracket their use with
# acquire()/release(); the last release finalizes, so a later session attaches afresh.

_users: dict[str, int] = {}
_users_lock = threading.Lock()
detached_once = False  # cuptiFinalize has run in this process (the SASS source checks it)
live_program: Callable[[], str | None] | None = None
"""Set while the probe runs in a program that goes on without it (``cuptistream attach``). The last
``release`` then finalizes CUPTI at the exit of a CUDA call (guide §2.3.7), as ``park`` does, rather
than on the stopping thread while the program's threads are inside CUDA; and not at all while this
returns a reason (a CUDA graph instantiated while CUPTI was attached: a detach fails its replays)."""
last_release = ""  # how the last finalizing ``release`` under ``live_program`` went, for the report


def acquire(user: str) -> None:
    with _users_lock:
        _users[user] = _users.get(user, 0) + 1


def held_by_others(user: str) -> bool:
    """Whether CUPTI stays attached after ``user`` lets go of its last use."""
    with _users_lock:
        return _others_hold(user)


def _others_hold(user: str) -> bool:
    """Under ``_users_lock``: another user, or ``user`` more than once, holds CUPTI."""
    return any(name != user or count > 1 for name, count in _users.items())


def detach_at_exit() -> None:
    """``cuptiFinalize`` at the program's exit, once no source of ours uses CUPTI, whoever else
    subscribed (a profiler that is done by now). Never raises."""
    with _users_lock:
        if _users:
            return
        try:
            call("cuptiFinalize")
        except Exception:
            return
    _forget_subscriber()


def release(user: str, finalize: bool = True) -> bool:
    """Drop one use by ``user``. Returns True when this call detached CUPTI (``cuptiFinalize``)."""
    with _users_lock:
        count = _users.get(user, 0) - 1
        if count > 0:
            _users[user] = count
        else:
            _users.pop(user, None)
        if _users or not finalize:
            return False
        if live_program is None:
            call("cuptiFinalize")
        elif not _finalize_live(live_program):
            return False
        global detached_once
        detached_once = True
    _forget_subscriber()
    return True


def _finalize_live(veto: Callable[[], str | None]) -> bool:
    """Under ``_users_lock``: ``cuptiFinalize`` at the next CUDA call's exit on any thread; directly
    when none returns within ``PARK_WAIT_S`` (the program is not in CUDA then); not when ``veto``
    gives a reason. Whether CUPTI was finalized; ``last_release`` says how."""
    global last_release
    if (why := veto()) is not None:
        last_release = f"CUPTI stays attached: {why}"
        return False
    why, _, site = _finalize_at_api_exit(lambda: veto() is None, PARK_WAIT_S)
    if why is None:
        last_release = "CUPTI finalized at a CUDA call's exit"
        return True
    if site.vetoed:
        last_release = f"CUPTI stays attached: {veto() or why}"
        return False
    call("cuptiFinalize")
    last_release = f"CUPTI finalized from the probe's thread ({why})"
    return True


PARK_WAIT_S = 1.0
"""How long ``park`` waits for a CUDA call to return on some thread before it leaves CUPTI attached
for this pause (a program that makes no CUDA call pays nothing for it)."""


def _finalize_at_api_exit(
    still_wanted: Callable[[], bool], wait_s: float
) -> tuple[str | None, list[subscriber.Registration], _FinalizeAtApiExit]:
    """Under ``_users_lock``: ``cuptiFinalize`` at the exit of the next CUDA runtime or driver call
    on any thread, if ``still_wanted()`` there; waits up to ``wait_s``. Returns (None, the exit
    callbacks, the site) when CUPTI was finalized (the callbacks' handles died with it), else (why
    not, ..., ...) with the callbacks removed again. Raises ``CuptiError`` when ``cuptiFinalize``
    itself fails."""
    site = _FinalizeAtApiExit(still_wanted)
    watches: list[subscriber.Registration] = []
    why: str | None = "cuptiFinalize failed"  # until the wait says otherwise (it raises then)
    try:
        for domain in (subscriber.Domain.RUNTIME_API, subscriber.Domain.DRIVER_API):
            watches.append(subscriber.register(domain, site.on_api))
        site.arm()
        why = site.wait(wait_s)
    except CuptiError:
        raise
    except Exception as error:
        why = f"no callback at a CUDA call's exit ({subscriber.describe_cupti_failure(error)})"
    finally:
        if why is not None:  # CUPTI is attached as before: its callbacks go off again
            for watch in watches:
                watch.remove()
    return why, watches, site


class _FinalizeAtApiExit:
    """Detaches CUPTI on the first thread that returns from a CUDA runtime or driver call. NVIDIA's
    guide (§2.3.7) names an API exit as the safe place for ``cuptiFinalize``: other threads inside
    CUPTI while it tears down may crash. Kineto saw such a crash and moved its teardown to an API
    exit (pytorch/kineto#686)."""

    def __init__(self, still_wanted: Callable[[], bool]) -> None:
        self._still_wanted = still_wanted
        self._lock = threading.Lock()
        self._armed = False  # until every watch is set: a detach between two would strand the rest
        self.finished = threading.Event()
        self.vetoed = False  # the caller stopped wanting it before a call returned (a CUDA graph)
        self.error: CuptiError | None = None

    def on_api(self, domain: int, cbid: int, data: object) -> None:
        # Inside the CUDA call, on the application's thread: only the first exit acts.
        info = subscriber.api_callback_data(data)
        if info is None or info.callbackSite != subscriber.API_EXIT:
            return
        with self._lock:
            if not self._armed:
                return
            self._armed = False
            if not self._still_wanted():
                self.vetoed = True
                self.finished.set()
                return
        try:
            call("cuptiFinalize")  # ctypes lets the GIL go: other threads' callbacks run on
        except CuptiError as error:
            self.error = error
        finally:
            self.finished.set()

    def arm(self) -> None:
        with self._lock:
            self._armed = True

    def wait(self, seconds: float) -> str | None:
        """None once CUPTI is detached; else why not: no call returned within ``seconds`` (and now
        none will act), or ``still_wanted`` said no. Raises the ``CuptiError`` of a failed detach."""
        if not self.finished.wait(seconds):
            with self._lock:
                if self._armed:
                    self._armed = False
                    return f"no CUDA call returned within {seconds:g} s"
            self.finished.wait()  # begun on a program thread: cuptiFinalize returns there
        if self.error is not None:
            raise self.error
        return "detaching was no longer wanted when a CUDA call returned" if self.vetoed else None


def park(
    user: str, wait_s: float = PARK_WAIT_S, still_wanted: Callable[[], bool] = lambda: True
) -> str | None:
    """Detach CUPTI between ``user``'s trace windows (``activity.between_windows: detach``): attached,
    CUPTI costs every kernel launch about 1 µs even with nothing traced (bench/launch_cost.py), and
    only ``cuptiFinalize`` takes that off. The next CUPTI call attaches afresh.

    ``cuptiFinalize`` runs at the exit of the next CUDA runtime or driver call that any thread of
    the program makes (``_FinalizeAtApiExit``), if ``still_wanted()`` says so there; this waits for
    it. The callback subscriber (the state source's) is then subscribed again with its
    registrations: a bare subscriber costs the launch path nothing measurable. The caller must have
    flushed CUPTI's buffers first.

    Returns None when CUPTI was detached, else why it stays attached: another source of ours holds
    it, the exit callbacks could not be set up, no call returned within ``wait_s``, or
    ``still_wanted()`` said no. Raises ``CuptiError`` when ``cuptiFinalize`` itself fails."""
    global detached_once
    with _users_lock:
        if _others_hold(user):
            return "another source of ours holds CUPTI"
        why, watches, _ = _finalize_at_api_exit(still_wanted, wait_s)
        if why is not None:
            return why
        detached_once = True
    sub = subscriber.get()
    for watch in watches:  # their handle died with CUPTI
        sub.drop_dead(watch)
    sub.resubscribe()
    return None


def _forget_subscriber() -> None:
    try:  # the callback subscriber's handle died with CUPTI; let it know without calling CUPTI
        subscriber.get().forget()
    except Exception:
        pass


def unsupported(kind_name: str, device: str, error: CuptiError) -> UserError:
    """The one-line error for a kind this GPU/CUPTI cannot enable."""
    return UserError(
        f"activity kind {kind_name!r} is not supported on {device} "
        f"({result_name(error.code)}); remove it from sources[].kinds"
    )
