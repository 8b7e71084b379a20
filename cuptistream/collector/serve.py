"""``cuptistream collector``: a collector process serving probes on a Unix socket until told to stop.

Prints one ``listening on PATH`` line on stdout once probes can connect. SIGTERM and SIGINT stop
it: connected probes get ``shutdown_deadline`` to hang up, what they published is drained, then
the pipeline. With ``--until-idle`` it also stops once the probes that came have all left.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType

from cuptistream.collector import memory
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
    require_healthy: bool = False,
    socket_mode: int = 0o600,
) -> int:
    cfg = load(config_path)
    memory.limit_malloc_arenas()  # before the collector's threads start
    collector = Collector(cfg, session_id=session_id, require_healthy=require_healthy).start()
    stop = threading.Event()
    signalled: list[float] = []  # the shutdown deadline starts at the first signal

    def request_stop(signum: int, frame: FrameType | None) -> None:
        if not signalled:
            signalled.append(time.monotonic())
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    collector.listen(socket_path, mode=socket_mode)
    print(f"listening on {socket_path}", flush=True)
    if collector.control_problem and not quiet:
        print(f"cuptistream: {collector.control_problem}; `cuptistream trace` cannot reach this collector",
              file=sys.stderr, flush=True)  # fmt: skip
    if not quiet and not until_idle:
        hint = f"point probes at it with CUPTISTREAM_COLLECTOR={socket_path}"
        print(f"cuptistream: collector listening; {hint}", file=sys.stderr, flush=True)
    while not stop.wait(0.2):
        if until_idle and collector.wait_idle(timeout=0):
            break
    summary = None if quiet or until_idle else "collector"
    began = signalled[0] if signalled else None
    report = collector.conclude(report_json=report_json, summary=summary, began=began)
    return 0 if report is not None else 1
