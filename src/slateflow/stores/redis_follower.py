"""The follower: one thread per Redis server and process, following every call it has open.

Each commit is published on its call's channel (sharded pub/sub) by the script that made it.
The follower holds one connection of its own in subscribe mode (a blocked read on a pooled
connection would starve the writers), subscribed to the channel of every call a replica of
this process follows, and hands each commit to those replicas in its own thread, where they
apply it as a write of another thread would be (subscribers, watchers, flows react there).

A subscription is confirmed before the follower catches the replica up from the call's stream:
a commit published before the subscription took is fetched, one published after it arrives as
a message; a replica skips what it already applied. When the connection fails the follower
reconnects with a backoff (at most half a second apart), subscribes again and checks every
call's history against its replica: the server's newest commit and the chain of commit ids
show a history the replica cannot account for (a server restarted without its data, or with
the last second of its AOF lost), which the replica then resyncs from a snapshot.

It works under asyncio and trio alike: it is a thread with a synchronous client.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import StoreCorruptError
from .records import decode_commit
from .shared import Remote, Replica

if TYPE_CHECKING:
    from .redis_scripts import CallKeys
    from .redis_server import RedisServer

__all__ = ["Follower", "fetch", "parse_remote"]

log = logging.getLogger("slateflow.stores")

_MAX_BACKOFF = 0.5
_POLL = 0.25  # how often an idle follower looks at its to-do list (it is woken sooner)
_PAGE = 1000


def parse_remote(payload: bytes, where: str) -> Remote:
    """A published commit, ``b"<seq> <id> <prev> <commit JSON>"``, as a :class:`Remote`."""
    try:
        seq, commit_id, prev, text = payload.decode().split(" ", 3)
        remote = Remote(int(seq), commit_id, prev, decode_commit(text, where))
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreCorruptError(f"{where}: a published commit is unreadable ({exc})") from None
    if remote.commit[0] != remote.seq:
        raise StoreCorruptError(f"{where}: commit {remote.commit[0]} published as {remote.seq}")
    return remote


def _header(payload: bytes) -> tuple[int, str]:
    """The seq and commit id a published commit starts with (``(0, "")`` if unreadable: the
    full parse then says what is wrong)."""
    head = payload[:96].split(b" ", 2)
    try:
        return int(head[0]), head[1].decode()
    except (ValueError, IndexError, UnicodeDecodeError):
        return 0, ""


def fetch(server: RedisServer, keys: CallKeys, after: int, upto: int | None) -> list[Remote]:
    """The commits of a call with ``after < seq <= upto`` from its stream, in order."""
    out: list[Remote] = []
    start = f"{after + 1}-0"
    end = "+" if upto is None else f"{upto}-0"
    base = f"{server.where} {keys.log} commit"
    while True:
        page = server.read(f"fetching the commits of {keys.log}", server.client.xrange,
                           keys.log, start, end, _PAGE)  # fmt: skip
        for entry_id, fields in page:
            seq = int(entry_id.split(b"-")[0])
            where = f"{base} {seq}"
            try:
                text = fields[b"c"].decode()
                commit_id = fields[b"i"].decode()
                prev = fields[b"p"].decode()
            except (KeyError, UnicodeDecodeError):
                raise StoreCorruptError(f"{where}: not a slateflow commit entry") from None
            out.append(Remote(seq, commit_id, prev, decode_commit(text, where)))
        if len(page) < _PAGE:
            return out
        start = f"{out[-1].seq + 1}-0"


@dataclass(eq=False)
class _Call:
    keys: CallKeys
    replica: Replica
    ready: threading.Event = field(default_factory=threading.Event)
    """Set once the replica was caught up after its channel's subscription was confirmed
    (cleared when the connection is lost)."""


class Follower:
    """Follows every call this process has open on one server (see the module)."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._calls: dict[str, list[_Call]] = {}
        self._thread: threading.Thread | None = None
        self._control = f"slateflow:follower:{uuid.uuid4().hex}"
        self._confirmed: set[str] = set()  # channels whose subscription the server confirmed
        self._changed = True  # calls came or went since the thread last looked
        self.reconnects = 0
        """How many times the follower has reconnected (for tests and the bench)."""

    def follow(self, keys: CallKeys, replica: Replica, *, wait: float) -> Callable[[], None]:
        """Hand the commits of ``keys``'s call to ``replica`` from now on (waiting up to
        ``wait`` seconds for the subscription and the catch-up); returns the function that
        stops it."""
        call = _Call(keys, replica)
        with self._lock:
            self._calls.setdefault(keys.channel, []).append(call)
            self._changed = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="slateflow-redis-follower", daemon=True
                )
                self._thread.start()
        self._wake()
        call.ready.wait(wait)

        def stop() -> None:
            with self._lock:
                calls = self._calls.get(keys.channel, [])
                if call in calls:
                    calls.remove(call)
                if not calls:
                    self._calls.pop(keys.channel, None)
                self._changed = True
            self._wake()

        return stop

    def _wake(self) -> None:
        # A server gone is found by the thread itself, which reconnects.
        with contextlib.suppress(*self.server.errors):
            self.server.client.publish(self._control, b"")

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.05
        conn: Any = None
        subscribed: set[str] = set()
        wanted: set[str] = set()
        while True:
            waiting: list[_Call] = []
            with self._lock:
                # Worked out again only when calls come or go (or the connection is new): with
                # a thousand calls open, doing it for every message would cost more than the
                # message.
                changed, self._changed = self._changed or conn is None, False
                if changed:
                    wanted = set(self._calls)
                    if not wanted:
                        self._thread = None
                        if conn is not None:
                            conn.disconnect()
                        return
                    waiting = [c for ch in self._confirmed & wanted for c in self._calls[ch]
                               if not c.ready.is_set()]  # fmt: skip
            try:
                if conn is None:
                    conn = self._connect()
                    subscribed = set()
                if changed:
                    new, gone = wanted - subscribed, subscribed - wanted
                    if new:
                        conn.send_command("SSUBSCRIBE", *sorted(new))
                        subscribed |= new
                    if gone:
                        conn.send_command("SUNSUBSCRIBE", *sorted(gone))
                        subscribed -= gone
                        with self._lock:
                            self._confirmed -= gone
                for call in waiting:  # a replica joining a channel already subscribed
                    self._catch_up(call)
                    call.ready.set()
                if conn.can_read(timeout=_POLL):
                    self._handle(conn.read_response())
                backoff = 0.05
            except self.server.errors as exc:
                log.warning("slateflow: the follower lost %s (%s); reconnecting", self.server.where,
                            exc)  # fmt: skip
                if conn is not None:
                    conn.disconnect()
                conn = None
                with self._lock:
                    self._confirmed.clear()
                    for calls in self._calls.values():
                        for call in calls:
                            call.ready.clear()  # checked and caught up again once resubscribed
                self.reconnects += 1
                threading.Event().wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
            except Exception:  # a bug must not stop every call's replicas for good
                log.exception("slateflow: the follower of %s failed", self.server.where)
                with self._lock:
                    self._changed = True  # whatever was under way is looked at again

    def _connect(self) -> Any:
        pool = self.server.pool
        conn = pool.connection_class(**pool.connection_kwargs)
        conn.connect()
        conn.send_command("SUBSCRIBE", self._control)
        return conn

    def _handle(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind = reply[0]
        channel = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        if kind == b"smessage":
            seq, commit_id = _header(reply[2])
            calls = [c for c in self._replicas(channel) if not c.replica.skips(seq, commit_id)]
            if calls:
                remote = parse_remote(reply[2], f"{self.server.where} {channel}")
                for call in calls:
                    self._deliver(call, [remote])
        elif kind == b"ssubscribe":
            with self._lock:
                self._confirmed.add(channel)
            for call in self._replicas(channel):
                self._catch_up(call)
                call.ready.set()

    def _replicas(self, channel: str) -> list[_Call]:
        with self._lock:
            return list(self._calls.get(channel, ()))

    def _catch_up(self, call: _Call) -> None:
        """Check the call's history on the server against the replica, then hand it what it
        has not applied."""
        seq, head = call.replica.position()
        server = self.server
        found = server.read(f"reading {call.keys.head}", server.client.hmget, call.keys.head,
                            "seq", "head")  # fmt: skip
        their_seq = int(found[0] or 0)
        their_head = (found[1] or b"").decode()
        if their_seq < seq or (their_seq == seq and their_head != head):
            call.replica.diverged(
                f"{server.where} holds the call's commits up to seq {their_seq}"
                + ("" if their_seq < seq else f" (commit {their_head}, not {head})")
                + f", and this replica applied up to seq {seq}"
            )
            return
        if their_seq > seq:
            self._deliver(call, fetch(server, call.keys, seq, None))

    def _deliver(self, call: _Call, remotes: list[Remote]) -> None:
        try:
            call.replica.receive(remotes)
        except self.server.errors:
            raise
        except Exception:
            log.exception("slateflow: a replica of %s failed to apply commits", call.keys.log)
