"""Servers that never answer, for the fault matrix (tests/test_fault_matrix_otlp.py), each on a free
loopback port, in daemon threads, from ``__enter__`` to ``__exit__``:

- ``closed_port()``: a port nothing listens on (bound, then closed);
- ``SilentAcceptor``: accepts TCP connections, reads what comes and never writes a byte;
- ``StallingTlsServer``: a TLS server (Python ``ssl``, the test's CA) that reads the ClientHello,
  sends the first half of its answer (ServerHello, certificate, ...) and then stalls, so the client
  is left in the middle of the handshake.
"""

from __future__ import annotations

import socket
import ssl
import threading


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Acceptor:
    """Accepts on a loopback port and hands each connection to ``serve`` in a daemon thread."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.connections = 0
        self._open: list[socket.socket] = []
        self._stop = threading.Event()

    def __enter__(self) -> _Acceptor:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.listener.close()
        for conn in self._open:
            try:
                conn.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve_quietly, args=(conn,), daemon=True).start()

    def _serve_quietly(self, conn: socket.socket) -> None:
        try:
            self.serve(conn)
        except OSError:
            pass

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _read_until_stopped(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        while not self._stop.is_set():
            try:
                if not conn.recv(65536):
                    return  # the client gave up
            except TimeoutError:
                continue


class SilentAcceptor(_Acceptor):
    def serve(self, conn: socket.socket) -> None:
        self._read_until_stopped(conn)


class StallingTlsServer(_Acceptor):
    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self.context = context
        self.stalled = 0  # handshakes left half done

    def serve(self, conn: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self.context.wrap_bio(incoming, outgoing, server_side=True)
        conn.settimeout(5)
        while True:
            data = conn.recv(65536)
            if not data:
                return
            incoming.write(data)
            try:
                tls.do_handshake()
            except ssl.SSLWantReadError:
                pass
            answer = outgoing.read()
            if answer:  # the ClientHello is in: send half of the server's flight, then nothing more
                conn.sendall(answer[: max(1, len(answer) // 2)])
                self.stalled += 1
                self._read_until_stopped(conn)
                return
