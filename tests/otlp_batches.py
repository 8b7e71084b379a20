"""Hand-built batches for the OTLP sink tests: one training step on one thread, with known answers."""

from __future__ import annotations

from collections.abc import Sequence

from cuptistream.events import (
    ApiCall,
    Batch,
    ClockSync,
    DeviceInfo,
    Error,
    Event,
    GraphLaunch,
    Kernel,
    Loss,
    Memcpy,
    Memset,
    NvtxRange,
    PcSample,
    PcSampleBatch,
    Resource,
    SassMetricBatch,
    SassRecord,
    SelfStats,
    StageStats,
    Synchronization,
)
from cuptistream.plugin import OutgoingBatch
from cuptistream.recording.codec import encode_batch_object

SESSION = "sess-1"
OFFSET = 1_700_000_000_000_000_000  # CUPTI clock + OFFSET = Unix-epoch ns
TID = 7
UUID = "GPU-0b5c7f2e-1111-2222-3333-444455556666"


def api(
    corr: int, start: int, end: int, name: str = "cudaLaunchKernel", domain: str = "runtime", cbid: int = 211
) -> ApiCall:
    return ApiCall(
        domain=domain,
        name=name,
        cbid=cbid,
        start=start,
        end=end,
        process_id=4242,
        thread_id=TID,
        correlation_id=corr,
    )


def kernel(corr: int, start: int, end: int, name: str = "k_a", node: int = 0) -> Kernel:
    return Kernel(
        start=start,
        end=end,
        name=name,
        device_id=0,
        context_id=1,
        stream_id=13,
        correlation_id=corr,
        grid=(64, 1, 1),
        block=(256, 1, 1),
        graph_node_id=node,
        graph_id=3 if node else 0,
    )


def step_events() -> list[Event]:
    """One step: NVTX "step" ⊃ "forward" ⊃ a launch; copies, memset, sync and a graph launch in "step"."""
    return [
        api(1, 300, 400),
        api(1, 310, 390, "cuLaunchKernel", "driver", cbid=307),
        NvtxRange(name="forward", start=200, end=5000, thread_id=TID, depth=1, domain="torch"),
        kernel(1, 1000, 2000),
        api(2, 5500, 5600, "cudaMemcpyAsync"),
        Memcpy(
            start=6000,
            end=6500,
            bytes=4096,
            copy_kind="HtoD",
            src_kind="pinned",
            dst_kind="device",
            device_id=0,
            context_id=1,
            stream_id=13,
            correlation_id=2,
        ),
        api(3, 6600, 6700, "cudaMemsetAsync"),
        Memset(
            start=6800,
            end=6900,
            bytes=512,
            value=0,
            memory_kind="device",
            device_id=0,
            context_id=1,
            stream_id=13,
            correlation_id=3,
        ),
        api(4, 7000, 9000, "cudaStreamSynchronize"),
        Synchronization(
            sync_type="stream_synchronize", start=7000, end=9000, context_id=1, stream_id=13, correlation_id=4
        ),
        api(5, 9100, 9200, "cudaGraphLaunch"),
        GraphLaunch(
            start=9300, end=9500, graph_id=3, device_id=0, context_id=1, stream_id=13, correlation_id=5
        ),
        kernel(5, 9300, 9400, "k_b", node=11),
        api(6, 9400, 9450),
        kernel(6, 9500, 9700),
        NvtxRange(name="step", start=100, end=10_000, thread_id=TID, depth=0),
    ]


SPAN_COUNTS = {
    "nvtx": 2,
    "api": 7,
    "kernel": 3,
    "memcpy": 1,
    "memset": 1,
    "synchronization": 1,
    "graph_launch": 1,
}


def other_events() -> list[Event]:
    return [
        Error(
            severity="warning",
            origin="cupti_state",
            message="buffer nearly full",
            timestamp=500,
            result_code=7,
        ),
        Error(severity="fatal", origin="source:activity", message="device lost", timestamp=600),
        Loss(stage="intake", reason="queue_full", count=5, since=OFFSET, until=OFFSET + 10),
        PcSampleBatch(
            timestamp=800,
            device_id=0,
            context_id=1,
            range_id=0,
            total_samples=18,
            samples=[
                PcSample(
                    cubin_crc=1,
                    function_name="k_a",
                    function_index=0,
                    pc_offset=16,
                    stalls={"long_scoreboard": 10, "selected": 2},
                ),
                PcSample(
                    cubin_crc=1, function_name="k_a", function_index=0, pc_offset=32, stalls={"selected": 6}
                ),
            ],
            dropped_samples=3,
        ),
        SassMetricBatch(
            timestamp=900,
            device_id=0,
            context_id=1,
            records=[
                SassRecord(
                    cubin_crc=1,
                    function_name="k_b",
                    function_index=0,
                    pc_offset=0,
                    values={"smsp__sass_inst_executed": [4, 6]},
                )
            ],
        ),
        SelfStats(
            timestamp=OFFSET + 20,
            stages={"intake": StageStats(events_in=100, events_out=95, queued_bytes=64)},
        ),
    ]


def make_batch(events: Sequence[Event], seq: int = 0, session: str = SESSION) -> Batch:
    return Batch(
        schema_version=1,
        session_id=session,
        seq=seq,
        resource=Resource(
            host="gpu-host-1",
            pid=4242,
            process_name="python",
            command_line=["python", "train.py", "--lr", "0.1"],
            devices=[DeviceInfo(device_id=0, name="NVIDIA H100 80GB HBM3", uuid=UUID)],
            job={"RANK": "0", "WORLD_SIZE": "8"},
        ),
        attributes={"service.name": "trainer", "team": "ml"},
        clock=ClockSync(cupti_ns=1_000, unix_ns=OFFSET + 1_000),
        events=list(events),  # type: ignore[arg-type]
    )


def outgoing(batch: Batch) -> OutgoingBatch:
    return OutgoingBatch(data=encode_batch_object(batch), seq=batch.seq, event_count=len(batch.events))
