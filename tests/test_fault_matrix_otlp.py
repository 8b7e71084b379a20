"""The OTLP rows of the fault matrix: a receiver that is down, silent, stalled mid-TLS-handshake,
or answers 503, 401 or nothing never stops, stalls or slows the program, and every event is accounted.

Every cell is a real ``cuptistream run`` of a program (a synthetic source, no GPU) with one OTLP sink,
against a real server the test starts:

- a closed port; a TCP acceptor that never answers (``tests/stalling_servers.py``);
- a TLS server (Python ``ssl``, a CA the test makes) that stalls in the middle of the handshake;
- the OTLP receivers of ``tests/otlp_receiver.py`` (HTTP, and HTTPS with its socket wrapped in TLS)
  and ``tests/otlp_grpc_receiver.py`` (gRPC, and gRPC on a TLS port) answering 503 (gRPC:
  UNAVAILABLE), 401 (UNAUTHENTICATED), or nothing at all;

over OTLP/HTTP, HTTPS, gRPC and gRPC+TLS where the server makes sense (a stalled TLS handshake only
with TLS). Per cell:

- the program's first line of output comes within 2 s of ``cuptistream run`` starting;
- its exit code is returned, and ``cuptistream run`` exits within ``shutdown_deadline`` + 1 s of the
  program's exit;
- events in = delivered + counted drops, exactly, each drop under a reason (``--report-json``);
- delivered (acknowledged by the receiver) equals what the receiver took: nothing, in every cell;
- one stderr line names the sink and the problem (a 401 stops the sink: its line names the fix).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import Answer, OtlpReceiver
from stalling_servers import SilentAcceptor, StallingTlsServer, closed_port
from test_tls import Certs, certs  # noqa: F401 - the session's CA and server certificate (fixture)

pytestmark = pytest.mark.slow  # scripts/test.sh --all and CI run it

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "cuptistream.cli"]
EVENTS = 2_000
DEADLINE_S = 2.0  # pipeline.shutdown_deadline
EXIT_CODE = 7

# The observed program: a first line at once, a second when it is about to exit.
PROGRAM = r"""
import sys, time
print("program started", flush=True)
time.sleep(1.0)
print("program exiting", flush=True)
sys.exit(7)
"""

PROTOCOLS = ("http", "https", "grpc", "grpc+tls")
# server kind -> the protocols where it makes sense, and what the one stderr line names for each
CELLS: dict[str, dict[str, tuple[str, ...]]] = {
    "closed port": {p: ("ConnectError", "gRPC UNAVAILABLE") for p in PROTOCOLS},
    "silent acceptor": {
        p: ("Timeout", "no answer", "gRPC DEADLINE_EXCEEDED", "gRPC UNAVAILABLE") for p in PROTOCOLS
    },
    "TLS stalls mid-handshake": {
        p: ("Timeout", "no answer", "gRPC DEADLINE_EXCEEDED", "gRPC UNAVAILABLE")
        for p in ("https", "grpc+tls")
    },
    "receiver answers 503": {p: ("HTTP 503", "gRPC UNAVAILABLE") for p in PROTOCOLS},
    "receiver answers 401": {p: ("HTTP 401", "gRPC UNAUTHENTICATED") for p in PROTOCOLS},
    "receiver answers nothing": {p: ("Timeout", "no answer", "gRPC DEADLINE_EXCEEDED") for p in PROTOCOLS},
}


@dataclass
class Server:
    endpoint: str
    taken: Any  # () -> items the receiver decoded and acknowledged (0 where there is no receiver)


@contextmanager
def server_for(kind: str, protocol: str, pki: Certs) -> Iterator[Server]:
    tls = protocol in ("https", "grpc+tls")
    scheme = "https" if tls else "http"
    with ExitStack() as stack:
        if kind == "closed port":
            yield Server(f"{scheme}://127.0.0.1:{closed_port()}", lambda: 0)
        elif kind == "silent acceptor":
            silent = stack.enter_context(SilentAcceptor())
            yield Server(f"{scheme}://127.0.0.1:{silent.port}", lambda: 0)
        elif kind == "TLS stalls mid-handshake":
            stalling = stack.enter_context(StallingTlsServer(pki.server_context()))
            yield Server(f"https://127.0.0.1:{stalling.port}", lambda: 0)
            assert stalling.stalled > 0, "no client got as far as the stalled handshake"
        elif protocol.startswith("grpc"):
            yield from _grpc_receiver(stack, kind, tls, pki)
        else:
            yield from _http_receiver(stack, kind, tls, pki)


def _http_receiver(stack: ExitStack, kind: str, tls: bool, pki: Certs) -> Iterator[Server]:
    receiver = OtlpReceiver()
    if tls:
        receiver.server.socket = pki.server_context().wrap_socket(receiver.server.socket, server_side=True)
    receiver.fallback = {
        "receiver answers 503": Answer(status=503),
        "receiver answers 401": Answer(status=401),
        "receiver answers nothing": Answer(delay=3600),
    }[kind]
    stack.enter_context(receiver)
    endpoint = receiver.endpoint.replace("http://", "https://" if tls else "http://")

    def taken() -> int:
        return len(receiver.spans()) + len(receiver.log_records()) + len(receiver.data_points())

    yield Server(endpoint, taken)
    # (a request left unanswered is recorded only when it is answered)
    assert receiver.received or kind == "receiver answers nothing", "the receiver never got a request"


def _grpc_receiver(stack: ExitStack, kind: str, tls: bool, pki: Certs) -> Iterator[Server]:
    grpc = pytest.importorskip("grpc")
    from otlp_grpc_receiver import OtlpGrpcReceiver, Reply

    receiver = OtlpGrpcReceiver()
    port = receiver.port
    if tls:
        credentials = grpc.ssl_server_credentials([(pki.key.read_bytes(), pki.cert.read_bytes())])
        port = receiver.server.add_secure_port("127.0.0.1:0", credentials)
    receiver.fallback = {
        "receiver answers 503": Reply(grpc.StatusCode.UNAVAILABLE),
        "receiver answers 401": Reply(grpc.StatusCode.UNAUTHENTICATED),
        "receiver answers nothing": Reply(delay=3600),
    }[kind]
    stack.enter_context(receiver)

    def taken() -> int:
        return len(receiver.spans()) + len(receiver.log_records()) + len(receiver.data_points())

    yield Server(f"{'https' if tls else 'http'}://127.0.0.1:{port}", taken)
    assert receiver.calls or kind == "receiver answers nothing", "the receiver never got a call"


@dataclass
class Outcome:
    first_line_s: float  # from starting `cuptistream run` to the program's first line
    after_exit_s: float  # from the program's last line to `cuptistream run` exiting
    returncode: int
    stderr: str
    report: dict[str, Any]


def run_cell(tmp: Path, endpoint: str, protocol: str, pki: Certs) -> Outcome:
    tmp.mkdir(parents=True, exist_ok=True)
    sink: dict[str, Any] = {
        "type": "otlp", "name": "otlp", "endpoint": endpoint, "timeout": "0.5s", "connect_timeout": "1s",
        "retry": {"initial_backoff": "0.1s", "max_backoff": "0.3s", "max_elapsed": "1s"},
    }  # fmt: skip
    if protocol.startswith("grpc"):
        sink["protocol"] = "grpc"
    if protocol in ("https", "grpc+tls"):
        sink["tls"] = {"ca_file": str(pki.ca)}
    config = {
        "sources": [{"type": "synthetic", "events": EVENTS, "rate": 4_000, "chunk_events": 250}],
        "pipeline": {"shutdown_deadline": f"{DEADLINE_S}s", "stats_interval": "1h"},
        "sinks": [sink],
    }
    (tmp / "cfg.json").write_text(json.dumps(config))
    report = tmp / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "run", "-c", str(tmp / "cfg.json"), "--report-json", str(report), "--",
         sys.executable, "-c", PROGRAM],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        first_line_s = time.monotonic() - started
        last = proc.stdout.readline()
        exiting = time.monotonic()
        _, stderr = proc.communicate(timeout=DEADLINE_S + 30)
        after_exit_s = time.monotonic() - exiting
    finally:
        proc.kill()
    assert first.strip() == "program started" and last.strip() == "program exiting", (first, last, stderr)
    assert report.exists(), f"no report\n{stderr}"
    return Outcome(first_line_s, after_exit_s, proc.returncode, stderr, json.loads(report.read_text()))


@pytest.mark.parametrize(
    ("kind", "protocol"), [(kind, protocol) for kind, cells in CELLS.items() for protocol in cells]
)
def test_otlp_fault_matrix(tmp_path: Path, certs: Certs, kind: str, protocol: str) -> None:  # noqa: F811
    if protocol.startswith("grpc"):
        pytest.importorskip("grpc")
    where = f"{kind} over {protocol}"
    for attempt in range(2):
        with server_for(kind, protocol, certs) as server:
            outcome = run_cell(tmp_path / f"try{attempt}", server.endpoint, protocol, certs)
            taken = server.taken()
        # A time bound missed on a loaded machine (2.0-2.2 s seen beside other suites, 0.75-1.4 s
        # alone) is measured once more; a hang, the fault this matrix is for, misses both times.
        if outcome.first_line_s < 2.0 and outcome.after_exit_s < DEADLINE_S + 1.0:
            break
        print(f"{where}: a time bound missed (first line {outcome.first_line_s:.2f}s), measuring once more")
    print(
        f"{where}: first line {outcome.first_line_s:.2f}s, exit {outcome.after_exit_s:.2f}s after the program's"
    )
    assert outcome.first_line_s < 2.0, (
        f"{where}: the program's first line came {outcome.first_line_s:.2f}s in"
    )
    assert outcome.returncode == EXIT_CODE, f"{where}: exit {outcome.returncode}\n{outcome.stderr}"
    assert outcome.after_exit_s < DEADLINE_S + 1.0, (
        f"{where}: run exited {outcome.after_exit_s:.2f}s after the program\n{outcome.stderr}"
    )
    assert "Traceback" not in outcome.stderr, outcome.stderr

    report = outcome.report
    assert report["events_in"] == EVENTS and report["intake_dropped"] == 0
    lane = report["sinks"]["otlp"]
    losses = {k.split("/", 1)[1]: n for k, n in report["losses"].items() if k.startswith("sink:otlp/")}
    assert lane["events_in"] >= EVENTS  # + the final loss and self-stats events (and errors)
    assert lane["events_in"] == lane["events_out"] + lane["events_dropped"], lane
    assert sum(losses.values()) == lane["events_dropped"], (losses, lane)  # each drop has a reason
    assert lane["events_out"] == taken == 0, f"{where}: delivered {lane['events_out']}, receiver took {taken}"
    if kind == "receiver answers 401":
        assert set(losses) == {"unauthorized"}, losses
        assert report["health"]["otlp"]["state"] == "stopped"
    else:
        assert report["health"]["otlp"]["state"] == "failing", report["health"]

    lines = [line for line in outcome.stderr.splitlines() if line.startswith("cuptistream: sinks[otlp]")]
    print(f"  {lines}  losses {losses}")
    assert len(lines) == 1, f"{where}: {lines}"
    assert any(needle in lines[0] for needle in CELLS[kind][protocol]), f"{where}: {lines[0]}"
    if kind == "receiver answers 401":
        assert ": stopped: " in lines[0] and "check headers" in lines[0], lines[0]
