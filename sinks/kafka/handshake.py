"""The Kafka sink's own check of a broker, every step under one deadline: TCP connect, TLS handshake,
SASL exchange.

Why not leave it to kafka-python (3.0.12): its bootstrap does not bound every wait (over SSL, against
a server that accepts and never answers, ``KafkaProducer()`` polled for over 40 s with no deadline),
and it reports a refused SASL login as the same ``KafkaTimeoutError`` as a silent server. Here each
step is a blocking socket call whose timeout is what is left of the deadline, so the outcome is one
of:

- ``None``: a broker took the connection, the TLS handshake and the login;
- ``BrokerDown(problem)``: transient (a closed port, no answer, a timeout at any step, a reset):
  retry;
- ``PermanentSinkError`` (raised): a certificate that does not verify, a SASL mechanism the broker
  does not enable, a login it refuses. Retrying cannot help; the message names the fix.

The SASL tokens come from kafka-python's own mechanisms (PLAIN, SCRAM), so what is checked is what
the producer will send. Secrets are never part of a message.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any

from cuptistream.errors import PermanentSinkError

_CLIENT_ID = "cuptistream-check"
log = logging.getLogger("cuptistream.sinks.kafka")


@dataclass(frozen=True)
class BrokerDown:
    """Why no broker could be checked (the last server's problem): worth retrying."""

    problem: str


@dataclass(frozen=True)
class Sasl:
    mechanism: str
    username: str
    password: str
    fix: str  # e.g. "check sasl_mechanism, sasl_username and the password in $KAFKA_PASSWORD"


def check_brokers(
    servers: list[str],
    deadline: float,
    tls: ssl.SSLContext | None,
    sasl: Sasl | None,
    where: str,
) -> BrokerDown | None:
    """Check the bootstrap servers in turn until one passes, by ``deadline`` (``time.monotonic()``).
    Raises ``PermanentSinkError`` on the first permanent refusal."""
    problem = "no bootstrap server given"
    for server in servers:
        host, port = _split(server)
        try:
            _check_one(host, port, deadline, tls, sasl, where)
            return None
        except _Step as step:
            problem = f"{step.step} with {host}:{port} failed: {step.reason}"
        if time.monotonic() >= deadline:
            break
    return BrokerDown(problem)


class _Step(Exception):
    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason


def _check_one(
    host: str, port: int, deadline: float, tls: ssl.SSLContext | None, sasl: Sasl | None, where: str
) -> None:
    step = "TCP connect"
    log.debug("%s: checking the broker at %s:%d", where, host, port)
    try:
        sock: socket.socket = socket.create_connection((host, port), timeout=_left(deadline))
    except OSError as error:
        raise _Step(step, _describe(error)) from None
    try:
        if tls is not None:
            step = "TLS handshake"
            sock.settimeout(_left(deadline))
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as error:
                raise PermanentSinkError(
                    f"{where}: the broker's TLS certificate at {host}:{port} does not verify "
                    f"({error.verify_message}); check ssl_cafile (the CA that signs the brokers' "
                    "certificates) and ssl_check_hostname",
                    "tls_certificate_rejected",
                ) from None
        if sasl is not None:
            step = "SASL exchange"
            _sasl_login(sock, host, deadline, sasl, where)
    except OSError as error:  # ssl.SSLError, socket.timeout and resets included
        raise _Step(step, _describe(error)) from None
    finally:
        sock.close()


def _sasl_login(sock: socket.socket, host: str, deadline: float, sasl: Sasl, where: str) -> None:
    from kafka.net.sasl import get_sasl_mechanism
    from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
    from kafka.protocol.sasl import (
        SaslAuthenticateRequest,
        SaslAuthenticateResponse,
        SaslHandshakeRequest,
        SaslHandshakeResponse,
    )

    def refused(problem: str) -> PermanentSinkError:
        return PermanentSinkError(
            f"{where}: SASL {sasl.mechanism} login as {sasl.username!r} refused by {host}: {problem}; "
            + sasl.fix,
            "sasl_login_refused",
        )

    log.debug("%s: SASL %s exchange with %s as %r", where, sasl.mechanism, host, sasl.username)
    _call(sock, deadline, ApiVersionsRequest[0](), ApiVersionsResponse[0], 0)
    request = SaslHandshakeRequest[1](mechanism=sasl.mechanism)
    shake = _call(sock, deadline, request, SaslHandshakeResponse[1], 1)
    if shake.error_code:  # UNSUPPORTED_SASL_MECHANISM and the like
        enabled = ", ".join(shake.mechanisms) or "no mechanism"
        raise refused(f"the broker enables {enabled} (error {shake.error_code})")
    mechanism = get_sasl_mechanism(sasl.mechanism)(
        host=host, sasl_mechanism=sasl.mechanism, sasl_plain_username=sasl.username,
        sasl_plain_password=sasl.password, security_protocol="SASL_SSL",  # SSL: no plaintext warning
    )  # fmt: skip
    correlation = 2
    while not mechanism.is_done():
        answer = _call(
            sock, deadline, SaslAuthenticateRequest[1](auth_bytes=mechanism.auth_bytes()),
            SaslAuthenticateResponse[1], correlation,
        )  # fmt: skip
        correlation += 1
        if answer.error_code:
            raise refused(answer.error_message or f"error {answer.error_code}")
        token = bytes(answer.auth_bytes or b"")
        if token.startswith(b"e="):  # a SCRAM server-error (RFC 5802), e.g. e=unknown-user
            raise refused(token[2:].decode("utf-8", "replace"))
        try:
            mechanism.receive(token)
        except (ValueError, KeyError) as error:  # e.g. a server signature that does not match
            raise refused(f"the exchange failed ({error})") from None
    if not mechanism.is_authenticated():
        raise refused("not authenticated")


def _call(sock: socket.socket, deadline: float, request: Any, response_type: Any, correlation: int) -> Any:
    """One request and its response, both within ``deadline``."""
    request.with_header(correlation_id=correlation, client_id=_CLIENT_ID)
    sock.settimeout(_left(deadline))
    sock.sendall(request.encode(framed=True, header=True))
    (size,) = struct.unpack(">i", _read(sock, 4, deadline))
    if not 0 <= size <= 16 * 1024 * 1024:
        raise OSError(f"not a Kafka response (frame of {size} bytes)")
    return response_type.decode(_read(sock, size, deadline), header=True)


def _read(sock: socket.socket, size: int, deadline: float) -> bytes:
    data = bytearray()
    while len(data) < size:
        sock.settimeout(_left(deadline))
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("the broker closed the connection")
        data += chunk
    return bytes(data)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _describe(error: OSError) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "no answer before connect_timeout"
    if isinstance(error, ssl.SSLError):
        return str(error.reason or error)
    return error.strerror or str(error) or type(error).__name__


def _split(server: str) -> tuple[str, int]:
    host, _, port = server.rpartition(":")
    if not host:
        return server.strip("[]") or "localhost", 9092
    return host.strip("[]") or "localhost", int(port or 9092)
