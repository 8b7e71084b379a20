"""The collector's CPU time per thread (``collector.thread_cpu``): real threads burning real CPU,
read back from /proc, and the collector's shutdown report naming its threads."""

from __future__ import annotations

import threading
import time

import cuptistream
from cuptistream.collector.collector import Collector
from cuptistream.collector.thread_cpu import ThreadCpu, read_thread_cpu
from cuptistream.events import Kernel
from cuptistream.recording.codec import encode_chunk


def _burn(seconds: float) -> None:
    ends = time.thread_time() + seconds
    while time.thread_time() < ends:
        pass


def test_a_busy_thread_is_named_with_its_cpu_and_is_the_busiest() -> None:
    watch = ThreadCpu(interval=60.0)  # sampled by hand here
    burnt, done = threading.Event(), threading.Event()

    def burner() -> None:
        _burn(0.4)
        burnt.set()
        done.wait(10)

    thread = threading.Thread(target=burner, name="burner")
    thread.start()
    time.sleep(0.05)
    watch.sample()  # seen while it burns: its name is known
    assert burnt.wait(10)
    watch.sample()
    assert thread.native_id is not None and read_thread_cpu(thread.native_id) is not None
    done.set()
    thread.join()
    totals = watch.stop()  # the burner has ended: its last reading still counts
    assert 0.35 <= totals["burner"] < 2.0, totals
    name, cpu = watch.busiest()  # pytest's main thread may have used more
    assert cpu >= totals["burner"] and totals[name] >= cpu


def test_the_collector_reports_its_threads_cpu() -> None:
    config = cuptistream.load_config({"sources": [], "sinks": [{"type": "null"}]})
    collector = Collector(config).start()
    kernels = [
        Kernel(start=i, end=i + 1, name="k", device_id=0, context_id=1, stream_id=7, correlation_id=i)
        for i in range(20)
    ]
    for _ in range(10_000):  # work for the pipeline's thread: 10,000 chunks into the null sink
        collector.pipeline.intake.emit_chunk(encode_chunk(kernels))
    report = collector.finish()
    assert report is not None
    assert "cuptistream-pipeline" in report.collector_threads_cpu_s
    assert report.collector_busiest_thread in report.collector_threads_cpu_s
    assert sum(report.collector_threads_cpu_s.values()) <= report.collector_cpu_s + 0.05
