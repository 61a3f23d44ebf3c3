"""What the tests' HTTP servers share: a threaded server on 127.0.0.1 that stays quiet about
clients hanging up, a handler that answers at once (HTTP/1.1, ``TCP_NODELAY``, no logging),
and a context manager that serves one for the length of a block."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-answer (a timeout, a cancelled stream, a size cap) is
        # expected here; printing its traceback from this thread would race the test thread's
        # use of ast (CPython 3.11 shares its recursion counter between threads).
        return None

    @property
    def base(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class LoopbackHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        return None

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes: without this, the client's delayed ACK
        # adds 40 ms to answers.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


S = TypeVar("S", bound=LoopbackServer)


@contextmanager
def serving(server: S) -> Iterator[S]:
    """Serve ``server`` in a thread for the block; shut down and closed after it."""
    # A short poll: shutdown() waits up to one interval.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
