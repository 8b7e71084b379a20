"""``cuptistream collector``: a collector process serving probes on a Unix socket until told to stop.

Prints one ``listening on PATH`` line on stdout once probes can connect. SIGTERM and SIGINT stop
it: connected probes get ``shutdown_deadline`` to hang up, what they published is drained, then
the pipeline. With ``--until-idle`` it also stops once the probes that came have all left.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import msgspec

from cuptistream.collector.collector import Collector
from cuptistream.config import load


def serve(
    config_path: str,
    socket_path: str,
    *,
    until_idle: bool = False,
    session_id: str | None = None,
    report_json: str | None = None,
    quiet: bool = False,
) -> int:
    cfg = load(config_path)
    collector = Collector(cfg, session_id=session_id).start()
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    collector.listen(socket_path)
    print(f"listening on {socket_path}", flush=True)
    if not quiet and not until_idle:
        hint = f"point probes at it with CUPTISTREAM_COLLECTOR={socket_path}"
        print(f"cuptistream: collector listening; {hint}", file=sys.stderr, flush=True)
    while not stop.wait(0.2):
        if until_idle and collector.wait_idle(timeout=0):
            break
    report = collector.finish(probe_timeout=float(cfg.pipeline.shutdown_deadline))
    if report_json and report is not None:
        Path(report_json).write_bytes(msgspec.json.encode(report))
    if report is None:
        print(f"cuptistream: the pipeline did not drain within {collector.stop_timeout:.0f}s; "
              "undelivered data is lost", file=sys.stderr)  # fmt: skip
        return 1
    if not quiet and not until_idle:
        print(f"cuptistream: collector {collector.session_id} drained: {report.summary()}", file=sys.stderr)
    return 0
