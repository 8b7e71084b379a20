"""OTLP delivery of one encoded request: the retry loop shared by HTTP and gRPC, and the HTTP transport.

Per the OTLP specification, HTTP 429, 502, 503 and 504 and connection-level failures are retried
(and 408, a request the server timed out on); any other answer is not. 401 and 403 stop the whole
sink (``Outcome.STOP``: the credentials are refused, and every signal shares them). Any other 4xx but
413 ends the signal for the session (``Outcome.END``): the same endpoint would refuse every later
request of it too (405: the backend takes no such signal; 404: wrong path). 413 and 5xx drop only
that request.

Every attempt has a deadline we enforce, ``timeout`` from its start, whatever the client library's
own timeouts do (connect, TLS handshake, request, response): an attempt past it is abandoned and
counts as a failure to retry, like a connection error (``ENFORCE_GRACE_S`` after httpx's
own). The retries follow the sink's shared ``retry`` settings
(``cuptistream.delivery.retry``); the caller passes an absolute deadline (``trio.current_time()`` based, the
batch's start plus ``retry.max_elapsed``) shared by every request of a batch, so a batch never holds
the pipeline longer than that.
"""

from __future__ import annotations

import email.utils
import enum
import gzip
import ssl
import time
from dataclasses import dataclass

import httpx
import trio

from cuptistream.config import RetryConfig
from cuptistream.delivery.retry import RetriesExhausted, RetryableError, call_with_retry
from cuptistream.errors import ConfigError
from cuptistream.plugin import sink_where

from .config import TlsConfig

RETRYABLE = frozenset({408, 429, 502, 503, 504})
# Our deadline for an attempt comes this long after the client's own timeout, so the client's reason
# ("ReadTimeout", a TLS error) is reported where it keeps its timeout; ours catches what it does not.
ENFORCE_GRACE_S = 0.25


class Outcome(enum.Enum):
    OK = "ok"
    RETRY = "retry"  # transient: try again after a backoff (or the server's delay)
    FAIL = "fail"  # this request is lost; later ones may succeed
    END = "end"  # every later request of this signal would be refused too
    STOP = "stop"  # every later request of every signal would be refused: the credentials (401, 403)


@dataclass
class Attempt:
    outcome: Outcome
    reason: str = ""  # "HTTP 405", "UNIMPLEMENTED", "ConnectError", ...
    retry_after: float | None = None  # seconds the server asked for
    body: bytes = b""  # the response body of a success (may hold a partial success)
    content_type: str = ""


@dataclass
class Delivery:
    ok: bool
    reason: str = ""  # why it failed: "HTTP 400", "deadline (last: HTTP 503)", ...
    body: bytes = b""
    content_type: str = ""
    retries: int = 0
    attempts: int = 0
    ended: bool = False  # the signal is refused for good (Outcome.END)
    stopped: bool = False  # the sink's credentials are refused (Outcome.STOP)


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def http_outcome(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.OK
    if status in RETRYABLE:
        return Outcome.RETRY
    if status in (401, 403):
        return Outcome.STOP
    if 400 <= status < 500 and status != 413:
        return Outcome.END
    return Outcome.FAIL


class Transport:
    """Sends request bodies to one endpoint with retries inside a deadline; subclasses do one attempt."""

    url: str
    timeout: float
    retry: RetryConfig

    def compress(self, body: bytes) -> bytes:
        return body

    async def attempt(self, body: bytes, timeout: float) -> Attempt:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None

    async def post(self, body: bytes, deadline: float) -> Delivery:
        """Send ``body`` until it is accepted, refused, or the deadline passes
        (``cuptistream.delivery.retry``)."""
        result = Delivery(ok=False)

        async def once(timeout: float) -> Attempt:
            attempt = await self.attempt(body, timeout)
            result.reason = attempt.reason
            if attempt.outcome is Outcome.RETRY:
                raise RetryableError(attempt.reason, attempt.retry_after)
            return attempt

        try:
            attempt = await call_with_retry(once, self.retry, self.timeout, deadline, counts=result)
        except RetriesExhausted as error:
            result.reason = str(error)
            return result
        if attempt.outcome is Outcome.OK:
            result.ok, result.body, result.content_type = True, attempt.body, attempt.content_type
        else:  # the same request would be refused again
            result.ended = attempt.outcome is Outcome.END
            result.stopped = attempt.outcome is Outcome.STOP
        return result


class HttpTransport(Transport):
    """OTLP/HTTP: POSTs bodies to one URL with the sink's headers and compression."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        content_type: str,
        compression: str,
        headers: dict[str, str],
        timeout: float,
        retry: RetryConfig,
    ) -> None:
        self.client = client
        self.url = url
        self.compression = compression
        self.timeout = timeout
        self.retry = retry
        self.headers = {"Content-Type": content_type, "User-Agent": "cuptistream", **headers}
        if compression == "gzip":
            self.headers["Content-Encoding"] = "gzip"

    def compress(self, body: bytes) -> bytes:
        return gzip.compress(body, compresslevel=6, mtime=0) if self.compression == "gzip" else body

    async def attempt(self, body: bytes, timeout: float) -> Attempt:
        # httpx's timeout is per phase (connect, each read, ...); a server that trickles its answer or
        # stalls a TLS handshake between phases could outlast it, so the whole attempt has ours too.
        response: httpx.Response | None = None
        with trio.move_on_after(timeout + ENFORCE_GRACE_S):
            try:
                response = await self.client.post(
                    self.url, content=body, headers=self.headers, timeout=timeout
                )
            except httpx.TransportError as error:  # connect refused, reset, read timeout, ...
                return Attempt(Outcome.RETRY, _transport_reason(error))
        if response is None:
            return Attempt(Outcome.RETRY, f"no answer within timeout ({timeout:g}s)")
        status = response.status_code
        outcome = http_outcome(status)
        if outcome is Outcome.OK:
            return Attempt(outcome, "", None, response.content, response.headers.get("content-type", ""))
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        return Attempt(outcome, f"HTTP {status}", retry_after)


def _transport_reason(error: BaseException) -> str:
    """The exception's name, and for a failed TLS handshake what failed, e.g. "ConnectError: TLS
    certificate verify failed: unable to get local issuer certificate"."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"{type(error).__name__}: TLS certificate verify failed: {cause.verify_message}"
        if isinstance(cause, ssl.SSLError):
            return f"{type(error).__name__}: TLS handshake failed: {cause.reason or cause}"
        cause = cause.__cause__ or cause.__context__
    return type(error).__name__


def ssl_context(tls: TlsConfig, sink: str) -> ssl.SSLContext:
    """The HTTP client's TLS settings from the sink's ``tls`` keys; a file that cannot be loaded is a
    ``ConfigError`` naming them."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file and tls.key_file:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(
            f"{sink_where(sink, 'tls')}: cannot load a certificate or key ({error.strerror or error}); "
            "check ca_file, cert_file and key_file"
        ) from None
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
