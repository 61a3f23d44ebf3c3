"""The State: a governed, observable, thread-safe key-value blackboard."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar, overload

from blinker import Signal

from ..errors import (
    KeyExistsError,
    MissingKeyError,
    SchemaError,
    StoreCorruptError,
)
from ..stores.base import Store
from .actors import Actor
from .engine import Engine, Row
from .governance import Governance
from .history import Journal
from .journal import JournalSink
from .keys import META_PREFIX, Key, check_key, key_name
from .keys import key_list as _key_list
from .persistence import Persistence
from .policy import Policy
from .provenance import Provenance, ns_to_dt
from .reacting import Reacting
from .records import SECRET_MASK, Entry
from .schema import explain
from .scopes import Scopes
from .snapshots import SNAPSHOT_FORMAT
from .transaction import Transaction
from .values import JSON, MISSING, REMOVED, Prefix, clean, copy_json

__all__ = [
    "SNAPSHOT_FORMAT",
    "State",
    "source_of",
]

T = TypeVar("T")
log = logging.getLogger("slateflow.state")


_MISSING = MISSING
_CONTAINERS = (dict, list, Prefix)


class State(Governance, Persistence, Reacting, Scopes):
    """The governed blackboard: JSON values under ``:``-separated keys, with versions,
    provenance, schemas, policies, transactions, a journal and change signals.

    Every method is synchronous, thread-safe and cheap; the ``wait_*`` methods are async (anyio,
    so asyncio and trio). Reads return private copies, so mutating what you read (or what you
    wrote) never changes the state.

    Parameters: ``policy`` (governance rules, see :class:`Policy`), ``journal_size`` (records kept
    in the in-memory journal ring, default 1024, 0 disables it), ``clock`` (a ``time.time``-like
    function used for provenance timestamps), ``sinks`` (journal sinks fed every batch),
    ``store`` (where committed batches are kept: none by default; a :class:`~slateflow.stores.
    MemoryStore` or a durable :class:`~slateflow.stores.SQLiteStore`, whose contents the new
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
        self._journal: Journal | None = None
        for sink in sinks:
            engine.add_sink(sink)
        if store is not None:
            if not isinstance(store, Store):
                raise TypeError(f"store must implement slateflow.stores.Store, got {store!r}")
            try:
                engine.recover(store.load())
            except StoreCorruptError as exc:
                where = getattr(store, "path", None)
                if where is None or str(where) in str(exc):
                    raise
                raise StoreCorruptError(
                    f"{str(where)!r}: {exc}; restore it from a backup or open a new file"
                ) from None
            engine.store = store
            engine.sync = store.durability == "sync"

    # -- small internals shared with transactions and views ----------------------------------

    def _typed(self, key: Key[T], raw: JSON) -> T:
        try:
            return key.adapter.validate_python(copy_json(raw))
        except Exception as exc:
            raise SchemaError(
                f"stored value of {key.name!r} does not match {key!r}; declare the key "
                f"(state.declare({key.name!r}, ...)) so writes are checked:\n"
                + explain(exc, self._secret(key.name))
            ) from None

    def _tx(self) -> Transaction | None:
        return self._engine.transaction()

    # -- reads -------------------------------------------------------------------------------

    @overload
    def get(self, key: Key[T], default: None = None) -> T | None: ...
    @overload
    def get(self, key: Key[T], default: T) -> T: ...
    @overload
    def get(self, key: str, default: Any = None) -> Any: ...

    def get(self, key: str | Key[Any], default: Any = None) -> Any:
        """The value at ``key`` (a private copy), or ``default`` if the key is not set.

        With a :class:`Key`, the value is validated into the key's type. ``"state_meta:<key>"``
        returns the provenance of ``<key>`` as a dict (seed compatibility).
        """
        if self._engine.tx_open and (tx := self._tx()) is not None:
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
        if isinstance(key, Key):
            row = self._entries.get(key.name)
            return default if row is None else self._typed(key, row[0])
        if type(key) is str and key.startswith(META_PREFIX):
            row = self._entries.get(key[len(META_PREFIX) :])
            if row is not None:
                return row[4].provenance(row[3]).as_meta()
        check_key(key)
        return default

    def require(self, key: str | Key[Any]) -> Any:
        """The value at ``key``; raises :class:`MissingKeyError` naming it if absent."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise MissingKeyError(
                f"required key {key_name(key)!r} is not set; set it first or use get() "
                "with a default"
            )
        return value

    def contains(self, key: str | Key[Any]) -> bool:
        """Whether ``key`` is set."""
        if self._engine.tx_open and (tx := self._tx()) is not None:
            return tx.contains(key)
        if type(key) is str:
            if key in self._entries:
                return True
            check_key(key)  # an invalid key is an error, not merely absent
            return False
        return self._row(key) is not None

    __contains__ = contains

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, key: str | Key[Any]) -> Entry | None:
        """The key's value with version, seq, provenance and update time, or None if absent.

        Inside a transaction this shows the committed entry (buffered writes have no version yet).
        """
        name = key_name(key)
        row = self._row(name)
        if row is None:
            return None
        return Entry(
            key=name,
            value=copy_json(row[0]),
            version=row[1],
            seq=row[2],
            provenance=row[4].provenance(row[3]),
            updated_at=ns_to_dt(row[3]),
            secret=self._secret(name),
        )

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
        if self._engine.tx_open and (tx := self._tx()) is not None:
            return tx.keys(prefix)
        return self._keys(prefix)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """``(key, value)`` pairs for the keys starting with ``prefix`` (values are copies)."""
        if self._engine.tx_open and (tx := self._tx()) is not None:
            return tx.items(prefix)
        entries = self._entries
        with self._lock:
            rows = [(k, entries[k][0]) for k in self._keys(prefix)]
        return [(k, copy_json(v)) for k, v in rows]

    def pick(self, *keys: str | Key[Any]) -> dict[str, Any]:
        """A dict of the given keys that are set, with their values."""
        if self._engine.tx_open and (tx := self._tx()) is not None:
            return tx.pick(*(key_name(k) for k in keys))
        found = {}
        with self._lock:
            for key in keys:
                row = self._row(key)
                if row is not None:
                    found[key_name(key)] = row[0]
        return {k: copy_json(v) for k, v in found.items()}

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
        """Write ``value`` at ``key``; returns the key's new version.

        ``source``/``writer``/``confidence``/``meta`` become the value's provenance.
        ``expected_version=v`` makes the write conditional (``0``: the key must not exist) and
        raises :class:`VersionConflictError` otherwise. Writing a value equal to the current one
        is a no-op: same version, no journal record, no signal. Any failure writes nothing.
        """
        engine = self._engine
        if engine.fenced:  # an acting_as block or a transaction is open somewhere
            if engine.acting and (actor := engine.actor()) is not None:
                source, writer = actor.admit(key_name(key), source, writer)
            if (tx := engine.transaction()) is not None:
                return tx.set(
                    key,
                    value,
                    source=source,
                    writer=writer,
                    confidence=confidence,
                    meta=meta,
                    expected_version=expected_version,
                )
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
        if engine.fenced:
            source, writer = engine.admit([*mapping, *_key_list(remove)], source, writer)
            if (tx := engine.transaction()) is not None:
                return tx.update(
                    mapping,
                    source=source,
                    writer=writer,
                    confidence=confidence,
                    meta=meta,
                    remove=remove,
                    expected_versions=expected_versions,
                )
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
        if engine.fenced:
            source, writer = engine.admit([key], source, writer)
            if (tx := engine.transaction()) is not None:
                return tx.remove(key, default, source=source, writer=writer)
        name = key_name(key)
        stamp = engine.stamp(name, source, writer, None, None)
        engine.check_remove(name, stamp)
        with self._lock:
            row = engine.row(name)
            if row is None:
                if default is _MISSING:
                    raise MissingKeyError(f"cannot remove {name!r}: it is not set")
                return default
            engine.commit([(name, REMOVED, stamp)], "remove", deliver=False)
        engine.deliver()
        return copy_json(row[0])

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
        """Atomically replace the value with ``fn(current)`` (``fn(default)`` if absent).

        No other write to the state can happen between the read and the write, so concurrent
        ``modify`` calls never lose an update. ``fn`` runs while the state's lock is held: keep
        it quick and do not wait on other threads inside it. Returns the new value.
        """
        engine = self._engine
        if engine.fenced:
            source, writer = engine.admit([key], source, writer)
            if (tx := engine.transaction()) is not None:
                return tx.modify(
                    key, default, fn, source=source, writer=writer, confidence=confidence, meta=meta
                )
        name = key_name(key)
        stamp = engine.stamp(name, source, writer, confidence, meta)
        with self._lock:
            row = engine.row(name)
            current = copy_json(row[0]) if row is not None else clean(default, name)
            name, cleaned = engine.prepare(key, fn(current), stamp)
            engine.commit([(name, cleaned, stamp)], "modify", deliver=False)
        engine.deliver()
        return copy_json(cleaned)

    def rename(
        self,
        old: str,
        new: str,
        *,
        overwrite: bool = False,
        source: str = "user",
        writer: str | None = None,
    ) -> int:
        """Move ``old``'s value to ``new`` in one batch, keeping its provenance.

        Raises :class:`MissingKeyError` if ``old`` is absent and :class:`KeyExistsError` if
        ``new`` exists (unless ``overwrite=True``). Returns ``new``'s version.
        """
        engine = self._engine
        if engine.fenced:
            source, writer = engine.admit([old, new], source, writer)
            if (tx := engine.transaction()) is not None:
                return tx.rename(old, new, overwrite=overwrite, source=source, writer=writer)
        stamp = engine.stamp(old, source, writer, None, None)
        engine.check_remove(old, stamp)
        with self._lock:
            row = self._entries.get(old)
            if row is None:
                check_key(old)
                raise MissingKeyError(f"cannot rename {old!r}: it is not set")
            if new == old:
                return row[1]
            if new in self._entries and not overwrite:
                raise KeyExistsError(
                    f"cannot rename {old!r} to {new!r}: {new!r} exists; pass overwrite=True"
                )
            kept = row[4]
            name, cleaned = engine.prepare(new, row[0], kept)
            if self._policy.active:
                # The renamer writes `new` too, whoever wrote the value originally.
                self._policy.check(name, cleaned, stamp)
            engine.commit([(old, REMOVED, stamp), (name, cleaned, kept)], "rename", deliver=False)
            version = self._entries[name][1]
        engine.deliver()
        return version

    def clear_prefix(self, prefix: str, *, source: str = "user", writer: str | None = None) -> int:
        """Remove every key starting with ``prefix`` in one batch; returns how many.

        ``clear_prefix("")`` empties the state.
        """
        return self._remove_where(prefix, source, writer, "clear_prefix")

    def _remove_where(
        self, prefix: str | tuple[str, ...], source: str, writer: str | None, origin: str
    ) -> int:
        engine = self._engine
        prefixes = (prefix,) if isinstance(prefix, str) else prefix
        if engine.fenced:
            source, writer = engine.admit(
                [k for p in prefixes for k in self.keys(p)], source, writer
            )
            if (tx := engine.transaction()) is not None:
                doomed = [k for p in prefixes for k in tx.keys(p)]
                tx.update({}, source=source, writer=writer, remove=doomed)  # all or nothing
                return len(doomed)
        stamp = engine.stamp(prefix, source, writer, None, None)
        with self._lock:
            doomed = [k for k in self._entries if k.startswith(prefix)]
            for k in doomed:
                engine.check_remove(k, stamp)
            engine.commit([(k, REMOVED, stamp) for k in doomed], origin, deliver=False)
        engine.deliver()
        return len(doomed)

    # -- acting writers -----------------------------------------------------------------------

    @contextmanager
    def acting_as(
        self,
        writer: str,
        *,
        source: str,
        allow: str | Iterable[str],
        deny: Iterable[str] = (),
    ) -> Iterator[Actor]:
        """Within the block (this thread or task, and tasks it starts), write as ``writer``.

        Writes with the default provenance are stamped ``source``/``writer``; a write to a key
        outside the ``allow`` patterns, or inside ``deny``, raises :class:`PolicyViolation` and
        writes nothing. The Session runs each resolver's code like this, fenced to its own
        ``<name>:*`` keys.
        """
        actor = Actor(writer, source, [allow] if isinstance(allow, str) else allow, deny)
        token = self._engine.push_actor(actor)
        try:
            yield actor
        finally:
            self._engine.pop_actor(token)

    # -- transactions ------------------------------------------------------------------------

    def transaction(self) -> Transaction:
        """A transaction: ``with state.transaction() as tx: ...`` commits all writes as one batch.

        See :class:`Transaction` for isolation (optimistic, conflict-checked) and nesting.
        """
        return Transaction(self, self._engine.transaction())

    # -- journal -----------------------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """The seq of the last committed batch (0 for a new state)."""
        return self._engine.seq

    @property
    def journal(self) -> Journal:
        """The journal: the commits since a cursor, sinks, the state as it was at a commit,
        compaction (see :class:`~slateflow.state.history.Journal`)."""
        journal = self._journal
        if journal is None:
            journal = self._journal = Journal(self)
        return journal

    def describe(self, prefix: str = "", *, provenance: bool = True) -> str:
        """A readable listing of the keys under ``prefix``, secrets masked; one key per line."""
        lines = []
        with self._lock:
            rows = [(key, self._entries[key]) for key in self._keys(prefix)]
        for key, row in rows:
            value = SECRET_MASK if self._secret(key) else repr(row[0])
            line = f"{key} = {value}"
            if provenance:
                stamp = row[4]
                who = stamp.source + (f"/{stamp.writer}" if stamp.writer else "")
                conf = "" if stamp.confidence is None else f", confidence {stamp.confidence:g}"
                line += f"  (v{row[1]}, {who}{conf})"
            lines.append(line)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<State {len(self._entries)} keys, seq {self._engine.seq}>"


def source_of(state: State, key: str | Key[Any]) -> str | None:
    """The provenance source (``"agent"``, ``"fetch"``, ``"user"``, ...) of ``key``'s value.

    None when the key is not set. The full record is ``state.provenance(key)`` (one word, one
    meaning: ``provenance`` is the record; this function used to share its name).
    """
    record = state.provenance(key)
    return None if record is None else record.source
