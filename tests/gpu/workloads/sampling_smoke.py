"""GPU smoke test of the pc_sampling and sass sources on NVRTC kernels with known hot spots.

Run on the GPU machine: ``python tests/gpu/workloads/sampling_smoke.py OUTDIR``. Writes
``OUTDIR/smoke.json`` (the numbers) and raw captures for the CI fixtures
(``pc_sampling_capture.json``, ``sass_capture.json``): the bytes CUPTI wrote, at their addresses,
with the decoded values, so CI decodes the same bytes and compares.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).parent))
from sampling_common import (
    KERNELS,
    OTHER_KERNEL,
    CollectingEmitter,
    Cuda,
    compile_cubin,
)

from cuptistream.config import convert
from cuptistream.cupti import cubin_api, sampling_decode
from cuptistream.cupti.sampling_decode import RecordingMemory
from cuptistream.events import PcSampleBatch, ResourceChange, SassMetricBatch

try:
    from cuptistream.sources import pc_sampling as pc_mod
    from cuptistream.sources import sass as sass_mod
    from cuptistream.sources.pc_sampling import drain as pc_drain  # where the decoder is looked up
except ImportError:  # not installed: the checkout is on PYTHONPATH
    from sources import pc_sampling as pc_mod  # type: ignore[no-redef]
    from sources import sass as sass_mod  # type: ignore[no-redef]
    from sources.pc_sampling import drain as pc_drain  # type: ignore[no-redef]

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
OUT.mkdir(parents=True, exist_ok=True)
captures: dict[str, list[dict[str, Any]]] = {"pc": [], "sass": []}


def _capture_pc(memory: Any, address: int, stall_names: dict[int, str], names: Any = None) -> Any:
    rec = RecordingMemory()
    data = sampling_decode.decode_pc_data(rec, address, stall_names, {})
    if data.total_num_pcs and len(captures["pc"]) < 3:
        captures["pc"].append(
            {
                "address": address,
                "stall_names": stall_names,
                "memory": rec.to_json(),
                "decoded": msgspec.to_builtins(data),
            }
        )
    return data


def _capture_sass(
    memory: Any, address: int, num: int, inst: int, metric_names: dict[int, str], names: Any = None
) -> Any:
    rec = RecordingMemory()
    out = sampling_decode.decode_sass_records(rec, address, num, inst, metric_names, {})
    if len(captures["sass"]) < 2:
        captures["sass"].append(
            {
                "address": address,
                "num_records": num,
                "num_instances": inst,
                "metric_names": metric_names,
                "memory": rec.to_json(),
                "decoded": msgspec.to_builtins(out),
            }
        )
    return out


pc_drain.decode_pc_data = _capture_pc  # type: ignore[assignment]
sass_mod.decode_sass_records = _capture_sass  # type: ignore[assignment]


def timed(cuda: Cuda, fn: int, n: int, *launch: Any) -> float:
    cuda.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        cuda.launch(fn, *launch)
    cuda.sync()
    return (time.perf_counter() - t0) / n * 1e3


def pc_sampling_part(cuda: Cuda, result: dict[str, Any], key: str = "pc") -> None:
    arch = cuda.arch()
    cubin_a, cubin_b = compile_cubin(KERNELS, arch), compile_cubin(OTHER_KERNEL, arch)
    crc_a, crc_b = cubin_api.cubin_crc(cubin_a), cubin_api.cubin_crc(cubin_b)
    result["crc"] = {"A": crc_a, "B": crc_b}
    result["cubin_size"] = {"A": len(cubin_a), "B": len(cubin_b)}
    out, inp = cuda.alloc(264 * 256 * 4), cuda.alloc(1 << 26)
    dep_args = (264, 256, out, ctypes.c_int(20000))
    strided_args = (264, 256, inp, out, ctypes.c_int((1 << 24) - 1), ctypes.c_int(4097), ctypes.c_int(2000))

    mod = cuda.load(cubin_a)
    dep, strided = cuda.function(mod, "dep_chain"), cuda.function(mod, "strided")
    base = {
        "dep_chain_ms": timed(cuda, dep, 5, *dep_args),
        "strided_ms": timed(cuda, strided, 5, *strided_args),
    }
    cuda.unload(mod)

    emitter = CollectingEmitter()
    cfg = convert(
        {"type": "pc_sampling", "sampling_period": 14, "duty_cycle": {"on": 1, "off": 0}, "get_data_interval": 0.2,
         "cubin_dir": "/tmp/cubins"},
        pc_mod.PcSamplingConfig,
    )  # fmt: skip
    src = pc_mod.PcSamplingSource(cfg, emitter)
    t0 = time.perf_counter()
    src.start()
    result["pc_start_s"] = time.perf_counter() - t0
    time.sleep(0.3)  # the worker opens the first window
    phases: dict[str, Any] = {}
    mod = cuda.load(cubin_a)
    dep, strided = cuda.function(mod, "dep_chain"), cuda.function(mod, "strided")
    phases["A1"] = {
        "dep_chain_ms": timed(cuda, dep, 10, *dep_args),
        "strided_ms": timed(cuda, strided, 10, *strided_args),
    }
    cuda.unload(mod)
    mod = cuda.load(cubin_b)
    other = cuda.function(mod, "other_module_kernel")
    phases["B"] = {"other_ms": timed(cuda, other, 10, *dep_args)}
    cuda.unload(mod)
    mod = cuda.load(cubin_a)
    strided = cuda.function(mod, "strided")
    phases["A2"] = {"strided_ms": timed(cuda, strided, 10, *strided_args)}
    # A second context on the same GPU: CUPTI samples one per GPU; expect a warning, not a crash.
    second = ctypes.c_void_p()
    code = cuda.lib.cuCtxCreate_v2(ctypes.byref(second), 0, cuda.device)
    result["second_ctx_create"] = code
    if code == 0:
        cuda.lib.cuCtxDestroy_v2(second)
    cuda.lib.cuCtxSetCurrent(cuda.ctx)
    time.sleep(0.5)
    t0 = time.perf_counter()
    src.stop()
    result["pc_stop_s"] = time.perf_counter() - t0
    cuda.unload(mod)

    batches = [e for e in emitter.events if isinstance(e, PcSampleBatch)]
    modules = [msgspec.to_builtins(e) for e in emitter.events if isinstance(e, ResourceChange)]
    by_fn: dict[str, Counter[str]] = defaultdict(Counter)
    pcs_by_fn: dict[str, Counter[int]] = defaultdict(Counter)
    crc_fn: dict[tuple[int, str], int] = Counter()
    for batch in batches:
        for s in batch.samples:
            by_fn[s.function_name].update(s.stalls)
            pcs_by_fn[s.function_name][s.pc_offset] += sum(s.stalls.values())
            crc_fn[(s.cubin_crc, s.function_name)] += sum(s.stalls.values())
    result[key] = {
        "base": base,
        "sampled": phases,
        "batches": len(batches),
        "total_samples": sum(b.total_samples for b in batches),
        "dropped": sum(b.dropped_samples for b in batches),
        "non_user": sum(b.non_user_samples for b in batches),
        "top_stalls": {fn: c.most_common(4) for fn, c in by_fn.items()},
        "top_pcs": {fn: c.most_common(5) for fn, c in pcs_by_fn.items()},
        "crc_function_samples": [[crc, fn, n] for (crc, fn), n in crc_fn.items()],
        "modules": modules,
        "losses": emitter.losses,
        "errors": emitter.errors,
        "stats": src.stats,
        "cubins_written": sorted(p.name for p in Path("/tmp/cubins").glob("*.cubin")),
        "distinct_name_pointers": len(src._drains._names),
    }


def sass_part(cuda: Cuda, result: dict[str, Any], lazy: bool = True, key: str = "sass") -> None:
    arch = cuda.arch()
    mod = cuda.load(compile_cubin(KERNELS, arch))
    counted = cuda.function(mod, "counted")
    out = cuda.alloc(132 * 128 * 4)
    emitter = CollectingEmitter()
    cfg = convert(
        # The worker opens each window before the launches: exact counts need every launch patched.
        {"type": "sass", "window": 1.0, "initial_delay": 3600, "lazy_patching": lazy},
        sass_mod.SassConfig,
    )  # fmt: skip
    src = sass_mod.SassMetricsSource(cfg, emitter)
    src.start()
    from cuptistream.cupti import sass_api

    available = sass_api.metrics(src.chip)
    try:
        sass_mod.resolve_metrics(["smsp__sass_inst_executd"], available, src.chip)
    except Exception as error:
        result["unknown_metric_message"] = str(error)
    launches, windows = 10, 3
    timings = []
    for _ in range(windows):
        t = threading.Thread(target=src.window)
        t.start()
        time.sleep(0.2)
        timings.append(timed(cuda, counted, launches, 132, 128, out))
        t.join()
        # One launch between windows, as a running program makes: with back-to-back windows the
        # kernel gives no data after the first.
        timed(cuda, counted, 1, 132, 128, out)
    src.stop()
    base = timed(cuda, counted, launches, 132, 128, out)
    batches = [e for e in emitter.events if isinstance(e, SassMetricBatch)]
    warps = 132 * 128 // 32
    per_window = []
    for b in batches:
        values = {
            r.pc_offset: sum(r.values.get("smsp__sass_inst_executed", [0]))
            for r in b.records
            if r.function_name == "counted"
        }
        per_window.append(values)
    result[key] = {
        "lazy_patching": lazy,
        "chip": src.chip,
        "metric_count": len(available),
        "metrics_sample": sorted(available)[:80],
        "windows": len(batches),
        "warps_x_launches": warps * launches,
        "per_window_pc_values": per_window,
        "loop_pcs_equal_100x": [
            sum(1 for v in w.values() if v == warps * launches * 100) for w in per_window
        ],
        "kernel_ms_patched": timings,
        "kernel_ms_unpatched": base,
        "losses": emitter.losses,
        "errors": emitter.errors,
        "stats": src.stats,
    }
    cuda.unload(mod)


def main() -> None:
    from cuptistream.cupti import driver, subscriber

    driver.acquire("smoke")  # keep CUPTI attached between the parts (no cuptiFinalize in between)
    cuda = Cuda(0)
    result: dict[str, Any] = {"arch": cuda.arch(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    parts: list[tuple[str, Any]] = [
        ("pc", lambda: pc_sampling_part(cuda, result)),
        ("sass", lambda: sass_part(cuda, result)),
        ("pc_after_sass", lambda: pc_sampling_part(cuda, result, key="pc_after_sass")),
    ]
    for name, part in parts:
        try:
            part()
        except Exception as error:  # keep the other parts' numbers
            import traceback

            result[f"{name}_error"] = traceback.format_exc()
            print(f"{name} failed: {error}", flush=True)
    result["handler_errors"] = [subscriber.get().handler_errors(), subscriber.get().last_handler_error()]
    (OUT / "smoke.json").write_text(json.dumps(result, indent=1, default=str))
    (OUT / "pc_sampling_capture.json").write_text(json.dumps(captures["pc"], default=str))
    (OUT / "sass_capture.json").write_text(json.dumps(captures["sass"], default=str))
    brief = {k: v for k, v in result.items() if not k.startswith(("sass", "pc"))}
    print(json.dumps(brief, default=str)[:3000])
    for key in ("pc", "pc_after_sass"):
        pc = result.get(key, {})
        keep = ("batches", "total_samples", "dropped", "non_user", "top_stalls", "crc_function_samples",
                "modules", "errors", "losses", "stats", "sampled", "base")  # fmt: skip
        print(key, json.dumps({k: pc.get(k) for k in keep}, default=str)[:4000])
    for key in ("sass",):
        sa = result.get(key, {})
        print(
            key, json.dumps({k: v for k, v in sa.items() if k not in ("metrics_sample",)}, default=str)[:2500]
        )


if __name__ == "__main__":
    main()
