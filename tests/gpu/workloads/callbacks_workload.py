"""GPU workload for the callbacks and state sources: known NVTX, API, module and stream activity.

``python -m tests.gpu.workloads.callbacks_workload OUT_DIR`` runs everything inside one
``cuptistream.session`` (the callbacks source sets ``NVTX_INJECTION64_PATH`` itself, before the
first NVTX call) and prints one JSON line saying what it did. Then, with the session closed, it
checks that a new session can subscribe again, and that a foreign subscriber makes the callbacks
source fail with a message naming it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

K, R, N, S = 6, 25, 2000, 7  # nesting depth, nest repetitions, launches, synchronizes

SOURCE = r"""
extern "C" __global__ void cb_probe(float *x) { x[threadIdx.x] += 1.0f; }
"""


def _check(result: object) -> object:
    error, *rest = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f"CUDA call failed: {error}")
    return rest[0] if len(rest) == 1 else rest


def _config(out: str, **source: object) -> dict:
    callbacks = {
        "type": "callbacks",
        "domains": ["resource", "synchronize", "nvtx", "runtime", "driver"],
        "runtime_api": ["cudaLaunchKernel", "cudaDeviceSynchronize"],
        "driver_api": ["cuModuleLoadData", "cuModuleUnload", "cuStreamCreate", "cuStreamDestroy"],
        **source,
    }
    return {"sources": [callbacks, {"type": "state"}], "sinks": [{"type": "file", "directory": out}]}


def main(out: str) -> None:
    import cuptistream
    from cuptistream.cupti.subscriber import Subscriber, SubscriberBusy

    did: dict[str, object] = {"K": K, "R": R, "N": N, "S": S, "pid": os.getpid()}
    with cuptistream.session(_config(os.path.join(out, "events"))) as session:
        did["failed_sources"] = dict(session.failed_sources)
        did["nvtx_injection"] = os.environ.get("NVTX_INJECTION64_PATH", "")
        import torch
        import torch.cuda.nvtx as nvtx
        from cuda.bindings import driver as cu
        from cuda.core import Device, Program, ProgramOptions

        x = torch.zeros(1024, device="cuda")
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(R):
            for level in range(K):
                nvtx.range_push(f"level{level}")
            for _ in range(K):
                nvtx.range_pop()
        did["nvtx_pair_us"] = (time.perf_counter() - began) / (R * K) * 1e6
        nvtx.mark("marker")
        range_id = nvtx.range_start("startend")
        nvtx.range_end(range_id)
        began = time.perf_counter()
        for _ in range(N):
            x.add_(1)
        torch.cuda.synchronize()
        did["launch_us"] = (time.perf_counter() - began) / N * 1e6
        for _ in range(S - 1):
            torch.cuda.synchronize()

        # A module loaded and unloaded, and a stream created and destroyed, through the driver API.
        dev = Device()
        dev.set_current()
        cc = dev.compute_capability
        cubin = Program(SOURCE, "c++", ProgramOptions(arch=f"sm_{cc.major}{cc.minor}")).compile("cubin").code
        did["cubin_size"] = len(cubin)
        module = _check(cu.cuModuleLoadData(cubin))
        _check(cu.cuModuleUnload(module))
        stream = _check(cu.cuStreamCreate(0))
        _check(cu.cuStreamDestroy(stream))

        # A second subscriber in this process is refused with our own name.
        try:
            Subscriber().register(6, lambda *a: None)
            did["second_subscriber"] = "accepted"
        except SubscriberBusy as error:
            did["second_subscriber"] = str(error)
        except Exception as error:
            did["second_subscriber"] = f"unexpected {type(error).__name__}: {error}"

        # Forced CUPTI errors: enabling an activity kind that does not exist, at runtime.
        from cupti import cupti

        forced = []
        for kind in (9999, 0):
            try:
                cupti.activity_enable(kind)
                forced.append(f"kind {kind}: accepted")
                cupti.activity_disable(kind)
            except Exception as error:
                forced.append(f"kind {kind}: {error}")
        did["forced"] = forced
        time.sleep(0.2)
    did["report"] = session.report.summary() if session.report else None

    # The subscriber was released: a new session subscribes again.
    with cuptistream.session(_config(os.path.join(out, "again"), domains=["resource"])) as again:
        s = torch.cuda.Stream()
        del s
    did["again_failed"] = dict(again.failed_sources)

    # A foreign tool holds the subscriber: the callbacks source is disabled with its name.
    from cuptistream.cupti.subscriber import SUBSCRIBER_NAME, _SubscriberParams

    name = ctypes.create_string_buffer(256)
    params = _SubscriberParams(
        structSize=40, subscriberName=b"other-tool", oldSubscriberName=ctypes.cast(name, ctypes.c_char_p),
        oldSubscriberSize=256,
    )  # fmt: skip
    try:
        holder = cupti.subscribe_v2(lambda *a: None, None, ctypes.addressof(params))
    except Exception:
        try:
            params.structSize = 32
            holder = cupti.subscribe_v2(lambda *a: None, None, ctypes.addressof(params))
        except Exception:
            holder = cupti.subscribe(lambda *a: None, None)  # no names with this CUPTI
    with cuptistream.session(_config(os.path.join(out, "busy"), domains=["resource"])) as busy:
        sharing = busy._probe.sharing if busy._probe is not None else None
        did["busy_standby"] = sharing.standing_by if sharing is not None else None
    cupti.unsubscribe(holder)
    did["busy_failed"] = dict(busy.failed_sources)
    did["our_name"] = SUBSCRIBER_NAME
    print(json.dumps(did))


if __name__ == "__main__":
    main(sys.argv[1])
