"""One CUPTI library layer: one loader per native library, one error type, one ``call``, one rule for
API function names. Read from the source tree (no GPU needed), so a second loader or a second
``CuptiError`` that creeps back in fails here."""

from __future__ import annotations

import ast
import ctypes
import threading
import time
from pathlib import Path

import pytest

from cuptistream.cupti import api_functions, cubin_api, library, pcsampling_api, sass_api
from tests.test_callbacks_subscriber import DriverCalls, FakeCupti, FakeCuptiError

ROOT = Path(__file__).resolve().parents[1]
TREES = ("cuptistream", "sources", "sinks")

# Where a native library may be opened (ctypes.CDLL), and which: one place each.
LOADERS = {
    "cuptistream/cupti/library.py": 1,  # libcupti
    "cuptistream/cupti/gpus.py": 1,  # libcuda
    "cuptistream/cupti/names.py": 1,  # libstdc++ for __cxa_demangle
    "cuptistream/cupti/libc.py": 1,  # libc: prctl (probe), mallopt (collector), free (CUPTI buffers)
    "cuptistream/cupti/perfworks.py": 1,  # libnvperf_host: metric names and passes, no driver needed
}


def _modules() -> list[tuple[str, ast.Module]]:
    found = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            found.append((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())))
    return found


def test_native_libraries_are_opened_in_one_place_each() -> None:
    opened: dict[str, int] = {}
    for name, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("ctypes.CDLL", "CDLL"):
                opened[name] = opened.get(name, 0) + 1
    assert opened == LOADERS


def test_one_cupti_error_and_one_call() -> None:
    defined: dict[str, list[str]] = {}
    for name, module in _modules():
        for node in module.body:
            if isinstance(node, ast.ClassDef) and node.name == "CuptiError":
                defined.setdefault("CuptiError", []).append(name)
            if isinstance(node, ast.FunctionDef) and node.name in (
                "call",
                "call_status",
                "libcupti",
                "libc_free",
            ):
                defined.setdefault(node.name, []).append(name)
    # CuptiError lives in the one exception tree (cuptistream/errors.py), the calls in the CUPTI layer.
    assert defined == {
        "CuptiError": ["cuptistream/errors.py"],
        **{
            name: ["cuptistream/cupti/library.py"]
            for name in ("call", "call_status", "libcupti", "libc_free")
        },
    }
    assert pcsampling_api.CuptiError is sass_api.CuptiError is library.CuptiError


def test_a_missing_function_is_a_cupti_error_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    class Lib:
        pass

    monkeypatch.setattr(library, "libcupti", lambda: Lib())
    with pytest.raises(
        library.CuptiError, match=r"^cuptiNoSuch failed: not in this libcupti \(CUptiResult 27\)$"
    ):
        library.call("cuptiNoSuch")


def test_call_passes_params_structs_by_reference_and_raises_on_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []

    class Lib:
        @staticmethod
        def cuptiGetCubinCrc(params: object) -> int:
            address = ctypes.cast(params, ctypes.c_void_p).value
            struct = cubin_api.GetCubinCrcParams.from_address(address)
            seen.append(struct.cubinSize)
            struct.cubinCrc = 0xC0FFEE
            return library.SUCCESS

        @staticmethod
        def cuptiGetDeviceId(ctx: object, out: object) -> int:
            return library.ERROR_INVALID_CONTEXT

    monkeypatch.setattr(library, "libcupti", lambda: Lib())
    assert cubin_api.cubin_crc_at(0x1000, 64) == 0xC0FFEE and seen == [64]
    with pytest.raises(library.CuptiError) as info:
        library.call("cuptiGetDeviceId", None, None)
    assert (info.value.call, info.value.code) == ("cuptiGetDeviceId", library.ERROR_INVALID_CONTEXT)
    assert "CUPTI_ERROR_INVALID_CONTEXT" in str(info.value)


def test_api_function_names_are_resolved_by_one_module() -> None:
    """Only cupti/api_functions.py reads cupti-python's API cbid enums for names (the launch hook's
    list of launch cbids aside: it resolves no user pattern)."""
    readers = set()
    for name, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, ast.Attribute) and node.attr in (
                "RuntimeApiTraceCbid", "DriverApiTraceCbid", "runtime_api_trace_cbid", "driver_api_trace_cbid",
            ):  # fmt: skip
                readers.add(name)
    assert readers == {"cuptistream/cupti/api_functions.py", "cuptistream/cupti/launch_hook.py"}


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("cudaLaunchKernel", {"cudaLaunchKernel", "cudaLaunchKernel_ptsz"}),  # a name: itself and its twin
        ("cudaLaunchKernel_v7000", {"cudaLaunchKernel"}),  # CUPTI's enum name
        ("cudaLaunchKernel_ptsz", {"cudaLaunchKernel_ptsz"}),
        (
            "cudaMemset2D*",
            {"cudaMemset2D", "cudaMemset2DAsync", "cudaMemset2D_ptds", "cudaMemset2DAsync_ptsz"},
        ),
    ],
)
def test_one_pattern_rule(pattern: str, expected: set[str]) -> None:
    names = api_functions.api_names("runtime")
    assert {names[c] for c in api_functions.select_cbids("runtime", [pattern])} == expected


def test_driver_names_without_the_v2_suffix_select_every_version() -> None:
    names = api_functions.api_names("driver")
    selected = api_functions.select_cbids("driver", ["cuMemcpyHtoD"])
    assert len(selected) == 3 and {names[c] for c in selected} == {"cuMemcpyHtoD", "cuMemcpyHtoD_v2_ptds"}
    with pytest.raises(ValueError, match=r"^driver_api pattern 'cuFoo\*' matches no driver API function"):
        api_functions.check_patterns("driver", ["cuLaunch*", "cuFoo*"])


@pytest.fixture
def parking(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, str]], FakeCupti]:
    """``driver.park``'s surroundings without libcupti: ``call`` records (name, thread) instead of
    calling CUPTI, and the process-wide subscriber talks to ``FakeCupti`` (the GPU tests run both
    for real). The state source's registration is there, as in a production config."""
    from cuptistream.cupti import driver, subscriber

    calls: list[tuple[str, str]] = []
    fake = FakeCupti()

    def call(name: str, *args: object) -> None:
        calls.append((name, threading.current_thread().name))
        if name == "cuptiFinalize":  # what it leaves: no callback enabled
            fake.enabled_domains.clear()
            fake.enabled_cbids.clear()

    monkeypatch.setattr(driver, "call", call)
    monkeypatch.setattr(subscriber, "_process_subscriber", subscriber.Subscriber(fake))
    subscriber.register(subscriber.Domain.STATE, lambda d, c, data: None)
    monkeypatch.setattr(driver, "_users", {"activity": 1})
    monkeypatch.setattr(driver, "detached_once", False)
    return calls, fake


def test_park_detaches_at_a_program_threads_driver_call_exit(
    parking: tuple[list[tuple[str, str]], FakeCupti],
) -> None:
    """``cuptiFinalize`` runs once, on the thread that left a CUDA driver call (NVIDIA's safe place),
    never at a call's enter; then the subscriber is back with the state source's registration only."""
    from cuptistream.cupti import driver
    from cuptistream.cupti.subscriber import Domain

    calls, fake = parking
    program = DriverCalls(fake)
    try:
        assert driver.park("activity") is None
    finally:
        program.stop()
    assert calls == [("cuptiFinalize", "program-thread")] and driver.detached_once
    assert fake.enabled_domains == {Domain.STATE}  # the exit watch went with the detach
    assert driver._users == {"activity": 1}  # still the source's: the next window attaches afresh


def test_park_stays_attached_when_no_cuda_call_returns(
    parking: tuple[list[tuple[str, str]], FakeCupti],
) -> None:
    """A program in no CUDA call (or in a long one) is not detached from under it: after the wait,
    CUPTI stays attached (it costs an idle program nothing) and the exit watch is removed."""
    from cuptistream.cupti import driver
    from cuptistream.cupti.subscriber import API_ENTER, Domain

    calls, fake = parking
    entering = DriverCalls(fake, sites=(API_ENTER,))  # a thread that enters calls, none returning
    try:
        assert driver.park("activity", wait_s=0.05) == "no CUDA call returned within 0.05 s"
    finally:
        entering.stop()
    assert entering.sites  # it was in CUDA calls all along
    assert calls == [] and not driver.detached_once
    assert fake.enabled_domains == {Domain.STATE}
    program = DriverCalls(fake)  # a call returning now finds nothing armed
    time.sleep(0.02)
    program.stop()
    assert calls == []


def test_park_called_off_at_the_exit_stays_attached(parking: tuple[list[tuple[str, str]], FakeCupti]) -> None:
    """The activity source stops wanting the detach while it waits for a call's exit (the program
    made a CUDA graph, which a detach would break): nothing is finalized, the watch is removed."""
    from cuptistream.cupti import driver
    from cuptistream.cupti.subscriber import Domain

    calls, fake = parking
    program = DriverCalls(fake)
    try:
        reason = driver.park("activity", still_wanted=lambda: False)
    finally:
        program.stop()
    assert reason == "detaching was no longer wanted when a CUDA call returned"
    assert calls == [] and not driver.detached_once and fake.enabled_domains == {Domain.STATE}


def test_park_acts_only_once_both_exit_watches_are_set(
    parking: tuple[list[tuple[str, str]], FakeCupti], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver API watch cannot be set: a runtime call that returns after the runtime watch was
    set, and before that failure, must not detach CUPTI behind the caller's back (it would think
    CUPTI still attached). Nothing is finalized and the runtime watch is taken off."""
    from cuptistream.cupti import driver
    from cuptistream.cupti.subscriber import API_EXIT, ApiCallbackData, Domain

    calls, fake = parking
    returned = ApiCallbackData(callbackSite=API_EXIT)
    enable = fake.enable_domain

    def refuse_driver_domain(on: int, handle: int, domain: int) -> None:
        if on and domain == Domain.DRIVER_API:
            fake.fire(Domain.RUNTIME_API, 1, ctypes.addressof(returned))  # a call returns meanwhile
            raise FakeCuptiError(1)
        enable(on, handle, domain)

    monkeypatch.setattr(fake, "enable_domain", refuse_driver_domain)
    reason = driver.park("activity")
    assert reason is not None and reason.startswith("no callback at a CUDA call's exit"), reason
    assert calls == [] and not driver.detached_once and fake.enabled_domains == {Domain.STATE}


def test_park_never_detaches_cupti_another_source_holds(
    parking: tuple[list[tuple[str, str]], FakeCupti], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cuptistream.cupti import driver

    calls, fake = parking
    program = DriverCalls(fake)
    try:
        monkeypatch.setattr(driver, "_users", {"activity": 1, "pc_sampling": 1})
        assert driver.park("activity") == "another source of ours holds CUPTI"
        monkeypatch.setattr(driver, "_users", {"activity": 2})
        assert driver.park("activity") == "another source of ours holds CUPTI"
    finally:
        program.stop()
    assert calls == [] and not driver.detached_once
