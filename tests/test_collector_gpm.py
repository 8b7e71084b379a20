"""The collector samples a device's counters itself where its probes would sample them through NVML's
GPM (``collector.gpm_sampler``, ``collector.samplers``): no probe samples the device, and where NVML
cannot sample it in the collector the probe that asked first does, as before.

NVML needs the NVIDIA driver's ``libnvidia-ml``, which this machine lacks: its GPM calls are
``tests.test_gpm.StandInNvml``'s (the real binding's structures and errors, values made up per
metric). The book, the collector's sampler, its GPM session, the pipeline and the probe processes
are real."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cuptistream.channel import messages
from cuptistream.collector import ondemand
from cuptistream.collector.collector import Collector
from cuptistream.collector.control import TraceRequest
from cuptistream.collector.gpm_sampler import CollectorSampler
from cuptistream.collector.pm_samples import SampleBoard
from cuptistream.collector.samplers import SamplerGrants
from cuptistream.events import PmSamples, PmStats
from cuptistream.nvml.gpm import GpmSession, metric_name
from cuptistream.probe.samplers import DeviceGrants
from tests.test_gpm import StandInNvml
from tests.test_pm_samplers import _Node, _Probe, _wait_for

MS = 1_000_000
SM = metric_name("sm_active")
NVLINK = metric_name("nvlink_rx_bytes")  # the stand-in's GPU has no NVLink: NVML reads nothing
HOW = messages.GpmAsk(interval_ns=100 * MS, metrics=[SM, NVLINK], decode_period_ns=100 * MS)


def _ask(uuid: str = "GPU-0", *, gpm: bool = True, ask: bool = True) -> messages.SamplerAsk:
    return messages.SamplerAsk(uuid=uuid, source="pm_sampling", ask=ask, gpm=HOW if gpm else None)


class _Book:
    """A collector's book of samplers whose own sampling reads ``StandInNvml``s (one per session)."""

    def __init__(self, driver: bool = True, samples: int = 8) -> None:
        self.nvmls: list[StandInNvml] = []
        self.board = SampleBoard()
        self.driver = driver
        self.samples = samples  # GPM samples NVML allocates before it answers out of memory
        self.grants = SamplerGrants(reclaim_s=0, own=self._sampler)

    def _gpm(self, uuid: str, clock: Callable[[], int]) -> GpmSession:
        self.nvmls.append(nvml := StandInNvml(driver=self.driver, samples=self.samples))
        return GpmSession(uuid, clock, nvml=nvml)

    def _sampler(self, uuid: str, ask: messages.GpmAsk) -> CollectorSampler:
        return CollectorSampler(uuid, ask, time.monotonic_ns, self.board, 200 * MS, self._gpm)


def _samples(probe: _Probe) -> list[PmSamples]:
    return [e for e in probe.emitter.events if isinstance(e, PmSamples)]


def test_the_collector_samples_a_device_itself_for_every_probe_that_would_sample_it_through_nvml() -> None:
    book = _Book()
    inbox = book.board.subscribe()
    first, second, cupti = _Probe(1), _Probe(2), _Probe(3)
    first.ordinals = {"GPU-0": 3}  # each process's own CUDA ordinal of the GPU
    book.grants.ask(first, _ask())
    book.grants.ask(second, _ask())
    book.grants.ask(cupti, _ask(gpm=False))  # would sample through CUPTI: waits, as for any sampler
    collector_says = messages.SamplerGrant(uuid="GPU-0", source="pm_sampling", collector=True)
    assert first.sent == second.sent == [collector_says] and cupti.sent == []
    assert book.grants.holder("GPU-0") == 0 and book.grants.sampled_here("GPU-0") == [1, 2]
    assert book.grants.waiting("GPU-0") == [3]
    [(origin, said, severity, _)] = first.emitter.errors
    assert origin == "collector:pm_sampling"
    assert severity == "info" and "runs in the collector" in said and "every 100 ms" in said
    _wait_for(lambda: len(_samples(first)) >= 2, "the collector's samples, through the first probe")
    samples = _samples(first)[0]
    assert samples.device_id == 3 and samples.chip == "NVIDIA H100 80GB HBM3"
    assert samples.metrics == [SM, NVLINK] and samples.values[0][0] == 2.0 and samples.values[1][0] is None
    assert all(b - a >= 100 * MS for a, b in zip(samples.starts, samples.ends, strict=True))
    assert [key for key, _ in inbox.take()][:1] == ["GPU-0"]  # to every stream's kernel attribution

    book.grants.left(first)  # its process ended: the next one served gets the events
    seen = len(_samples(second))
    _wait_for(lambda: len(_samples(second)) > seen, "the samples through the second probe")
    assert book.nvmls[0].shut_down is False and book.grants.sampled_here("GPU-0") == [2]

    book.grants.ask(second, _ask(ask=False))  # the last one stopped: the collector stops sampling
    assert book.nvmls[0].shut_down and book.nvmls[0].freed == 2
    assert any(isinstance(e, PmStats) for e in second.emitter.events)  # the open intervals, closed
    assert cupti.sent == [messages.SamplerGrant(uuid="GPU-0", source="pm_sampling")]  # now it samples
    assert book.grants.sampled_here("GPU-0") == [] and book.grants.holder("GPU-0") == 3
    assert len(book.nvmls) == 1  # one session for the device, whatever number of probes


def test_where_nvml_cannot_sample_in_the_collector_the_first_probe_samples_it() -> None:
    book = _Book(driver=False)  # a collector container without the driver's NVML
    first, second = _Probe(1), _Probe(2)
    book.grants.ask(first, _ask())
    book.grants.ask(second, _ask())
    assert first.sent == [messages.SamplerGrant(uuid="GPU-0", source="pm_sampling")] and second.sent == []
    [(_, said, severity, _)] = first.emitter.errors
    assert (
        severity == "info" and "cannot sample GPU GPU-0 through NVML" in said and "a probe samples it" in said
    )
    book.grants.ask(first, _ask(ask=False))  # handed on to the next probe, not tried again here
    assert second.sent == [messages.SamplerGrant(uuid="GPU-0", source="pm_sampling", previous=1)]
    assert len(book.nvmls) == 1 and second.emitter.errors == []


def test_nvml_failing_to_start_in_the_collector_leaves_the_device_to_the_probe() -> None:
    book = _Book(samples=0)  # NVML answers out of memory for the first GPM sample
    first = _Probe(1)
    book.grants.ask(first, _ask())
    assert first.sent == [messages.SamplerGrant(uuid="GPU-0", source="pm_sampling")]
    [(_, said, _, _)] = first.emitter.errors
    assert "cannot sample GPU GPU-0 through NVML (Insufficient" in said and book.nvmls[0].shut_down


def test_a_metrics_window_borrows_the_collectors_sampling_and_the_samples_missed_are_a_loss() -> None:
    book = _Book()
    first = _Probe(1)
    book.grants.ask(first, _ask())
    _wait_for(lambda: _samples(first), "the collector's first samples")
    assert book.grants.lend(["GPU-1"]) == []  # not sampled here: nothing to lend
    lent = book.grants.lend(["GPU-0", "GPU-0"])
    assert len(lent) == 1 and book.nvmls[0].shut_down  # NVML let go for the window
    before = len(_samples(first))
    time.sleep(0.45)  # the window: no samples
    assert len(_samples(first)) == before
    book.grants.take_back(lent)
    [(stage, reason, missed, unit)] = first.emitter.losses
    assert (stage, reason, unit) == ("pm_sampling", "counters_lent", "samples") and 4 <= missed <= 6
    _wait_for(lambda: len(_samples(first)) > before, "the samples after the window")
    book.grants.ask(first, _ask(ask=False))
    book.grants.take_back(lent)  # stopped meanwhile: it stays stopped
    assert len(book.nvmls) == 1 and book.nvmls[0].shut_down and len(first.emitter.losses) == 1


def test_a_probe_that_still_samples_after_a_collector_restart_keeps_its_device() -> None:
    book = _Book()
    served, sampling = _Probe(1), _Probe(2)
    book.grants.ask(served, _ask())
    assert book.grants.sampled_here("GPU-0") == [1]
    book.grants.ask(sampling, messages.SamplerAsk(uuid="GPU-0", source="pm_sampling", holds=True))
    assert book.grants.holder("GPU-0") == 2 and book.grants.sampled_here("GPU-0") == []
    assert book.nvmls[0].shut_down and book.grants.waiting("GPU-0") == [1]
    book.grants.ask(sampling, messages.SamplerAsk(uuid="GPU-0", source="pm_sampling", ask=False, last_end=5))
    assert served.sent[-1].collector and book.grants.sampled_here("GPU-0") == [1]  # sampled here again
    book.grants.close()
    assert book.nvmls[1].shut_down


class _Link:
    """The probe's link to its collector, as ``DeviceGrants`` uses it: what it posts, and what it
    would say to a new collector."""

    def __init__(self) -> None:
        self.posted: list[messages.Message] = []
        self.standing: list[Callable[[], list[messages.Message]]] = []
        self.devices: list[Any] = []

    def post(self, message: messages.Message, wait: float = 0.0) -> bool:
        self.posted.append(message)
        return True


def test_a_probe_source_waits_on_while_the_collector_samples_and_says_so_to_a_new_collector() -> None:
    link = _Link()
    grants = DeviceGrants(link)  # type: ignore[arg-type]
    stopping = threading.Event()
    answers: list[messages.SamplerGrant | None] = []

    def wait(ask: bool) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: answers.append(grants.wait("GPU-0", "pm", stopping, HOW, ask))
        )
        thread.start()
        return thread

    waiting = wait(ask=True)
    _wait_for(lambda: link.posted, "the ask")
    assert link.posted == [messages.SamplerAsk(uuid="GPU-0", source="pm", gpm=HOW)]
    grants.granted(messages.SamplerGrant(uuid="GPU-0", source="pm", collector=True))
    waiting.join(5)
    assert answers == [messages.SamplerGrant(uuid="GPU-0", source="pm", collector=True)]
    waiting = wait(ask=False)  # waits on, asking nothing more
    time.sleep(0.3)
    assert waiting.is_alive() and len(link.posted) == 1
    [standing] = link.standing
    assert standing() == [
        messages.SamplerAsk(uuid="GPU-0", source="pm", gpm=HOW)
    ]  # a new collector decides anew
    grants.granted(messages.SamplerGrant(uuid="GPU-0", source="pm", previous=7))  # the collector stopped
    waiting.join(5)
    assert answers[-1] == messages.SamplerGrant(uuid="GPU-0", source="pm", previous=7)
    assert standing() == [messages.SamplerAsk(uuid="GPU-0", source="pm", holds=True)]  # it samples now
    stopping.set()  # a source that stops while it waits gets no answer
    assert grants.wait("GPU-1", "pm", stopping, HOW) is None


@pytest.fixture
def collector_nvmls(monkeypatch: pytest.MonkeyPatch) -> list[StandInNvml]:
    """The NVML of each GPM session the collectors of the test start (8 samples' memory each)."""
    nvmls: list[StandInNvml] = []

    def gpm(uuid: str, clock: Callable[[], int]) -> Any:
        nvmls.append(nvml := StandInNvml(samples=8))
        return GpmSession(uuid, clock, nvml=nvml)

    monkeypatch.setattr(Collector, "gpm_factory", staticmethod(gpm))
    return nvmls


@pytest.mark.slow  # real collector and probe processes, seconds each
def test_probes_that_would_sample_through_nvml_leave_it_to_the_collector(
    tmp_path: Path, collector_nvmls: list[StandInNvml]
) -> None:
    nvmls = collector_nvmls
    node = _Node(tmp_path)
    try:
        first = node.probe("first", "GPU-same", SM)
        second = node.probe("second", "GPU-same", SM)
        samplers = node.collector.samplers
        _wait_for(lambda: samplers.sampled_here("GPU-same") == [first.pid, second.pid], "both to be served")
        time.sleep(0.5)  # several of the collector's decode periods
        first_stats = node.stop("first", first)
        _wait_for(lambda: samplers.sampled_here("GPU-same") == [second.pid], "the first to leave")
        time.sleep(0.5)
        second_stats = node.stop("second", second)
        _wait_for(lambda: samplers.sampled_here("GPU-same") == [], "the collector to stop sampling")
    finally:
        samples, errors, losses = node.recording()
    assert not node.mark("first", "enabled") and not node.mark("second", "enabled")  # no probe sampled
    for stats in (first_stats, second_stats):
        assert stats["in_collector"] == 1 and stats["granted"] == 0 and stats["samples"] == 0
    assert len(nvmls) == 1 and nvmls[0].shut_down
    assert set(samples) == {first.pid, second.pid}  # through the probe served first, then the next
    first_end = max(e.ends[-1] for e in samples[first.pid])
    assert first_end <= min(e.starts[0] for e in samples[second.pid])
    said = [e.message for _, e in errors]
    assert sum("runs in the collector" in m for m in said) == 3  # the collector's line and each probe's
    assert not losses


@pytest.mark.slow  # real collector and probe processes, seconds each
def test_cuptistream_trace_with_metrics_lends_the_collectors_sampling_of_the_probes_gpus(
    tmp_path: Path, collector_nvmls: list[StandInNvml]
) -> None:
    node = _Node(tmp_path)
    try:
        probe = node.probe("probe", "GPU-same", SM)
        _wait_for(lambda: node.collector.samplers.sampled_here("GPU-same") == [probe.pid], "the sampling")
        reply = ondemand.trace(node.collector, TraceRequest(seconds=0.5, metrics="utilization"))
        [nvml] = collector_nvmls
        assert nvml.samples_left == 8 - 2 * 2  # stopped for the window, started again after it
        [result] = reply.probes
        assert "none of its sources opens windows" in result.problem  # this probe traces nothing
        node.stop("probe", probe)
    finally:
        node.recording()
