"""tests/s3_server.py, the object store behind the persistent Kafka broker: a PUT whose client dies
mid-body stores nothing, as S3 does (a SIGKILLed broker must not leave a torn batch behind)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from tests.s3_server import S3Server


def _put_raw(endpoint: str, path: str, announced: int, body: bytes) -> None:
    """A PUT that announces ``announced`` bytes, sends ``body``, then hangs up."""
    where = urlsplit(endpoint)
    with socket.create_connection((where.hostname, where.port)) as sock:
        head = f"PUT {path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Length: {announced}\r\n\r\n"
        sock.sendall(head.encode() + body)
        if len(body) == announced:
            sock.recv(1024)  # the answer, before hanging up


def test_a_put_cut_off_mid_body_stores_nothing_and_a_whole_one_is_stored() -> None:
    with S3Server() as s3:
        _put_raw(s3.endpoint, "/bucket/torn", 100, b"x" * 10)
        _put_raw(s3.endpoint, "/bucket/whole", 10, b"y" * 10)
        time.sleep(0.2)  # the server thread has seen the torn request's end of stream
        assert urllib.request.urlopen(f"{s3.endpoint}/bucket/whole").read() == b"y" * 10
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{s3.endpoint}/bucket/torn")
        assert refused.value.code == 404
