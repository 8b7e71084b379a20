"""GPU acceptance of always-on mode: budget windows, statistics, and a deep window on demand.

- ``configs/production.yaml`` on a torch step loop: the activity source traces only in windows (the
  recording holds no raw kernel, only statistics and ``trace_window`` events), the statistics say
  what fraction was traced and carry estimates, and the governor priced the windows.
- ``cuptistream trace --for 3s`` against that running job: it returns within the window plus
  delivery, the window started within 2 s of the command, and the recording then holds raw kernels
  inside the window's span, as many as the workload launched in it (every kernel: the workload
  counts its launches per 10 ms tick and the test compares over the span).

Run on the GPU machine from a directory outside the checkout, with cuptistream installed
(``python -m pytest tests/gpu/test_budget_gpu.py``); ``CUPTISTREAM_GPU_RESULTS=DIR`` keeps the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "configs" / "production.yaml"
CLI = [sys.executable, "-m", "cuptistream.cli"]

# A step loop that logs, every step, its wall time and how many kernels it launched (one kernel per
# ``add_``), so the test can count the kernels launched inside any span of time.
WORKLOAD = r"""
import json, sys, time, torch
seconds, log = float(sys.argv[1]), open(sys.argv[2], "w")
y = torch.zeros(1 << 16, device="cuda")
end = time.time() + seconds
while time.time() < end:
    for _ in range(50):
        y.add_(1)
    torch.cuda.synchronize()
    log.write(json.dumps([time.time_ns(), 50]) + "\n")
log.close()
"""


def _gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _read(path: Path) -> list[Any]:
    from cuptistream.recording.reader import read

    return list(read(path))


def _record(name: str, data: dict[str, Any]) -> None:
    if results := os.environ.get("CUPTISTREAM_GPU_RESULTS"):
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / name).write_text(json.dumps(data, indent=1, default=str))


def test_production_config_traces_in_windows_and_keeps_statistics(tmp_path: Path) -> None:
    _gpu()
    out, log = tmp_path / "rec", tmp_path / "steps.jsonl"
    (tmp_path / "w.py").write_text(WORKLOAD)
    run = subprocess.run(
        [*CLI, "run", "-c", str(PRODUCTION), "-o", str(out), "--quiet", "--", sys.executable,
         str(tmp_path / "w.py"), "25", str(log)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    events = _read(out)
    kinds = {type(e).__name__ for e in events}
    assert "Kernel" not in kinds and "ApiCall" not in kinds  # records: on_demand keeps raw records out
    windows = [e for e in events if type(e).__name__ == "TraceWindow" and e.kinds]  # not the presence span
    stats = [e for e in events if type(e).__name__ == "ActivityStats" and e.category == "kernel"]
    gpu = [e for e in events if type(e).__name__ == "GpuStats"]
    decisions = [e for e in events if type(e).__name__ == "GovernorDecision" and e.source == "activity"]
    assert len(windows) >= 3, windows  # windows at least every max_pause (5 s) over 25 s
    assert all(
        not w.on_demand and "concurrent_kernel" in w.kinds and "runtime" not in w.kinds for w in windows
    )
    assert stats and gpu and decisions
    traced = sum(g.traced_ns for g in gpu) / sum(g.interval_end - g.interval_start for g in gpu)
    assert 0 < traced < 0.2, traced  # a few percent of the time, not continuous tracing
    assert all(s.estimated for s in stats) and all(s.estimated_count > s.count for s in stats if s.count)
    launched = sum(n for _, n in map(json.loads, log.read_text().splitlines()))
    estimated = sum(s.estimated_count for s in stats)
    assert 0.5 < estimated / launched < 1.5, (estimated, launched)  # rough here: a 25 s run, few windows
    _record("budget_production.json", {
        "windows": len(windows), "traced_fraction": traced, "launched": launched, "estimated": estimated,
        "decisions": [{f: getattr(d, f) for f in d.__struct_fields__} for d in decisions],
    })  # fmt: skip


def test_trace_for_opens_a_full_window_on_a_running_job(tmp_path: Path) -> None:
    _gpu()
    out, log = tmp_path / "rec", tmp_path / "steps.jsonl"
    (tmp_path / "w.py").write_text(WORKLOAD)
    env = dict(os.environ, CUPTISTREAM_RUNTIME_DIR=str(tmp_path / "runtime"))
    job = subprocess.Popen(
        [*CLI, "run", "-c", str(PRODUCTION), "-o", str(out), "--quiet", "--", sys.executable,
         str(tmp_path / "w.py"), "20", str(log)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(8)  # the job is up and stepping
        asked = time.time_ns()
        trace = subprocess.run(
            [*CLI, "trace", "--for", "3s", "--format", "json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        returned = time.time_ns()
        assert trace.returncode == 0, trace.stderr
    finally:
        _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-3000:]
    (probe,) = json.loads(trace.stdout)["probes"]
    start_unix, end_unix = probe["start_unix_ns"], probe["end_unix_ns"]
    events = _read(out)
    windows = [e for e in events if type(e).__name__ == "TraceWindow" and e.on_demand]
    assert len(windows) == 1, windows
    window = windows[0]
    length_s = (window.end - window.start) / 1e9
    assert 2.9 < length_s < 3.5, length_s
    assert (start_unix - asked) / 1e9 < 2.0  # the window opened within 2 s of the command
    assert (returned - asked) / 1e9 < length_s + 10
    kernels = [e for e in events if type(e).__name__ == "Kernel"]
    # Raw kernels only from the on-demand window (records: on_demand), none from outside its span.
    assert kernels and all(window.start - 5_000_000 <= k.start <= window.end + 5_000_000 for k in kernels)
    # Every kernel of the span: the steps that ended well inside it launched exactly 50 kernels each;
    # the recording holds at least those, and no more than the steps that touched the span.
    steps = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    inside = sum(n for t, n in steps if start_unix + 20_000_000 <= t <= end_unix)
    touching = sum(n for t, n in steps if start_unix <= t <= end_unix + 20_000_000)
    assert inside <= len(kernels) <= touching, (inside, len(kernels), touching)
    _record("trace_on_demand.json", {"probe": probe, "window_s": length_s, "kernels": len(kernels),
                                      "launched_inside": inside, "launched_touching": touching,
                                      "opened_after_s": (start_unix - asked) / 1e9,
                                      "took_s": (returned - asked) / 1e9})  # fmt: skip


# Plain launches, then CUDA graphs captured and replayed, under budget windows that detach CUPTI
# (between_windows: detach). Detaching while graphs exist makes their replays fail with
# cudaErrorLaunchFailure, so the source must stop detaching at the first graph; every replay's work
# is checked. float64: the sum stays exact past 2**24 adds.
GRAPHS = r"""
import json, sys, time, torch
plain_s, graphs_s = float(sys.argv[1]), float(sys.argv[2])
x = torch.zeros(1, dtype=torch.float64, device="cuda")
expected = 0
end = time.time() + plain_s
while time.time() < end:  # windows detach CUPTI here: no graph yet
    for _ in range(50):
        x.add_(1)
    expected += 50
    torch.cuda.synchronize()
def capture():
    global expected
    g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch asks
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    expected += 3
    with torch.cuda.graph(g):
        for _ in range(50):
            x.add_(1)
    return g
graphs, replays, step = [capture()], 0, 0
end = time.time() + graphs_s
while time.time() < end:
    if step % 100 == 0 and len(graphs) < 60:
        graphs.append(capture())
    for g in graphs[-4:]:
        g.replay()
        replays += 1
    step += 1
    if step % 50 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print(json.dumps({"graphs": len(graphs), "replays": replays, "value": x.item(), "expected": expected + 50 * replays}))
"""


def detach_config(tmp_path: Path, budget: str | None = None, **activity_fields: Any) -> Path:
    """production.yaml with ``between_windows: detach`` and a window (an attach and a detach) at least
    every second; ``budget`` replaces ``overhead.budget`` (a larger one shortens the pauses) and
    ``activity_fields`` override more of the activity source."""
    import yaml

    config = yaml.safe_load(PRODUCTION.read_text())
    if budget is not None:
        config["overhead"]["budget"] = budget
    activity = next(s for s in config["sources"] if s["type"] == "activity")
    activity.update({"between_windows": "detach", "max_pause": "1s", **activity_fields})
    path = tmp_path / "detach.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run_under(config: Path, tmp_path: Path, script: str, *args: str) -> tuple[dict[str, Any], list[Any]]:
    """``script`` run with ``args`` under ``cuptistream run -c config``: the JSON of its last line
    and the recording's events. Fails the test unless everything exits 0."""
    (tmp_path / "script.py").write_text(script)
    out = tmp_path / "rec"
    run = subprocess.run(
        [*CLI, "run", "-c", str(config), "-o", str(out), "--quiet", "--", sys.executable,
         str(tmp_path / "script.py"), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), _read(out)


def test_windows_detach_cupti_until_the_first_cuda_graph(tmp_path: Path) -> None:
    _gpu()
    got, events = _run_under(detach_config(tmp_path, records="all"), tmp_path, GRAPHS, "10", "15")
    assert got["value"] == got["expected"], got  # every launch and replay ran once
    windows = sorted(
        (e for e in events if type(e).__name__ == "TraceWindow" and e.kinds), key=lambda w: w.start
    )
    fresh = [w.fresh for w in windows]
    # The first window found CUPTI attached since the start; then detached between the plain launches'
    # windows, and attached for good from the first graph on.
    later = fresh[1:]
    assert sum(later) >= 3 and later == sorted(later, reverse=True) and later.count(False) >= 3, fresh
    # The first window may fall in the program's CUDA start-up, before its first launch.
    assert all(w.records for w in windows[1:]), [(w.window, w.records) for w in windows]
    warnings = [e.message for e in events if type(e).__name__ == "Error" and e.severity != "info"]
    assert len(warnings) == 1 and "made a CUDA graph" in warnings[0], warnings
    # Whether CUPTI's correlation ids run on across a detach (then the call-rate cycles need not skip
    # fresh windows): each window's smallest and largest kernel correlation id, kept for the docs.
    kernels = [e for e in events if type(e).__name__ == "Kernel"]
    ids = []
    for w in windows:
        inside = [k.correlation_id for k in kernels if w.start <= k.start <= w.end + 50_000_000]
        ids.append([min(inside), max(inside)] if inside else [])
    _record("budget_graphs_detach.json", {**got, "fresh": fresh, "records": [w.records for w in windows],
                                          "correlation_ids": ids})  # fmt: skip


# Threads that launch on their own streams while budget windows detach CUPTI: cuptiFinalize runs at
# one of their calls' exits (driver.park), while the others may be inside CUDA calls.
THREADS = r"""
import json, sys, threading, time, torch
seconds, count = float(sys.argv[1]), int(sys.argv[2])
done, errors = [0] * count, []
def launch(i):
    try:
        x, stream = torch.zeros(1, dtype=torch.float64, device="cuda"), torch.cuda.Stream()
        end = time.time() + seconds
        with torch.cuda.stream(stream):
            while time.time() < end:
                for _ in range(20):
                    x.add_(1)
                done[i] += 20
                stream.synchronize()
        if x.item() != done[i]:
            errors.append(f"thread {i}: {x.item()} != {done[i]}")
    except Exception as error:
        errors.append(f"thread {i}: {error!r}")
threads = [threading.Thread(target=launch, args=(i,)) for i in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"launched": sum(done), "errors": errors}))
"""


def test_windows_detach_cupti_while_threads_launch(tmp_path: Path) -> None:
    _gpu()
    got, events = _run_under(detach_config(tmp_path), tmp_path, THREADS, "20", "4")
    assert got["launched"] and not got["errors"], got  # every thread's every launch ran once
    windows = [e for e in events if type(e).__name__ == "TraceWindow" and e.kinds]
    said = [(e.severity, e.message) for e in events if type(e).__name__ == "Error"]
    # Attached since the start for the first window, then detached after every one: each later
    # window attached afresh while the threads launched.
    fresh = [w.fresh for w in sorted(windows, key=lambda w: w.start)]
    assert len(fresh) >= 5 and not fresh[0] and all(fresh[1:]), (fresh, said)
    problems = [message for severity, message in said if severity != "info"]
    assert not problems, problems
    _record("budget_threads_detach.json", {**got, "windows": len(windows), "fresh": sum(fresh)})
