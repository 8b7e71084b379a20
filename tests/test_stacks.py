"""GPU time by code on the CPU: the stack sampler on real threads, the join on hand-made records, and
``cuptistream flame`` on a recording captured on the GPU with stacks on (``tests/fixtures/stacks``,
see ``tests/fixtures/README.md``), its pprof read back by the protobuf runtime and its speedscope file
checked against speedscope's JSON schema."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cuptistream.analysis.records import Part
from cuptistream.analysis.stacks import NO_PYTHON_STACK, NO_STACK_RECORDED, Frame, join_stacks
from cuptistream.config import build
from cuptistream.config.model import StacksConfig
from cuptistream.errors import ConfigError
from cuptistream.events import ApiCall, Event, Kernel, Resource, StackChanges, StackTable
from cuptistream.stacks import BACKWARD, SYNTHETIC_FILE, TABLE_FULL, TRUNCATED, StackSampler
from tests.pprof_profile import profile_class

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURE = FIXTURES / "stacks"
SCHEMA = json.loads((FIXTURES / "speedscope" / "file-format-schema.json").read_text())
MASK = 0xFFFFFFFF


# --- the sampler ---------------------------------------------------------------------------------


def alpha(ready: threading.Event, go: threading.Event) -> None:
    ready.set()
    go.wait()


def beta(ready: threading.Event, go: threading.Event) -> None:
    ready.set()
    go.wait()


def nest(depth: int, ready: threading.Event, go: threading.Event) -> None:
    if depth:
        nest(depth - 1, ready, go)
    else:
        alpha(ready, go)


class Sampled:
    """A sampler fed by hand (``sample()``), its events and losses collected."""

    def __init__(self, **config: Any) -> None:
        self.events: list[Event] = []
        self.lost: list[int] = []
        self.sampler = StackSampler(
            StacksConfig(**config), self.events.extend, time.monotonic_ns, self.lost.append
        )

    def tables(self) -> tuple[dict[int, tuple[str, str, int]], dict[int, list[int]]]:
        frames: dict[int, tuple[str, str, int]] = {}
        stacks: dict[int, list[int]] = {}
        for e in self.events:
            if isinstance(e, StackTable):
                frames.update(zip(e.frame_ids, zip(e.files, e.functions, e.lines, strict=True), strict=True))
                stacks.update(zip(e.stack_ids, e.stacks, strict=True))
        return frames, stacks

    def stacks_of(self, ident: int) -> list[list[str]]:
        """The function names of each stack ``ident`` moved to, outermost first."""
        frames, stacks = self.tables()
        return [
            [frames[f][1] for f in stacks[s]]
            for e in self.events if isinstance(e, StackChanges)
            for t, s in zip(e.thread_ids, e.stack_ids, strict=True) if t == ident & MASK and s
        ]  # fmt: skip


def _threads(*targets: Any, settle: float = 0.01) -> tuple[list[threading.Thread], threading.Event]:
    go = threading.Event()
    threads = []
    for target, *args in targets:
        ready = threading.Event()
        thread = threading.Thread(target=target, args=(*args, ready, go))
        thread.start()
        assert ready.wait(5)
        threads.append(thread)
    time.sleep(settle)  # each thread is inside go.wait()
    return threads, go


def test_each_thread_gets_its_own_stack_and_library_frames_are_left_out() -> None:
    sampled = Sampled()
    (a, b), go = _threads((alpha,), (beta,))
    sampled.sampler.sample()
    sampled.sampler.sample()  # nothing moved: nothing new
    go.set()
    a.join()
    b.join()
    sampled.sampler.sample()  # both ended
    sampled.sampler.stop()
    assert sampled.stacks_of(a.ident or 0) == [["alpha"]]
    assert sampled.stacks_of(b.ident or 0) == [["beta"]]
    changes = [e for e in sampled.events if isinstance(e, StackChanges)]
    ends = [
        s
        for e in changes
        for t, s in zip(e.thread_ids, e.stack_ids, strict=True)
        if t == (a.ident or 0) & MASK
    ]
    assert ends == [ends[0], 0]  # its stack, then "no Python" when it ended


def test_a_window_looks_at_its_threads_as_it_opens_and_as_it_closes() -> None:
    """Budget windows: the sampling thread may wait for the GIL, so opening and closing a window
    sample at once (no sampling thread runs here: ``start`` is never called)."""
    sampled = Sampled()
    (a,), go = _threads((alpha,))
    try:
        opened = time.monotonic_ns()
        sampled.sampler.set_active(True)
        sampled.sampler.set_active(False)
        closed = time.monotonic_ns()
    finally:
        go.set()
        a.join()
    sampled.sampler.flush()
    rows = [
        (at, stack, before)
        for e in sampled.events if isinstance(e, StackChanges)
        for t, at, stack, before in zip(e.thread_ids, e.times, e.stack_ids, e.previous, strict=True)
        if t == (a.ident or 0) & MASK
    ]  # fmt: skip
    (seen, stack, before), (ended, no_python, last) = rows
    assert sampled.stacks_of(a.ident or 0) == [["alpha"]] and stack and no_python == 0
    assert opened <= before <= seen <= closed  # seen at the open, the window's start before it
    assert seen < last <= ended <= closed  # ended at the close, right after a last look


def test_all_frames_keeps_library_frames() -> None:
    sampled = Sampled(frames="all")
    (a,), go = _threads((alpha,))
    sampled.sampler.sample()
    go.set()
    a.join()
    sampled.sampler.stop()
    (stack,) = sampled.stacks_of(a.ident or 0)
    assert stack[-2:] == ["Event.wait", "Condition.wait"] and "alpha" in stack and "Thread.run" in stack


def test_max_depth_keeps_the_innermost_frames() -> None:
    sampled = Sampled(max_depth=4)
    (a,), go = _threads((nest, 10))
    sampled.sampler.sample()
    go.set()
    a.join()
    sampled.sampler.stop()
    assert sampled.stacks_of(a.ident or 0) == [[TRUNCATED, "nest", "nest", "alpha"]]


def test_a_full_table_maps_new_stacks_to_one_and_counts_them() -> None:
    sampled = Sampled(max_table_bytes=64 * 1024, max_depth=1024)
    # Threads with distinct stacks of 100 to 200 frames (8 bytes each in the table): the bound is hit.
    ends = []
    for depth in range(100):
        (thread,), go = _threads((nest, depth + 100))
        sampled.sampler.sample()
        go.set()
        thread.join()
        ends.append(thread)
    sampled.sampler.stop()
    assert sampled.sampler.table_bytes <= 64 * 1024
    assert sum(sampled.lost) >= 1
    assert [TABLE_FULL] in [s for t in ends for s in sampled.stacks_of(t.ident or 0)]


def test_stacks_config_refuses_values_that_cannot_work() -> None:
    sink = {"type": "null"}
    cases = [
        ({"max_depth": 0}, "stacks: max_depth must be between 1 and 1024, got 0"),
        ({"max_table_bytes": -1}, "stacks.max_table_bytes: expected a non-negative size"),
        ({"max_table_bytes": "100GiB"}, "stacks: max_table_bytes must be between 64KiB and 1GiB"),
        ({"frames": "lib"}, 'stacks.frames: "lib" is not one of user, all'),
        ({"interval": "10s"}, "stacks: interval must be between 100us and 1s"),
    ]
    for stacks, expected in cases:
        with pytest.raises(ConfigError) as caught:
            build({"stacks": stacks, "sinks": [sink]})
        assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)
    activity = {"type": "activity", "kinds": ["concurrent_kernel"]}
    with pytest.raises(ConfigError, match=r"^sources\[0\]: stacks are taken in mode full, which needs"):
        build({"stacks": {"modes": ["full"]}, "sources": [activity], "sinks": [sink]})
    build({"sources": [activity], "sinks": [sink]})  # by default such a source takes no stacks


# --- the join --------------------------------------------------------------------------------------

RESOURCE = Resource(host="h", pid=7, process_name="p", command_line=[])
MAIN, WORKER, AUTOGRAD = 0x1111, 0x2222, 0x3333
MS = 1_000_000


def _table() -> StackTable:
    """Stacks 1: main > forward (line 20); 2: main > step; 3: main > step > [autograd backward];
    4: main > forward (line 21, say its synchronize)."""
    files = [SYNTHETIC_FILE, "train.py", "train.py", "train.py", "train.py"]
    return StackTable(
        process_id=7, frame_ids=[1, 2, 3, 4, 5], files=files,
        functions=[BACKWARD, "main", "forward", "step", "forward"], lines=[0, 10, 20, 30, 21],
        stack_ids=[1, 2, 3, 4], stacks=[[2, 3], [2, 4], [2, 4, 1], [2, 5]],
    )  # fmt: skip


def _launch(correlation: int, thread: int, at: int, ns: int = 1000) -> list[Event]:
    api = ApiCall(domain="runtime", name="cudaLaunchKernel", cbid=1, start=at, end=at + 5, process_id=7,
                  thread_id=thread, correlation_id=correlation)  # fmt: skip
    kernel = Kernel(start=at + 10, end=at + 10 + ns, name=f"k{correlation}", device_id=0, context_id=1,
                    stream_id=7, correlation_id=correlation)  # fmt: skip
    return [api, kernel]


class _Recording:
    """Events as one batch of one process, read as often as the join reads."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = list(events)

    def parts(self) -> Iterator[Part]:
        yield Part(RESOURCE, 0, self.events)


def _frames(*events: Event) -> dict[int, tuple[Frame, ...]]:
    """Each kernel's (``k<correlation>``) frames, through both passes of the join."""
    stacks = join_stacks(_Recording(events)).result()  # type: ignore[arg-type]
    return {int(s.work[1:]): s.frames for s in stacks}


def _join(*events: Event) -> dict[int, list[str]]:
    return {c: [f.function for f in frames] for c, frames in _frames(*events).items()}


def test_a_launch_takes_the_stack_its_thread_was_at() -> None:
    # MAIN: forward from 0 (seen at 0 ms), step from the sample at 10 ms (it moved within 9-10 ms).
    changes = StackChanges(
        process_id=7, interval_ns=MS, thread_ids=[MAIN, MAIN], times=[0, 10 * MS], stack_ids=[1, 2]
    )
    found = _join(
        _table(), changes,
        *_launch(1, MAIN, 5 * MS), *_launch(2, MAIN, 9 * MS + MS // 4), *_launch(3, MAIN, 9 * MS + 3 * MS // 4),
        *_launch(4, MAIN, 50 * MS), *_launch(5, WORKER, 5 * MS), _launch(6, MAIN, 7 * MS)[1],
    )  # fmt: skip
    assert found[1] == ["main", "forward"]
    assert found[2] == ["main", "forward"]  # before the midpoint of the interval in which it moved
    assert found[3] == ["main", "step"]
    assert found[4] == ["main", "step"]
    assert found[5] == [NO_PYTHON_STACK]  # a thread never seen running Python
    assert found[6] == [NO_STACK_RECORDED]  # a kernel whose API record is not there


def test_a_thread_without_python_takes_the_stack_inside_backward() -> None:
    changes = StackChanges(
        process_id=7, interval_ns=MS, thread_ids=[MAIN, MAIN, MAIN], times=[0, 10 * MS, 30 * MS], stack_ids=[1, 3, 2]
    )  # fmt: skip
    found = _join(_table(), changes, *_launch(1, AUTOGRAD, 9 * MS + MS // 2), *_launch(2, AUTOGRAD, 20 * MS),
                  *_launch(3, AUTOGRAD, 40 * MS))  # fmt: skip
    assert found[1] == found[2] == ["main", "step", BACKWARD]  # the first from just before it was seen
    assert found[3] == [NO_PYTHON_STACK]


def _sync(start: int, end: int) -> ApiCall:
    return ApiCall(domain="runtime", name="cudaDeviceSynchronize", cbid=2, start=start, end=end, process_id=7,
                   thread_id=MAIN, correlation_id=99)  # fmt: skip


def _lines(*events: Event) -> dict[int, list[tuple[str, int]]]:
    return {c: [(f.function, f.line) for f in frames] for c, frames in _frames(*events).items()}


def test_a_launch_seen_waiting_takes_its_functions_launching_line() -> None:
    # MAIN launches from forward:20 (seen at 0) and waits in a synchronize at forward:21 from 1 to
    # 9.5 ms (seen at 2 ms): the launch at 9.9 ms was made from line 20, not from the line that waits.
    changes = StackChanges(
        process_id=7, interval_ns=MS, thread_ids=[MAIN, MAIN], times=[0, 2 * MS], stack_ids=[1, 4]
    )
    found = _lines(_table(), changes, _sync(MS, 9 * MS + MS // 2), *_launch(1, MAIN, 9 * MS + 9 * MS // 10))
    assert found[1] == [("main", 10), ("forward", 20)]


def test_a_function_never_seen_launching_keeps_the_waiting_line() -> None:
    changes = StackChanges(
        process_id=7, interval_ns=MS, thread_ids=[MAIN, MAIN], times=[0, 2 * MS], stack_ids=[2, 4]
    )
    found = _lines(_table(), changes, _sync(MS, 9 * MS + MS // 2), *_launch(1, MAIN, 9 * MS + 9 * MS // 10))
    assert found[1] == [("main", 10), ("forward", 21)]  # the right function still; its only line seen


def test_no_stacks_recorded() -> None:
    assert _join(*_launch(1, MAIN, 0))[1] == [NO_STACK_RECORDED]


# --- flame, on the GPU capture ---------------------------------------------------------------------


def _flame(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "flame", str(CAPTURE), "-o", str(tmp_path / name), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _gpu_ns() -> int:
    from cuptistream.analysis.sources import open_recordings

    total = 0
    for part in open_recordings([str(CAPTURE)]).parts():
        for e in part.events:
            if type(e).__struct_config__.tag in ("kernel", "memcpy", "memset"):
                total += e.end - e.start
    return total


def test_flame_pprof_reads_back_with_the_gpu_time_of_the_capture(tmp_path: Path) -> None:
    run = _flame(tmp_path, "gpu.pb.gz")
    assert run.returncode == 0, run.stderr
    profile = profile_class().FromString(gzip.decompress((tmp_path / "gpu.pb.gz").read_bytes()))
    strings = list(profile.string_table)
    assert strings[0] == ""
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [
        ("gpu_time", "nanoseconds"), ("launches", "count")
    ]  # fmt: skip
    assert sum(s.value[0] for s in profile.sample) == _gpu_ns()
    functions = {f.id: strings[f.name] for f in profile.function}
    locations = {loc.id: functions[loc.line[0].function_id] for loc in profile.location}
    by_function: dict[str, int] = {}
    for sample in profile.sample:
        names = [locations[i] for i in sample.location_id]  # innermost (the kernel) first
        assert {strings[label.key] for label in sample.label} >= {"pid"}
        for name in set(names):
            by_function[name] = by_function.get(name, 0) + sample.value[0]
    total = sum(s.value[0] for s in profile.sample)
    for function in (
        "gemm_loop",
        "elementwise_loop",
        "graph_replay",
        "train_step",
        "thread_sin",
        "thread_cos",
    ):
        assert by_function.get(function, 0) > 0.01 * total, function


def test_kernels_land_on_the_line_that_launched_them() -> None:
    """In the capture's GEMM loop the thread waits in ``synchronize`` most of the time: the GEMMs
    still land on the ``a @ a`` line, not on the line that waits."""
    from cuptistream.analysis.sources import open_recordings

    workload = Path(__file__).parent / "gpu" / "workloads" / "stacks_workload.py"
    lines = workload.read_text().splitlines()
    gemm_line = lines.index("            a @ a") + 1
    joiner = join_stacks(open_recordings([str(CAPTURE)]), kernel="nvjet")
    by_line: dict[int, int] = {}
    for stack in joiner.result():
        ours = [f for f in stack.frames if f.file.endswith("stacks_workload.py")]
        if ours and ours[-1].function == "gemm_loop":  # (the backward pass runs nvjet GEMMs too)
            by_line[ours[-1].line] = by_line.get(ours[-1].line, 0) + stack.gpu_ns
    assert by_line.get(gemm_line, 0) >= 0.9 * sum(by_line.values()), by_line


def test_flame_speedscope_follows_the_schema(tmp_path: Path) -> None:
    run = _flame(tmp_path, "gpu.speedscope.json", "--kernel", "gemm|nvjet|cutlass|sm90")
    assert run.returncode == 0, run.stderr
    document = json.loads((tmp_path / "gpu.speedscope.json").read_text())
    jsonschema.validate(document, SCHEMA)
    (profile,) = document["profiles"]
    frames = document["shared"]["frames"]
    leaves = {frames[s[-1]]["name"] for s in profile["samples"]}
    assert leaves and all(any(k in leaf for k in ("gemm", "nvjet", "cutlass", "sm90")) for leaf in leaves)
    assert profile["endValue"] == sum(profile["weights"]) > 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--kernel", "("], "cuptistream: --kernel '(': not a regular expression"),
        (["--format", "svg"], "cuptistream: --format 'svg': expected one of pprof, speedscope"),
        (["--kernel", "no_such_kernel_anywhere"], "no kernel, copy or memset recorded in the selection"),
    ],
)
def test_flame_bad_input_is_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    run = _flame(tmp_path, "x.pb.gz", *args)
    assert run.returncode != 0
    assert expected in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_perfetto_export_puts_the_stack_on_kernel_and_api_slices(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "export", str(CAPTURE), "-o", str(tmp_path / "t.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    document = json.loads((tmp_path / "t.json").read_text())
    slices = document["traceEvents"] if isinstance(document, dict) else document
    kernels = [e for e in slices if e.get("cat") == "kernel"]
    stacked = [e for e in kernels if "stack" in e["args"]]
    assert kernels and len(stacked) >= 0.99 * len(kernels)
    gemm = [e for e in stacked if "nvjet" in e["name"]]
    innermost = {e["args"]["stack"][-1].split(" (")[0] for e in gemm}
    assert innermost <= {"gemm_loop", "train_step", "[autograd backward]"} and "gemm_loop" in innermost
    launches = [e for e in slices if e.get("name") == "cudaLaunchKernel"]
    assert launches and all("stack" in e["args"] for e in launches)


def test_compare_names_the_code_of_the_slow_ranks_extra_time(tmp_path: Path) -> None:
    """Four ranks made of the capture's main process; rank 3's GEMMs take three times as long."""
    import msgspec

    from cuptistream.recording.reader import read
    from tests.helpers.fixture_recording import Process, write_recording

    everything = list(read(CAPTURE).batches())
    main = next(b.resource.pid for b in everything if any(isinstance(e, Kernel) for e in b.events))
    batches = [b for b in everything if b.resource.pid == main]  # the workload's process, not its launcher
    events = [e for b in batches for e in b.events]
    processes = []
    for rank in range(4):
        mine = [
            msgspec.structs.replace(e, end=e.start + 3 * (e.end - e.start))
            if rank == 3 and isinstance(e, Kernel) and "nvjet" in e.name
            else e
            for e in events
        ]
        # Each rank on a GPU of its own (the capture had one: its UUID is varied here), so compare
        # weighs measured time rather than the shared-GPU work basis.
        first = batches[0].resource
        devices = [msgspec.structs.replace(d, uuid=f"{d.uuid}-{rank}") for d in first.devices]
        resource = msgspec.structs.replace(first, pid=5000 + rank, rank=rank, devices=devices)
        processes.append(Process(resource, batches[0].clock, mine))
    write_recording(tmp_path / "job", processes)
    run = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "compare", str(tmp_path / "job"), "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    (outlier,) = json.loads(run.stdout)["outliers"]
    assert outlier["rank"] == "rank 3"
    gemm_line = (Path(__file__).parent / "gpu" / "workloads" / "stacks_workload.py").read_text().splitlines()
    line = gemm_line.index("            a @ a") + 1
    assert outlier["code_longer"][0]["code"].startswith("gemm_loop (")
    assert outlier["code_longer"][0]["code"].endswith(f"stacks_workload.py:{line})")


def test_changes_and_tables_are_sent_in_events_that_fit_an_event_slot() -> None:
    sampled = Sampled()
    for i in range(1100):  # threads in alpha and beta by turns: a change at each sample
        (thread,), go = _threads((alpha if i % 2 else beta,), settle=0)  # in alpha or beta either way
        sampled.sampler.sample()
        go.set()
        thread.join()
    sampled.sampler.sample()
    sampled.sampler.stop()
    changes = [e for e in sampled.events if isinstance(e, StackChanges)]
    assert sum(len(e.times) for e in changes) >= 1100
    assert len(changes) >= 2 and all(len(e.times) <= 1024 for e in changes)
    from cuptistream.recording.codec import encode_chunk

    assert max(encode_chunk([e]).nbytes for e in sampled.events) < 64 * 1024


def test_cuptistreams_own_threads_are_not_sampled() -> None:
    sampled = Sampled()
    go, ready = threading.Event(), threading.Event()
    own = threading.Thread(target=alpha, args=(ready, go), name="cuptistream-probe-sender")
    own.start()
    assert ready.wait(5)
    (theirs,), go_theirs = _threads((beta,))
    sampled.sampler.sample()
    go.set()
    go_theirs.set()
    own.join()
    theirs.join()
    sampled.sampler.stop()
    assert sampled.stacks_of(own.ident or 0) == []
    assert sampled.stacks_of(theirs.ident or 0) == [["beta"]]


def test_the_sampler_sleeps_between_windows_and_counts_its_cpu_while_one_is_open() -> None:
    # Between budget windows the sampling thread must not wake every interval: each wake-up takes
    # the GIL from the program. While a window is open its CPU time is what the window is charged.
    sampled = Sampled(interval=0.001)
    sampler = sampled.sampler
    sampler.start(active=False)
    thread = sampler._thread
    assert thread is not None and thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    idle_from = time.clock_gettime(clock)
    time.sleep(0.8)
    idle_cpu = time.clock_gettime(clock) - idle_from
    assert sampler.samples == 0 and sampler.cpu_s() == 0.0
    sampler.set_active(True)
    time.sleep(0.3)
    sampler.set_active(False)
    taken, charged = sampler.samples, sampler.cpu_s()
    sampler.stop()
    # 800 wake-ups of a 1 ms poll cost several ms of CPU; sleeping until a window opens, none.
    assert idle_cpu < 0.002, idle_cpu
    assert taken >= 20 and charged > 0.0, (taken, charged)
