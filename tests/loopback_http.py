"""What the tests' HTTP servers share (tests/otlp_receiver.py, tests/s3_server.py): ``http.server`` in
a daemon thread on a free loopback port, started and stopped as a context manager."""

from __future__ import annotations

import http.server
import threading
from typing import TypeVar

_Server = TypeVar("_Server", bound="LoopbackServer")


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive), and no line on stderr per request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass


class LoopbackServer:
    """Serves ``handler`` on 127.0.0.1 at a port the system picks, from ``__enter__`` to ``__exit__``."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self: _Server) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
