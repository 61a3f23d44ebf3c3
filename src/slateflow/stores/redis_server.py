"""One Redis server as this process uses it: a connection pool, the scripts, one follower.

Every State connected to the same server (same URL and options) shares one
:class:`RedisServer`: its pool serves commits and reads, and its one follower thread
(:mod:`~slateflow.stores.redis_follower`) follows every call the process has open.

Commands run without redis-py's own retries: a script whose reply was lost would otherwise be
sent again silently (redis-py #3554). :meth:`RedisServer.run` says precisely what happened
instead: it raises :class:`NotSent` when the command never reached the server whole (safe to
send again), :class:`NoReply` when it was sent and no reply came (it may have run).
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from ..extras import require

if TYPE_CHECKING:
    from .redis_follower import Follower

__all__ = ["NoReply", "NotSent", "RedisServer"]

_SERVERS: dict[tuple[str, float, float], RedisServer] = {}
_SERVERS_LOCK = threading.Lock()


def _pack(args: tuple[Any, ...] | list[Any]) -> bytes:
    """``args`` as RESP bulk strings (each a str, bytes or int), without the array header."""
    parts = []
    for arg in args:
        data = arg if type(arg) is bytes else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class NotSent(Exception):
    """The command never reached the server whole: it did not run."""


class NoReply(Exception):
    """The command was sent but no reply came back: it may have run."""


def _redis() -> Any:
    return require("redis", "redis", "a State shared on Redis (State.connect)")


class RedisServer:
    """A Redis server's pool, scripts and follower, shared by this process (see the module)."""

    def __init__(self, url: str, *, socket_timeout: float, connect_timeout: float) -> None:
        redis = _redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        try:
            self.pool = redis.ConnectionPool.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
                retry=Retry(NoBackoff(), 0),
                protocol=2,  # RESP2: pub/sub messages are plain replies (RESP3 pushes them)
            )
        except ValueError as exc:
            raise StoreError(f"Redis URL {url!r}: {exc}; give redis://host:port/db") from None
        self.client = redis.Redis(connection_pool=self.pool)
        self._errors: tuple[type[BaseException], ...] = (
            redis.ConnectionError,
            redis.TimeoutError,
            OSError,
        )
        self._response_error: type[Exception] = redis.ResponseError
        self._no_script: type[Exception] = redis.exceptions.NoScriptError
        self._shas: dict[str, str] = {}
        self._heads: dict[tuple[str, tuple[str, ...]], bytes] = {}
        self._follower: Follower | None = None
        self._lock = threading.Lock()
        # Commits go out on a connection per thread, outside the pool: one command at a time,
        # with none of the pool's bookkeeping on the path of every write.
        self._local = threading.local()

    @classmethod
    def get(cls, url: str, *, socket_timeout: float, connect_timeout: float) -> RedisServer:
        """The process's :class:`RedisServer` for ``url`` with these timeouts (made once)."""
        key = (url, socket_timeout, connect_timeout)
        with _SERVERS_LOCK:
            server = _SERVERS.get(key)
            if server is None:
                server = _SERVERS[key] = cls(
                    url, socket_timeout=socket_timeout, connect_timeout=connect_timeout
                )
            return server

    @property
    def where(self) -> str:
        """The server's address as a message names it (no password)."""
        kwargs = self.pool.connection_kwargs
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions that mean the server could not be reached or did not answer."""
        return self._errors

    def follower(self) -> Follower:
        """The follower thread of this server (made on first use)."""
        with self._lock:
            if self._follower is None:
                from .redis_follower import Follower

                self._follower = Follower(self)
            return self._follower

    # -- running commands ---------------------------------------------------------------------

    def run(self, script: str, keys: tuple[str, ...], args: list[Any]) -> Any:
        """Run ``script`` once (by its SHA, loading it when the server lacks it) and return its
        reply; raises :class:`NotSent`, :class:`NoReply` or ``StoreError`` (the server refused
        it)."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        head = self._heads.get((sha, keys))
        if head is None:  # the same for every commit of a call: packed once
            head = self._heads[sha, keys] = _pack(("EVALSHA", sha, len(keys), *keys))
        command = b"*%d\r\n%s%s" % (3 + len(keys) + len(args), head, _pack(args))
        try:
            return self._send(command)
        except self._no_script:
            pass
        except self._response_error as exc:
            raise StoreError(f"{self.where} refused a slateflow script: {exc}") from None
        self._send(b"*3\r\n" + _pack(("SCRIPT", "LOAD", script)))  # the server lost its scripts
        try:
            return self._send(command)
        except self._response_error as exc:
            raise StoreError(f"{self.where} refused a slateflow script: {exc}") from None

    def _send(self, command: bytes) -> Any:
        """Send ``command`` (packed) on this thread's own connection and read its reply."""
        conn = getattr(self._local, "conn", None)
        sent = False
        try:
            if conn is None:
                conn = self._local.conn = self.pool.connection_class(**self.pool.connection_kwargs)
            try:
                # A connection the server closed (or left data on) still accepts a send: only
                # a reply that never comes would tell, and that would make the outcome unknown.
                if conn.can_read(timeout=0):
                    raise ConnectionError("unexpected data on an idle connection")
            except self._errors:
                conn.disconnect()
                conn.connect()
            conn.send_packed_command([command], check_health=False)
            sent = True
            return conn.read_response()
        except self._errors as exc:
            if conn is not None:
                conn.disconnect()
            raise (NoReply if sent else NotSent)(f"{self.where}: {exc}") from None

    def read(self, what: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` (a read through :attr:`client`), sent again once when the connection
        fails (a read is safe to repeat); raises ``StoreUnavailableError`` naming ``what``."""
        from ..errors import StoreUnavailableError

        for attempt in range(2):
            try:
                return fn(*args)
            except self._errors as exc:
                if attempt:
                    raise StoreUnavailableError(
                        f"{what}: {self.where} cannot be reached ({exc}); the local replica keeps "
                        "serving reads"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover
