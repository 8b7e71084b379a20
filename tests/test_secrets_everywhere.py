"""A planted secret appears in no output unless explicitly enabled.

One unique token is planted where a user keeps secrets: the OTLP sink's ``headers_env`` variable,
``OTEL_EXPORTER_OTLP_HEADERS``, the Kafka sink's ``sasl_password_env`` variable, and a
``--token=...`` argument of the observed program. ``cuptistream run`` then runs with file + Kafka
(a real tansu broker) + OTLP (a real receiver) + stdout sinks and every logger at DEBUG, and every
output is searched for the token: the file sink's raw bytes (every file in its directory) and its
decoded events (``cuptistream cat``), every record of every Kafka topic (value, key, headers), the
receiver's request bodies (decompressed), the run's stdout and stderr, and the ``--report-json``
report. The config itself has no key that holds a secret inline (secrets are named through ``_env``
keys only; ``session.attributes`` is copied into every batch by design), so no config value is planted.

tansu with ``--authentication`` has no users, so SASL cannot deliver there: the SASL password is
checked in a run of its own that the broker refuses (the start-up error, under DEBUG, must name the
variable and not hold its value). Then ``session: {command_line: true}`` puts the token into the
file events' resource, the stdout batches, the Kafka messages and the OTLP bodies: the same search
finds it there, so the search can fail.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

import cuptistream
from tests.kafka_broker import TansuBroker, kafka_broker_fixture  # noqa: F401 - the fixture
from tests.kafka_consume import consume
from tests.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parent.parent
# The CLI with every logger at DEBUG (the collector and the sinks run in this process).
DEBUG_CLI = [
    sys.executable, "-c",
    "import logging, sys; logging.basicConfig(level=logging.DEBUG); "
    "from cuptistream.cli import main; sys.exit(main(sys.argv[1:]))",
]  # fmt: skip
TOPIC = "secrets.events"


@pytest.fixture(autouse=True)
def _no_inherited_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def _env(token: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env["TEST_OTLP_TOKEN"] = token
    env["TEST_KAFKA_PASSWORD"] = token
    env["OTEL_EXPORTER_OTLP_HEADERS"] = f"X-Env-Token={token}"
    return env


def _config(tmp_path: Path, name: str, broker: str, endpoint: str, command_line: bool) -> Path:
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps({
        "session": {"command_line": command_line, "attributes": {"team": "secrets-test"}},
        "sources": [{"type": "synthetic", "events": 2000, "chunk_events": 500}],
        "sinks": [
            {"type": "file", "directory": str(tmp_path / f"{name}-out")},
            {"type": "kafka", "bootstrap_servers": broker, "topic": TOPIC, "connect_timeout": "5s"},
            {"type": "otlp", "endpoint": endpoint, "headers_env": {"Authorization": "TEST_OTLP_TOKEN"},
             "trace_grouping": "window", "trace_window": "100ms", "reorder_window": "100ms"},
            {"type": "stdout"},
        ],
    }))  # fmt: skip
    return cfg


def _program(token: str) -> list[str]:
    # The program gets the token as an argument and never prints it.
    return ["python", "-c", "import sys; assert sys.argv[1].startswith('--token=')", f"--token={token}"]


def _run(
    cfg: Path, report: Path, program: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*DEBUG_CLI, "run", "-c", str(cfg), "--report-json", str(report), "--", *program],
        capture_output=True, timeout=60, env=env, cwd=report.parent,
    )  # fmt: skip


def _outputs(
    token: str, tmp_path: Path, name: str, broker: TansuBroker, receiver: OtlpReceiver, env: dict[str, str]
) -> dict[str, bytes]:
    """Run once; every output as bytes, by where it came from."""
    cfg = _config(tmp_path, name, broker.bootstrap, receiver.endpoint, command_line=name == "enabled")
    report = tmp_path / f"{name}-report.json"
    result = _run(cfg, report, _program(token), env)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    assert b"DEBUG" in result.stderr, "DEBUG logging was not on"
    out = tmp_path / f"{name}-out"
    outputs: dict[str, bytes] = {"run stdout": result.stdout, "run stderr": result.stderr}
    outputs["report"] = report.read_bytes()
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert files, "the file sink wrote nothing"
    for path in files:
        outputs[f"file {path.relative_to(out)}"] = path.read_bytes()
    cat = subprocess.run([*DEBUG_CLI, "cat", str(out)], capture_output=True, timeout=30, env=env)
    assert cat.returncode == 0, cat.stderr
    assert cat.stdout.count(b"\n") >= 2000
    outputs["cuptistream cat stdout"], outputs["cuptistream cat stderr"] = cat.stdout, cat.stderr
    outputs["decoded file batches"] = repr(list(cuptistream.read(out).batches())).encode()
    records = consume(broker.bootstrap, TOPIC)
    assert records, "nothing reached Kafka"
    outputs["kafka"] = b"\n".join(
        (r.key or b"") + b"\t" + (r.value or b"") + b"\t" + repr(r.headers).encode() for r in records
    )
    with receiver.lock:
        received = list(receiver.received)
    assert {r.path for r in received} >= {"/v1/traces", "/v1/metrics"}
    for r in received:
        # The headers carry the secret on purpose: that is what headers_env is for.
        assert r.headers.get("Authorization") == token and r.headers.get("X-Env-Token") == token
    outputs["otlp bodies"] = b"\n".join(
        gzip.decompress(r.raw) if r.headers.get("Content-Encoding") == "gzip" else r.raw for r in received
    )
    outputs["otlp decoded"] = "\n".join(str(r.message) for r in received).encode()
    return outputs


def _holding(token: str, outputs: dict[str, bytes]) -> list[str]:
    return [where for where, data in outputs.items() if token.encode() in data]


def test_a_planted_secret_appears_in_no_output_unless_enabled(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    token = f"planted-{secrets.token_hex(12)}"
    env = _env(token)
    with OtlpReceiver() as receiver:
        outputs = _outputs(token, tmp_path, "default", kafka_broker, receiver, env)
    assert _holding(token, outputs) == []

    # Explicitly enabled: the command line, token included, goes everywhere, and the search finds it.
    with OtlpReceiver() as receiver:
        enabled = _outputs(token, tmp_path, "enabled", kafka_broker, receiver, env)
    command_lines = {
        arg for b in cuptistream.read(tmp_path / "enabled-out").batches() for arg in b.resource.command_line
    }
    assert f"--token={token}" in command_lines
    holding = _holding(token, enabled)
    for where in ("run stdout", "cuptistream cat stdout", "decoded file batches", "kafka", "otlp bodies"):
        assert where in holding, f"the enabled command line did not reach {where}"


def test_the_sasl_password_is_in_no_output_when_the_broker_refuses(
    kafka_broker: TansuBroker, tmp_path: Path
) -> None:
    token = f"planted-{secrets.token_hex(12)}"
    broker = TansuBroker(kafka_broker.binary, authentication=True)  # accepts no one: no users exist
    broker.start()
    try:
        cfg = tmp_path / "sasl.json"
        cfg.write_text(json.dumps({
            "sources": [{"type": "synthetic", "events": 100}],
            "sinks": [
                {"type": "file", "directory": str(tmp_path / "sasl-out")},
                {"type": "kafka", "bootstrap_servers": broker.bootstrap, "topic": TOPIC,
                 "connect_timeout": "3s", "security_protocol": "SASL_PLAINTEXT",
                 "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "alice",
                 "sasl_password_env": "TEST_KAFKA_PASSWORD"},
            ],
        }))  # fmt: skip
        report = tmp_path / "sasl-report.json"
        result = _run(cfg, report, _program("not-the-secret"), _env(token))
    finally:
        broker.kill()
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 0, stderr[-3000:]  # a refused login stops the sink, not the program
    assert "SASL SCRAM-SHA-256 login as 'alice' refused" in stderr, stderr[-3000:]
    assert "$TEST_KAFKA_PASSWORD" in stderr, stderr[-3000:]
    assert "DEBUG" in stderr, "DEBUG logging was not on"
    outputs = {"run stdout": result.stdout, "run stderr": result.stderr}
    outputs |= {f"file {p.name}": p.read_bytes() for p in (tmp_path / "sasl-out").rglob("*") if p.is_file()}
    if report.exists():
        outputs["report"] = report.read_bytes()
    assert _holding(token, outputs) == []
