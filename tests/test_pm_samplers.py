"""One PM sampler per device on the node: the collector grants a device's counters to one probe
(``collector.samplers``), and hands them on when it leaves (``probe.samplers``, the
``pm_sampling`` source).

The end-to-end tests run a real collector and real probe processes. Only the device side of PM
sampling (the CUPTI calls that need a GPU: Enable, SetConfig, Start, DecodeData, Stop, Disable) is a
stand-in, which answers as CUPTI does and marks on disk that Enable was called; the device UUIDs
are the stand-in's too (there is no GPU to report them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

import cuptistream
from cuptistream.channel import messages
from cuptistream.collector.collector import Collector
from cuptistream.collector.samplers import RECLAIM_S, SamplerGrants
from cuptistream.events import Error, Loss, PmSamples
from tests.test_sass_window import RecordingEmitter

# --- the collector's book, in process -------------------------------------------------------------


class _Probe:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sent: list[messages.SamplerGrant] = []
        self.emitter = RecordingEmitter()
        self.ordinals = {"GPU-0": 0, "GPU-1": 1}

    def send(self, message: messages.Message) -> bool:
        assert isinstance(message, messages.SamplerGrant)
        self.sent.append(message)
        return True


def _ask(uuid: str, ask: bool = True, last_end: int = 0) -> messages.SamplerAsk:
    return messages.SamplerAsk(uuid=uuid, source="pm_sampling", ask=ask, last_end=last_end)


def test_the_first_to_ask_samples_and_the_device_goes_to_the_longest_waiting_when_it_leaves() -> None:
    grants = SamplerGrants(reclaim_s=0)
    a, b, c, other = _Probe(1), _Probe(2), _Probe(3), _Probe(4)
    grants.ask(a, _ask("GPU-0"))
    grants.ask(b, _ask("GPU-0"))
    grants.ask(c, _ask("GPU-0"))
    grants.ask(other, _ask("GPU-1"))  # another device: its own sampler
    assert [m.uuid for m in a.sent] == ["GPU-0"] and b.sent == c.sent == []
    assert [m.uuid for m in other.sent] == ["GPU-1"]
    assert grants.holder("GPU-0") == 1 and grants.waiting("GPU-0") == [2, 3]
    grants.ask(a, _ask("GPU-0"))  # asked again: nothing changes
    grants.ask(b, _ask("GPU-0", ask=False))  # gave up waiting
    grants.ask(c, _ask("GPU-0", ask=False, last_end=99))  # not the sampler: its word changes nothing
    assert grants.holder("GPU-0") == 1 and grants.waiting("GPU-0") == []
    grants.ask(b, _ask("GPU-0"))
    grants.ask(c, _ask("GPU-0"))
    grants.sampled(a, "GPU-0", 500)
    grants.sampled(b, "GPU-0", 900)  # not the sampler's samples
    grants.ask(a, _ask("GPU-0", ask=False, last_end=400))  # stopped: the latest end it is known by
    assert b.sent == [messages.SamplerGrant(uuid="GPU-0", source="pm_sampling", previous=1, since=500)]
    grants.left(b)  # killed: its samples seen so far date the gap
    assert c.sent == [messages.SamplerGrant(uuid="GPU-0", source="pm_sampling", previous=2, since=0)]
    grants.left(c)
    assert grants.holder("GPU-0") == 0 and grants.holder("GPU-1") == 4 and grants.handovers == 2
    grants.ask(a, _ask("GPU-0"))  # nobody sampled it just before: no hand-over
    assert a.sent[-1] == messages.SamplerGrant(uuid="GPU-0", source="pm_sampling")


def test_a_new_collector_lets_the_probes_that_sample_reclaim_their_devices_before_it_grants() -> None:
    grants = SamplerGrants(reclaim_s=0.3)
    sampling, waiting, alone = _Probe(1), _Probe(2), _Probe(3)
    grants.ask(waiting, _ask("GPU-0"))  # reconnected first
    grants.ask(alone, _ask("GPU-1"))
    grants.ask(sampling, messages.SamplerAsk(uuid="GPU-0", source="pm_sampling", holds=True))
    assert grants.holder("GPU-0") == 1 and grants.waiting("GPU-0") == [2] and grants.holder("GPU-1") == 0
    time.sleep(0.5)
    assert waiting.sent == [] and sampling.sent == []  # GPU-0's counters are still held
    assert alone.sent == [messages.SamplerGrant(uuid="GPU-1", source="pm_sampling")]  # nobody held GPU-1
    grants.ask(sampling, _ask("GPU-0", ask=False, last_end=7))
    assert waiting.sent == [messages.SamplerGrant(uuid="GPU-0", source="pm_sampling", previous=1, since=7)]
    grants.close()


def test_a_stopping_collector_hands_no_device_on_as_its_probes_hang_up() -> None:
    """Its probes hang up in any order: the sampler's hang-up must not grant the device to one
    still connected (the sampler samples on, and claims the device from the next collector)."""
    grants = SamplerGrants(reclaim_s=0)
    sampler, waiting = _Probe(1), _Probe(2)
    grants.ask(sampler, _ask("GPU-0"))
    grants.ask(waiting, _ask("GPU-0"))
    grants.close()
    grants.left(sampler)
    grants.ask(waiting, _ask("GPU-0"))
    assert waiting.sent == [] and grants.holder("GPU-0") == 0 and grants.handovers == 0


# --- real collector, real probes ------------------------------------------------------------------

_PROGRAM = """
import json, os, sys, time, cuptistream
from cuptistream.cupti import driver
from cuptistream.cupti.pm_sampling_api import Decoded
from cuptistream.events import DeviceInfo
from cuptistream.probe import probe as probe_module
from cuptistream.sources.pm_sampling import PmSamplingSource
from cuptistream.nvml.gpm import GpmSession
from tests.test_gpm import StandInNvml

sock, uuid, marks, metric = sys.argv[1:5]
STEP = 10_000_000  # the configured interval

class StandIn:  # the device side of PM sampling: samples of STEP on the wall clock, as they come
    def __init__(self, device): pass
    def enable(self):
        open(marks + ".enabled", "w").close()
        return "GH100"
    def configure(self, metrics, interval_ns, hardware_buffer): self.metrics = metrics; return metrics
    def start(self): self.next = time.time_ns()
    def stop(self): pass
    def disable(self): pass
    def decode(self, max_samples):
        starts = list(range(self.next, time.time_ns() - STEP, STEP))
        if starts:
            self.next = starts[-1] + STEP
            open(marks + ".decoded", "w").close()
        values = [[50.0] * len(starts) for _ in self.metrics]
        return Decoded(starts, [s + STEP for s in starts], values, False, "end_of_records")

class StandInGpm(GpmSession):  # NVML's side, marking on disk that this process sampled through it
    def __init__(self, uuid, clock):
        super().__init__(uuid, clock, nvml=StandInNvml())
    def start(self):
        open(marks + ".enabled", "w").close()
        return super().start()

PmSamplingSource.session_factory = StandIn
PmSamplingSource.gpm_factory = StandInGpm
PmSamplingSource.find_context = lambda self, device: 0xC0
probe_module.visible_devices = lambda: [DeviceInfo(device_id=0, name="stand-in", uuid=uuid)]
driver.acquire("test")  # no driver here: the source's release must not finalize CUPTI
sampler = {"type": "pm_sampling", "metrics": [metric], "interval": "10ms", "decode_period": "50ms"}
if metric.startswith("gpm__"):  # GPM's counters: through NVML, at its shortest interval
    sampler.update(backend="nvml", interval="100ms", decode_period="100ms")
with cuptistream.session({"sources": [sampler], "sinks": [{"type": "null"}]}, collector=sock, quiet=True) as s:
    [source] = s.sources
    open(marks + ".started", "w").close()
    while not os.path.exists(marks + ".stop"):
        time.sleep(0.02)
print(json.dumps(source.stats))
"""
_METRIC = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"


def _wait_for(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class _Node:
    """A collector writing to ``out`` and the probe processes started against it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.sock = str(tmp_path / "c.sock")
        self.out = tmp_path / "out"
        self.collector = self._collector()
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.probes: list[subprocess.Popen[str]] = []

    def _collector(self) -> Collector:
        config = cuptistream.load_config({
            "sources": [], "statistics": {"interval": "1s"},
            "sinks": [{"type": "file", "directory": str(self.out)}],
        })  # fmt: skip
        collector = Collector(config).start()
        collector.listen(self.sock)
        return collector

    def restart(self) -> None:
        """A new collector at the same address, recording to ``out2``; the probes reconnect."""
        assert self.collector.finish(probe_timeout=0.5) is not None
        self.out = self.tmp / "out2"
        self.collector = self._collector()

    def probe(self, name: str, uuid: str, metric: str = _METRIC) -> subprocess.Popen[str]:
        """A probe process whose ``pm_sampling`` source samples ``metric`` (a ``gpm__`` one: through
        NVML)."""
        marks = str(self.tmp / name)
        program = [sys.executable, "-c", _PROGRAM, self.sock, uuid, marks, metric]
        process = subprocess.Popen(
            program, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.probes.append(process)
        _wait_for(lambda: self.mark(name, "started") or process.poll() is not None, f"{name} to start")
        assert process.poll() is None, process.communicate()[1]
        return process

    def mark(self, name: str, mark: str) -> bool:
        return (self.tmp / f"{name}.{mark}").exists()

    def stop(self, name: str, process: subprocess.Popen[str]) -> dict[str, float]:
        (self.tmp / f"{name}.stop").touch()
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        stats: dict[str, float] = json.loads(out.strip().splitlines()[-1])
        return stats

    def recording(self) -> tuple[dict[int, list[PmSamples]], list[tuple[int, Error]], list[Loss]]:
        """PM samples per pid, the errors with their pid, and the losses. Probes a failed test left
        running are killed first."""
        for process in self.probes:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=30)
        assert self.collector.finish(probe_timeout=30) is not None
        samples: dict[int, list[PmSamples]] = defaultdict(list)
        errors: list[tuple[int, Error]] = []
        losses: list[Loss] = []
        for batch in cuptistream.read(self.out).batches():
            for event in batch.events:
                if isinstance(event, PmSamples):
                    samples[batch.resource.pid].append(event)
                elif isinstance(event, Error):
                    errors.append((batch.resource.pid, event))
                elif isinstance(event, Loss):
                    losses.append(event)
        return samples, errors, losses


def _span(events: list[PmSamples]) -> tuple[int, int, int]:
    """First start, last end and number of samples."""
    return min(e.starts[0] for e in events), max(e.ends[-1] for e in events), sum(len(e.ends) for e in events)


@pytest.mark.slow  # real collector and probe processes, seconds each
@pytest.mark.parametrize("leaves", ["stops", "killed"])
def test_two_probes_on_one_device_one_samples_and_the_other_takes_over_when_it_leaves(
    tmp_path: Path, leaves: str
) -> None:
    node = _Node(tmp_path)
    try:
        first = node.probe("first", "GPU-same")
        _wait_for(lambda: node.mark("first", "enabled"), "the first probe to enable PM sampling")
        second = node.probe("second", "GPU-same")
        _wait_for(lambda: node.collector.samplers.waiting("GPU-same") == [second.pid], "the second to ask")
        _wait_for(lambda: node.mark("first", "decoded"), "the first to sample")
        time.sleep(0.3)  # several decode periods of the first: the second still waits
        assert not node.mark("second", "enabled")
        assert node.collector.samplers.holder("GPU-same") == first.pid
        if leaves == "stops":
            first_stats = node.stop("first", first)
            assert first_stats["granted"] == 1 and first_stats["samples"] > 0
        else:
            # A decode's samples reach the collector before the kill.
            _wait_for(lambda: node.collector.samplers.last_sample_end("GPU-same") > 0, "the first's samples")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        _wait_for(lambda: node.mark("second", "enabled"), "the second probe to take over")
        _wait_for(lambda: node.collector.samplers.holder("GPU-same") == second.pid, "the grant")
        _wait_for(lambda: node.mark("second", "decoded"), "the second to sample")
        second_stats = node.stop("second", second)
    finally:
        samples, errors, losses = node.recording()
    assert set(samples) == {first.pid, second.pid}
    _, first_end, _ = _span(samples[first.pid])
    second_start, _, count = _span(samples[second.pid])
    assert first_end <= second_start  # never both at once
    assert second_stats["granted"] == 1 and second_stats["samples"] == count > 0
    assert second_stats["grant_wait_s"] >= 0.3
    [(pid, gap)] = [(pid, e) for pid, e in errors if "taken over" in e.message]
    assert pid == second.pid and gap.severity == "info" and f"from pid {first.pid}" in gap.message
    # The gap runs from the first sampler's last sample (as it said, or as the collector saw its
    # samples when it was killed) to the second's first.
    assert f"between {first_end} and {second_start}" in gap.message
    missing = (second_start - first_end) // 10_000_000
    assert second_stats["lost_samples"] == missing
    assert sum(e.count for e in losses if e.reason == "sampler_handover") == missing
    assert node.collector.samplers.handovers == 1


@pytest.mark.slow  # real collector and probe processes, seconds each
def test_after_a_collector_restart_the_sampler_keeps_its_device_and_hands_it_on_when_it_stops(
    tmp_path: Path,
) -> None:
    node = _Node(tmp_path)
    try:
        first = node.probe("first", "GPU-same")
        _wait_for(lambda: node.mark("first", "enabled"), "the first probe to enable PM sampling")
        second = node.probe("second", "GPU-same")
        _wait_for(lambda: node.collector.samplers.waiting("GPU-same") == [second.pid], "the second to ask")
        node.restart()
        samplers = node.collector.samplers
        _wait_for(lambda: samplers.holder("GPU-same") == first.pid, "the sampler to reclaim its device")
        _wait_for(lambda: samplers.waiting("GPU-same") == [second.pid], "the second to ask again")
        time.sleep(RECLAIM_S)  # past the new collector's reclaim time: still nothing for the second
        assert not node.mark("second", "enabled")
        first_stats = node.stop("first", first)
        _wait_for(lambda: node.mark("second", "decoded"), "the second probe to take over and sample")
        second_stats = node.stop("second", second)
    finally:
        samples, errors, _ = node.recording()
    assert first_stats["granted"] == second_stats["granted"] == 1 and second_stats["samples"] > 0
    _, first_end, _ = _span(samples[first.pid])
    second_start, _, _ = _span(samples[second.pid])
    assert first_end <= second_start
    [gap] = [e for pid, e in errors if "taken over" in e.message and pid == second.pid]
    assert f"between {first_end} and {second_start}" in gap.message


@pytest.mark.slow  # real collector and probe processes, seconds each
def test_probes_on_different_devices_each_sample_their_own(tmp_path: Path) -> None:
    node = _Node(tmp_path)
    try:
        first = node.probe("first", "GPU-one")
        second = node.probe("second", "GPU-two")
        _wait_for(lambda: node.mark("first", "decoded") and node.mark("second", "decoded"), "both to sample")
        stats = [node.stop("first", first), node.stop("second", second)]
    finally:
        samples, errors, _ = node.recording()
    assert all(s["granted"] == 1 and s["samples"] > 0 for s in stats)
    assert all(_span(samples[p.pid])[2] > 0 for p in (first, second))
    assert not [e for _, e in errors if "taken over" in e.message]
