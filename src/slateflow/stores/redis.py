"""RedisStore: one call's State shared on Redis by every process that connects to it.

``State.connect(url, call_id)`` opens a State over a :class:`RedisStore` (``pip install
'slateflow[redis]'``). Redis decides the order of the call's commits and the versions of its
keys; every process keeps a replica in memory for reads and follows the call's commits
(:mod:`~slateflow.stores.redis_follower`). What is kept on the server, and the scripts that
change it, are in :mod:`~slateflow.stores.redis_scripts`.

A commit is one round trip (a Lua script). It carries an id, so sending it again after a lost
reply never applies it twice: the connection does not retry by itself, and
:meth:`RedisStore.propose` sends a commit again (with its id) only when it cannot tell whether
the first one ran, at most ``commit_attempts`` times in all. It then raises
:class:`~slateflow.errors.StoreUnavailableError` (nothing was committed) or
:class:`~slateflow.errors.CommitUnknownError` (it may have been).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import (
    CommitUnknownError,
    StateValueError,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from .base import Durability
from .records import (
    CommitRow,
    EntryRow,
    Loaded,
    decode_entries,
    encode_canonical,
    encode_entries,
    encode_value,
)
from .redis_follower import fetch, parse_remote
from .redis_scripts import COMMIT, COMPACT, SNAPSHOT, CallKeys, check_call_id
from .redis_server import NoReply, NotSent, RedisServer
from .shared import Committed, Conflict, Proposal, Remote, Replica, Snapshot, Unchanged

__all__ = ["RedisStore"]

_CONTAINERS = (dict, list)


class RedisStore:
    """One call's commits on a Redis server, shared by every process connected to it.

    ``url``: ``redis://host:port/db`` (``rediss://`` for TLS; a password or ACL user in the
    URL); ``call_id``: the call (letters, digits, punctuation other than braces); ``prefix``:
    the namespace of slateflow's keys on the server. ``socket_timeout``: how long a command may
    wait for its reply; ``commit_attempts``: how many times a commit whose outcome is unknown
    is sent (with the same id).

    Its ``durability`` is the server's: with ``appendonly yes`` and ``appendfsync always`` an
    acknowledged commit survives a crash of the server; with ``everysec`` the last second may
    be lost, and the replicas detect it (see ``docs/distributed.md``).
    """

    durability: Durability = "batch"

    def __init__(
        self,
        url: str,
        call_id: str,
        *,
        prefix: str = "slateflow",
        socket_timeout: float = 5.0,
        connect_timeout: float = 2.0,
        commit_attempts: int = 3,
    ) -> None:
        if commit_attempts < 1:
            raise ValueError(f"commit_attempts must be at least 1, got {commit_attempts!r}")
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
        self.call_id = check_call_id(call_id)
        self.url = url
        self.prefix = prefix
        self.keys = CallKeys.of(prefix, call_id)
        self.server = RedisServer.get(
            url, socket_timeout=socket_timeout, connect_timeout=connect_timeout
        )
        self.commit_attempts = commit_attempts
        self.error: Exception | None = None
        self._stamps: dict[tuple[str, str | None, float | None], str] = {}
        self._unfollow: Callable[[], None] | None = None

    @property
    def where(self) -> str:
        """The call as messages name it: server and call id."""
        return f"call {self.call_id!r} on {self.server.where}"

    # -- committing ----------------------------------------------------------------------------

    def propose(self, proposal: Proposal) -> Committed | Unchanged | Conflict:
        """Commit ``proposal`` (see :class:`~slateflow.stores.shared.SharedStore`)."""
        if self.error is not None:
            raise self.error
        args = self._args(proposal)
        maybe = False
        why = ""
        for attempt in range(self.commit_attempts):
            if attempt > 1:
                time.sleep(0.01 * 2**attempt)  # a server restarting, a failover
            try:
                reply = self.server.run(COMMIT, self.keys.commit_keys, args)
            except NotSent as exc:
                why = str(exc)
                continue
            except NoReply as exc:
                maybe, why = True, str(exc)
                continue
            return self._outcome(reply, len(proposal.changes))
        if maybe:
            raise CommitUnknownError(
                f"commit {proposal.commit_id} of {self.where}: sent, but no reply came back "
                f"after {self.commit_attempts} attempts ({why}); it may have been applied (never "
                "twice): read the keys again before retrying"
            )
        raise StoreUnavailableError(
            f"{self.where} cannot be reached ({why}); nothing was written and the local replica "
            "keeps serving reads: write again once the server is back"
        )

    def _args(self, proposal: Proposal) -> list[Any]:
        args: list[Any] = [proposal.commit_id, str(proposal.at_ns), encode_value(proposal.origin),
                           proposal.after, len(proposal.checks)]  # fmt: skip
        for key, version in proposal.checks.items():
            args += (key, version)
        args.append(len(proposal.changes))
        stamps = self._stamps
        for change in proposal.changes:
            key = change.key
            if change.removed:
                value_json = canonical = ""
            else:
                value = change.value
                try:
                    value_json = encode_value(value)
                    canonical = encode_canonical(value) if type(value) in _CONTAINERS else ""
                except (ValueError, TypeError, RecursionError) as exc:
                    raise StateValueError(
                        f"{key!r}: the value cannot be sent to {self.where} as JSON ({exc}); "
                        "store it in a form JSON can hold (a string, say)"
                    ) from None
                if canonical == value_json:
                    canonical = ""
            if change.meta:
                stamp = encode_value([change.source, change.writer, change.confidence,
                                      change.meta])[1:-1]  # fmt: skip
            else:
                parts = (change.source, change.writer, change.confidence)
                stamp = stamps.get(parts, "")
                if not stamp:
                    stamp = encode_value([*parts, None])[1:-1]
                    if len(stamps) < 1024:
                        stamps[parts] = stamp
            args += (key, encode_value(key), value_json, canonical, stamp,
                     "r" if change.refresh else "")  # fmt: skip
        args.append(self.keys.channel)
        return args

    def _outcome(self, reply: Any, changes: int) -> Committed | Unchanged | Conflict:
        try:
            kind = reply[0]
            if kind == b"ok":
                end = 3 + changes
                missed = tuple(parse_remote(r, self.where) for r in reply[end:])
                return Committed(
                    int(reply[1]), reply[2].decode(), tuple(map(int, reply[3:end])), missed
                )
            if kind == b"noop":
                return Unchanged(int(reply[1]), reply[2].decode())
            if kind == b"conflict":
                value = reply[3].decode() if len(reply) > 3 and reply[3] else None
                return Conflict(reply[1].decode(), int(reply[2]), value)
            if kind == b"dup":
                return Committed(int(reply[1]), "", None)
        except (IndexError, TypeError, ValueError, AttributeError):
            pass
        raise StoreCorruptError(f"{self.where}: the commit script replied {reply!r:.120}")

    # -- reading -------------------------------------------------------------------------------

    def head(self) -> tuple[int, str]:
        """The seq and id of the call's newest commit (``(0, "")`` for a new call)."""
        keys = self.keys
        seq, head = self._read("reading the head of", lambda: self.server.client.hmget(
            keys.head, "seq", "head"))  # fmt: skip
        return int(seq or 0), (head or b"").decode()

    def snapshot(self) -> Snapshot:
        """The call's entries as of its newest commit, read at one moment."""
        keys = self.keys
        reply = self._read("reading", lambda: self.server.run(
            SNAPSHOT, (keys.head, keys.entries, keys.values), []))  # fmt: skip
        seq, head, entries, values = reply
        seq = int(seq)
        where = f"{self.where}, the entries at seq {seq}"
        by_key = dict(zip(values[::2], values[1::2], strict=True))
        text = []
        for raw_key, meta in zip(entries[::2], entries[1::2], strict=True):
            value = by_key.get(raw_key)
            if value is None:
                raise StoreCorruptError(f"{where}: {raw_key!r} has no value")
            # [version, seq, at, source, writer, conf, meta] -> [key, value, ...]
            text.append(f"[{encode_value(raw_key.decode())},{value.decode()},{meta.decode()[1:]}")
        base = decode_entries(f"[{','.join(text)}]", seq)
        return Snapshot(Loaded(seq, base, []), head.decode())

    def load(self) -> Loaded:
        """The call now: its entries as a base at the newest seq (no commits)."""
        return self.snapshot().loaded

    def read(self, upto: int | None = None) -> Loaded:
        """The base of the last compaction and the commits after it up to ``upto``."""
        keys = self.keys
        base_seq, text = self._read("reading the history", lambda: (
            int(self.server.client.hget(keys.head, "base") or 0),
            self.server.client.get(keys.base)))  # fmt: skip
        base = decode_entries(text.decode(), base_seq) if text else []
        if upto is not None and upto <= base_seq:
            return Loaded(base_seq, base, [])
        return Loaded(base_seq, base, [r.commit for r in self.fetch(base_seq, upto)])

    def fetch(self, after: int, upto: int | None = None) -> list[Remote]:
        """The commits with ``after < seq <= upto`` the call's stream still holds."""
        return fetch(self.server, self.keys, after, upto)

    def commits(self, after: int = 0, upto: int | None = None) -> Iterator[CommitRow]:
        """The stored commits with ``after < seq <= upto``, in order."""
        for remote in self.fetch(after, upto):
            yield remote.commit

    def _read(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, a command safe to send again (a read, or a write of the same value), sent
        up to ``commit_attempts`` times while no reply comes."""
        for attempt in range(self.commit_attempts):
            try:
                return fn()
            except (NotSent, NoReply, *self.server.errors) as exc:  # type: ignore[misc]
                if attempt + 1 == self.commit_attempts:
                    raise StoreUnavailableError(
                        f"{what} {self.where}: the server cannot be reached ({exc})"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    # -- following, the rest of the Store seam ------------------------------------------------

    def follow(self, replica: Replica) -> Callable[[], None]:
        """Hand every later commit of the call to ``replica`` (from the follower's thread)."""
        stop = self.server.follower().follow(self.keys, replica, wait=self.server.socket_timeout)
        self._unfollow = stop
        return stop

    def append(self, commit: CommitRow) -> None:
        """Refused: a shared store takes proposals (:meth:`propose`), it decides the seq."""
        raise StoreError(f"{self.where}: a shared store decides the order; propose commits")

    def sync(self, seq: int | None = None) -> None:
        """Nothing to wait for: a commit is on the server when :meth:`propose` returns."""
        if self.error is not None and not isinstance(self.error, StoreClosedError):
            raise self.error

    def compact(self, seq: int, entries: list[EntryRow]) -> None:
        """Drop the call's commits up to ``seq`` from the server, keeping ``entries`` (the
        state as of ``seq``) as the base history reads start from."""
        keys = self.keys
        self._read("compacting", lambda: self.server.run(
            COMPACT, (keys.head, keys.log, keys.ids, keys.base),
            [seq, encode_entries(entries)]))  # fmt: skip

    def close(self) -> None:
        """Stop following the call; later commits through this store are refused. The call's
        keys stay on the server (other processes may still use them)."""
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
        self.error = StoreClosedError(
            f"{self.where}: this State was closed; State.connect again to write"
        )

    # -- checkpoints (resumable workflows) -----------------------------------------------------

    def load_checkpoint(self, workflow_id: str) -> str | None:
        """The checkpoint saved for ``workflow_id`` on the call, or None."""
        found = self._read("reading a checkpoint of", lambda: self.server.client.hget(
            self.keys.checkpoints, workflow_id))  # fmt: skip
        return None if found is None else bytes(found).decode()

    def save_checkpoint(self, workflow_id: str, data: str) -> None:
        """Save (replace) the checkpoint of ``workflow_id``."""
        self._read("saving a checkpoint of", lambda: self.server.client.hset(
            self.keys.checkpoints, workflow_id, data))  # fmt: skip

    def delete_checkpoint(self, workflow_id: str) -> None:
        """Forget the checkpoint of ``workflow_id``."""
        self._read("deleting a checkpoint of", lambda: self.server.client.hdel(
            self.keys.checkpoints, workflow_id))  # fmt: skip

    def __repr__(self) -> str:
        return f"<RedisStore {self.where}>"
