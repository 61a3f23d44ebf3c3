"""``slateflow timeline --live``: the timeline page served on 127.0.0.1, following the call.

The page loads what the call holds now, then listens on ``/events`` (server-sent events): the
server reads the store again every ``poll`` seconds (read-only: a file is opened without the
writer's lock, a Redis call is read, never followed) and sends the new changes, with the lanes
worked out again over the whole call. Bounded: at most ``max_clients`` pages follow at once
(more get 503), each event carries at most ``max_batch`` changes, and only ``GET`` is served.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .flow import Flow
from .replay import ReplayCommit, load
from .timeline import call_data, changes_data, guard_readers, lanes, page

__all__ = ["LiveTimeline"]


class LiveTimeline:
    """A read-only server of one call's live timeline; :meth:`start` it, then open
    :attr:`url`; :meth:`close` stops it (also as a context manager)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        call: str | None = None,
        flows: Sequence[Flow] = (),
        port: int = 0,
        poll: float = 0.5,
        max_clients: int = 8,
        max_batch: int = 2000,
    ) -> None:
        self.path, self.call, self.flows = path, call, list(flows)
        self.poll, self.max_batch = poll, max_batch
        self._clients = threading.BoundedSemaphore(max_clients)
        self._stop = threading.Event()
        self._readers = guard_readers(self.flows)
        load(path, call=call, end=1)  # a missing file or call fails here, before serving
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the page is served."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> LiveTimeline:
        """Serve in a thread of its own; returns self."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="slateflow-timeline", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        self._server.serve_forever()

    def close(self) -> None:
        """Stop serving and end every event stream."""
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LiveTimeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the handler does ----------------------------------------------------------------

    def _page(self) -> bytes:
        found = load(self.path, call=self.call)
        label = f"{self.path} call {self.call}" if self.call else str(self.path)
        return page(call_data(found, label, self.flows), live=True).encode()

    def _events(self, send: Any) -> None:
        """Send the changes made after the page was built, until the client goes."""
        commits: list[ReplayCommit] = list(load(self.path, call=self.call).commits)
        last = commits[-1].seq if commits else 0
        quiet = 0.0
        while not self._stop.wait(self.poll):
            fresh = load(self.path, call=self.call, start=last + 1).commits
            if not fresh:
                quiet += self.poll
                if quiet >= 15:  # a comment keeps proxies from closing an idle stream
                    send(b": still here\n\n")
                    quiet = 0.0
                continue
            quiet = 0.0
            for i in range(0, len(fresh), self.max_batch):
                batch = fresh[i : i + self.max_batch]
                commits.extend(batch)
                last = batch[-1].seq
                event = {
                    "changes": changes_data(batch, self._readers),
                    "lanes": lanes(commits, commits[-1].at_ns),
                    "start": commits[0].at_ns,
                    "end": commits[-1].at_ns,
                }
                send(b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        live = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet by default
                return

            def do_GET(self) -> None:
                if self.path in ("/", "/index.html"):
                    body = live._page()
                    self.send_response(HTTPStatus.OK)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == "/events":
                    self._stream()
                else:
                    self.send_error(HTTPStatus.NOT_FOUND)

            def _stream(self) -> None:
                if not live._clients.acquire(blocking=False):
                    self.send_error(
                        HTTPStatus.SERVICE_UNAVAILABLE, "too many pages follow this call"
                    )
                    return
                try:
                    self.send_response(HTTPStatus.OK)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()

                    def send(data: bytes) -> None:
                        self.wfile.write(data)
                        self.wfile.flush()

                    live._events(send)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the page went away
                finally:
                    live._clients.release()

            def _refuse(self) -> None:
                self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, "the timeline is read-only")

            do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

        return Handler


def serve(args: Any, flows: Sequence[Flow]) -> int:
    """``slateflow timeline --live``: serve until interrupted."""
    server = LiveTimeline(args.path, call=args.call, flows=flows, port=args.port)
    print(f"slateflow timeline: following {args.path} at {server.url} (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0
