"""The OTLP sink follows the OpenTelemetry semantic conventions (tests/semconv/names.txt, v1.44.0):
identity (service, process, host, telemetry.sdk), the hardware metrics (hw.gpu.*, hw.power, ...),
EventName on log records, one Resource per observed process, and the opt-in command line.

Every request the receiver decodes is also checked name by name by tests/semconv_check.py when the
receiver closes (tests/otlp_receiver.py), here and in every other OTLP test.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from cuptistream.config import build
from cuptistream.events import Device, Environment, MemoryAllocation, Resource
from cuptistream.pipeline.resource import current_resource
from tests.otlp_batches import OFFSET, UUID, api, kernel, make_batch, other_events, outgoing, step_events
from tests.otlp_receiver import OtlpReceiver
from tests.semconv_check import conventions
from tests.test_otlp import attrs, deliver, sink_for

SECOND = 1_000_000_000


@pytest.fixture
def receiver() -> Any:
    with OtlpReceiver() as r:
        yield r


def _resource(receiver: OtlpReceiver, path: str = "/v1/traces") -> list[dict[str, Any]]:
    field = {"/v1/traces": "resource_spans", "/v1/metrics": "resource_metrics", "/v1/logs": "resource_logs"}
    return [attrs(rx.resource) for m in receiver.messages(path) for rx in getattr(m, field[path])]


def test_the_names_list_is_the_one_the_sink_claims() -> None:
    from cuptistream.sinks.otlp.common import SCHEMA_URL, SEMCONV_VERSION

    version, attributes, metrics, _ = conventions()
    assert version == SEMCONV_VERSION and SCHEMA_URL.endswith("/" + version)
    assert {"service.name", "service.instance.id", "process.parent_pid", "hw.model"} <= set(attributes)
    assert metrics["hw.gpu.utilization"][:2] == ("1", "gauge")
    assert "hw.gpu.uuids" not in attributes and "hw.gpu.names" not in attributes  # what we used to invent


def test_identity_of_the_observed_process(receiver: OtlpReceiver, monkeypatch: Any) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    batch = make_batch(step_events())
    batch.attributes = {}
    batch.resource = Resource(
        host="gpu-host-1", pid=4242, ppid=4000, process_name="python3", command_line=[], rank=3,
        local_rank=1, world_size=8,
    )  # fmt: skip
    assert deliver(sink_for(receiver.endpoint, signals=["traces"]), batch) == []
    (res,) = _resource(receiver)
    assert res["service.name"] == "unknown_service:python3"  # the SDK rule, with the observed program
    assert res["process.executable.name"] == "python3" and res["process.pid"] == 4242
    assert res["process.parent_pid"] == 4000 and res["host.name"] == "gpu-host-1"
    assert (res["job.rank"], res["job.local_rank"], res["job.world_size"]) == (3, 1, 8)
    assert res["telemetry.sdk.name"] == "cuptistream" and res["telemetry.sdk.language"] == "python"
    assert "process.command_line" not in res and "process.command_args" not in res
    assert "service.version" not in res  # not known for the observed program
    rs = receiver.messages("/v1/traces")[0].resource_spans[0]
    assert rs.schema_url == "https://opentelemetry.io/schemas/1.44.0"

    again = OtlpReceiver()
    with again:
        deliver(sink_for(again.endpoint, signals=["traces"]), batch)
    assert _resource(again)[0]["service.instance.id"] == res["service.instance.id"]  # stable per process


def test_otel_service_name_and_resource_attributes(receiver: OtlpReceiver, monkeypatch: Any) -> None:
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored,service.version=2.1%2C0,service.namespace=ml"
    )
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer-env")
    batch = make_batch(other_events())
    batch.attributes = {}
    assert deliver(sink_for(receiver.endpoint, signals=["logs"]), batch) == []
    (res,) = _resource(receiver, "/v1/logs")
    assert (res["service.name"], res["service.version"], res["service.namespace"]) == (
        "trainer-env",
        "2.1,0",
        "ml",
    )

    batch.attributes = {"service.name": "from-config"}  # the config's session.attributes win
    with OtlpReceiver() as other:
        deliver(sink_for(other.endpoint, signals=["logs"]), batch)
    assert _resource(other, "/v1/logs")[0]["service.name"] == "from-config"


def test_log_records_name_their_event_in_the_event_name_field(receiver: OtlpReceiver) -> None:
    assert deliver(sink_for(receiver.endpoint, signals=["logs"]), make_batch(other_events())) == []
    records = receiver.log_records()
    assert len(records) == 2
    assert all(r.event_name == "cuptistream.error" and "event.name" not in attrs(r) for r in records)


def test_each_observed_process_is_its_own_resource(receiver: OtlpReceiver) -> None:
    batches = []
    for rank in (0, 1):
        batch = make_batch([api(1, 100, 200), kernel(1, 300, 400 + rank * 100)], seq=rank)
        batch.resource = Resource(
            host="h", pid=100 + rank, process_name="python3", command_line=[], rank=rank
        )
        batches.append(batch)
    assert deliver(sink_for(receiver.endpoint, signals=["traces", "metrics"]), *batches) == []
    by_rank = {}
    for m in receiver.messages("/v1/traces"):
        for rs in m.resource_spans:
            by_rank[attrs(rs.resource)["job.rank"]] = [s for ss in rs.scope_spans for s in ss.spans]
    assert sorted(by_rank) == [0, 1] and all(len(spans) == 2 for spans in by_rank.values())
    kernel_end = {
        r: next(s for s in spans if s.name == "k_a").end_time_unix_nano for r, spans in by_rank.items()
    }
    assert kernel_end == {0: OFFSET + 400, 1: OFFSET + 500}
    durations = {}
    for m in receiver.messages("/v1/metrics"):
        for rm in m.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == "cuda.kernel.duration":
                        durations[attrs(rm.resource)["job.rank"]] = metric.sum.data_points[0].as_double
    assert durations == {0: pytest.approx(100e-9), 1: pytest.approx(200e-9)}  # not summed across ranks


def test_gpu_metrics_follow_the_hardware_conventions(receiver: OtlpReceiver) -> None:
    gib = 1 << 30
    events = [
        Device(device_id=0, name="NVIDIA H100 80GB HBM3", uuid=UUID, compute_capability=(9, 0),
               global_memory_bytes=80 * gib),
        Environment(device_id=0, timestamp=10, power_mw=312_500, power_limit_mw=700_000),
        Environment(device_id=0, timestamp=11, temperature_c=54),
        Environment(device_id=0, timestamp=12, sm_clock_mhz=1980, memory_clock_mhz=2619, throttle_reasons=4),
        Environment(device_id=0, timestamp=13, fan_speed_percent=40),
        MemoryAllocation(operation="alloc", timestamp=20, address=1, bytes=gib, memory_kind="device",
                         device_id=0, context_id=1, stream_id=0, correlation_id=9),
        MemoryAllocation(operation="free", timestamp=30, address=1, bytes=gib // 4, memory_kind="device",
                         device_id=0, context_id=1, stream_id=0, correlation_id=10),
        # Busy 0.75 s of the first second (two overlapping kernels), idle in the next, 0.1 s in the third.
        kernel(1, 0, SECOND // 2),
        kernel(2, SECOND // 4, 3 * SECOND // 4),
        kernel(3, 2 * SECOND, 2 * SECOND + SECOND // 10),
    ]  # fmt: skip
    batch = make_batch(events)
    offset = batch.clock.offset_ns
    assert deliver(sink_for(receiver.endpoint, signals=["metrics"]), batch) == []
    points: dict[str, list[Any]] = {}
    for name, point in receiver.data_points():
        points.setdefault(name, []).append(point)

    def last(name: str) -> Any:
        return points[name][-1]

    gpu = {"hw.id": UUID, "hw.model": "NVIDIA H100 80GB HBM3", "hw.vendor": "NVIDIA", "cuda.device.id": 0}
    assert attrs(last("hw.gpu.memory.limit")) == gpu and last("hw.gpu.memory.limit").as_int == 80 * gib
    assert last("hw.gpu.memory.usage").as_int == 3 * gib // 4
    assert last("hw.gpu.memory.utilization").as_double == pytest.approx(0.75 / 80)
    assert last("hw.power").as_double == 312.5 and attrs(last("hw.power"))["hw.type"] == "gpu"
    assert last("hw.power").time_unix_nano == offset + 10
    assert last("cuda.device.power.limit").as_double == 700.0
    assert (
        last("hw.temperature").as_int == 54 and attrs(last("hw.temperature"))["hw.sensor_location"] == "GPU"
    )
    assert last("hw.fan.speed_ratio").as_double == 0.4
    assert last("cuda.device.clock.sm").as_int == 1_980_000_000
    assert last("cuda.device.throttle_reasons").as_int == 4
    utilization = sorted((p.time_unix_nano - offset, p.as_double) for p in points["hw.gpu.utilization"])
    assert utilization == [(SECOND, 0.75), (2 * SECOND, 0.0), (3 * SECOND, pytest.approx(0.1))]
    assert attrs(points["hw.gpu.utilization"][0])["hw.gpu.task"] == "general"
    duration = last("cuda.kernel.duration")
    assert duration.as_double == pytest.approx((SECOND // 2 + SECOND // 2 + SECOND // 10) / 1e9)


def test_utilization_windows_wait_for_late_kernels() -> None:
    from cuptistream.sinks.otlp.hw import BusyWindows

    w = BusyWindows(window_ns=10, grace_ns=20)
    w.add(0, [(0, 5)])
    assert w.closed() == []  # kernels of window 0 may still arrive
    w.add(0, [(7, 9), (35, 40)])
    assert w.closed() == [(0, 10, 0.7), (0, 20, 0.0)]  # 40 - 20: windows before 20 are final
    w.add(0, [(1, 2)])  # too late for window 0: ignored, not double-reported
    assert w.closed(final=True) == [(0, 30, 0.0), (0, 40, 0.5)]


def test_the_command_line_is_opt_in() -> None:
    assert current_resource([]).command_line == []
    assert current_resource([], command_line=True).command_line  # /proc/self/cmdline
    assert build({"session": {"command_line": True}, "sinks": [{"type": "null"}]}).session.command_line
    assert not build({"sinks": [{"type": "null"}]}).session.command_line


def test_a_process_gone_quiet_is_flushed_and_forgotten(receiver: OtlpReceiver, monkeypatch: Any) -> None:
    import cuptistream.sinks.otlp.sink as otlp

    first = make_batch([api(1, 100, 200), kernel(9, 0, SECOND // 2)])  # kernel 9: its call may still come
    first.resource = Resource(host="h", pid=1, process_name="python3", command_line=[], rank=0)
    second = make_batch([kernel(2, 300, 400)], seq=1)
    second.resource = Resource(host="h", pid=2, process_name="python3", command_line=[], rank=1)
    sink = sink_for(receiver.endpoint, signals=["traces", "metrics"], reorder_window="1h")

    async def main() -> None:
        await sink.open()
        await sink.write(outgoing(first))
        assert sink.stats()["spans_waiting"] == 1
        monkeypatch.setattr(otlp, "PROCESS_IDLE_S", 0.0)  # everyone but the sender of a batch is idle
        await sink.write(outgoing(second))
        assert [o[2] for o in sink._processes] == [2]  # pid 1 is forgotten
        assert sink.stats()["spans_waiting"] == 0  # pid 1's waiting kernel was sent

    trio.run(main)
    ranks: dict[int, int] = {}
    for m in receiver.messages("/v1/traces"):
        for rs in m.resource_spans:
            rank = attrs(rs.resource)["job.rank"]
            ranks[rank] = ranks.get(rank, 0) + len(rs.scope_spans[0].spans)
    assert ranks == {0: 2, 1: 1}
    utilization = [p for name, p in receiver.data_points() if name == "hw.gpu.utilization"]
    assert [p.as_double for p in utilization] == [0.5]  # pid 1's last window, closed when it was dropped
