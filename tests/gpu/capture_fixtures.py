"""Capture the replay fixtures on a GPU machine (see tests/fixtures/README.md).

    python -m tests.gpu.capture_fixtures OUT_DIR

Each scenario runs a workload under an ActivitySource with ``capture`` set, so the raw buffers CUPTI
completed are written as a capture file. Then, still in the live process (before CUPTI detaches and
while the name strings are valid), an independent oracle walks the same raw bytes with CUPTI's own
``cuptiActivityGetNextRecord`` and reads fields through cupti-python's record classes; its counts
and values go to ``expected.json``, which the CI tests compare the replayed decode against.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import sys
from pathlib import Path

from cuptistream.cupti import capture, driver, kinds, library
from cuptistream.cupti.records import choose_dtype
from sources.activity import ActivitySource, ActivitySourceConfig
from tests.gpu.workloads import exact_counts
from tests.gpu.workloads.collect import Collect

FIELDS = {  # fields the oracle records for the first record of these kinds
    "kernel": ["start", "end", "name", "correlation_id", "grid_x", "block_x", "registers_per_thread",
               "graph_id", "graph_node_id", "stream_id", "device_id"],
    "memcpy": ["start", "end", "bytes", "copy_kind", "src_kind", "dst_kind", "correlation_id"],
    "memset": ["start", "end", "bytes", "value", "correlation_id"],
    "api": ["cbid", "start", "end", "correlation_id", "thread_id"],
    "graph_launch": ["start", "end", "graph_id", "correlation_id"],
}  # fmt: skip


def _class_for(record: str):
    from cupti import cupti

    special = {"api": "ActivityAPI", "memcpy_pto_p4": "ActivityMemcpyPtoP4"}
    name = special.get(record) or "Activity" + "".join(p[:1].upper() + p[1:] for p in record.split("_"))
    return getattr(cupti, name)


def oracle(cap: capture.Capture) -> dict:
    """Counts and values from CUPTI's own record walk and cupti-python's record classes."""
    lib = library.libcupti()
    by_kind: collections.Counter[str] = collections.Counter()
    kernel_names: collections.Counter[str] = collections.Counter()
    memcpy_bytes = 0
    first: dict[str, dict] = {}
    keep = []
    for buf in cap.buffers:
        raw = ctypes.create_string_buffer(buf.data, len(buf.data))
        keep.append(raw)
        base = ctypes.addressof(raw)
        record = ctypes.c_void_p(None)
        while lib.cuptiActivityGetNextRecord(base, len(buf.data), ctypes.byref(record)) == 0:
            kind = ctypes.c_int32.from_address(record.value).value
            spec = kinds.BY_VALUE.get(kind)
            label = spec.name if spec else str(kind)
            by_kind[label] += 1
            if spec is None:
                continue
            chosen = choose_dtype(kind, cap.struct_sizes.get(kind, 0))
            if chosen is None:
                continue
            obj = _class_for(chosen[0]).from_ptr(record.value, readonly=True)
            if spec.event == "kernel":
                kernel_names[obj.name] += 1
            if spec.event == "memcpy":
                memcpy_bytes += obj.bytes
            if spec.event in FIELDS and spec.name not in first:
                first[spec.name] = {
                    f: (v if isinstance(v := getattr(obj, f), str) else int(v)) for f in FIELDS[spec.event]
                }
    return {
        "records_by_kind": dict(by_kind), "kernel_names": dict(kernel_names), "memcpy_bytes": memcpy_bytes,
        "first": first,
    }  # fmt: skip


def run_scenario(name: str, out: Path, kinds_: list[str], body, **extra) -> dict:
    sink = Collect()
    path = out / f"{name}.cupti"
    cfg = ActivitySourceConfig(
        type="activity", name=name, kinds=kinds_, capture=str(path), detach=False, flush_interval=0.0,
        buffer_size=256 * 1024, **extra,
    )  # fmt: skip
    source = ActivitySource(cfg, sink)
    source.start()
    did = body()
    source.stop()
    cap = capture.read(path)
    result = oracle(cap)
    events: collections.Counter[str] = collections.Counter(type(e).__name__ for e in sink.events)
    result.update(
        workload=did, decoded_events=dict(events), losses=sink.losses, errors=sink.errors,
        file_bytes=path.stat().st_size, buffers=len(cap.buffers), cupti_version=cap.cupti_version,
        device=cap.device, struct_sizes=cap.struct_sizes,
    )  # fmt: skip
    print(
        name,
        json.dumps(
            {k: result[k] for k in ("records_by_kind", "decoded_events", "file_bytes", "losses", "errors")}
        ),
    )
    return result


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    expected: dict[str, dict] = {}
    ctx = exact_counts.setup()
    expected["exact_counts"] = run_scenario(
        "exact_counts", out,
        ["concurrent_kernel", "memcpy", "memset", "runtime", "driver", "marker", "name", "overhead",
         "synchronization", "external_correlation"],
        lambda: exact_counts.run(500, 1 << 20, 5, 20, 3, ctx=ctx),
    )  # fmt: skip
    expected["graph_trace"] = run_scenario(
        "graph_trace",
        out,
        ["graph_trace", "runtime", "driver", "memset", "cuda_event", "stream"],
        lambda: exact_counts.run(10, 1 << 12, 2, 30, 4, ctx=ctx),
    )
    from tests.gpu.workloads import torch_mlp

    torch, model, opt, x, y = torch_mlp.make()
    torch_mlp.steps(torch, model, opt, x, y, 2)

    def train() -> dict:
        from cupti import cupti

        cupti.activity_push_external_correlation_id(cupti.ExternalCorrelationKind.CUSTOM0, 17)
        torch.cuda.nvtx.range_push("train_step")
        torch_mlp.steps(torch, model, opt, x, y, 3)
        torch.cuda.nvtx.range_pop()
        cupti.activity_pop_external_correlation_id(cupti.ExternalCorrelationKind.CUSTOM0)
        host = torch.randn(1 << 18).pin_memory()
        for _ in range(3):
            dev_t = host.to("cuda", non_blocking=True)
            host.copy_(dev_t.cpu())
        torch.cuda.synchronize()
        return {"steps": 3, "external_id": 17}

    expected["torch_train"] = run_scenario(
        "torch_train", out,
        ["concurrent_kernel", "memcpy", "memset", "runtime", "driver", "marker", "external_correlation",
         "synchronization", "memory2", "memory_pool", "cuda_event"],
        train, demangle=True,
    )  # fmt: skip
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))


if __name__ == "__main__":
    os.environ.setdefault("NVTX_INJECTION64_PATH", driver.nvtx_injection_path())
    main(Path(sys.argv[1]))
