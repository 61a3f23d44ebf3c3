"""The State: a governed, observable, thread-safe key-value blackboard."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Self, TypeVar, overload

from blinker import Signal

from ..errors import (
    MissingKeyError,
)
from ..stores.base import Durability, Store
from . import governance, persistence, snapshots, waits, writes
from .actors import Actor
from .engine import Engine, Row
from .journal import Journal
from .keys import KNOWN_VALID, META_PREFIX, Key, check_key, key_name
from .keys import key_list as _key_list
from .policy import Policy
from .provenance import Provenance
from .records import Change, Entry
from .sealing import EncryptionKey
from .sinks import JournalSink
from .snapshots import missing, typed
from .subscriptions import Callback, Subscription, on_transition
from .transaction import Transaction
from .values import JSON, MISSING, Prefix, copy_json
from .when import Transition

__all__ = ["State"]

T = TypeVar("T")
log = logging.getLogger("slateflow.state")


_MISSING = MISSING
_CONTAINERS = (dict, list, Prefix)


class State:
    """The governed blackboard: JSON values under ``:``-separated keys, with versions,
    provenance, schemas, policies, transactions, a journal and change signals.

    Every method is synchronous, thread-safe and cheap; the ``wait_*`` methods are async (anyio,
    so asyncio and trio). Reads return private copies, so mutating what you read (or what you
    wrote) never changes the state.

    ``policy``: governance rules (:class:`Policy`); ``journal_size``: records kept in the
    in-memory journal ring (0 disables it); ``clock``: a ``time.time``-like function for
    provenance times; ``sinks``: journal sinks fed every batch; ``store``: where committed
    batches are kept (a ``MemoryStore``, or a durable ``SQLiteStore`` whose contents the new
    state recovers exactly). ``State.open(path)`` opens a durable state in one call.
    """

    changed: Signal
    """The blinker signal every reaction to the State receives from, flows included: sent once
    per committed batch, ``receiver(state, changes=tuple_of_Change)``. Connect with a key as the
    sender to receive only the batches that change it; ``muted()`` mutes every receiver.
    Receivers run in the order they were connected (see :mod:`slateflow.state.delivery`)."""

    receiver_failed: Signal
    """Sent when a subscriber, watcher, signal receiver or sink raises:
    ``receiver(state, receiver=..., error=exc, changes=...)``."""

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        journal_size: int = 1024,
        clock: Callable[[], float] | None = None,
        sinks: Iterable[JournalSink] = (),
        store: Store | None = None,
    ) -> None:
        self._policy = policy if policy is not None else Policy()
        engine = Engine(self, policy=self._policy, journal_size=journal_size, clock=clock)
        self.engine = engine
        """The commit path under this State (:class:`~slateflow.state.engine.Engine`): the
        runtime API the flow and resolve layers use; applications write through the State."""
        # Aliases of the engine's own objects, so the hot reads take one attribute lookup.
        self._engine = engine
        self._entries = engine.entries
        self._lock = engine.lock
        self.changed = engine.delivery.changed
        self.receiver_failed = engine.delivery.receiver_failed
        self._context = engine.context
        self.journal = Journal(engine, self._past)
        """The journal: the commits since a cursor, sinks, the state as it was at a commit,
        compaction (see :class:`~slateflow.state.journal.Journal`)."""
        for sink in sinks:
            engine.add_sink(sink)
        if store is not None:
            persistence.attach(engine, store)
            governance.record_secrets(engine)

    # -- small internals shared with transactions and views ----------------------------------

    def _typed(self, key: Key[T], raw: JSON) -> T:
        return typed(key, raw, self._secret(key.name))

    def _tx(self) -> Transaction | None:
        return self._context.transaction()

    def _secret(self, key: str) -> bool:
        return self._policy.is_secret(key)

    def _past(self, loaded: Any) -> State:
        """A detached State holding ``loaded`` (the journal's ``at``)."""
        past = type(self)(policy=self._policy, journal_size=self._engine.ring.size)
        past._engine.recover(loaded)
        return past

    # -- reads -------------------------------------------------------------------------------

    @overload
    def get(self, key: Key[T], default: None = None) -> T | None: ...
    @overload
    def get(self, key: Key[T], default: T) -> T: ...
    @overload
    def get(self, key: str, default: Any = None) -> Any: ...

    def get(self, key: str | Key[Any], default: Any = None) -> Any:
        """The value at ``key`` (a private copy), or ``default`` if the key is not set; with a
        :class:`Key`, validated into its type. ``"state_meta:<key>"`` is ``<key>``'s
        provenance as a dict (seed compatibility)."""
        if self._context.tx_open and (tx := self._tx()) is not None:
            return tx.get(key, default)
        try:
            row = self._entries.get(key)  # type: ignore[arg-type]
        except TypeError:
            row = None
        if row is None:
            return self._get_missing(key, default)
        value = row[0]
        if type(value) in _CONTAINERS:
            return copy_json(value)
        return value

    def _get_missing(self, key: object, default: Any) -> Any:
        if type(key) is str and key in KNOWN_VALID and not key.startswith(META_PREFIX):
            return default  # a valid key that is not set (a state_meta: view reads provenance)
        return missing(self._entries, key, default, self._secret)

    def __getitem__(self, key: str | Key[Any]) -> Any:
        """``state[key]``: the value at ``key``; raises :class:`MissingKeyError` (a
        ``KeyError``) naming it if absent."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise MissingKeyError(
                f"required key {key_name(key)!r} is not set; set it first or use get() "
                "with a default"
            )
        return value

    def __contains__(self, key: str | Key[Any]) -> bool:
        """``key in state``: whether ``key`` is set (an invalid key raises)."""
        if self._context.tx_open and (tx := self._tx()) is not None:
            return key in tx
        if type(key) is str:
            if key in self._entries:
                return True
            check_key(key)  # an invalid key is an error, not merely absent
            return False
        return self._row(key) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, key: str | Key[Any]) -> Entry | None:
        """The key's value with version, seq, provenance and update time, or None if absent
        (inside a transaction: the committed entry; buffered writes have no version yet)."""
        name = key_name(key)
        row = self._row(name)
        return None if row is None else snapshots.entry(name, row, self._secret(name))

    def version(self, key: str | Key[Any]) -> int:
        """The key's current version (0 when it is not set)."""
        row = self._row(key)
        return 0 if row is None else row[1]

    def provenance(self, key: str | Key[Any]) -> Provenance | None:
        """Who wrote the key's current value, how and when; None if the key is not set."""
        row = self._row(key)
        return None if row is None else row[4].provenance(row[3])

    def _row(self, key: str | Key[Any]) -> Row | None:
        name = key_name(key)
        row = self._entries.get(name)
        if row is None:
            check_key(name)  # an invalid key is an error, not merely absent
        return row

    def _keys(self, prefix: str) -> list[str]:
        # Under the lock, so a multi-key read never sees half of another thread's batch.
        with self._lock:
            if not prefix:
                return list(self._entries)
            return [k for k in self._entries if k.startswith(prefix)]

    def keys(self, prefix: str = "") -> list[str]:
        """The keys starting with ``prefix``, in the order they were created."""
        if self._context.tx_open and (tx := self._tx()) is not None:
            return tx.keys(prefix)
        return self._keys(prefix)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """``(key, value)`` pairs for the keys starting with ``prefix`` (values are copies)."""
        if self._context.tx_open and (tx := self._tx()) is not None:
            return tx.items(prefix)
        entries = self._entries
        with self._lock:
            rows = [(k, entries[k][0]) for k in self._keys(prefix)]
        return [(k, copy_json(v)) for k, v in rows]

    def pick(self, *keys: str | Key[Any]) -> dict[str, Any]:
        """A dict of the given keys that are set, with their values, read in one view."""
        if self._context.tx_open and (tx := self._tx()) is not None:
            return tx.pick(*(key_name(k) for k in keys))
        with self._lock:
            rows = [(key_name(key), self._row(key)) for key in keys]
        return {k: copy_json(row[0]) for k, row in rows if row is not None}

    # -- writes ------------------------------------------------------------------------------

    def set(
        self,
        key: str | Key[Any],
        value: Any,
        *,
        source: str = "user",
        writer: str | None = None,
        confidence: float | None = None,
        meta: Mapping[str, Any] | None = None,
        expected_version: int | None = None,
    ) -> int:
        """Write ``value`` at ``key``; returns the key's new version. ``source``/``writer``/
        ``confidence``/``meta`` become the value's provenance.
        ``expected_version=v`` makes the write conditional (``0``: the key must not exist) and
        raises :class:`VersionConflictError` otherwise. Writing a value equal to the current one
        is a no-op: same version, no journal record, no signal. Any failure writes nothing.
        """
        engine = self._engine
        if self._context.fenced:  # an acting_as block or a transaction is open somewhere
            context = self._context
            if context.acting and (actor := context.actor()) is not None:
                source, writer = actor.admit(key_name(key), source, writer)
            if (tx := context.transaction()) is not None:
                return tx.set(key, value, source=source, writer=writer, confidence=confidence,
                              meta=meta, expected_version=expected_version)  # fmt: skip
        if meta is None and source == "user" and writer is None and confidence is None:
            stamp = engine.default_stamp
        else:
            stamp = engine.stamp(key, source, writer, confidence, meta)
        return engine.write(key, value, stamp, expected_version)

    def update(
        self,
        mapping: Mapping[str | Key[Any], Any],
        *,
        source: str = "user",
        writer: str | None = None,
        confidence: float | None = None,
        meta: Mapping[str, Any] | None = None,
        remove: str | Key[Any] | Iterable[str | Key[Any]] = (),
        expected_versions: Mapping[str | Key[Any], int] | None = None,
    ) -> int:
        """Write several keys (and remove the ``remove`` keys that exist) as one atomic batch.

        Every value is validated before anything is written; one bad value fails the whole
        batch. ``expected_versions`` makes it conditional per key. Returns the commit's ``seq``
        (the current cursor if nothing changed).
        """
        engine = self._engine
        context = self._context
        if context.fenced:
            source, writer = context.admit([*mapping, *_key_list(remove)], source, writer)
            if (tx := context.transaction()) is not None:
                return tx.update(mapping, source=source, writer=writer, confidence=confidence,
                                 meta=meta, remove=remove,
                                 expected_versions=expected_versions)  # fmt: skip
        stamp = engine.stamp(next(iter(mapping), "update"), source, writer, confidence, meta)
        ops, expected = engine.stage_update(mapping, stamp, remove, expected_versions)
        return engine.commit(ops, "update", expected=expected)

    def remove(
        self,
        key: str | Key[Any],
        default: Any = _MISSING,
        *,
        source: str = "user",
        writer: str | None = None,
    ) -> Any:
        """Remove ``key`` and return its value; if absent, return ``default`` or raise
        :class:`MissingKeyError` when no default is given (like ``dict.pop``)."""
        engine = self._engine
        context = self._context
        if context.fenced:
            source, writer = context.admit([key], source, writer)
            if (tx := context.transaction()) is not None:
                return tx.remove(key, default, source=source, writer=writer)
        return writes.remove(engine, key, default, engine.stamp(key, source, writer, None, None))

    def modify(
        self,
        key: str | Key[Any],
        default: Any,
        fn: Callable[[Any], Any],
        *,
        source: str = "user",
        writer: str | None = None,
        confidence: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Any:
        """Atomically replace the value with ``fn(current)`` (``fn(default)`` if absent); returns
        the new value. Concurrent ``modify`` calls never lose an update. ``fn`` runs under the
        state's lock: keep it quick. On a shared State it may run more than once (a
        compare-and-set loop: another process changed the key between read and commit)."""
        engine = self._engine
        context = self._context
        if context.fenced:
            source, writer = context.admit([key], source, writer)
            if (tx := context.transaction()) is not None:
                return tx.modify(
                    key, default, fn, source=source, writer=writer, confidence=confidence, meta=meta
                )
        stamp = engine.stamp(key, source, writer, confidence, meta)
        return writes.modify(engine, key, default, fn, stamp)

    def rename(
        self,
        old: str,
        new: str,
        *,
        overwrite: bool = False,
        source: str = "user",
        writer: str | None = None,
    ) -> int:
        """Move ``old``'s value to ``new`` in one batch, keeping its provenance; returns
        ``new``'s version. Raises :class:`MissingKeyError` if ``old`` is absent and
        :class:`KeyExistsError` if ``new`` exists (unless ``overwrite=True``)."""
        engine = self._engine
        context = self._context
        if context.fenced:
            source, writer = context.admit([old, new], source, writer)
            if (tx := context.transaction()) is not None:
                return tx.rename(old, new, overwrite=overwrite, source=source, writer=writer)
        stamp = engine.stamp(old, source, writer, None, None)
        return writes.rename(engine, old, new, overwrite, stamp)

    def clear_prefix(
        self, prefix: str | tuple[str, ...], *, source: str = "user", writer: str | None = None
    ) -> int:
        """Remove every key starting with ``prefix`` (or any of several prefixes) in one batch;
        returns how many. ``clear_prefix("")`` empties the state."""
        engine = self._engine
        context = self._context
        prefixes = (prefix,) if isinstance(prefix, str) else prefix
        if context.fenced:
            source, writer = context.admit(
                [k for p in prefixes for k in self.keys(p)], source, writer
            )
            if (tx := context.transaction()) is not None:
                doomed = [k for p in prefixes for k in tx.keys(p)]
                tx.update({}, source=source, writer=writer, remove=doomed)  # all or nothing
                return len(doomed)
        return writes.clear(engine, prefixes, source, writer)

    # -- acting writers -----------------------------------------------------------------------

    def acting_as(
        self,
        writer: str,
        *,
        source: str,
        allow: str | Iterable[str],
        deny: Iterable[str] = (),
    ) -> AbstractContextManager[Actor]:
        """Within the block (this thread or task, and tasks it starts), write as ``writer``:
        default provenance becomes ``source``/``writer``, and a write outside the ``allow``
        patterns (or inside ``deny``) raises :class:`PolicyViolation`, writing nothing. The
        Session runs each resolver's code so, fenced to its own ``<name>:*`` keys."""
        actor = Actor(writer, source, [allow] if isinstance(allow, str) else allow, deny)
        return self._context.acting_as(actor)

    # -- transactions ------------------------------------------------------------------------

    def transaction(self) -> Transaction:
        """A transaction: ``with state.transaction() as tx: ...`` commits all writes as one batch.

        See :class:`Transaction` for isolation (optimistic, conflict-checked) and nesting.
        """
        return Transaction(self, self._context.transaction())

    # -- reacting ----------------------------------------------------------------------------

    def subscribe(
        self,
        callback: Callback,
        keys: str | Key[Any] | Iterable[str | Key[Any]] | None = None,
        pattern: str | Iterable[str] | None = None,
    ) -> Subscription:
        """Call ``callback(changes)`` once per committed batch touching the watched keys:
        ``keys`` (exact) and ``pattern`` (``*`` patterns) filter, neither means every change;
        ``changes`` holds the batch's matching changes in commit order. A callback that raises
        is logged and reported on ``receiver_failed``; the write and the other subscribers are
        unaffected. Subscriptions are receivers of :attr:`changed`, run in connection order."""
        names = None if keys is None else [key_name(k) for k in _key_list(keys)]
        return self._engine.delivery.subscribe(callback, names, pattern)

    def watch(
        self,
        key: str | Key[Any],
        when: Transition | Callable[[Any, Any], bool],
        action: Callable[[Change], Any],
    ) -> Subscription:
        """Call ``action(change)`` in the writer's thread whenever a change to ``key``
        satisfies ``when(old, new)`` (the predicates of :mod:`slateflow.state.when`:
        ``changed_to``, ``crossed_above``, ...). For async actions, use ``Session.watch``."""
        name = key_name(key)
        return self.subscribe(on_transition(name, when, action), keys=[name])

    async def wait_for(self, key: str | Key[Any], *, timeout: float | None = None) -> Any:
        """Wait until ``key`` is set and return its value (at once if it already is).

        Wakes on writes from any thread. Raises :class:`WaitTimeoutError` (a ``TimeoutError``)
        after ``timeout`` seconds; cancelling the waiting task leaves nothing behind.
        """
        return await waits.wait_for(self, key, timeout)

    async def wait_until(
        self,
        predicate: Callable[[State], Any],
        *,
        keys: Iterable[str | Key[Any]] | None = None,
        pattern: str | Iterable[str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Wait until ``predicate(state)`` is truthy and return what it returned: checked now
        and at the delivery of every batch touching ``keys`` / ``pattern`` (every batch if
        neither is given), so a briefly true condition is still seen. Its exception is raised
        here; :class:`WaitTimeoutError` after ``timeout`` seconds."""
        return await waits.wait_until(self, predicate, keys, pattern, timeout)

    # -- governance --------------------------------------------------------------------------

    def policy(
        self,
        pattern: str | None = None,
        *,
        read_only: bool = False,
        sources: Iterable[str] | None = None,
        writers: Iterable[str] | None = None,
        max_bytes: int | None = None,
        secret: bool = False,
        max_keys: int | None = None,
    ) -> Policy:
        """Add a governance rule for ``pattern`` (and/or set ``max_keys``); returns the policy:
        ``policy("verify:*", writers=["verify"])`` lets only the ``verify`` resolver write its
        keys; ``policy("user:card", secret=True)`` masks a value wherever the state is shown.
        Rules govern later writes; existing values are not re-checked."""
        return governance.add_rule(self._engine, pattern, read_only=read_only, sources=sources,
                                   writers=writers, max_bytes=max_bytes, secret=secret,
                                   max_keys=max_keys)  # fmt: skip

    def is_secret(self, key: str | Key[Any]) -> bool:
        """Whether ``key`` is marked secret by the policy."""
        return self._policy.is_secret(check_key(key_name(key)))

    def declare(self, key: str | Key[Any], type_: Any = None) -> None:
        """Declare the type of a key or ``*`` pattern (``declare("booking:party_size", int)``,
        ``declare("*:result", str)``, ``declare(BOOKING)``); later writes are validated against
        the most specific match. Values stored under it must match, or :class:`SchemaError`
        lists them and nothing is declared."""
        governance.declare(self._engine, key, type_)

    # -- persistence -------------------------------------------------------------------------

    def snapshot(self, *, redact: bool = False) -> dict[str, Any]:
        """The whole state as JSON-ready data: values, versions, seqs and provenance.

        ``State.restore(snapshot)`` rebuilds it exactly. ``redact=True`` masks secret values
        (for logs and people; a redacted snapshot cannot be restored).
        """
        with self._lock:
            rows = list(self._entries.items())
            seq = self._engine.seq
        return snapshots.build(rows, seq, self._secret if redact else None)

    @classmethod
    def restore(
        cls,
        snapshot: Mapping[str, Any],
        *,
        policy: Policy | None = None,
        journal_size: int = 1024,
        clock: Callable[[], float] | None = None,
        sinks: Iterable[JournalSink] = (),
    ) -> Self:
        """A new state rebuilt exactly from :meth:`snapshot` output (values, versions, seqs,
        provenance, cursor). Raises :class:`SnapshotError` naming the first bad part."""
        seq, rows = snapshots.parse(snapshot)
        state = cls(policy=policy, journal_size=journal_size, clock=clock, sinks=sinks)
        state._engine.load(rows, seq)
        return state

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "batch",
        policy: Policy | None = None,
        journal_size: int = 1024,
        clock: Callable[[], float] | None = None,
        sinks: Iterable[JournalSink] = (),
        encryption_key: EncryptionKey | None = None,
    ) -> Self:
        """Open the durable state kept in the SQLite file at ``path``, creating or recovering it
        exactly. ``durability="batch"`` (default): a write returns at once and reaches the disk
        within a few ms (a killed process loses about the last 5 ms, never half a batch);
        ``"sync"``: once it is on disk. Close it (or use ``with``). Raises
        :class:`~slateflow.errors.StoreCorruptError` for a file that is not a readable store.
        ``encryption_key`` (``slateflow[crypto]``) encrypts secret keys' values in the file
        (:mod:`slateflow.state.sealing`); declare secret policies first (``policy=``)."""
        options = _options(policy, journal_size, clock, sinks)
        return persistence.open_file(cls, options, path, durability, encryption_key)

    @property
    def store(self) -> Store | None:
        """The store keeping this state's commits (None: memory only, no history); its
        ``durable`` says whether they reach a disk."""
        return self._engine.store

    @classmethod
    def connect(
        cls,
        url: str,
        call_id: str,
        *,
        policy: Policy | None = None,
        journal_size: int = 1024,
        clock: Callable[[], float] | None = None,
        sinks: Iterable[JournalSink] = (),
        prefix: str = "slateflow",
        socket_timeout: float = 5.0,
        commit_attempts: int = 3,
    ) -> Self:
        """The State of call ``call_id`` on the Redis server at ``url``, shared by every process
        connected to it (``slateflow[redis]``; the twin of :meth:`open`). Reads use this
        process's replica; a write is one round trip in which Redis decides seq and versions;
        other processes' commits reach subscribers and flows here like local writes (in the
        follower's thread). Raises :class:`~slateflow.errors.StoreUnavailableError` if the
        server cannot be reached. ``docs/distributed.md`` says what differs from a local State.
        """
        options = _options(policy, journal_size, clock, sinks)
        return persistence.connect(cls, options, url, call_id, prefix=prefix,
                                   socket_timeout=socket_timeout,
                                   commit_attempts=commit_attempts)  # fmt: skip

    def sync(self) -> None:
        """Return once every commit so far is in the store (on disk, for a durable one) and, on
        a shared State, every commit other processes made is applied here; raises
        :class:`~slateflow.errors.StoreError` if the store cannot persist or be reached."""
        persistence.sync(self._engine)

    def close(self) -> None:
        """Flush and close the store; later writes raise :class:`~slateflow.errors.StoreClosedError`
        (reads keep working). Idempotent; a state without a store has nothing to close."""
        persistence.close(self._engine)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    __reduce__ = persistence.not_shipped

    def describe(self, prefix: str = "", *, provenance: bool = True) -> str:
        """A readable listing of the keys under ``prefix``, secrets masked; one key per line."""
        with self._lock:
            rows = [(key, self._entries[key]) for key in self._keys(prefix)]
        return snapshots.describe(rows, self._secret, provenance)

    def __repr__(self) -> str:
        return f"<State {len(self._entries)} keys, seq {self._engine.seq}>"


def _options(
    policy: Policy | None,
    journal_size: int,
    clock: Callable[[], float] | None,
    sinks: Iterable[JournalSink],
) -> dict[str, Any]:
    """The constructor options of a State a classmethod opens (a policy made if none)."""
    policy = policy if policy is not None else Policy()
    return {"policy": policy, "journal_size": journal_size, "clock": clock, "sinks": sinks}
