"""The pm_sampling source when the counters cannot be had. There is no GPU here, so the device side
is a stand-in (``StandInSession``) whose Enable fails with the CUptiResult codes CUPTI returns
(cupti_result.h / cupti_pmsampling.h: 26 CUPTI_ERROR_HARDWARE_BUSY, "in use by other client"; 7
CUPTI_ERROR_INVALID_OPERATION, "already enabled on the device"; 35 CUPTI_ERROR_INSUFFICIENT_PRIVILEGES,
ERR_NVGPUCTRPERM), turned into exceptions by the same ``unavailable`` the real session uses; the
real session's own mapping is checked against cupti-python's ``cuptiError`` with the driver calls
replaced. The last test runs a real collector and a probe process (with the same stand-in) beside
another source."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cupti import cupti

import cuptistream
from cuptistream.channel.messages import GpmAsk, SamplerGrant
from cuptistream.config import convert
from cuptistream.cupti import counter_holders, driver
from cuptistream.cupti.pm_sampling_api import CountersHeld, NoCounterPermission, PmSamplingSession
from cuptistream.events import Kernel, PmSamples
from cuptistream.sources import pm_sampling
from cuptistream.sources.pm_sampling import PmSamplingConfig
from tests.test_pm_samplers import _Node
from tests.test_pm_sampling_source import StandInSession, _source
from tests.test_sass_window import RecordingEmitter

BUSY, INVALID_OPERATION, NO_PERMISSION = 26, 7, 35
FAST = {"initial_backoff": "50ms", "max_backoff": "100ms"}


@pytest.fixture(autouse=True)
def _cupti_stays_attached() -> Iterator[None]:
    driver.acquire("test")  # so the source's release does not finalize a CUPTI that has no driver here
    yield
    driver.release("test", finalize=False)


def _samples(emitter: RecordingEmitter) -> list[PmSamples]:
    return [e for e in emitter.events if isinstance(e, PmSamples)]


def _until(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_held_counters_are_one_warning_then_standby_then_sampling_resumes_with_the_gap_counted() -> None:
    session = StandInSession(0)
    session.enable_results = [BUSY, BUSY, INVALID_OPERATION]  # freed at the fourth Enable
    source, emitter = _source(session, standby=FAST)
    source.start()
    _until(lambda: len(_samples(emitter)) >= 2)
    source.stop()
    warnings = [e for e in emitter.errors if e[2] == "warning"]
    [(origin, message, _, code)] = warnings
    assert origin == "source:pm_sampling" and code == BUSY and "\n" not in message
    assert "CUPTI_ERROR_HARDWARE_BUSY" in message and "standing by" in message
    assert counter_holders.describe() in message  # the holder as far as this host shows it
    # Every failed Enable is undone before the next, so each try starts clean.
    assert session.calls[:7] == ["enable", "disable"] * 3 + ["enable"]
    assert session.calls[7:9] == ["configure", "start"]
    [(stage, reason, missed, unit)] = emitter.losses
    assert (stage, reason, unit) == ("pm_sampling", "counters_held", "samples")
    assert missed >= 10  # three waits of >= 50 ms at a 10 ms interval
    [info] = [e for e in emitter.errors if e[2] == "info"]
    assert "resumed" in info[1] and "4 tries" in info[1] and f"{missed} samples missed" in info[1]
    assert source.stats["standbys"] == 1 and source.stats["standby_s"] >= 0.1


def test_stop_while_standing_by_returns_at_once_and_counts_what_was_missed() -> None:
    session = StandInSession(0)
    session.enable_results = [BUSY] * 100
    source, emitter = _source(session)  # the default waits: 5 s, then 10 s ...
    source.start()
    _until(lambda: bool(emitter.errors))
    time.sleep(0.2)
    began = time.monotonic()
    source.stop()
    assert time.monotonic() - began < 1.0
    assert not any(t.name == "cuptistream-pm_sampling" for t in threading.enumerate())
    assert session.calls == ["enable", "disable", "disable"] and not _samples(emitter)
    assert [e[2] for e in emitter.errors] == ["warning"]  # no "resumed"
    [(_, reason, missed, _)] = emitter.losses
    assert reason == "counters_held" and missed >= 15  # >= 0.2 s stood by at 10 ms


def test_no_permission_is_one_line_naming_the_driver_option_and_is_not_retried() -> None:
    session = StandInSession(0)
    session.enable_results = [NO_PERMISSION, NO_PERMISSION]
    source, emitter = _source(session, standby=FAST)
    source.start()
    _until(lambda: bool(emitter.errors))
    time.sleep(0.3)  # three backoffs' time: no second Enable comes
    source.stop()
    [(_, message, severity, code)] = emitter.errors
    assert severity == "error" and code == NO_PERMISSION and "\n" not in message
    assert "NVreg_RestrictProfilingToAdminUsers=0" in message and "CAP_SYS_ADMIN" in message
    assert "ERR_NVGPUCTRPERM" in message and "not retried" in message
    assert session.calls.count("enable") == 1 and emitter.losses == []


def test_a_failure_once_the_counters_are_free_is_not_called_resumed() -> None:
    session = StandInSession(0, fail_config=ValueError("CUPTI refused the PM sampling config on GH100"))
    session.enable_results = [BUSY]
    source, emitter = _source(session, standby=FAST)
    source.start()
    _until(lambda: len(emitter.errors) >= 2)
    source.stop()
    assert [e[2] for e in emitter.errors] == ["warning", "error"] and "refused" in emitter.errors[1][1]
    assert [loss[1] for loss in emitter.losses] == ["counters_held"]


def test_with_retry_off_held_counters_are_one_warning_and_the_source_ends() -> None:
    session = StandInSession(0)
    session.enable_results = [BUSY, BUSY]
    source, emitter = _source(session, standby={"enabled": False})
    source.start()
    _until(lambda: bool(emitter.errors))
    time.sleep(0.1)
    source.stop()
    [(_, message, severity, code)] = emitter.errors
    assert severity == "warning" and code == BUSY and "standing by" not in message
    assert session.calls.count("enable") == 1


def test_the_rest_of_the_process_runs_on_while_one_source_stands_by() -> None:
    held, free = StandInSession(0), StandInSession(1)
    held.enable_results = [BUSY] * 100
    standing, standing_out = _source(held, standby=FAST)
    sampling, sampling_out = _source(free, name="pm_sampling_1", device=1)
    standing.start()
    sampling.start()
    _until(lambda: len(_samples(sampling_out)) >= 3 and held.calls.count("enable") >= 3)
    assert not _samples(standing_out)  # still standing by, retrying
    sampling.stop()
    standing.stop()
    assert sampling_out.errors == [] and sampling_out.losses == []


class _Grants:
    """The probe's grants as the source uses them; records whether the device was released."""

    def __init__(self, grant: SamplerGrant) -> None:
        self.grant = grant
        self.released: list[int] = []

    def uuid_of(self, device: int) -> str:
        return self.grant.uuid

    def wait(
        self, uuid: str, source: str, stopping: threading.Event, gpm: GpmAsk | None = None, ask: bool = True
    ) -> SamplerGrant:
        return self.grant

    def release(self, uuid: str, source: str, last_end: int) -> None:
        self.released.append(last_end)


def test_the_grant_is_kept_while_standing_by_and_a_handover_gap_ends_where_standby_begins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pm_sampling, "_TAKEOVER_S", 0.5)  # the hand-over's own retries of Enable
    session = StandInSession(0)
    session.enable_results = [BUSY] * 100  # held past the hand-over's own retries
    source, emitter = _source(session, standby=FAST)
    grants = _Grants(SamplerGrant(uuid="GPU-0", source="pm_sampling", previous=41, since=1))
    source.use_grants(grants)  # type: ignore[arg-type]
    source.start()
    _until(lambda: any(e[2] == "warning" for e in emitter.errors), seconds=10)
    time.sleep(0.2)
    assert grants.released == []  # standing by, the device stays ours
    source.stop()
    assert grants.released == [0]
    reasons = [loss[1] for loss in emitter.losses]
    assert reasons == ["sampler_handover", "counters_held"]
    assert [e[2] for e in emitter.errors] == ["info", "warning"]  # the hand-over's gap, then the holder


def test_the_holder_is_named_where_the_host_shows_it(tmp_path: Path) -> None:
    for pid, name in ((812, "nv-hostengine"), (900, "python3"), (1, "systemd")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(name + "\n")
    (tmp_path / "self").mkdir()
    described = counter_holders.describe(tmp_path)
    assert (
        described.startswith("nv-hostengine (pid 812) runs here: DCGM")
        and "dcgmi profile --pause" in described
    )
    assert counter_holders.describe(tmp_path / "none") == counter_holders.GENERIC
    assert "dcgmi profile --pause" in counter_holders.GENERIC and "Nsight" in counter_holders.GENERIC


class _Cupti:
    """cupti-python's module with the calls that need a driver replaced: Enable fails with ``code``."""

    def __init__(self, code: int) -> None:
        self.code, self.calls = code, []

    def __getattr__(self, name: str) -> Any:
        return getattr(cupti, name)

    def profiler_initialize(self, ptr: int) -> None:
        self.calls.append("initialize")

    def device_get_chip_name(self, ptr: int) -> None:
        pass

    def pm_sampling_enable(self, ptr: int) -> None:
        raise cupti.cuptiError(self.code)

    def profiler_deinitialize(self, ptr: int) -> None:
        self.calls.append("deinitialize")


@pytest.mark.parametrize(
    ("code", "raised"),
    [(BUSY, CountersHeld), (INVALID_OPERATION, CountersHeld), (NO_PERMISSION, NoCounterPermission)],
)
def test_the_session_maps_cuptis_codes_and_leaves_nothing_initialized(code: int, raised: type) -> None:
    session = PmSamplingSession.__new__(PmSamplingSession)
    PmSamplingSession.__init__(session, 0)
    fake = _Cupti(code)
    session._c = fake
    with pytest.raises(raised) as caught:
        session.enable()
    assert caught.value.code == code and fake.calls == ["initialize", "deinitialize"]


def test_other_cupti_failures_pass_through() -> None:
    session = PmSamplingSession(0)
    session._c = _Cupti(999)
    with pytest.raises(cupti.cuptiError):
        session.enable()


class _KeepingCupti(_Cupti):
    """Enable and SetConfig succeed; SetConfig notes the config image's address, as CUPTI keeps it."""

    def __init__(self) -> None:
        super().__init__(0)
        self.config_address = 0

    def pm_sampling_enable(self, ptr: int) -> None:
        pass

    def pm_sampling_set_config(self, ptr: int) -> None:
        self.config_address = cupti.PmSamplingSetConfigParams.from_ptr(ptr).p_config

    def pm_sampling_disable(self, ptr: int) -> None:
        self.calls.append("disable")


def test_the_session_owns_the_config_image_until_disable() -> None:
    # CUPTI reads SetConfig's image at Start and Decode, by address: freed, it reads whatever the
    # memory holds next. No driver here: the cupti calls that need one are replaced.
    session = PmSamplingSession(0)
    fake = _KeepingCupti()
    session._c = fake
    session.enable()
    image = np.arange(64, dtype=np.uint8)
    owner = weakref.ref(image)
    session._set_config(image, 20_000_000, 64 << 20)
    assert fake.config_address == image.ctypes.data
    del image
    gc.collect()
    assert owner() is not None, "the config image was freed while CUPTI holds its address"
    session.disable()
    gc.collect()
    assert owner() is None and fake.calls == ["initialize", "disable", "deinitialize"]


@pytest.mark.parametrize(
    ("retry", "fragment"),
    [
        ({"initial_backoff": "0s"}, "initial_backoff must be more than 0"),
        ({"initial_backoff": "10s", "max_backoff": "5s"}, "max_backoff must be at least"),
        ({"multiplier": 0.5}, "multiplier must be at least 1"),
        ({"every": "5s"}, "every"),
    ],
)
def test_bad_retry_values_are_one_line(retry: dict[str, Any], fragment: str) -> None:
    with pytest.raises(Exception) as caught:
        convert({"type": "pm_sampling", "standby": retry}, PmSamplingConfig)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_retry_defaults() -> None:
    retry = convert({"type": "pm_sampling"}, PmSamplingConfig).standby
    assert (retry.enabled, float(retry.initial_backoff), float(retry.max_backoff), retry.multiplier) == (
        True, 5.0, 60.0, 2.0,
    )  # fmt: skip


# --- a real collector and a probe process: the grant kept, the rest of the process running on ----

_PROGRAM = """
import json, os, sys, time, cuptistream
from cuptistream.cupti import driver
from cuptistream.cupti.pm_sampling_api import Decoded, unavailable
from cuptistream.events import DeviceInfo
from cuptistream.probe import probe as probe_module
from cuptistream.sources.pm_sampling import PmSamplingSource

sock, uuid, marks = sys.argv[1:4]
STEP = 10_000_000  # the configured interval

class StandIn:  # the device side: Enable fails as CUPTI does while another tool holds the counters
    def __init__(self, device): self.device = device
    def enable(self):
        if not os.path.exists(marks + ".free"):
            open(marks + ".refused", "w").close()
            raise unavailable(self.device, 26)  # CUPTI_ERROR_HARDWARE_BUSY
        return "GH100"
    def configure(self, metrics, interval_ns, hardware_buffer): self.metrics = metrics; return metrics
    def start(self): self.next = time.time_ns()
    def stop(self): pass
    def disable(self): pass
    def decode(self, max_samples):
        starts = list(range(self.next, time.time_ns() - STEP, STEP))
        if starts:
            self.next = starts[-1] + STEP
            open(marks + ".decoded", "w").close()
        values = [[50.0] * len(starts) for _ in self.metrics]
        return Decoded(starts, [s + STEP for s in starts], values, False, "end_of_records")

PmSamplingSource.session_factory = StandIn
PmSamplingSource.find_context = lambda self, device: 0xC0
probe_module.visible_devices = lambda: [DeviceInfo(device_id=0, name="stand-in", uuid=uuid)]
driver.acquire("test")  # no driver here: the source's release must not finalize CUPTI
sampler = {"type": "pm_sampling", "metrics": ["sm__cycles_active.avg.pct_of_peak_sustained_elapsed"],
           "interval": "10ms", "decode_period": "50ms",
           "standby": {"initial_backoff": "50ms", "max_backoff": "100ms"}}
synthetic = {"type": "synthetic", "events": 0, "rate": 500, "chunk_events": 10}
config = {"sources": [sampler, synthetic], "sinks": [{"type": "null"}]}
with cuptistream.session(config, collector=sock, quiet=True) as s:
    source = next(x for x in s.sources if isinstance(x, PmSamplingSource))
    open(marks + ".started", "w").close()
    while not os.path.exists(marks + ".stop"):
        time.sleep(0.02)
print(json.dumps(source.stats))
"""


@pytest.mark.slow  # real collector and probe processes, seconds each
def test_under_a_collector_the_standing_by_probe_keeps_its_grant_and_its_other_sources_run_on(
    tmp_path: Path,
) -> None:
    node = _Node(tmp_path)
    marks = tmp_path / "probe"
    process = subprocess.Popen(
        [sys.executable, "-c", _PROGRAM, node.sock, "GPU-held", str(marks)],
        env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _until(lambda: Path(f"{marks}.refused").exists() or process.poll() is not None, seconds=30)
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.3)  # several retries
        assert node.collector.samplers.holder("GPU-held") == process.pid  # standing by, still granted
        Path(f"{marks}.free").touch()  # the other tool let go
        _until(lambda: Path(f"{marks}.decoded").exists(), seconds=30)
        Path(f"{marks}.stop").touch()
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
        samples, errors, losses = node.recording()
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["standbys"] == 1 and stats["samples"] > 0
    assert sum(len(e.ends) for e in samples[process.pid]) == stats["samples"]
    [warning] = [e for _, e in errors if e.severity == "warning"]
    assert "CUPTI_ERROR_HARDWARE_BUSY" in warning.message and warning.result_code == 26
    assert [e for _, e in errors if e.severity == "info" and "resumed" in e.message]
    [held] = [e for e in losses if e.reason == "counters_held"]
    assert held.stage == "pm_sampling" and held.unit == "samples" and held.count >= 20  # >= 0.3 s
    kernels = [e for b in cuptistream.read(node.out).batches() for e in b.events if isinstance(e, Kernel)]
    assert len(kernels) >= 100  # the synthetic source emitted throughout
