"""The probe/collector boundary without a GPU: real sockets, real shared memory, real subprocesses
and real signals. CUPTI itself cannot exist here: where a test needs it, a fake libcupti records
the calls (and says so); the data crossing the boundary is real CUPTI output (the replay fixtures).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream.events import ActivityStats, GpuStats, Kernel, Loss
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures
from tests.gpu.workloads.collect import Collect

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CLI = [sys.executable, "-m", "cuptistream.cli"]


def _expected(capture: str | None = None) -> tuple[int, int]:
    """(events, buffers) the committed captures decode to (one capture, or all)."""
    entries = [EXPECTED[capture]] if capture else list(EXPECTED.values())
    return sum(sum(e["decoded_events"].values()) for e in entries), sum(e["buffers"] for e in entries)


def _write_config(path: Path, out: Path, source: dict[str, Any], **extra: Any) -> Path:
    cfg = {"sources": [source], "sinks": [{"type": "file", "directory": str(out)}], **extra}
    path.write_text(json.dumps(cfg))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


# --- the API filter order (fake libcupti: CUPTI cannot run without a GPU) -----------------------


class _FakeCupti:
    """Stands in for libcupti: every call succeeds and is recorded in order; record sizes come from
    a real capture's table (``cuptiActivityGetStructSize``)."""

    def __init__(self, struct_sizes: dict[int, int] | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.struct_sizes = struct_sizes or {}

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("cupti"):
            raise AttributeError(name)

        def call(*args: Any) -> int:
            self.calls.append((name, args))
            if name == "cuptiActivityGetStructSize" and args[0] in self.struct_sizes:
                args[2]._obj.value = self.struct_sizes[args[0]]
            return 0

        return call


def test_api_filters_are_set_after_their_kinds_are_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuptistream.cupti import api_functions, driver, gpus, library
    from cuptistream.sources.activity import ActivitySource, ActivitySourceConfig

    fake = _FakeCupti()
    monkeypatch.setattr(library, "libcupti", lambda: fake)
    monkeypatch.setattr(driver, "require_gpu", lambda: None)
    monkeypatch.setattr(gpus, "device_name", lambda ordinal=0: "fake GPU")
    config = ActivitySourceConfig(
        type="activity", kinds=["concurrent_kernel", "runtime", "driver"], flush_interval=0,
        runtime_api=["cudaLaunchKernel"], driver_api=["cuLaunchKernel"],
    )  # fmt: skip
    source = ActivitySource(config, Collect())
    source.start()
    source.stop()
    names = [name for name, _ in fake.calls]
    enables = {args[0]: i for i, (name, args) in enumerate(fake.calls) if name == "cuptiActivityEnable"}
    for kind, setter in ((5, "cuptiActivityEnableRuntimeApi"), (4, "cuptiActivityEnableDriverApi")):
        positions = [i for i, n in enumerate(names) if n == setter]
        assert positions, f"{setter} never called"
        assert min(positions) > enables[kind], (
            f"{setter} before cuptiActivityEnable({kind}): the filter is lost"
        )
    on = {
        (name, args[0]) for name, args in fake.calls
        if name.endswith(("RuntimeApi", "DriverApi")) and args[1] == 1
    }  # fmt: skip
    expected = {
        ("cuptiActivityEnableRuntimeApi", c)
        for c in api_functions.select_cbids("runtime", ["cudaLaunchKernel"])
    }
    expected |= {
        ("cuptiActivityEnableDriverApi", c) for c in api_functions.select_cbids("driver", ["cuLaunchKernel"])
    }
    assert on == expected


def test_resource_kinds_are_enabled_with_a_dump_of_what_predates_cupti(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUPTI makes device records at CUDA's initialization and context/stream records at creation; a
    probe attached later (the usual case) sees them only through cuptiActivityEnableAndDump. A plain
    enable gives no device event there, and so no hw.gpu.memory.limit."""
    from cuptistream.cupti import driver, gpus, library
    from cuptistream.sources.activity import ActivitySource, ActivitySourceConfig

    fake = _FakeCupti()
    monkeypatch.setattr(library, "libcupti", lambda: fake)
    monkeypatch.setattr(driver, "require_gpu", lambda: None)
    monkeypatch.setattr(gpus, "device_name", lambda ordinal=0: "fake GPU")
    config = ActivitySourceConfig(
        type="activity",
        kinds=["concurrent_kernel", "device", "context", "stream", "memory2"],
        flush_interval=0,
    )
    source = ActivitySource(config, Collect())
    source.start()
    source.stop()
    dumped = {args[0] for name, args in fake.calls if name == "cuptiActivityEnableAndDump"}
    plain = {args[0] for name, args in fake.calls if name == "cuptiActivityEnable"}
    assert dumped == {8, 9, 37}  # CUPTI_ACTIVITY_KIND_DEVICE, _CONTEXT, _STREAM
    assert plain == {10, 49}  # CONCURRENT_KERNEL, MEMORY2


def test_buffer_callbacks_hand_whole_buffers_over_and_capture_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """CUPTI's two buffer callbacks, called as CUPTI would, with a buffer CUPTI wrote on an H200."""
    import ctypes

    from cuptistream.cupti import capture, driver, gpus, library
    from cuptistream.sources.activity import ActivitySource, ActivitySourceConfig

    cap = capture.read(CAPTURES / "exact_counts.cupti")
    monkeypatch.setattr(library, "libcupti", lambda: _FakeCupti(dict(cap.struct_sizes)))
    monkeypatch.setattr(driver, "require_gpu", lambda: None)
    monkeypatch.setattr(gpus, "device_name", lambda ordinal=0: "fake GPU")
    config = ActivitySourceConfig(
        type="activity", kinds=["concurrent_kernel", "runtime", "driver", "memcpy"], flush_interval=0,
        capture=str(tmp_path / "again.cupti"),
    )  # fmt: skip
    emitter = Collect()
    source = ActivitySource(config, emitter)
    source.start()
    assert source.callbacks is not None
    buffer, size, most = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    source.callbacks._requested(ctypes.pointer(buffer), ctypes.pointer(size), ctypes.pointer(most))
    assert buffer.value and size.value == config.buffer_size
    data = cap.buffers[0].data
    ctypes.memmove(buffer.value, data, len(data))
    source.callbacks._completed(None, 0, buffer.value, size.value, len(data))
    source.stop()
    kernels = [e for e in emitter.events if isinstance(e, Kernel)]
    assert len(kernels) == EXPECTED["exact_counts"]["decoded_events"]["Kernel"]
    again = capture.read(tmp_path / "again.cupti")  # written when the source stopped
    assert [b.data for b in again.buffers] == [data]


# --- the channel across real processes ----------------------------------------------------------


def test_run_decodes_replayed_buffers_in_the_collector_process(tmp_path: Path) -> None:
    cfg = _write_config(tmp_path / "cfg.json", tmp_path / "out", {"type": "replay"})
    report_path = tmp_path / "report.json"
    program = "import os; print(os.getpid(), flush=True)"
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--report-json", str(report_path), "--",
                             "python", "-c", program], capture_output=True, text=True, timeout=120, env=_env())  # fmt: skip
    assert result.returncode == 0, result.stderr
    program_pid = int(result.stdout.split()[0])
    events, buffers = _expected()
    report = json.loads(report_path.read_text())
    assert report["probes"] == 1
    assert report["activity_buffers"] == buffers  # decoded in the collector, not the program
    assert report["activity_records"] >= events
    batches = list(cuptistream.read(tmp_path / "out").batches())

    def accounting(event: object) -> bool:
        return isinstance(event, Loss) or type(event).__name__ == "SelfStats"

    def statistics(event: object) -> bool:
        return isinstance(event, (ActivityStats, GpuStats))

    decoded = [e for b in batches for e in b.events if not accounting(e) and not statistics(e)]
    assert len(decoded) == events
    assert any(statistics(e) for b in batches for e in b.events)  # on by default
    data_pids = {b.resource.pid for b in batches if not all(accounting(e) for e in b.events)}
    assert data_pids == {program_pid}, "data batches must describe the observed program"
    collector = [b for b in batches if b.resource.pid != program_pid]
    assert collector and all(accounting(e) for b in collector for e in b.events)


SILENT_PUBLISHER = r"""
import os, signal, sys
from cuptistream.channel.messages import OpenStream
from cuptistream.cupti import capture
from cuptistream.events import Resource
from cuptistream.probe.emitter import ProbeEmitter
from cuptistream.probe.link import ProbeLink

cap = capture.read(sys.argv[2])
link = ProbeLink(sys.argv[1], "crash-test", Resource(host="h", pid=os.getpid(), process_name="p", command_line=[]))
emitter = ProbeEmitter(link, 1 << 20, "drop_newest", 1 << 20, 2, lambda: None)
link.connect()
stream = OpenStream(stream=0, source="replay", struct_sizes=dict(cap.struct_sizes), strings=dict(cap.strings))
outlet = emitter.open_activity_stream(stream, 1 << 20, len(cap.buffers))
for buf in cap.buffers:  # publish, but die before any wake-up reaches the collector
    slot = outlet.pool.take()
    outlet.pool.view(slot, len(buf.data))[:] = buf.data
    outlet.pool.publish(slot, 1, outlet.stream, len(buf.data), buf.dropped)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _start_collector(tmp_path: Path, name: str, socket_path: Path) -> subprocess.Popen[str]:
    cfg = _write_config(tmp_path / f"{name}.json", tmp_path / name, {"type": "synthetic", "events": 1})
    proc = subprocess.Popen([*CLI, "collector", "-c", str(cfg), "--socket", str(socket_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("listening on"), proc.stderr.read() if proc.stderr else ""
    return proc


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    return stderr


def test_a_sigkilled_probe_loses_no_published_buffer(tmp_path: Path) -> None:
    socket_path = tmp_path / "c.sock"
    collector = _start_collector(tmp_path, "node", socket_path)
    capture_file = CAPTURES / "exact_counts.cupti"
    child = subprocess.run([sys.executable, "-c", SILENT_PUBLISHER, str(socket_path), str(capture_file)],
                           capture_output=True, text=True, timeout=60, env=_env())  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    _stop(collector)
    kernels = collections.Counter(
        e.name for e in cuptistream.read(tmp_path / "node") if isinstance(e, Kernel)
    )
    assert dict(kernels) == EXPECTED["exact_counts"]["kernel_names"]


SESSION_PROGRAM = r"""
import sys, time
import cuptistream
cfg = {"probe": {"collector": sys.argv[1], "event_buffers": 2, "event_buffer_size": "64KiB"},
       "sources": [{"type": "synthetic", "events": 0, "rate": 20000, "chunk_events": 200, "duration": float(sys.argv[2])}],
       "sinks": [{"type": "null"}]}
start = time.monotonic()
with cuptistream.session(cfg):
    print("started", flush=True)
    cuptistream_sources = None
    time.sleep(float(sys.argv[2]) + 0.5)
print(f"elapsed {time.monotonic() - start:.2f}", flush=True)
sys.exit(5)
"""


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_a_dead_collector_never_blocks_the_program_and_losses_reach_the_next(tmp_path: Path) -> None:
    socket_path = tmp_path / "c.sock"
    first = _start_collector(tmp_path, "first", socket_path)
    program = subprocess.Popen([sys.executable, "-c", SESSION_PROGRAM, str(socket_path), "5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    assert program.stdout is not None and program.stdout.readline().strip() == "started"
    time.sleep(1.0)
    first.kill()  # SIGKILL: no drain, no goodbye
    first.wait(10)
    time.sleep(1.5)  # the program keeps going on its own; its event buffers fill and it counts drops
    second = _start_collector(tmp_path, "second", socket_path)
    out, err = program.communicate(timeout=60)
    assert program.returncode == 5, err
    elapsed = float(out.split("elapsed")[1])
    assert elapsed < 5 + 0.5 + 3, f"the program was held up: {elapsed:.1f}s"
    _stop(second)
    events = list(cuptistream.read(tmp_path / "second"))
    losses = collections.Counter()
    for event in events:
        if isinstance(event, Loss):
            losses[event.stage, event.reason] += event.count
    assert losses["probe", "collector_unavailable"] > 0, losses
    assert any(isinstance(e, Kernel) for e in events), "the probe did not reconnect to the new collector"


def test_one_collector_serves_several_probes(tmp_path: Path) -> None:
    socket_path = tmp_path / "c.sock"
    collector = _start_collector(tmp_path, "node", socket_path)
    program = (
        "import sys, cuptistream\n"
        "cfg = {'sources': [{'type': 'synthetic', 'events': 3000}], 'sinks': [{'type': 'null'}]}\n"
        "with cuptistream.session(cfg, collector=sys.argv[1], quiet=True): pass\n"
    )
    children = [
        subprocess.Popen([sys.executable, "-c", program, str(socket_path)], env=_env()) for _ in range(3)
    ]
    assert [c.wait(60) for c in children] == [0, 0, 0]
    stderr = _stop(collector)
    kernels = [e for e in cuptistream.read(tmp_path / "node") if isinstance(e, Kernel)]
    assert len(kernels) == 3 * 3000, stderr


def test_session_starts_its_own_collector_process(tmp_path: Path) -> None:
    cfg = {"sources": [{"type": "replay", "path": str(CAPTURES / "exact_counts.cupti")}],
           "sinks": [{"type": "file", "directory": str(tmp_path / "out")}]}  # fmt: skip
    with cuptistream.session(cfg, quiet=True) as session:
        pass
    assert session.report is not None and session.report.probes == 1
    assert session.report.activity_buffers == EXPECTED["exact_counts"]["buffers"]
    kernels = collections.Counter(e.name for e in cuptistream.read(tmp_path / "out") if isinstance(e, Kernel))
    assert dict(kernels) == EXPECTED["exact_counts"]["kernel_names"]


def test_unreachable_collector_is_one_line(tmp_path: Path) -> None:
    program = (
        "import cuptistream\n"
        f"cfg = {{'sources': [], 'sinks': [{{'type': 'null'}}], 'probe': {{'collector': '{tmp_path}/none.sock'}}}}\n"
        "cuptistream.session(cfg).start()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert result.returncode != 0
    assert "cannot reach the collector at" in result.stderr


REPLAY_PROGRAM = r"""
import sys, time
import cuptistream
cfg = {"probe": {"collector": sys.argv[1]},
       "sources": [{"type": "replay", "path": sys.argv[2], "loops": 0}], "sinks": [{"type": "null"}]}
with cuptistream.session(cfg, quiet=True):
    print("started", flush=True)
    time.sleep(2.0)
"""


def test_a_dead_collector_does_not_hold_an_endless_replay_at_exit(tmp_path: Path) -> None:
    socket_path = tmp_path / "c.sock"
    collector = _start_collector(tmp_path, "node", socket_path)
    began = time.monotonic()
    program = subprocess.Popen(
        [sys.executable, "-c", REPLAY_PROGRAM, str(socket_path), str(CAPTURES / "exact_counts.cupti")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    assert program.stdout is not None and program.stdout.readline().strip() == "started"
    collector.kill()
    collector.wait(10)
    _, err = program.communicate(timeout=60)
    assert program.returncode == 0, err
    assert time.monotonic() - began < 15, "the replay waited for slots nobody will free"


def test_probe_environment_points_a_launched_job_at_a_node_collector(tmp_path: Path) -> None:
    """``launch.probe_environment``: what ``run`` gives its command, aimed at a node collector that
    is already listening. A launcher (here ``sh`` starting two Pythons, as ``torchrun`` starts
    ranks) runs with it unchanged, and every Python process feeds that collector."""
    from cuptistream.run.program import probe_environment

    socket_path = tmp_path / "c.sock"
    collector = _start_collector(tmp_path, "node", socket_path)
    program = _write_config(
        tmp_path / "program.json", tmp_path / "unused",
        {"type": "replay", "path": str(CAPTURES / "exact_counts.cupti"), "loops": 1},
    )  # fmt: skip
    env = probe_environment(str(socket_path), program, quiet=True)
    assert env["CUPTISTREAM_COLLECTOR"] == str(socket_path)
    assert env["CUPTISTREAM_PROBE_START"] == "process"  # a replay traces no CUDA: probed at start-up
    env["PYTHONPATH"] += os.pathsep + str(ROOT)
    py = sys.executable
    job = subprocess.run(["sh", "-c", f"{py} -c pass & {py} -c pass; wait"], env=env, timeout=120)
    assert job.returncode == 0
    stderr = _stop(collector)
    kernels = collections.Counter(
        e.name for e in cuptistream.read(tmp_path / "node") if isinstance(e, Kernel)
    )
    expected = EXPECTED["exact_counts"]["kernel_names"]
    assert dict(kernels) == {name: 2 * count for name, count in expected.items()}, stderr
    assert not (tmp_path / "unused").exists()  # the sinks are the collector's
