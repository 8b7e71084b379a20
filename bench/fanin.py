"""Fan-in: N probed processes into ONE collector, the file sink at the end.

    python bench/fanin.py --mode cpu --probes 1,4,8,16 --seconds 15 --runs 3
    python bench/fanin.py --mode cpu --probes 16 --full-policy block --loops 200   # exact read-back
    python bench/fanin.py --mode cpu --probes 4,8 --runs 3                 # overload: 2N against N
    python bench/fanin.py --mode gpu --probes 1,4,8,16 --seconds 15 --runs 3       # on a GPU host
    python bench/fanin.py --mode gpu --probes 2,16 --seconds 10   # 2 GPUs: 1, then 8 per GPU
    python bench/fanin.py --mode ddp --nproc 2   # a node collector in front of a torchrun job

Each (run, N) is one ``cuptistream run -c CFG --report-json R -- sh -c '<N programs> & wait'``: the
``run`` process is the collector, and ``sh`` is not Python, so exactly N processes are probed.

- ``--mode cpu``: each program is an idle Python whose probe runs the replay source over the shipped
  real-GPU captures (taken on an H200) (``loops: 0``, no interval: as fast as slots come free; ``--loops L``: L times, then
  the program exits). No GPU needed; one replay offers more than one GPU does.
- ``--mode gpu``: each program replays a CUDA graph of 50 tiny kernels (``bench/workloads.py`` W3)
  for ``--seconds`` under ``configs/default.yaml``'s sources. The programs are spread round-robin
  over the visible GPUs (``--gpus``, default: all of ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``;
  program i on device i mod G), so N = 8 x G is one collector for 8 processes per GPU. The result
  has the programs per device and, from the read-back, the kernels recorded per device.
- ``--mode ddp``: no ``run`` collector. A node collector, ``cuptistream collector -c CFG --socket
  S``, is started first, then ``torchrun --standalone --nproc_per_node=NPROC examples/train_ddp.py``
  with the environment ``cuptistream run`` gives a program, aimed at S
  (``cuptistream.run.program.probe_environment``): each rank's probe starts at CUDA initialization and
  feeds the node collector, which is stopped (SIGTERM: it drains) once the job has exited. Checked:
  ``--nproc`` probes came, every rank's kernels are all on its own device, NCCL kernels among them.

Rounds are interleaved (run 1 of every N, then run 2, ...), so a noisy neighbour spreads over all N.
Per N: offered records/s (records the collector took from the probes' slots, decoded or shed
before decoding, over the window the programs ran), decoded records/s, delivered events/s
(acknowledged by the file sink; and, read back, the steady rate: what the sink wrote between
the collector's SelfStats samples, every second, from 2 s after the programs began, their start-up
left out), drops by stage and reason, collector CPU-s per million records (and, read back, per
million events delivered over the steady rate's span: the start-up of the collector and its
workers left out), cores used (collector CPU over that window, sampled from
/proc), and the collector's anonymous and shared RSS (peak of /proc/PID/status samples every 0.1 s).
With ``--runs K``: median, min and max. JSON per run and a summary go under ``--out`` (default: a new
``bench/out/fanin-<time>`` folder). The last lines printed are the headline rows: per N (and decode
workers), delivered events/s, collector CPU-s per million records and peak anonymous RSS, median
[min..max] over the runs; and, where the runs hold N and 2N probes, 2N's delivered events over N's.

The read-back check (``--no-check`` skips it; a failed one makes the exit status 1) reads every
event on disk and checks ``events_in == data events on disk + counted drops`` exactly (event
drops at ``intake`` and the file lane, from ``--report-json``); with ``--loops L`` also, type by
type, ``record events on disk == N x L x what one loop of the captures decodes to`` when nothing
was dropped (``--full-policy block``; the collector's statistics events are derived, not counted).

``--workers W[,W2...]`` sets ``pipeline.decode_workers`` (each W is run for each N, interleaved);
CPU, cores and RSS then count the collector's decode worker processes too (``workers_*`` apart).

``--collector-cpus`` / ``--program-cpus`` pin the collector and the programs apart.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONTROL = {"Loss", "SelfStats", "Error"}  # the collector's accounting, not the probes' data
SHED = "intake/shed_before_decode"  # whole buffers dropped before decoding: counted in records
TICK = os.sysconf("SC_CLK_TCK")

GPU_PROGRAM = r"""
import os, sys, time
sys.path.insert(0, {root!r})
from bench.workloads import w3_graph_replay
import torch
torch.cuda.set_device(int(os.environ.get("FANIN_DEVICE", "0")))
block = w3_graph_replay()
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    block(200)
    torch.cuda.synchronize()
"""


def _cpu_list(spec: str) -> set[int]:
    """``0-3,8`` -> {0, 1, 2, 3, 8}; "" -> empty (no pinning)."""
    cpus: set[int] = set()
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _now() -> float:
    """The clock of the programs' stamps (/proc/uptime)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# The collector's SelfStats every second: the steady rate is read from the recording's samples,
# past the programs' start (the window's rate also counts their start-up, which grows with N).
STATS_INTERVAL_S = 1
SETTLE_S = 2.0


def worker_counts(spec: str) -> list[int | str]:
    """``--workers``: comma-separated ``pipeline.decode_workers`` values, whole numbers or ``auto``."""
    return [x if x == "auto" else int(x) for x in spec.split(",")]


def config(args: argparse.Namespace, out: Path, workers: int | str) -> dict[str, Any]:
    pipeline = {
        "memory_budget": args.memory_budget, "full_policy": args.full_policy, "decode_workers": workers,
        "heap_trim": args.heap_trim, "worker_replies": args.worker_replies,
        "batch": {"max_events": 8192, "max_bytes": "4MiB", "max_latency": "1s"},
        "stats_interval": f"{STATS_INTERVAL_S}s", "shutdown_deadline": f"{args.shutdown_deadline}s",
    }  # fmt: skip
    sink = {"type": "file", "directory": str(out), "format": "msgpack", "fsync": "rotate",
            "rotate_bytes": "256MiB", "queue": {"full_policy": args.full_policy, "max_bytes": args.sink_queue}}  # fmt: skip
    if args.zstd_level is not None:  # else the sink's default
        sink["zstd_level"] = args.zstd_level
    if args.mode == "cpu":
        sources: list[dict[str, Any]] = [{"type": "replay", "loops": args.loops}]
        if args.replay_buffer_size:  # the captures' ~1k-record buffers packed into GPU-sized ones
            sources[0]["buffer_size"] = args.replay_buffer_size
        if args.replay_path:  # e.g. a GPU's own buffers (bench/capture_stream.py)
            sources[0]["path"] = args.replay_path
    else:
        default = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
        sources = default["sources"]
    return {"pipeline": pipeline, "sources": sources, "sinks": [sink]}


def visible_gpus() -> int:
    """GPUs a program may use: the entries of CUDA_VISIBLE_DEVICES if set, else ``nvidia-smi -L``'s
    lines, else 1."""
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return max(1, len([d for d in visible.split(",") if d.strip()]))
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 1
    return max(1, sum(line.startswith("GPU ") for line in listed.splitlines()))


def device_plan(n: int, gpus: int) -> dict[str, int]:
    """Programs per device index when program i (from 0) runs on device i mod ``gpus``."""
    counts = collections.Counter(str(i % gpus) for i in range(n))
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def programs(args: argparse.Namespace, n: int, stamps: Path) -> str:
    """The shell line that starts N probed programs (and no other Python) and stamps when they
    began and all ended; on the GPU, program i on device i mod ``args.gpus``."""
    py = shlex.quote(sys.executable)
    if args.mode == "gpu":
        one = f"{py} -c {shlex.quote(GPU_PROGRAM.format(root=str(ROOT), seconds=args.seconds))}"
    elif args.loops:
        one = f"{py} -c pass"  # the replay finishes its loops at exit (ReplaySource.stop)
    else:
        one = f"{py} -c {shlex.quote(f'import time; time.sleep({args.seconds})')}"
    # Not a Python (it would be probed too): /proc/uptime is CLOCK_BOOTTIME, 10 ms steps.
    stamp = f"read up _ < /proc/uptime; echo $up >> {shlex.quote(str(stamps))}"
    if args.program_cpus:  # the programs on their own cores: they do not take the collector's
        one = f"taskset -c {shlex.quote(args.program_cpus)} {one}"
    if args.mode == "gpu":
        one = f"FANIN_DEVICE=$(( (i - 1) % {max(1, args.gpus)} )) {one}"
    return f"{stamp}; for i in $(seq {n}); do {one} & done; wait; {stamp}"


def _cpu_and_faults(pid: int) -> tuple[float, int]:
    """CPU seconds and minor page faults so far, from one read of /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # field 3 on: index 0 on
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[7])


def _rss_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


class ProcWatch:
    """Samples the collector's CPU ticks, RssAnon/RssShmem and minor page faults from /proc every
    ``interval`` s, and those of its decode workers (CPU added to the collector's; RSS and faults
    apart). The faults are the last sample's, up to ``interval`` before each process ended."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval = pid, interval
        self.cpu: list[tuple[float, float]] = []  # (_now(), CPU seconds, decode workers included)
        self.peak_anon_kib = self.peak_shmem_kib = 0
        self.workers_peak_anon_kib = 0  # the workers' RssAnon added up, at its peak
        self._worker_cpu: dict[int, float] = {}  # last reading per worker (it stays once one exits)
        self.minor_faults = 0
        self._worker_faults: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from cuptistream.collector.worker_pool import worker_pids

        while not self._stop.is_set():
            try:
                own, self.minor_faults = _cpu_and_faults(self.pid)
                self.peak_anon_kib = max(self.peak_anon_kib, _rss_kib(self.pid, "RssAnon:"))
                self.peak_shmem_kib = max(self.peak_shmem_kib, _rss_kib(self.pid, "RssShmem:"))
                workers = worker_pids(self.pid)
            except OSError:
                return
            anon = 0
            for worker in workers:
                try:
                    self._worker_cpu[worker], self._worker_faults[worker] = _cpu_and_faults(worker)
                    anon += _rss_kib(worker, "RssAnon:")
                except OSError:
                    continue
            self.workers_peak_anon_kib = max(self.workers_peak_anon_kib, anon)
            self.cpu.append((_now(), own + sum(self._worker_cpu.values())))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def workers_minor_faults(self) -> int:
        return sum(self._worker_faults.values())

    def cpu_between(self, start: float, end: float) -> float:
        """CPU seconds the collector used between two ``_now()`` times (nearest samples)."""

        def at(t: float) -> float:
            return min(self.cpu, key=lambda s: abs(s[0] - t))[1] if self.cpu else 0.0

        return at(end) - at(start)


def per_loop_events(path: str = "") -> collections.Counter[str]:
    """Events by type that one loop over the captures at ``path`` ("": the shipped ones) decodes to,
    by the collector's decoder."""
    from cuptistream.collector.buffer_decoder import Decoder
    from cuptistream.cupti import capture
    from cuptistream.cupti.names import TableNames
    from cuptistream.cupti.records import RecordLayouts
    from cuptistream.sources.replay import capture_files

    events: collections.Counter[str] = collections.Counter()
    for file in capture_files(path):
        cap = capture.read(file)
        decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)), False)
        for buf in cap.buffers:
            events.update(
                type(e).__name__ for e in decoder.decode(memoryview(bytearray(buf.data)), len(buf.data))
            )
    return events


class ReadBack(NamedTuple):
    types: collections.Counter[str]  # events on disk by type
    kernels: collections.Counter[str]  # kernels by device index
    errors: collections.Counter[str]  # Error events by origin and message
    delivered: list[tuple[int, int]]  # (SelfStats' Unix ns, events the file sink had written by then)


def read_back(out: Path) -> ReadBack:
    """What is on disk: see ``ReadBack``. Errors are the probes' and CUPTI's own reports (a storm of
    them under overload is worth seeing)."""
    import cuptistream

    back = ReadBack(collections.Counter(), collections.Counter(), collections.Counter(), [])
    for e in cuptistream.read(out):
        name = type(e).__name__
        back.types[name] += 1
        if name == "Kernel":
            back.kernels[str(e.device_id)] += 1
        elif name == "Error":
            back.errors[f"{e.origin}: {e.message[:160]}"] += 1
        elif name == "SelfStats":
            sinks = [stage for key, stage in e.stages.items() if key.startswith("sink:")]
            if sinks:
                back.delivered.append((e.timestamp, sinks[0].events_out))
    back.delivered.sort()
    return back


def steady_rate(delivered: list[tuple[int, int]], start_ns: int, end_ns: int) -> float | None:
    """Events/s the sink wrote between the first sample ``SETTLE_S`` past ``start_ns`` and the last
    one before ``end_ns`` (Unix ns: the programs' window); None with under 2 s between them."""
    inside = [(t, n) for t, n in delivered if start_ns + SETTLE_S * 1e9 <= t <= end_ns]
    if len(inside) < 2 or inside[-1][0] - inside[0][0] < 2e9:
        return None
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / ((t1 - t0) / 1e9)


def one_run(args: argparse.Namespace, n: int, workers: int | str, run: int, workdir: Path) -> dict[str, Any]:
    where = workdir / f"n{n}-w{workers}-run{run}"
    where.mkdir(parents=True)
    out, cfg, report_path, stamps = where / "out", where / "cfg.yaml", where / "report.json", where / "stamps"
    cfg.write_text(yaml.safe_dump(config(args, out, workers)))
    command = [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(cfg), "--report-json", str(report_path),
               "--quiet", "--", "sh", "-c", programs(args, n, stamps)]  # fmt: skip
    began = _now()
    cpus = _cpu_list(args.collector_cpus)
    collector = subprocess.Popen(
        command, cwd=where, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    )
    watch = ProcWatch(collector.pid)
    code = collector.wait(timeout=args.seconds * 20 + 120)
    wall = _now() - began
    watch.stop()
    if code != 0:
        raise SystemExit(f"fanin: `cuptistream run` exited {code} for N={n} (see {where})")
    report = json.loads(report_path.read_text())
    if report["probes"] != n:
        raise SystemExit(f"fanin: {report['probes']} probes connected, not {n} (see {where})")
    start, end = (float(x) for x in stamps.read_text().split())
    window = end - start
    file = report["sinks"]["file"]
    records = report["activity_records"]  # decoded
    losses = report["losses"]
    shed = losses.get(SHED, 0)
    cpu_window = watch.cpu_between(start, end)
    cpu_s = report["collector_cpu_s"] + report.get("decode_workers_cpu_s", 0.0)  # workers apart in the report
    result: dict[str, Any] = {
        "probes": n, "workers": workers, "decode_workers_started": report.get("decode_workers", 0), "decode_worker_moves": report.get("decode_worker_moves", 0), "run": run, "window_s": round(window, 3), "wall_s": round(wall, 3),
        "offered_records_per_s": round((records + shed) / window),
        "decoded_records_per_s": round(records / window),
        "delivered_events_per_s": round(file["events_out"] / window),
        "records": records, "shed_records": shed, "events_in": report["events_in"], "delivered_events": file["events_out"],
        # buffers per decode: consecutive buffers that queued up on a connection are decoded as one
        "buffers_per_decode": round(report["activity_buffers"] / report["activity_decodes"], 2)
        if report.get("activity_decodes") else None,
        "drops": losses, "dropped_events": file["events_dropped"] + report["intake_dropped"],
        # lost in the programs before the collector (CUPTI found no free buffer): not in events_in
        "cupti_dropped_records": sum(v for k, v in losses.items() if k.startswith("cupti/")),
        "collector_cpu_s": report["collector_cpu_s"], "workers_cpu_s": report.get("decode_workers_cpu_s", 0.0),
        # per record taken from the probes, shed or decoded: what the collector costs per offered record
        "cpu_s_per_m_records": round(cpu_s / ((records + shed) / 1e6), 3) if records else None,
        "cores_used": round(cpu_window / window, 3),
        "peak_rss_anon_mib": round(watch.peak_anon_kib / 1024, 1),
        "peak_rss_shmem_mib": round(watch.peak_shmem_kib / 1024, 1),
        "workers_peak_rss_anon_mib": round(watch.workers_peak_anon_kib / 1024, 1),
        "report_peak_rss_anon_mib": round(report.get("collector_peak_rss_anon_kib", 0) / 1024, 1),
        # minor page faults per record: each fresh page of a reply or a numpy temporary is one
        "collector_faults_per_k_records": round(watch.minor_faults / records * 1e3, 2) if records else None,
        "workers_faults_per_k_records": round(watch.workers_minor_faults / records * 1e3, 2) if records else None,
        # the collector's busiest thread, as cores over the run: near 1.0, that thread is the limit
        "busiest_thread": report.get("collector_busiest_thread", ""),
        "busiest_thread_cores": round(report.get("collector_busiest_thread_cpu_s", 0.0) / wall, 3),
        "threads_cpu_s": report.get("collector_threads_cpu_s", {}),
    }  # fmt: skip
    if args.mode == "gpu":
        result["programs_by_device"] = device_plan(n, args.gpus)
    if args.check:
        back = read_back(out)
        result["check"] = check(args, n, report, back.types)
        result["errors_on_disk"] = dict(back.errors.most_common(5))
        # The window's stamps are CLOCK_BOOTTIME; SelfStats carry Unix time.
        epoch = time.time() - _now()
        rate = steady_rate(back.delivered, int((start + epoch) * 1e9), int((end + epoch) * 1e9))
        result["steady_delivered_events_per_s"] = round(rate) if rate is not None else None
        # The same span's CPU (workers included) per event: without the start-up of the collector and
        # its workers (~0.7 CPU-s each), which a short run charges to few records and a node
        # collector that runs for hours does not.
        settled = start + SETTLE_S
        if rate and end - settled >= 2:
            cpu_rate = watch.cpu_between(settled, end) / (end - settled)
            result["steady_cpu_s_per_m_events"] = round(cpu_rate / rate * 1e6, 3)
        if args.mode == "gpu":
            result["kernels_by_device"] = dict(sorted(back.kernels.items(), key=lambda kv: int(kv[0])))
            result["check"]["every_device_traced"] = all(
                back.kernels[d] > 0 for d in result["programs_by_device"]
            )
    if not args.keep:
        for path in sorted(out.glob("*")):
            path.unlink()
    (where / "result.json").write_text(json.dumps(result, indent=1))
    return result


def check(
    args: argparse.Namespace, n: int, report: dict[str, Any], on_disk: collections.Counter[str]
) -> dict[str, Any]:
    data = sum(c for name, c in on_disk.items() if name not in CONTROL)
    dropped = sum(
        v for k, v in report["losses"].items() if k.split("/")[0] in ("intake", "sink:file") and k != SHED
    )
    found: dict[str, Any] = {"data_events_on_disk": data, "counted_drops": dropped,
                             "in_equals_disk_plus_drops": report["events_in"] == data + dropped}  # fmt: skip
    if args.mode == "cpu" and args.loops:
        # Per type of record event: the collector's statistics (ActivityStats, GpuStats) are derived
        # from the records, not records, and their count depends on the intervals the run spanned.
        per_loop = per_loop_events(args.replay_path)
        expected = {name: n * args.loops * count for name, count in per_loop.items()}
        found["expected_data_events"] = sum(expected.values())
        found["record_events_on_disk"] = sum(on_disk[name] for name in expected)
        same = all(on_disk[name] == count for name, count in expected.items())
        found["disk_equals_captures_x_loops"] = same if not dropped else None
    return found


def torchrun_job(args: argparse.Namespace, where: Path) -> list[str]:
    """``--mode ddp``'s job: examples/train_ddp.py on ``--nproc`` ranks, each writing where/ranks/rank{R}.json."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
            str(ROOT / "examples" / "train_ddp.py"), "--steps", str(args.steps), "--out", str(where / "ranks")]  # fmt: skip


def ddp_behind_node_collector(
    args: argparse.Namespace,
    workdir: Path,
    job: Callable[[argparse.Namespace, Path], list[str]] = torchrun_job,
) -> dict[str, Any]:
    """``--mode ddp``: a node collector first, then a torchrun job pointed at it (see the docstring).
    ``job`` gives the job's command; its ranks write ``ranks/rank{R}.json`` with the ``device`` they used."""
    from cuptistream.run.program import probe_environment

    where = workdir / f"ddp-n{args.nproc}"
    where.mkdir(parents=True)
    out, cfg, report_path, sock = (
        where / "out",
        where / "cfg.yaml",
        where / "report.json",
        where / "node.sock",
    )
    cfg.write_text(yaml.safe_dump(config(args, out, worker_counts(args.workers)[0])))
    node = subprocess.Popen(
        [sys.executable, "-m", "cuptistream.cli", "collector", "-c", str(cfg), "--socket", str(sock),
         "--report-json", str(report_path), "--quiet"],
        cwd=where, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert node.stdout is not None
    if not node.stdout.readline().startswith("listening on"):
        node.kill()
        raise SystemExit(f"fanin: the node collector did not start (exit {node.wait()})")
    watch = ProcWatch(node.pid)
    env = probe_environment(str(sock), cfg, quiet=True)
    began = time.monotonic()
    done = subprocess.run(
        job(args, where), cwd=where, env=env, capture_output=True, text=True, timeout=args.seconds * 20 + 300
    )
    job_s = time.monotonic() - began
    node.send_signal(signal.SIGTERM)  # the job is over: drain what its probes handed over, then stop
    code = node.wait(timeout=args.shutdown_deadline + 60)
    watch.stop()
    if done.returncode != 0 or code != 0:
        raise SystemExit(
            f"fanin: torchrun exited {done.returncode}, the node collector {code}: {done.stderr[-2000:]}"
        )
    report = json.loads(report_path.read_text())
    missing = [r for r in range(args.nproc) if not (where / "ranks" / f"rank{r}.json").exists()]
    if missing:
        raise SystemExit(f"fanin: ranks {missing} wrote no result: {done.stderr[-2000:]}")
    truth = {r: json.loads((where / "ranks" / f"rank{r}.json").read_text()) for r in range(args.nproc)}
    import cuptistream

    per_rank: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for batch in cuptistream.read(out).batches():
        rank = batch.resource.rank
        for e in batch.events:
            if type(e).__name__ == "Kernel":
                row = per_rank[str(rank)]
                row["kernels"] += 1
                row["nccl_kernels"] += "nccl" in e.name.lower()  # mangled: _Z39ncclDevKernel_...
                row[f"device{e.device_id}"] += 1
    ranks = {r: dict(c) for r, c in sorted(per_rank.items())}
    result = {
        "nproc": args.nproc, "steps": args.steps, "job_s": round(job_s, 2), "probes": report["probes"],
        "events_in": report["events_in"], "losses": report["losses"], "collector_cpu_s": report["collector_cpu_s"],
        "peak_rss_anon_mib": round(watch.peak_anon_kib / 1024, 1), "ranks": ranks,
    }  # fmt: skip
    result["check"] = ddp_check(result, {r: t["device"] for r, t in truth.items()})
    if not args.keep:
        for path in sorted(out.glob("*")):
            path.unlink()
    (where / "result.json").write_text(json.dumps(result, indent=1))
    return result


def ddp_check(result: dict[str, Any], devices: dict[int, int]) -> dict[str, bool]:
    """A node collector served every rank: ``nproc`` probes; each rank's kernels all on its own
    device (``devices``: rank -> the ordinal it trained on), NCCL kernels among them."""
    ranks = result["ranks"]
    return {
        "every_rank_a_probe": result["probes"] == result["nproc"],
        "every_rank_recorded": sorted(ranks) == [str(r) for r in range(result["nproc"])],
        "kernels_on_own_device": all(
            ranks.get(str(r), {}).get(f"device{d}", 0) == ranks.get(str(r), {}).get("kernels", -1) > 0
            for r, d in devices.items()
        ),
        "nccl_on_every_rank": all(ranks.get(str(r), {}).get("nccl_kernels", 0) > 0 for r in devices),
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["offered_records_per_s", "decoded_records_per_s", "delivered_events_per_s", "steady_delivered_events_per_s",
            "dropped_events", "cupti_dropped_records", "shed_records", "cpu_s_per_m_records", "steady_cpu_s_per_m_events",
            "cores_used", "peak_rss_anon_mib", "peak_rss_shmem_mib", "workers_peak_rss_anon_mib"]  # fmt: skip
    by_n: dict[tuple[int, int | str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        by_n[r["probes"], r["workers"]].append(r)
    summary: dict[str, Any] = {}
    for (n, w), rs in sorted(by_n.items(), key=lambda item: (item[0][0], str(item[0][1]))):
        key = f"{n}/w{w}"  # N probes, W decode workers
        summary[key] = {
            k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for k in keys
            if (v := [r[k] for r in rs if r.get(k) is not None])
        }
        summary[key]["drops"] = [r["drops"] for r in rs]
        summary[key]["checks"] = [r.get("check") for r in rs]
        if "programs_by_device" in rs[0]:
            summary[key]["programs_by_device"] = rs[0]["programs_by_device"]
            summary[key]["kernels_by_device"] = [r.get("kernels_by_device") for r in rs]
    if overload := overload_ratios(results):
        summary["overload"] = overload
    return summary


def _mmm(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}..{max(values):{fmt}}]"


def rows(results: list[dict[str, Any]]) -> list[str]:
    """The headline rows: per N probes and decode workers, delivered events/s (and steady), the
    collector's CPU-s per million records and its peak anonymous RSS; then each 2N / N pair's
    delivered events, per run, as median [min..max]."""
    out = []
    by_n: dict[tuple[int, int | str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        by_n[r["probes"], r["workers"]].append(r)
    for (n, w), rs in sorted(by_n.items(), key=lambda item: (item[0][0], str(item[0][1]))):
        delivered = [r["delivered_events_per_s"] / 1e6 for r in rs]
        steady = [
            r["steady_delivered_events_per_s"] / 1e6 for r in rs if r.get("steady_delivered_events_per_s")
        ]
        cpu = [r["cpu_s_per_m_records"] for r in rs if r.get("cpu_s_per_m_records") is not None]
        anon = [r["peak_rss_anon_mib"] for r in rs if r.get("peak_rss_anon_mib") is not None]
        text = f"{n} probes, workers {w}, {len(rs)} runs: delivered {_mmm(delivered, '.2f')} M events/s"
        text += f" (steady {_mmm(steady, '.2f')})" if steady else ""
        text += f", collector {_mmm(cpu, '.2f')} CPU-s per M records" if cpu else ""
        text += f", peak anon {_mmm(anon, '.0f')} MiB" if anon else ""
        out.append(text)
    for pair, ratios in overload_ratios(results).items():
        text = f"overload {pair} probes: delivered 2N / N {_mmm(ratios['window'], '.3f')}"
        text += f" (steady {_mmm(ratios['steady'], '.3f')})" if ratios["steady"] else ""
        out.append(text)
    return out


def overload_ratios(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Overload, where the runs hold N and 2N probes: per run (and decode workers), what 2N
    delivered over what N did, over the window and steady, with the median of each."""
    by_run = {(r["probes"], r["workers"], r["run"]): r for r in results}
    found: dict[str, Any] = {}
    for (n, w, run), one in sorted(
        by_run.items(), key=lambda item: (item[0][0], str(item[0][1]), item[0][2])
    ):
        two = by_run.get((2 * n, w, run))
        if two is None:
            continue
        pair = found.setdefault(f"{2 * n}/{n}/w{w}", {"window": [], "steady": []})
        pair["window"].append(round(two["delivered_events_per_s"] / max(one["delivered_events_per_s"], 1), 3))
        if one.get("steady_delivered_events_per_s") and two.get("steady_delivered_events_per_s"):
            pair["steady"].append(
                round(two["steady_delivered_events_per_s"] / one["steady_delivered_events_per_s"], 3)
            )
    for pair in found.values():
        for kind in ("window", "steady"):
            if pair[kind]:
                pair[f"{kind}_median"] = round(statistics.median(pair[kind]), 3)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["cpu", "gpu", "ddp"], default="cpu")
    parser.add_argument(
        "--gpus", type=int, default=0, help="gpu: spread the programs over G devices (default: all)"
    )
    parser.add_argument("--nproc", type=int, default=2, help="ddp: torchrun ranks (a GPU each)")
    parser.add_argument("--steps", type=int, default=300, help="ddp: examples/train_ddp.py --steps")
    parser.add_argument("--probes", default="1,4,8,16", help="comma-separated N (default 1,4,8,16)")
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="how long the programs run (endless replay, gpu)"
    )
    parser.add_argument(
        "--loops", type=int, default=0, help="cpu: replay the captures L times per probe (0: for --seconds)"
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--workers",
        default="auto",
        help="comma-separated pipeline.decode_workers (N or auto), each run per N (default auto, as the default config)",
    )
    parser.add_argument(
        "--full-policy", choices=["drop_newest", "drop_oldest", "block"], default="drop_newest"
    )
    parser.add_argument(
        "--replay-path",
        type=lambda p: str(Path(p).resolve()) if p else "",
        default="",
        help="cpu: replay these captures (a file or folder; default the shipped ones), e.g. a GPU's "
        "own buffers from bench/capture_stream.py",
    )
    parser.add_argument(
        "--replay-buffer-size",
        default="",
        help="cpu: pack the captured buffers into buffers of this size "
        "(e.g. 4MiB, the activity source's default); default: as captured",
    )
    parser.add_argument("--memory-budget", default="256MiB")
    parser.add_argument(
        "--no-heap-trim",
        dest="heap_trim",
        action="store_false",
        help="pipeline.heap_trim: false (A/B the trim)",
    )
    parser.add_argument(
        "--worker-replies",
        choices=["heap", "mapped", "shared"],
        default="shared",
        help="pipeline.worker_replies",
    )
    parser.add_argument("--sink-queue", default="64MiB", help="the file lane's queue.max_bytes")
    parser.add_argument(
        "--zstd-level",
        type=int,
        default=None,
        help="the file sink's zstd_level (default: the sink's; a high one makes the sink the bottleneck)",
    )
    parser.add_argument("--shutdown-deadline", type=float, default=30.0)
    parser.add_argument(
        "--out", type=Path, default=None, help="results folder (default: a new bench/out/fanin-<time>)"
    )
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip reading the files back")
    parser.add_argument(
        "--collector-cpus", default="", help="pin the collector (cuptistream run) to these CPUs, e.g. 0-7"
    )
    parser.add_argument(
        "--program-cpus", default="", help="pin the probed programs to these CPUs (taskset), e.g. 8-15"
    )
    parser.add_argument("--keep", action="store_true", help="keep the recordings")
    args = parser.parse_args(argv)
    default = ROOT / "bench" / "out" / time.strftime("fanin-%Y%m%d-%H%M%S")
    out = (args.out or default).resolve()  # the runs work in subfolders
    if args.out is not None and out.exists() and any(out.iterdir()):
        print(f"fanin: --out {out} holds an earlier run; give an empty or new folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "gpu" and not args.gpus:
        args.gpus = visible_gpus()
    if args.mode == "ddp":
        result = ddp_behind_node_collector(args, out)
        print(json.dumps(result), flush=True)
        failed_checks = [k for k, ok in result["check"].items() if not ok]
        if failed_checks:
            print(f"fanin: ddp behind a node collector: failed {failed_checks}", file=sys.stderr)
        return 1 if failed_checks else 0
    ns = [int(x) for x in args.probes.split(",")]
    ws = worker_counts(args.workers)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    results = []
    for run in range(args.runs):
        for n in ns:
            for w in ws:
                result = one_run(args, n, w, run, out)
                results.append(result)
                print(json.dumps(result), flush=True)
    meta = {"argv": sys.argv, "commit": commit, "cpus": os.cpu_count(), "host": os.uname().nodename}
    (out / "summary.json").write_text(
        json.dumps({"meta": meta, "summary": summarize(results), "runs": results}, indent=1)
    )
    print(f"fanin: results in {out}", file=sys.stderr)
    for row in rows(results):
        print(row)
    failed = [
        (r["probes"], r["workers"], r["run"], c)
        for r in results
        if (c := r.get("check")) and any(v is False for v in c.values())
    ]
    for n, w, run, found in failed:
        print(f"fanin: read-back check failed for N={n} W={w} run {run}: {found}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
