"""GPU overhead of cuptistream's default config against no tracing, bare CUPTI and Kineto.

What it measures: the per-iteration time of four workloads (``bench/workloads.py``: W1 tiny-kernel
loop, W2 MLP SGD step, W3 CUDA-graph replay of 50 tiny kernels, W4 transformer-encoder AdamW step)
under each mode, every run in its own process:

- ``none``: no tracing;
- ``bare``: "bare CUPTI", ``bench/bare_cupti.c`` injected through ``CUDA_INJECTION64_PATH``. It enables
  the default config's activity kinds and the same per-cbid runtime/driver API filters (taken from
  ``configs/default.yaml`` through ``cuptistream.cupti.api_functions.select_cbids``), walks every buffer with
  ``cuptiActivityGetNextRecord``, counts and frees it. The floor that the goal (cuptistream <= 1.05 x
  bare) is measured against;
- ``cuptistream``: ``cuptistream run -c configs/default.yaml --report-json R.json -- python
  bench/workloads.py ...`` in a fresh temporary directory (the default config writes ./cuptistream-out,
  deleted afterwards);
- ``kineto``: the workload inside ``torch.profiler.profile(activities=[CUDA])``.

How: ``--rounds`` rounds; in each, for each workload, every mode once, in an order rotated by the
round so that slow drift of the machine spreads over the modes. Each process builds its model,
warms up for ``--warmup-seconds`` (not timed), runs timed blocks for ``--seconds`` (each block ends
with a device sync) and prints per-iteration time and its peak RSS. Ratios are taken within a round
and workload (mode / none, mode / bare of the same round), then summarized over rounds.

Command (on a GPU machine, in the repository root, with torch, cupti-python and cuptistream's
dependencies importable; ``bare`` compiles ``bench/bare_cupti.c`` with the system's C compiler)::

    python3 bench/overhead_gpu.py [--rounds 3] [--workloads W1,W2,W3,W4] \\
        [--modes none,bare,cuptistream,kineto] [--seconds 1.5] [--warmup-seconds 0.5]
    python3 bench/overhead_gpu.py --modes none,cuptistream --config configs/production.yaml  # always-on
    python3 bench/overhead_gpu.py --merge a.json b.json --out all.json    # one table from several runs

The second line is the whole-process view of always-on mode: the same program's throughput bare and
under ``cuptistream run -c configs/production.yaml``, interleaved processes; a cost spread between
budget windows shows here, where the lost-time method (``bench/budget_lost_time.py``) values only the
blocks near windows.

Time: a process costs ~4.5 s beyond its warm-up and timed region (Python, torch import, CUDA init,
exit), W2 and W4 4 s more of setup, Kineto's stop up to 6 s per traced second (W3). The defaults
(3 rounds x 4 workloads x 4 modes = 48 processes) are planned at about 8.3 minutes; the plan is
printed first. ``--budget`` (default 540 s) starts no process that would end past it, so a run under
a wall-clock limit still ends with its table. For more rounds or longer windows, split the workloads
over several runs (e.g. ``--workloads W1,W3`` then ``W2,W4``) and ``--merge`` their files.

Reading the results: the table printed last has, per workload and mode, the per-iteration time in µs
as median [min..max] over rounds, its ratio to ``none`` and, for cuptistream and kineto, to ``bare``
(same round). The goal is ``cuptistream / bare`` ≤ 1.05 and ``cuptistream / none`` below
``kineto / none``. Spreads wider than the differences between modes mean noise: run more rounds.
The second table gives, for cuptistream, the collector's CPU seconds per million activity records,
the collector's and the program's peak RSS, and the records and losses cuptistream reported; for
bare, the records CUPTI delivered and dropped. The last lines are the headline rows: per traced
mode, its ratio to ``bare`` (or to ``none`` where bare was not run), median [min..max] over rounds.
``--out`` (default ``bench/out/overhead_gpu.json``) holds every raw number (each process's blocks,
rc, stderr tail on failure, the cbids used).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import re
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from spread import spread_text

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS_PY = ROOT / "bench" / "workloads.py"
BARE_C = ROOT / "bench" / "bare_cupti.c"
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"
ALL_WORKLOADS = ["W1", "W2", "W3", "W4"]
ALL_MODES = ["none", "bare", "cuptistream", "kineto"]
# Seconds a process takes beyond warm-up + timed region, for the plan: Python, torch import, CUDA init
# and exit; W2 and W4's setup (the optimizer's first call imports torch._dynamo); Kineto's stop, per
# second of traced run (W3's millions of records); cuptistream's start and drain.
BASE_OVERHEAD_S = 4.5
SETUP_S = {"W1": 0.3, "W2": 4.0, "W3": 0.3, "W4": 4.0}
KINETO_STOP_PER_RUN_S = {"W1": 0.8, "W2": 0.5, "W3": 6.0, "W4": 0.5}
CUPTISTREAM_EXTRA_S = 3.0


def is_cuptistream(mode: str) -> bool:
    """``cuptistream`` (the --config) or ``cuptistream:NAME`` (a --variant config)."""
    return mode == "cuptistream" or mode.startswith("cuptistream:")


def estimate_s(workload: str, mode: str, run_s: float) -> float:
    """Expected wall seconds of one process (run_s = warm-up + timed)."""
    extra = {"kineto": KINETO_STOP_PER_RUN_S[workload] * run_s}
    if is_cuptistream(mode):
        extra[mode] = CUPTISTREAM_EXTRA_S
    return BASE_OVERHEAD_S + SETUP_S[workload] + run_s + extra.get(mode, 0.0)


INJECTION_VARS = ("CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH")


def log(message: str) -> None:
    print(message, flush=True)


def fail(message: str) -> SystemExit:
    return SystemExit(f"overhead_gpu.py: {message}")


# --- CUPTI headers and library, the bare client ---------------------------------------------------


def _site_dirs() -> list[Path]:
    dirs: list[str] = []
    with contextlib.suppress(AttributeError):
        dirs += site.getsitepackages()
    with contextlib.suppress(AttributeError):
        dirs.append(site.getusersitepackages())
    dirs += [p for p in sys.path if p]
    seen: dict[Path, None] = {}
    for d in dirs:
        path = Path(d)
        if path.is_dir():
            seen.setdefault(path.resolve(), None)
    return list(seen)


def _toolkit_includes() -> list[Path]:
    """Include dirs of CUDA toolkits: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, nvcc's, and the pip wheels'."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parent.parent))
    dirs = [Path(h) / sub for h in filter(None, homes) for sub in ("include", "targets/x86_64-linux/include")]
    for d in _site_dirs():
        dirs += [d / f"nvidia/{sub}/include" for sub in ("cu13", "cuda_runtime", "cuda_nvcc", "cuda_crt")]
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


def find_cupti() -> tuple[list[Path], Path]:
    """(include dirs, cupti.h's first, libcupti): the torch environment's ``nvidia/cu13`` first (the library
    torch itself loads), then ``nvidia/cuda_cupti`` (CUDA 12 wheels), then the toolkit. The wheels' include
    dir may hold cuda.h but not crt/host_defines.h: a toolkit's include dir is added for what is missing."""
    candidates: list[tuple[Path, Path]] = []  # (include dir, lib dir)
    with contextlib.suppress(Exception):
        import nvidia.cu13  # type: ignore[import-not-found]

        base = Path(next(iter(nvidia.cu13.__path__)))
        candidates.append((base / "include", base / "lib"))
    for d in _site_dirs():
        for sub in ("nvidia/cu13", "nvidia/cuda_cupti"):
            candidates.append((d / sub / "include", d / sub / "lib"))
    for home in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        h = Path(home)
        candidates += [
            (h / "targets/x86_64-linux/include", h / "targets/x86_64-linux/lib"),
            (h / "extras/CUPTI/include", h / "extras/CUPTI/lib64"),
            (h / "include", h / "lib64"),
        ]
    toolkit = _toolkit_includes()
    for include, libdir in candidates:
        if not (include / "cupti.h").is_file() or not libdir.is_dir():
            continue
        libs = sorted(libdir.glob("libcupti.so*"), key=lambda p: (len(p.name), p.name), reverse=True)
        if not libs:
            continue
        includes = [include]
        for header in ("cuda.h", "crt/host_defines.h"):
            if not any((i / header).is_file() for i in includes):
                extra = [t for t in toolkit if (t / header).is_file()]
                if extra:
                    includes.append(extra[0])
        if not any((i / "cuda.h").is_file() for i in includes):
            continue
        return includes, libs[0].resolve()
    raise fail(
        "no CUPTI found: need nvidia/cu13/include/cupti.h + nvidia/cu13/lib/libcupti.so* in site-packages "
        "(nvidia-cuda-cupti) or /usr/local/cuda/targets/x86_64-linux/{include,lib}, and a cuda.h"
    )


# Host-only stand-in for crt/host_defines.h (from the CUDA toolkit), used only where no toolkit has it:
# cupti_activity.h pulls in builtin_types.h, which needs these macros and nothing else from it.
HOST_DEFINES_STUB = """#pragma once
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __host__
#define __device__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define CUDARTAPI
#define __location__(a) __annotate__(a)
#define __annotate__(a) __attribute__((a))
#define __specialization_static
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __inline_hint__
#define __thread__ __thread
"""


def build_bare(build_dir: Path) -> tuple[Path, Path]:
    """Compile bench/bare_cupti.c; (the .so, the libcupti it links)."""
    includes, libcupti = find_cupti()
    if not any((i / "crt/host_defines.h").is_file() for i in includes):
        stub = build_dir / "stub"
        (stub / "crt").mkdir(parents=True, exist_ok=True)
        (stub / "crt/host_defines.h").write_text(HOST_DEFINES_STUB)
        includes.append(stub)
        log(f"no crt/host_defines.h in any CUDA include dir; using a host-only stand-in in {stub}")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise fail("no gcc/cc on PATH to build bench/bare_cupti.c")
    out = build_dir / "bare_cupti.so"
    cmd = [gcc, "-O2", "-Wall", "-shared", "-fPIC", *(f"-I{i}" for i in includes), str(BARE_C),
           str(libcupti), f"-Wl,-rpath,{libcupti.parent}", "-lpthread", "-o", str(out)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise fail(f"building bare_cupti.so failed: {' '.join(cmd)}\n{result.stderr}")
    log(f"built {out} against {libcupti} (headers {', '.join(map(str, includes))})")
    return out, libcupti


# --- cbid selection ------------------------------------------------------------------------------


def activity_api_patterns(config: Path) -> dict[str, list[str] | None]:
    """The default config's activity source ``runtime_api`` / ``driver_api`` (None where absent)."""
    import yaml

    data = yaml.safe_load(config.read_text())
    for source in data.get("sources", []) or []:
        if isinstance(source, dict) and source.get("type") == "activity":
            return {"runtime": source.get("runtime_api"), "driver": source.get("driver_api")}
    raise fail(f"{config} has no activity source")


def _header_cbids(domain: str, include: Path) -> dict[int, str]:
    """cbid → function name parsed from cupti_{runtime,driver}_cbid.h (fallback without cupti-python)."""
    prefix = "CUPTI_RUNTIME_TRACE_CBID_" if domain == "runtime" else "CUPTI_DRIVER_TRACE_CBID_"
    text = (include / f"cupti_{domain}_cbid.h").read_text()
    names: dict[int, str] = {}
    for name, value in re.findall(rf"{prefix}(\w+)\s*=\s*(\d+)", text):
        if name not in {"INVALID", "SIZE", "FORCE_INT"}:
            names[int(value)] = re.sub(r"_v\d+$", "", name)
    return names


def select_api_cbids(config: Path, include: Path) -> tuple[dict[str, list[int]], dict[str, list[str]], str]:
    """Per domain, the cbids cuptistream's default config traces, their names, and where they came from."""
    patterns = activity_api_patterns(config)
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    try:
        from cuptistream.cupti.api_functions import api_names, select_cbids
        from cuptistream.cupti.kinds import DEFAULT_DRIVER_API, DEFAULT_RUNTIME_API

        defaults = {"runtime": DEFAULT_RUNTIME_API, "driver": DEFAULT_DRIVER_API}
        cbids = {d: select_cbids(d, patterns[d] or defaults[d]) for d in ("runtime", "driver")}
        names = {d: [api_names(d)[c] for c in cbids[d]] for d in cbids}
        return cbids, names, "cuptistream.cupti.kinds.select_cbids (cupti-python enums)"
    except ImportError as error:
        log(f"cuptistream's cbid tables unavailable ({error}); matching the patterns against the headers")
    cbids, names = {}, {}
    for domain in ("runtime", "driver"):
        pats = patterns[domain]
        if not pats:
            raise fail(f"{config} has no {domain}_api list and cuptistream's defaults are not importable")
        table = _header_cbids(domain, include)
        chosen = []
        for cbid, name in table.items():  # the same rule as select_cbids: the name or its base
            base = name.removesuffix("_ptsz").removesuffix("_ptds")
            if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(base, p) for p in pats):
                chosen.append(cbid)
        cbids[domain] = sorted(chosen)
        names[domain] = [table[c] for c in cbids[domain]]
    return cbids, names, f"headers in {include}"


# --- one process ---------------------------------------------------------------------------------


def cuptistream_command() -> list[str]:
    exe = shutil.which("cuptistream")
    return [exe] if exe else [sys.executable, "-m", "cuptistream.cli"]


def run_child(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> dict[str, Any]:
    """Run one process; its stdout, stderr, rc, wall time, and from wait4 its CPU time and peak RSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        return {
            "rc": proc.returncode,
            "timed_out": killed.is_set(),
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "wait4_max_rss_kib": usage.ru_maxrss,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def parse_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict) and "per_iteration_us" in data:
                    return data
    return None


class Runner:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.base_env = dict(os.environ, PYTHONUNBUFFERED="1")
        for var in INJECTION_VARS:
            self.base_env.pop(var, None)
        pythonpath = [p for p in self.base_env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(ROOT) not in pythonpath:  # appended: an installed cuptistream still wins
            pythonpath.append(str(ROOT))
        self.base_env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        self.bare_so: Path | None = None
        self.libcupti: Path | None = None
        self.cbids: dict[str, list[int]] = {}
        self.counter = 0

    def workload_args(self, workload: str) -> list[str]:
        return [str(WORKLOADS_PY), "--workload", workload, "--seconds", str(self.args.seconds),
                "--warmup-seconds", str(self.args.warmup_seconds)]  # fmt: skip

    def run(self, workload: str, mode: str) -> dict[str, Any]:
        self.counter += 1
        env = dict(self.base_env)
        cwd = ROOT
        cmd = [sys.executable, *self.workload_args(workload)]
        report: Path | None = None
        scratch = Path(tempfile.mkdtemp(prefix=f"{workload}-{mode}-", dir=self.work))
        if mode == "bare":
            assert self.bare_so is not None and self.libcupti is not None
            report = scratch / "bare.json"
            env.update(
                CUDA_INJECTION64_PATH=str(self.bare_so),
                NVTX_INJECTION64_PATH=str(self.libcupti),
                BARE_CUPTI_RUNTIME_CBIDS=",".join(map(str, self.cbids["runtime"])),
                BARE_CUPTI_DRIVER_CBIDS=",".join(map(str, self.cbids["driver"])),
                BARE_CUPTI_OUT=str(report),
            )
        elif is_cuptistream(mode):
            report = scratch / "report.json"
            config = self.args.variants.get(mode, self.args.config)
            cmd = [*cuptistream_command(), "run", "-c", str(config), "--report-json", str(report),
                   "--", sys.executable, *self.workload_args(workload)]  # fmt: skip
            cwd = scratch  # the default config writes ./cuptistream-out
        elif mode == "kineto":
            cmd.append("--profiler")
        timeout = self.args.seconds + self.args.warmup_seconds + self.args.process_timeout
        child = run_child(cmd, env, cwd, timeout)
        result = parse_result(child["stdout"])
        record: dict[str, Any] = {
            "workload": workload,
            "mode": mode,
            "rc": child["rc"],
            "timed_out": child["timed_out"],
            "wall_s": round(child["wall_s"], 3),
            "cpu_s": round(child["cpu_s"], 3),
            "wait4_max_rss_kib": child["wait4_max_rss_kib"],
            "result": result,
        }
        if report is not None:
            record["report"] = None
            if report.is_file():
                with contextlib.suppress(ValueError):
                    record["report"] = json.loads(report.read_text())
        if is_cuptistream(mode):
            out_dir = scratch / "cuptistream-out"
            record["output_bytes"] = (
                sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file()) if out_dir.is_dir() else 0
            )
        ok = child["rc"] == 0 and result is not None
        if mode == "bare" and ok and not (record["report"] or {}).get("records"):
            ok = False
            record["error"] = "bare CUPTI wrote no report or counted no records: was the injection loaded?"
        record["stderr_tail"] = child["stderr"][-1000 if ok else -3000 :]
        if not ok:
            record.setdefault("error", f"rc {child['rc']}{' (timed out)' if child['timed_out'] else ''}")
            record["stdout_tail"] = child["stdout"][-1000:]
        record["ok"] = ok
        shutil.rmtree(scratch, ignore_errors=True)
        return record


# --- summary -------------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]], workloads: list[str], modes: list[str]) -> dict[str, Any]:
    by_key: dict[tuple[int, str, str], dict[str, Any]] = {
        (r["round"], r["workload"], r["mode"]): r for r in runs if r["ok"]
    }
    rounds = sorted({r["round"] for r in runs})
    summary: dict[str, Any] = {}
    for w in workloads:
        for m in modes:
            per_iter, to_none, to_bare = [], [], []
            for rnd in rounds:
                run = by_key.get((rnd, w, m))
                if run is None:
                    continue
                value = run["result"]["per_iteration_us"]
                per_iter.append(value)
                for ref_mode, bucket in (("none", to_none), ("bare", to_bare)):
                    ref = by_key.get((rnd, w, ref_mode))
                    if ref is not None:
                        bucket.append(value / ref["result"]["per_iteration_us"])
            cells = [by_key[(rnd, w, m)] for rnd in rounds if (rnd, w, m) in by_key]
            summary[f"{w}/{m}"] = {
                "per_iteration_us": per_iter,
                "ratio_to_none": to_none,
                "ratio_to_bare": to_bare,
                "program_max_rss_kib": [c["result"]["max_rss_kib"] for c in cells],
                "reports": [c.get("report") for c in cells],
                "failed": sum(1 for r in runs if r["workload"] == w and r["mode"] == m and not r["ok"]),
            }
    return summary


def _num(report: dict[str, Any] | None, key: str) -> float | None:
    value = (report or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def tables(summary: dict[str, Any], workloads: list[str], modes: list[str]) -> str:
    lines = [
        "| workload | mode | µs / iteration, median [min..max] | ratio to none | ratio to bare | failed |",
        "|---|---|---|---|---|---|",
    ]
    for w in workloads:
        for m in modes:
            s = summary[f"{w}/{m}"]
            to_none = spread_text(s["ratio_to_none"], ".2f") if m != "none" else "1"
            to_bare = spread_text(s["ratio_to_bare"], ".2f") if is_cuptistream(m) or m == "kineto" else ""
            lines.append(f"| {w} | {m} | {spread_text(s['per_iteration_us'], '.2f')} | {to_none} | {to_bare} "
                         f"| {s['failed'] or ''} |")  # fmt: skip
    detail = []
    for w in workloads:
        for m in [*(m for m in modes if is_cuptistream(m)), "bare"]:
            if m not in modes:
                continue
            s = summary[f"{w}/{m}"]
            reports = [r for r in s["reports"] if isinstance(r, dict)]
            rss_mib = [v / 1024 for v in s["program_max_rss_kib"]]
            if is_cuptistream(m):
                cpu_per_m = [
                    c / n * 1e6
                    for r in reports
                    if (c := _num(r, "collector_cpu_s")) is not None and (n := _num(r, "activity_records"))
                ]
                coll_rss = [v / 1024 for r in reports if (v := _num(r, "collector_max_rss_kib")) is not None]
                records = [v for r in reports if (v := _num(r, "activity_records")) is not None]
                losses = [
                    sum(v for v in r["losses"].values() if isinstance(v, (int, float)))
                    for r in reports
                    if isinstance(r.get("losses"), dict)
                ]
                detail.append(f"| {w} | {m} | {spread_text(records, '.0f')} | {spread_text(losses, '.0f')} "
                              f"| {spread_text(cpu_per_m, '.2f')} | {spread_text(coll_rss, '.0f')} "
                              f"| {spread_text(rss_mib, '.0f')} |")  # fmt: skip
            else:
                records = [v for r in reports if (v := _num(r, "records")) is not None]
                dropped = [v for r in reports if (v := _num(r, "dropped")) is not None]
                detail.append(f"| {w} | bare | {spread_text(records, '.0f')} | {spread_text(dropped, '.0f')} | | "
                              f"| {spread_text(rss_mib, '.0f')} |")  # fmt: skip
    if detail:
        lines += [
            "",
            "| workload | mode | activity records | lost / dropped | collector CPU s per M records "
            "| collector peak RSS MiB | program peak RSS MiB |",
            "|---|---|---|---|---|---|---|",
            *detail,
        ]
    return "\n".join(lines)


# --- main ----------------------------------------------------------------------------------------


def report(runs: list[dict[str, Any]], meta: dict[str, Any], out: Path, skipped: list[str]) -> int:
    """Summarize, write ``out`` and print the tables; the exit code (1 if a process failed)."""
    workloads = [w for w in ALL_WORKLOADS if any(r["workload"] == w for r in runs)]
    seen = list(dict.fromkeys(r["mode"] for r in runs))
    modes = [m for m in ALL_MODES if m in seen] + [m for m in seen if m not in ALL_MODES]
    summary = summarize(runs, workloads, modes)
    out.parent.mkdir(parents=True, exist_ok=True)
    devices = sorted({r["result"]["device"] for r in runs if r["ok"]})
    meta["device"] = devices
    meta["torch"] = sorted({r["result"]["torch"] for r in runs if r["ok"]})
    meta["skipped"] = skipped
    out.write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    failed = [r for r in runs if not r["ok"]]
    log(f"\nwrote {out}; {len(runs) - len(failed)} of {len(runs)} processes ok; device {', '.join(devices)}")
    for r in failed:
        log(f"failed: round {r['round']} {r['workload']} {r['mode']}: {r.get('error')}")
    if skipped:
        log(f"skipped (over --budget): {', '.join(skipped)}")
    log("")
    log(tables(summary, workloads, modes))
    log("")
    for line in headline(summary, workloads, modes):
        log(line)
    return 1 if failed else 0


def headline(summary: dict[str, Any], workloads: list[str], modes: list[str]) -> list[str]:
    """Per traced mode, one row: its ratio to bare CUPTI (to no tracing where bare was not run) on
    each workload, median [min..max] over rounds."""
    rows = []
    for m in modes:
        if m in ("none", "bare"):
            continue
        against = "bare" if "bare" in modes else "none"
        cells = []
        for w in workloads:
            values = summary[f"{w}/{m}"][f"ratio_to_{against}"]
            if values:
                cells.append(f"{w} {statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]")
        if cells:
            rows.append(f"{m} / {against}: {', '.join(cells)}")
    return rows


def merge(paths: list[Path], out: Path) -> int:
    """Combine the runs of several --out files (e.g. one device call per workload pair) into one table."""
    runs: list[dict[str, Any]] = []
    metas = []
    for i, path in enumerate(paths):
        data = json.loads(path.read_text())
        metas.append(data.get("meta", {}))
        for r in data["runs"]:
            runs.append({**r, "round": f"{i}.{r['round']}"})
    return report(runs, {"merged_from": [str(p) for p in paths], "metas": metas}, out, [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(ALL_WORKLOADS))
    parser.add_argument("--modes", default=",".join(ALL_MODES))
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per process (default 1.5)")
    parser.add_argument("--warmup-seconds", type=float, default=0.5, help="warm-up per process (default 0.5)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="cuptistream config (default)")
    parser.add_argument(
        "--process-timeout",
        type=float,
        default=60.0,
        help="seconds a process may take beyond warm-up + timed before it is killed (default 60)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=540.0,
        help="start no process that would end past this many seconds (default 540); "
        "the table covers what ran",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="only combine earlier --out files into one table (written to --out)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=CONFIG",
        help="also run cuptistream with CONFIG, as mode cuptistream:NAME (for cost breakdowns; repeatable)",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench/out/overhead_gpu.json", help="raw numbers (JSON)"
    )
    args = parser.parse_args(argv)  # fmt: skip
    os.environ["PYTHONUNBUFFERED"] = "1"
    if args.merge:
        return merge(args.merge, args.out)
    args.config = args.config.resolve()
    args.variants = {}
    for variant in args.variant:
        name, _, path = variant.partition("=")
        if not name or not path or not Path(path).is_file():
            raise fail(f"--variant {variant!r}: expected NAME=CONFIG with an existing CONFIG file")
        args.variants[f"cuptistream:{name}"] = Path(path).resolve()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for w in workloads:
        if w not in ALL_WORKLOADS:
            raise fail(f"unknown workload {w!r} (known: {', '.join(ALL_WORKLOADS)})")
    modes += [m for m in args.variants if m not in modes]
    for m in modes:
        if m not in ALL_MODES and m not in args.variants:
            raise fail(f"unknown mode {m!r} (known: {', '.join(ALL_MODES)})")

    run_s = args.seconds + args.warmup_seconds
    n_proc = args.rounds * len(workloads) * len(modes)
    planned = args.rounds * sum(estimate_s(w, m, run_s) for w in workloads for m in modes)
    log(f"plan: {args.rounds} rounds x {len(workloads)} workloads x {len(modes)} modes = {n_proc} processes, "
        f"{args.warmup_seconds:g} s warm-up + {args.seconds:g} s timed each; about {planned / 60:.1f} min "
        f"(budget {args.budget / 60:.1f} min)")  # fmt: skip
    if planned > args.budget:
        log("the plan is over the budget: the last processes will be skipped; use fewer rounds or workloads "
            "per call (and --merge the --out files)")  # fmt: skip

    t_start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    skipped: list[str] = []
    meta: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "python": sys.version}
    with tempfile.TemporaryDirectory(prefix="overhead_gpu-") as tmp:
        work = Path(tmp)
        runner = Runner(args, work)
        if "bare" in modes:
            runner.bare_so, runner.libcupti = build_bare(work)
            includes, _ = find_cupti()
            runner.cbids, names, source = select_api_cbids(args.config, includes[0])
            log(f"bare CUPTI filters from {source}: {len(runner.cbids['runtime'])} runtime cbids, "
                f"{len(runner.cbids['driver'])} driver cbids")  # fmt: skip
            meta.update(
                libcupti=str(runner.libcupti), cbid_source=source, cbids=runner.cbids, cbid_names=names
            )
        if any(is_cuptistream(m) for m in modes):
            meta["variants"] = {k: str(v) for k, v in args.variants.items()}
            meta["cuptistream_command"] = cuptistream_command()

        for rnd in range(args.rounds):
            shift = rnd % len(modes)
            order = modes[shift:] + modes[:shift]
            for w in workloads:
                for m in order:
                    elapsed = time.perf_counter() - t_start
                    if elapsed + estimate_s(w, m, run_s) > args.budget:
                        skipped.append(f"round {rnd} {w} {m}")
                        continue
                    record = runner.run(w, m)
                    record["round"] = rnd
                    runs.append(record)
                    res = record["result"] or {}
                    status = (f"{res['per_iteration_us']:.2f} µs/it, {res['iterations']} it"
                              if record["ok"] else f"FAILED: {record.get('error')}")  # fmt: skip
                    log(f"[{len(runs)}/{n_proc} {time.perf_counter() - t_start:.0f}s] round {rnd} {w} {m}: "
                        f"{status} ({record['wall_s']:.1f} s)")  # fmt: skip
                    if not record["ok"]:
                        log(record.get("stderr_tail", "")[-1500:])
    return report(runs, meta, args.out, skipped)


if __name__ == "__main__":
    sys.exit(main())
