"""A real HTTP server on 127.0.0.1 serving availability JSON, with faults, for the HTTP
resolver's tests: what it answers is chosen by the path.

- ``/slots?date=D``: ``{"date": D, "slots": ["09:00", "09:30"]}`` (JSON);
- ``/echo/<rest>`` (any method): the method, the raw path, the query, the headers and the
  JSON body it was sent, as JSON;
- ``/text``: a plain-text answer; ``/notjson``: ``{broken`` with a JSON content type;
- ``/e<status>``: that status with ``{"error": {"message": ...}}`` (``/e503?after=2`` adds
  ``Retry-After: 2``; ``/e429?after_ms=250`` adds ``retry-after-ms: 250``);
- ``/flaky/<name>?fail=N``: 503 the first N times for that name, then the slots;
- ``/big?n=N``: N bytes of JSON string (with a Content-Length); ``/chunked?n=N``: N bytes
  sent chunked, without one;
- ``/hangup``: closes the connection without answering;
- ``/leak?token=T``: a 401 whose body repeats the token (a server echoing a secret).

Every request is counted in ``calls`` by path (without the query).
"""

from __future__ import annotations

import json
import socket
import threading
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import parse_qs, urlsplit

from loopback import LoopbackHandler, LoopbackServer, serving


class AvailabilityServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.base

    def count(self, path: str) -> int:
        with self.lock:
            self.calls[path] = self.calls.get(path, 0) + 1
            return self.calls[path]


def availability_server() -> AbstractContextManager[AvailabilityServer]:
    return serving(AvailabilityServer())


class _Handler(LoopbackHandler):
    server: AvailabilityServer

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def do_PUT(self) -> None:
        self._route()

    def do_DELETE(self) -> None:
        self._route()

    def _route(self) -> None:
        parts = urlsplit(self.path)
        path = parts.path
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("content-length", "0") or 0)
        raw = self.rfile.read(length) if length else b""
        seen = self.server.count(path)
        if path == "/slots":
            self._json(200, {"date": query.get("date"), "slots": ["09:00", "09:30"]})
        elif path.startswith("/echo"):
            self._json(
                200,
                {
                    "method": self.command,
                    "path": path,
                    "query": query,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "json": json.loads(raw) if raw else None,
                },
            )
        elif path == "/text":
            self._send(200, b"open all day", "text/plain")
        elif path == "/notjson":
            self._send(200, b"{broken", "application/json")
        elif path.startswith("/flaky/"):
            if seen <= int(query.get("fail", "1")):
                self._json(503, {"error": {"message": "try again"}})
            else:
                self._json(200, {"slots": ["10:00"]})
        elif path == "/big":
            self._send(200, json.dumps("x" * int(query["n"])).encode(), "application/json")
        elif path == "/chunked":
            self._chunked(json.dumps("x" * int(query["n"])).encode())
        elif path == "/hangup":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif path == "/leak":
            self._json(401, {"error": {"message": f"bad token {query.get('token')}"}})
        elif path.startswith("/e") and path[2:].isdigit():
            headers = {}
            if "after" in query:
                headers["Retry-After"] = query["after"]
            if "after_ms" in query:
                headers["retry-after-ms"] = query["after_ms"]
            self._json(int(path[2:]), {"error": {"message": f"status {path[2:]}"}}, headers)
        else:
            self._json(404, {"error": {"message": f"no route {path}"}})

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(body).encode(), "application/json", headers)

    def _send(
        self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _chunked(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for start in range(0, len(body), 4096):
            piece = body[start : start + 4096]
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            except OSError:
                return  # the client stopped reading: its cap
        self.wfile.write(b"0\r\n\r\n")
