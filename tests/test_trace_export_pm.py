"""``cuptistream export`` of a PM sampling recording shaped like an H100 run (two hosts): one counter
track per process, device and metric, each sample's value at its start, decoded from the written
trace and checked against the generated samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuptistream.cli import main
from tests.helpers.pm_recording import CLOCK, HOSTS, samples_of, write_pm_recording
from tests.test_trace_export import _load, validate


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("pm")
    recording = write_pm_recording(root / "out")
    assert main(["export", str(recording), "-o", str(root / "trace.json.gz")]) == 0
    return _load(root / "trace.json.gz")


def test_a_counter_track_per_device_and_metric(trace: dict) -> None:
    events = validate(trace)
    base = trace["otherData"]["ts_base_unix_ns"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    counters: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "C" and e["name"].startswith("GPU 0 · "):
            host = names[e["pid"]].rsplit(" on ", 1)[1]
            ((_, value),) = e["args"].items()
            counters.setdefault((host, e["name"]), []).append((e["ts"], value))
    for index, host in enumerate(HOSTS):
        metrics, starts, values = samples_of(host, seed=index)
        ts = [(int(s) + CLOCK.offset_ns - base) / 1000 for s in starts]
        tracks = {name: points for (h, name), points in counters.items() if h == host}
        assert len(tracks) == len(metrics) == 14
        sm = tracks["GPU 0 · sm_active (%)"]
        m = metrics.index("sm__cycles_active.avg.pct_of_peak_sustained_elapsed")
        assert [t for t, _ in sm] == pytest.approx(ts) and [v for _, v in sm] == values[m].tolist()
        assert max(v for _, v in sm) > 85 and min(v for _, v in sm) < 1  # the work and the idle ends
        pcie = tracks["GPU 0 · pcie_rx_bytes (B/s)"]
        assert [v for _, v in pcie] == values[metrics.index("pcie__read_bytes.sum.per_second")].tolist()
    assert not any(e["ph"] == "C" and "pm_stats" in e["name"] for e in events)


def test_a_window_and_a_device_filter_keep_their_samples(tmp_path: Path) -> None:
    recording = write_pm_recording(tmp_path / "out")
    low = 7_010 * 1_000_000_000 + CLOCK.offset_ns
    out = tmp_path / "window.json"
    args = ["export", str(recording), "-o", str(out), "--since", f"@{low / 1e9:.9f}", "--pid", "7100"]
    assert main(args) == 0
    trace = _load(out)
    points = [e for e in validate(trace) if e["ph"] == "C" and e["name"] == "GPU 0 · sm_active (%)"]
    base = trace["otherData"]["ts_base_unix_ns"]
    assert len(points) == (7_033_400 - 7_010_000) // 20
    assert min(e["ts"] for e in points) * 1000 + base >= low - 1000
    assert main(["export", str(recording), "-o", str(tmp_path / "none.json"), "--device", "1"]) == 0
    assert not [e for e in validate(_load(tmp_path / "none.json")) if e["ph"] == "C"]  # the processes only
