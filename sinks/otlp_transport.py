"""OTLP/HTTP delivery of one encoded request: retries, backoff, ``Retry-After`` and one deadline.

Per the OTLP specification, 429, 502, 503 and 504 and connection-level failures are retried; any
other non-2xx answer is permanent. The caller passes an absolute deadline (``trio.current_time()``
based) shared by every request of a batch, so a batch never holds the pipeline longer than that.
"""

from __future__ import annotations

import email.utils
import gzip
import random
import time
from dataclasses import dataclass

import httpx
import trio

from .otlp_config import RetryConfig

RETRYABLE = frozenset({429, 502, 503, 504})


@dataclass
class Delivery:
    ok: bool
    reason: str = ""  # why it failed: "HTTP 400", "deadline (last: HTTP 503)", ...
    body: bytes = b""  # the response body of a success (may hold a partial success)
    content_type: str = ""
    retries: int = 0
    attempts: int = 0


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


class Transport:
    """Posts request bodies to one URL with the sink's headers, compression and retry policy."""

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

    async def post(self, body: bytes, deadline: float) -> Delivery:
        """Send ``body`` (already compressed) until it is accepted, permanently refused, or the deadline."""
        result = Delivery(ok=False)
        backoff = float(self.retry.initial_backoff)
        while True:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                result.reason = f"deadline (last: {result.reason or 'no answer'})"
                return result
            result.attempts += 1
            wait: float | None = None
            with trio.move_on_after(remaining):
                try:
                    response = await self.client.post(
                        self.url, content=body, headers=self.headers, timeout=min(self.timeout, remaining)
                    )
                except httpx.TransportError as error:  # connect refused, reset, read timeout, ...
                    result.reason = type(error).__name__
                else:
                    status = response.status_code
                    if 200 <= status < 300:
                        result.ok, result.reason = True, ""
                        result.body = response.content
                        result.content_type = response.headers.get("content-type", "")
                        return result
                    result.reason = f"HTTP {status}"
                    if status not in RETRYABLE:
                        return result  # permanent: the same request would be refused again
                    wait = retry_after_seconds(response.headers.get("retry-after"))
            if wait is None:
                wait = backoff * random.uniform(0.5, 1.0)
                backoff = min(backoff * self.retry.multiplier, self.retry.max_backoff)
            if trio.current_time() + wait >= deadline:
                result.reason = f"deadline (last: {result.reason or 'no answer'})"
                return result
            result.retries += 1
            await trio.sleep(wait)
