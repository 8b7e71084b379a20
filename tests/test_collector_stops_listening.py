"""A collector that finishes takes no probe in afterwards. Closing a listening socket does not wake
a thread blocked in ``accept`` on Linux: the socket stayed open under it, a probe reconnecting to
the collector that had just cut it off was accepted, and its pools were drained into the closed
intake after the shutdown report was made: one chunk counted nowhere (CI, test_fault_reconciliation,
"200000 != 80500 + 119000"). Real sockets, a real collector (its pipeline on a null sink)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

import cuptistream
from cuptistream.channel import sockets
from cuptistream.channel.shm import ChannelError
from cuptistream.collector.collector import Collector
from cuptistream.events import Kernel
from cuptistream.pipeline.core import ShutdownReport
from cuptistream.recording.codec import encode_chunk


def test_a_closed_listener_still_accepts_under_a_blocked_accept() -> None:
    """The premise, on this kernel: ``close`` alone leaves the blocked ``accept`` accepting."""
    path = Path(sockets.private_socket_path())
    listener = sockets.listen(path)
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    thread.join(0.2)
    listener.close()
    sockets.connect(str(path), timeout=1.0).close()  # no error: it is still listening
    thread.join(2.0)
    assert accepted, "accept returned a connection made after close"


def test_a_finished_collector_refuses_probes_and_its_accept_thread_ends(tmp_path: Path) -> None:
    config = cuptistream.load_config({"sources": [], "sinks": [{"type": "null"}]})
    collector = Collector(config).start()
    path = str(tmp_path / "c.sock")
    collector.listen(path)
    sockets.connect(path, timeout=1.0).close()  # it accepts while running
    time.sleep(0.3)  # its accept thread is back in ``accept``, blocked
    assert collector.served == 1
    collector.finish()
    accepting = collector._accepting
    assert accepting is not None and not accepting.is_alive()
    with pytest.raises(ChannelError, match="cannot reach the collector"):
        sockets.connect(path, timeout=1.0)


def test_what_a_connection_hands_over_after_the_pipeline_stopped_is_in_the_report() -> None:
    """A probe connection cut off at the deadline may still be draining when the pipeline's report
    is made; what it hands to the closed intake then is counted lost, and the collector puts it in
    the report (as losses no recording has). The connection's thread is stood in for by a plain
    thread that emits one chunk late: a real one cannot be held at that point on cue."""
    config = cuptistream.load_config(
        {"sources": [], "sinks": [{"type": "null"}], "pipeline": {"shutdown_deadline": "1s"}}
    )
    collector = Collector(config).start()
    stopped = threading.Event()

    def drain_late() -> None:
        stopped.wait(10)
        time.sleep(0.2)  # after ``finish`` has its report from the pipeline
        collector.pipeline.intake.emit_chunk(encode_chunk([_kernel(i) for i in range(7)]))

    late = threading.Thread(target=drain_late)
    late.start()
    collector._threads.append(late)
    stop = collector._pipeline_thread.stop

    def stop_then_signal(timeout: float, drain_until: float | None = None) -> ShutdownReport | None:
        report = stop(timeout, drain_until)
        stopped.set()
        return report

    collector._pipeline_thread.stop = stop_then_signal  # type: ignore[method-assign]
    report = collector.finish()
    assert report is not None
    assert report.losses.get("intake/closed") == 7
    assert report.unrecorded_losses.get("intake/closed") == 7
    assert report.intake_dropped == 7


def _kernel(i: int) -> Kernel:
    return Kernel(start=i, end=i + 1, name="k", device_id=0, context_id=1, stream_id=7, correlation_id=i)
