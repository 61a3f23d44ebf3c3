"""Real redis-server processes for the tests, and a proxy that loses replies.

Tests that need Redis start a real ``redis-server`` on 127.0.0.1 (``.ci/run`` installs Debian's
package). Without the binary they skip with the reason, except under ``CI=true``, where a
missing server is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")


def need_redis_server() -> str:
    """The redis-server binary, or skip (fail under CI=true) saying how to install it."""
    if REDIS_SERVER is None:
        why = "redis-server is not installed (apt-get install -y redis-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI must run the Redis tests")
        pytest.skip(why)
    return REDIS_SERVER


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """One redis-server on 127.0.0.1, started and killed by the test."""

    def __init__(
        self, directory: Path, *, appendonly: bool = False, appendfsync: str = "everysec"
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisProcess:
        """Start it (again, on the same port and directory) and return once it accepts
        connections: read from its log, not waited for."""
        binary = need_redis_server()
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--dir", str(self.directory), "--logfile", "", "--daemonize", "no",
                "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", self.appendfsync]  # fmt: skip
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)  # fmt: skip
        self.process = process
        ready = threading.Event()
        log: list[str] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                log.append(line)
                if "Ready to accept connections" in line:
                    ready.set()
            ready.set()  # it exited

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or process.poll() is not None:
            self.kill()
            raise RuntimeError(f"redis-server did not start: {''.join(log)[-2000:]}")
        return self

    def kill(self) -> None:
        """SIGKILL it (what a crash does) and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self._reaped()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reaped()

    def _reaped(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None


@contextlib.contextmanager
def redis_process(directory: Path, **options: object) -> Iterator[RedisProcess]:
    server = RedisProcess(directory, **options).start()  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


class ReplyDropper:
    """A TCP proxy on 127.0.0.1 in front of a Redis server that loses the reply of every
    other commit (``every=1``: of all of them): the commit script runs on the server, then the
    proxy closes the client's connection instead of passing the reply on."""

    def __init__(self, port: int, *, every: int = 2) -> None:
        import hashlib

        from slateflow.stores.redis_scripts import COMMIT

        self.target = port
        self.every = every
        self.commit = hashlib.sha1(COMMIT.encode()).hexdigest().encode()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped = 0
        self._seen = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            drop = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, drop), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, drop),
                             daemon=True).start()  # fmt: skip

    def _up(self, client: socket.socket, upstream: socket.socket, drop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.commit in data:
                    with self._lock:
                        self._seen += 1
                        if self._seen % self.every == 1 % self.every:
                            drop.set()  # one command at a time: the next reply is its own
                upstream.sendall(data)
        _close(client, upstream)

    def _down(self, client: socket.socket, upstream: socket.socket, drop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if drop.is_set():
                    with self._lock:
                        self.dropped += 1
                    break  # the script ran; its reply is lost with the connection
                client.sendall(data)
        _close(client, upstream)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def wait_for_state(
    state: object, predicate: object, *, timeout: float = 10.0, what: str = ""
) -> None:
    """Block until ``predicate(state)`` holds: checked now and at every batch the state
    delivers (from any thread: the follower's, for another process's commit). Raises
    ``TimeoutError`` after ``timeout`` seconds."""
    held = threading.Event()

    def check(_changes: object = None) -> None:
        if predicate(state):  # type: ignore[operator]
            held.set()

    subscription = state.subscribe(check)  # type: ignore[attr-defined]
    try:
        check()
        if not held.wait(timeout):
            raise TimeoutError(f"waited {timeout}s for {what or predicate!r}")
    finally:
        subscription.close()
