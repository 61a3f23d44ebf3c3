"""The State: a governed, observable, thread-safe key-value blackboard."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar, Token
from functools import cached_property
from typing import Any, TypeVar, overload

from blinker import ANY, Signal

from ..errors import (
    DeliveryChainError,
    HistoryError,
    InvalidKeyError,
    KeyExistsError,
    MissingKeyError,
    ReadOnlyError,
    SchemaError,
    StateValueError,
    StoreCorruptError,
    UsageError,
    VersionConflictError,
)
from ..stores.base import Durability, Store
from ..stores.records import ChangeRow, EntryRow, Loaded
from . import snapshots, waits
from .actors import Actor
from .chains import MAX_CHAIN, in_chain
from .chains import depth as chain_depth
from .derived import Derived
from .journal import JournalSink, Ring
from .keys import META_PREFIX, Key, check_key, result_key
from .keys import key_list as _key_list
from .policy import Policy, Rule, name_set
from .provenance import Provenance, Stamp, ns_to_dt
from .records import SECRET_MASK, Change, Entry, Mutation, RawChange
from .schema import Schemas, explain, validate_with
from .scopes import ReadOnlyView, ScopedView
from .sealing import EncryptionKey, SealedStore, Sealer, is_sealed, needs_key
from .snapshots import SNAPSHOT_FORMAT
from .subscriptions import Callback, Subscription, SubscriptionIndex
from .transaction import Transaction
from .values import _BIG, JSON, MISSING, REMOVED, clean, copy_json, same
from .when import Trigger

__all__ = ["SNAPSHOT_FORMAT", "State", "provenance"]

T = TypeVar("T")
log = logging.getLogger("slateflow.state")


_MISSING = MISSING
_F = TypeVar("_F", bound=Callable[..., Any])
_CONTAINERS = (dict, list)
_wrap = Change.wrap
_STRICT = (dict, list, float)
_SCALARS = frozenset({str, int, bool, type(None)})
# One stored entry: (value, version, seq, at_ns, stamp). A plain tuple keeps a key small.
_Row = tuple[JSON, int, int, int, Stamp]


class _ChangedSignal(Signal):
    """``state.changed``: a blinker Signal that tells its state when receivers come and go, so
    a write with nobody listening skips delivery with one flag test."""

    def __init__(self, on_receivers: Callable[[], None]) -> None:
        super().__init__("slateflow.state.changed")
        self._on_receivers = on_receivers

    def connect(self, receiver: _F, sender: Any = ANY, weak: bool = True) -> _F:
        connected = super().connect(receiver, sender, weak)
        self._on_receivers()
        return connected

    def disconnect(self, receiver: Callable[..., Any], sender: Any = ANY) -> None:
        super().disconnect(receiver, sender)
        self._on_receivers()


class State:
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
    """Sent once per committed batch: ``receiver(state, changes=tuple_of_Change)``."""

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
        self._entries: dict[str, _Row] = {}
        self._lock = threading.RLock()
        self._seq = 0
        self._ring = Ring(journal_size)
        self._records = self._ring.records
        self._journaling = journal_size > 0
        self._sinks: tuple[JournalSink, ...] = ()
        for sink in sinks:
            self.add_sink(sink)
        self._subs = SubscriptionIndex()
        # Raw batches (plain tuples) waiting for delivery; wrapped into Changes once, when sent.
        # Batches waiting for delivery, each with the chain depth of the code that wrote it.
        self._pending: deque[tuple[tuple[RawChange, ...], int]] = deque()
        self._delivering = False
        self._policy = policy if policy is not None else Policy()
        self._schemas = Schemas()
        # Commit times are kept as integer nanoseconds: time.time_ns is the cheapest clock call.
        self._now: Callable[[], int] = (
            # A user clock is read at microsecond precision, as Provenance shows it.
            time.time_ns if clock is None else (lambda: round(clock() * 1_000_000) * 1000)
        )
        self._default_stamp = Stamp("user", None, None, None)
        self._stamps: dict[tuple[str, str | None, float | None], Stamp] = {}
        self._tx_open = 0
        self._txvar: ContextVar[Transaction | None] = ContextVar(
            f"slateflow_tx_{id(self)}", default=None
        )
        # How many acting_as blocks are open in any context: writes look up the actor only then.
        self._acting = 0
        self._actorvar: ContextVar[Actor | None] = ContextVar(
            f"slateflow_actor_{id(self)}", default=None
        )
        # Whether any subscription or signal receiver exists. It may stay True after a weakly
        # referenced receiver is collected; that only costs a delivery that finds nobody.
        self._listening = False
        self.changed = _ChangedSignal(self._refresh_listening)
        self.receiver_failed = Signal("slateflow.state.receiver_failed")
        self._store: Store | None = None
        self._sync = False
        if store is not None:
            if not isinstance(store, Store):
                raise TypeError(f"store must implement slateflow.stores.Store, got {store!r}")
            try:
                self._recover(store.load())
            except StoreCorruptError as exc:
                where = getattr(store, "path", None)
                if where is None or str(where) in str(exc):
                    raise
                raise StoreCorruptError(
                    f"{str(where)!r}: {exc}; restore it from a backup or open a new file"
                ) from None
            self._store = store
            self._sync = store.durability == "sync"

    # -- small internals shared with transactions and views ----------------------------------

    def _refresh_listening(self) -> None:
        # Under the lock, so the last refresh always reflects every finished (un)subscribe.
        with self._lock:
            self._listening = bool(self.changed.receivers) or self._subs.count > 0

    def _name(self, key: str | Key[Any]) -> str:
        if type(key) is str:
            return key
        if isinstance(key, Key):
            return key.name
        return check_key(key)  # raises InvalidKeyError

    def _stamp(
        self,
        key: object,
        source: str,
        writer: str | None,
        confidence: float | None,
        meta: Mapping[str, Any] | None,
    ) -> Stamp:
        cacheable = (
            meta is None
            and type(source) is str
            and (writer is None or type(writer) is str)
            and (confidence is None or type(confidence) is float)
        )
        if cacheable:
            if source == "user" and writer is None and confidence is None:
                return self._default_stamp
            stamp = self._stamps.get((source, writer, confidence))
            if stamp is not None:
                return stamp
        stamp = Stamp.checked(str(key), source, writer, confidence, meta)
        if cacheable:
            if len(self._stamps) > 4096:
                self._stamps = {}
            self._stamps[(source, writer, confidence)] = stamp
        return stamp

    def _check_new_key(self, key: str) -> None:
        check_key(key)
        if key.startswith(META_PREFIX):
            raise ReadOnlyError(
                f"cannot write {key!r}: 'state_meta:' keys are read-only views of provenance; "
                "pass source=/writer=/meta= when writing the key itself"
            )

    def _prepare(self, key: str | Key[Any], value: Any, stamp: Stamp) -> tuple[str, JSON]:
        """Validate a write of ``value`` to ``key`` (key, value, schema, policy)."""
        if type(key) is str:
            name = key
        elif isinstance(key, Key):
            name = key.name
            value = validate_with(key.adapter, name, value, key.type, secret=self._secret(name))
        else:
            name = check_key(key)
        if name not in self._entries:
            self._check_new_key(name)
        # A declared type sees the value as written (a datetime, a model) and yields its JSON.
        decl = self._schemas.find(name) if self._schemas.decls else None
        if decl is not None:
            value = Schemas.check(decl, name, value, secret=self._secret(name))
        cleaned = clean(value, name)
        if self._policy.active:
            self._policy.check(name, cleaned, stamp)
        return name, cleaned

    def _check_remove(self, name: str, stamp: Stamp) -> None:
        if self._policy.active:
            self._policy.check(name, None, stamp, removing=True)

    @staticmethod
    def _check_version_arg(name: str, expected: object) -> int:
        if type(expected) is not int or expected < 0:
            raise StateValueError(
                f"expected_version for {name!r} must be an int >= 0 (0 = must not exist), "
                f"got {expected!r}"
            )
        return expected

    def _typed(self, key: Key[T], raw: JSON) -> T:
        try:
            return key.adapter.validate_python(copy_json(raw))
        except Exception as exc:
            raise SchemaError(
                f"stored value of {key.name!r} does not match {key!r}; declare the key "
                f"(state.declare({key.name!r}, ...)) so writes are checked:\n"
                + explain(exc, self._secret(key.name))
            ) from None

    def _secret(self, key: str) -> bool:
        return self._policy.is_secret(key)

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
        if self._tx_open and (tx := self._tx()) is not None:
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
                f"required key {self._name(key)!r} is not set; set it first or use get() "
                "with a default"
            )
        return value

    def contains(self, key: str | Key[Any]) -> bool:
        """Whether ``key`` is set."""
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.contains(key)
        return self._row(key) is not None

    __contains__ = contains

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, key: str | Key[Any]) -> Entry | None:
        """The key's value with version, seq, provenance and update time, or None if absent.

        Inside a transaction this shows the committed entry (buffered writes have no version yet).
        """
        name = self._name(key)
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

    def _row(self, key: str | Key[Any]) -> _Row | None:
        name = self._name(key)
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
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.keys(prefix)
        return self._keys(prefix)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """``(key, value)`` pairs for the keys starting with ``prefix`` (values are copies)."""
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.items(prefix)
        entries = self._entries
        with self._lock:
            rows = [(k, entries[k][0]) for k in self._keys(prefix)]
        return [(k, copy_json(v)) for k, v in rows]

    def pick(self, *keys: str | Key[Any]) -> dict[str, Any]:
        """A dict of the given keys that are set, with their values."""
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.pick(*(self._name(k) for k in keys))
        found = {}
        with self._lock:
            for key in keys:
                row = self._row(key)
                if row is not None:
                    found[self._name(key)] = row[0]
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
        if self._acting and (actor := self._actorvar.get()) is not None:
            source, writer = actor.admit(self._name(key), source, writer)
        if self._tx_open and (tx := self._tx()) is not None:
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
            stamp = self._default_stamp
        else:
            stamp = self._stamp(key, source, writer, confidence, meta)
        entries = self._entries
        policy = self._policy
        # acquire/release costs a third of a with-block on CPython 3.11; this is the hot path.
        lock = self._lock
        lock.acquire()
        try:
            store = self._store
            if store is not None and store.error is not None:
                raise store.error
            try:
                row = entries.get(key)  # type: ignore[arg-type]
            except TypeError:  # an unhashable key: _prepare names the problem
                row = None
            t = type(value)
            # Fast path: a scalar written to an existing key of an ungoverned state. (Only str
            # keys are stored, so a row found means `key` is a valid str key.)
            if (
                row is not None
                and type(key) is str
                and (t is str or t is bool or value is None or (t is int and -_BIG < value < _BIG))
                and not self._schemas.decls
                and not policy.active
            ):
                name: str = key
                cleaned = value
            else:
                name, cleaned = self._prepare(key, value, stamp)
                row = entries.get(name)
            if expected_version is not None:
                have = 0 if row is None else row[1]
                if have != self._check_version_arg(name, expected_version):
                    raise VersionConflictError(
                        f"{name!r} is at version {have}, not the expected {expected_version}; "
                        "read it again and retry"
                    )
            if row is None:
                if policy.max_keys is not None:
                    policy.check_count(name, len(entries) + 1)
                old = None
                version = 1
            else:
                old = row[0]
                if old is cleaned or (
                    old == cleaned
                    and type(old) is type(cleaned)
                    and (type(old) not in _STRICT or same(old, cleaned))
                ):
                    return row[1]
                version = row[1] + 1
            # Read before the seq moves on, in case a user clock raises. (A local call avoids
            # CPython's slow method lookup for a callable stored on the instance.)
            now = self._now
            at = now()
            seq = self._seq + 1
            if store is not None:
                # Before anything is applied: a store that refuses the commit leaves the
                # state exactly as it was.
                store.append(
                    (
                        seq,
                        at,
                        "set",
                        (
                            (
                                name,
                                cleaned,
                                version,
                                stamp.source,
                                stamp.writer,
                                stamp.confidence,
                                stamp.meta,
                            ),
                        ),
                    )
                )
            self._seq = seq
            entries[name] = (cleaned, version, seq, at, stamp)
            # A plain tuple: it becomes a Change only if someone reads it.
            change: RawChange = (
                name,
                old,
                cleaned,
                version,
                seq,
                "set",
                False,
                at,
                stamp,
                policy,
            )
            # Ring.append, inlined; trimming every 64th commit bounds the overshoot (reads trim
            # exactly) and spares every write a length check.
            if self._journaling:
                self._records.append(change)
                if not seq & 63:
                    self._ring.trim()
            subs = self._subs
            listened = self._listening and (
                self.changed.receivers
                or name in subs.by_key
                or subs.everything
                or (subs.by_pattern and subs.for_key(name))
            )
            # Queued before the sinks run, so a write a sink makes is delivered after this one.
            if listened:
                self._pending.append(((change,), chain_depth()))
            failures = self._feed_sinks((change,)) if self._sinks else None
        finally:
            lock.release()
        if failures:
            self._report_sink_failures(failures, (change,))
        if listened:
            self._deliver()
        if self._sync:
            self._store.sync(seq)  # type: ignore[union-attr]
        return version

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
        if self._acting:
            source, writer = self._admit([*mapping, *_key_list(remove)], source, writer)
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.update(
                mapping,
                source=source,
                writer=writer,
                confidence=confidence,
                meta=meta,
                remove=remove,
                expected_versions=expected_versions,
            )
        if meta is None and source == "user" and writer is None and confidence is None:
            stamp = self._default_stamp
        else:
            stamp = self._stamp(next(iter(mapping), "update"), source, writer, confidence, meta)
        ops, expected = self._stage_update(mapping, stamp, remove, expected_versions)
        return self._commit_batch(ops, "update", expected=expected)

    def _stage_update(
        self,
        mapping: Mapping[str | Key[Any], Any],
        stamp: Stamp,
        remove: str | Key[Any] | Iterable[str | Key[Any]],
        expected_versions: Mapping[str | Key[Any], int] | None,
    ) -> tuple[list[tuple[str, JSON, Stamp]], dict[str, int]]:
        """Validate an update (shared with transactions): its ops and its expected versions."""
        expected = {
            (name := check_key(self._name(key))): self._check_version_arg(name, version)
            for key, version in (expected_versions or {}).items()
        }
        entries = self._entries
        prepare = self._prepare
        odd: list[object] = []  # keys that are not plain str (a Key may repeat a str's name)

        def validated(k: str | Key[Any], v: Any) -> tuple[str, JSON, Stamp]:
            if type(k) is not str:
                odd.append(k)
            return (*prepare(k, v, stamp), stamp)

        ops: list[tuple[str, JSON, Stamp]]
        # Scalars written to existing keys of an ungoverned state need no validation work.
        if not self._schemas.decls and not self._policy.active:
            ops = [
                (k, v, stamp)
                if type(k) is str and type(v) in _SCALARS and k in entries
                else validated(k, v)
                for k, v in mapping.items()
            ]
        else:
            ops = [validated(k, v) for k, v in mapping.items()]
        if odd:
            names = [op[0] for op in ops]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise StateValueError(
                    f"update() names {', '.join(map(repr, twice))} twice (as a str and a Key?);"
                    " give each key once"
                )
        if not remove:
            return ops, expected
        written = {op[0] for op in ops}
        removed: set[str] = set()
        for key in _key_list(remove):
            name = check_key(self._name(key))
            self._check_remove(name, stamp)
            if name in written:
                raise StateValueError(
                    f"update() both writes and removes {name!r}; do one or the other"
                )
            if name not in removed:
                removed.add(name)
                ops.append((name, REMOVED, stamp))
        return ops, expected

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
        if self._acting:
            source, writer = self._admit([key], source, writer)
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.remove(key, default, source=source, writer=writer)
        name = self._name(key)
        stamp = self._stamp(name, source, writer, None, None)
        self._check_remove(name, stamp)
        with self._lock:
            row = self._row(name)
            if row is None:
                if default is _MISSING:
                    raise MissingKeyError(f"cannot remove {name!r}: it is not set")
                return default
            self._commit_batch([(name, REMOVED, stamp)], "remove", deliver=False)
        self._deliver()
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
        if self._acting:
            source, writer = self._admit([key], source, writer)
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.modify(
                key, default, fn, source=source, writer=writer, confidence=confidence, meta=meta
            )
        name = self._name(key)
        stamp = self._stamp(name, source, writer, confidence, meta)
        with self._lock:
            row = self._row(name)
            current = copy_json(row[0]) if row is not None else clean(default, name)
            name, cleaned = self._prepare(key, fn(current), stamp)
            self._commit_batch([(name, cleaned, stamp)], "modify", deliver=False)
        self._deliver()
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
        if self._acting:
            source, writer = self._admit([old, new], source, writer)
        if self._tx_open and (tx := self._tx()) is not None:
            return tx.rename(old, new, overwrite=overwrite, source=source, writer=writer)
        stamp = self._stamp(old, source, writer, None, None)
        self._check_remove(old, stamp)
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
            name, cleaned = self._prepare(new, row[0], kept)
            if self._policy.active:
                # The renamer writes `new` too, whoever wrote the value originally.
                self._policy.check(name, cleaned, stamp)
            self._commit_batch(
                [(old, REMOVED, stamp), (name, cleaned, kept)], "rename", deliver=False
            )
            version = self._entries[name][1]
        self._deliver()
        return version

    def clear_prefix(self, prefix: str, *, source: str = "user", writer: str | None = None) -> int:
        """Remove every key starting with ``prefix`` in one batch; returns how many.

        ``clear_prefix("")`` empties the state.
        """
        return self._remove_where(prefix, source, writer, "clear_prefix")

    def end_turn(self) -> int:
        """Clear the ``turn:`` and ``temp:`` scopes in one batch; returns how many keys."""
        return self._remove_where(("turn:", "temp:"), "system", None, "end_turn")

    def _remove_where(
        self, prefix: str | tuple[str, ...], source: str, writer: str | None, origin: str
    ) -> int:
        if self._acting:
            prefixes = (prefix,) if isinstance(prefix, str) else prefix
            source, writer = self._admit(
                [k for p in prefixes for k in self.keys(p)], source, writer
            )
        if self._tx_open and (tx := self._tx()) is not None:
            prefixes = (prefix,) if isinstance(prefix, str) else prefix
            doomed = [k for p in prefixes for k in tx.keys(p)]
            tx.update({}, source=source, writer=writer, remove=doomed)  # all or nothing
            return len(doomed)
        stamp = self._stamp(prefix, source, writer, None, None)
        with self._lock:
            doomed = [k for k in self._entries if k.startswith(prefix)]
            for k in doomed:
                self._check_remove(k, stamp)
            self._commit_batch([(k, REMOVED, stamp) for k in doomed], origin, deliver=False)
        self._deliver()
        return len(doomed)

    # -- the commit path ---------------------------------------------------------------------

    def _commit_owned(
        self,
        writes: Mapping[str, Any],
        removes: Iterable[str],
        stamp: Stamp,
        origin: str,
        *,
        refresh: frozenset[str] = frozenset(),
        deliver: bool = True,
        trusted: bool = False,
    ) -> int:
        """Commit a runtime batch (a resolver's own keys) with a prebuilt stamp.

        Validated like any write (keys, values, schemas, policies) but not fenced by an actor nor
        routed into a transaction: the runtime writes its keys as itself, whoever's code is
        running. Keys in ``refresh`` are written even when their value is unchanged (a new run
        produced it: its provenance and age must be the new run's). With ``deliver=False`` the
        caller delivers later (``_deliver()``). ``trusted=True`` skips the value check and copy:
        only for fresh plain JSON the caller built and will not change (keys and policies are
        still checked). Returns the commit's seq.
        """
        if trusted:
            ops = []
            for key, value in writes.items():
                if key not in self._entries:
                    self._check_new_key(key)
                if self._policy.active:
                    self._policy.check(key, value, stamp)
                ops.append((key, value, stamp))
        else:
            prepare = self._prepare
            ops = [(*prepare(key, value, stamp), stamp) for key, value in writes.items()]
        for key in removes:
            self._check_remove(key, stamp)
            ops.append((key, REMOVED, stamp))
        return self._commit_batch(ops, origin, refresh=refresh, deliver=deliver)

    def _commit_batch(
        self,
        ops: Sequence[tuple[str, JSON, Stamp]],
        origin: str,
        *,
        expected: Mapping[str, int] | None = None,
        reads: Mapping[str, int] | None = None,
        deliver: bool = True,
        refresh: frozenset[str] = frozenset(),
    ) -> int:
        """Apply validated ``ops`` as one batch: one seq, one journal batch, one signal.

        Every check that depends on the current state happens before the first mutation, so a
        failure leaves everything as it was. This is the seam where a durable or remote store
        will persist each committed batch.
        """
        entries = self._entries
        policy = self._policy
        store = self._store
        with self._lock:
            if store is not None and store.error is not None:
                raise store.error
            for label, versions in (
                (("expected", expected), ("read", reads)) if expected or reads else ()
            ):
                for key, version in (versions or {}).items():
                    row = entries.get(key)
                    have = 0 if row is None else row[1]
                    if have != version:
                        why = (
                            "read it again and retry"
                            if label == "expected"
                            else "another writer changed it after this transaction read it; "
                            "run the transaction again"
                        )
                        raise VersionConflictError(
                            f"{key!r} is at version {have}, not the {label} {version}; {why}"
                        )
            if policy.max_keys is not None:
                created = {k for k, v, _ in ops if v is not REMOVED and k not in entries}
                gone = {k for k, v, _ in ops if v is REMOVED and k in entries}
                if created:
                    policy.check_count(next(iter(created)), len(entries) + len(created) - len(gone))
            seq = self._seq + 1
            now = self._now
            at = now()
            changes: list[RawChange] = []
            add = changes.append
            # The rows this batch replaces, to put back if the store refuses it.
            undo: list[tuple[str, Any]] | None = [] if store is not None else None
            for key, value, stamp in ops:
                row = entries.get(key)
                if value is REMOVED:
                    if row is None:
                        continue
                    if undo is not None:
                        undo.append((key, row))
                    del entries[key]
                    old, value, version = row[0], None, 0
                elif row is None:
                    old, version = None, 1
                else:
                    old = row[0]
                    if (
                        old is value
                        or (
                            old == value
                            and type(old) is type(value)
                            and (type(old) not in _STRICT or same(old, value))
                        )
                    ) and key not in refresh:
                        continue
                    version = row[1] + 1
                if version:
                    if undo is not None:
                        undo.append((key, row))
                    entries[key] = (value, version, seq, at, stamp)
                add((key, old, value, version, seq, origin, not version, at, stamp, policy))
            if not changes:
                return self._seq
            batch = tuple(changes)
            if store is not None:
                rows: list[ChangeRow] = []
                for c in batch:
                    st = c[8]
                    rows.append((c[0], c[2], c[3], st.source, st.writer, st.confidence, st.meta))
                try:
                    store.append((seq, at, origin, tuple(rows)))
                except BaseException:
                    assert undo is not None
                    for key, row in reversed(undo):
                        if row is None:
                            entries.pop(key, None)
                        else:
                            entries[key] = row
                    raise
            self._seq = seq
            self._ring.append(batch)
            if self._listening and (
                self.changed.receivers or any(self._subs.for_key(c[0]) for c in batch)
            ):
                self._pending.append((batch, chain_depth()))
            failures = self._feed_sinks(batch) if self._sinks else None
        if failures:
            self._report_sink_failures(failures, batch)
        if deliver:
            self._deliver()
        if self._sync:
            self._store.sync(seq)  # type: ignore[union-attr]
        return seq

    def _feed_sinks(self, raw: tuple[RawChange, ...]) -> list[tuple[object, Exception]]:
        failures: list[tuple[object, Exception]] = []
        batch = tuple(map(_wrap, raw))
        for sink in self._sinks:
            try:
                sink.record(batch)
            except Exception as exc:
                failures.append((sink, exc))
        return failures

    def _report_sink_failures(
        self, failures: list[tuple[object, Exception]], raw: tuple[RawChange, ...]
    ) -> None:
        batch = tuple(map(_wrap, raw))
        for sink, exc in failures:
            self._report_failure(sink, exc, batch)

    # -- delivery ----------------------------------------------------------------------------

    def _deliver(self) -> None:
        """Deliver pending batches in commit order, breadth-first, from one thread at a time.

        A receiver's own write is committed at once but queued here, so chains of writes never
        recurse; another thread's write that arrives during delivery is delivered by this loop.
        """
        lock = self._lock
        pending = self._pending
        with lock:
            if self._delivering or not pending:
                return
            self._delivering = True
        try:
            while True:
                with lock:
                    if not pending:
                        self._delivering = False
                        return
                    batch, level = pending.popleft()
                if level >= MAX_CHAIN:
                    self._chain_stopped(batch, level)
                    continue
                # What receivers write now is one level deeper in this chain.
                with in_chain(level + 1):
                    self._dispatch(batch)
        except BaseException:
            with lock:
                self._delivering = False
            raise

    def _dispatch(self, raw: tuple[RawChange, ...]) -> None:
        batch = tuple(map(_wrap, raw))
        signal = self.changed
        if signal.receivers:
            for receiver in signal.receivers_for(self):
                try:
                    receiver(self, changes=batch)
                except Exception as exc:
                    self._report_failure(receiver, exc, batch)
        subs = self._subs
        if not subs.count:
            return
        if len(batch) == 1:
            for sub in subs.for_key(raw[0][0]):
                if sub.active:
                    try:
                        sub.callback(batch)
                    except Exception as exc:
                        self._report_failure(sub.callback, exc, batch)
            return
        grouped: dict[Subscription, list[Change]] = {}
        for change, (key, *_) in zip(batch, raw, strict=True):
            for sub in subs.for_key(key):
                grouped.setdefault(sub, []).append(change)
        for sub in sorted(grouped, key=lambda s: s.id):
            if sub.active:
                try:
                    sub.callback(tuple(grouped[sub]))
                except Exception as exc:
                    self._report_failure(sub.callback, exc, batch)

    def _chain_stopped(self, raw: tuple[RawChange, ...], level: int) -> None:
        """A chain of reactions went past MAX_CHAIN: this batch stays committed, undelivered."""
        batch = tuple(map(_wrap, raw))
        keys = ", ".join(sorted({c.key for c in batch}))
        error = DeliveryChainError(
            f"receivers and watchers reacting to each other's writes made a chain of {level} "
            f"deliveries, stopped at {keys}: the writes stand, this change was not delivered. A "
            "receiver or watcher probably writes a key it reacts to; make it write only when "
            "the value differs, or react to another key"
        )
        log.error("state delivery (seq %d): %s", batch[0].seq, error)
        self._send_failure("delivery chain", error, batch)

    def _report_failure(self, receiver: object, exc: Exception, batch: tuple[Change, ...]) -> None:
        keys = ", ".join(sorted({c.key for c in batch}))
        name = getattr(receiver, "__qualname__", None) or repr(receiver)
        log.error(
            "state receiver %s failed on a change to %s (seq %d); the write stands and other "
            "receivers still ran",
            name,
            keys,
            batch[0].seq,
            exc_info=exc,
        )
        self._send_failure(receiver, exc, batch)

    def _send_failure(self, receiver: object, exc: Exception, batch: tuple[Change, ...]) -> None:
        if self.receiver_failed.receivers:
            try:
                self.receiver_failed.send(self, receiver=receiver, error=exc, changes=batch)
            except Exception:
                log.exception("a receiver_failed handler failed too")

    # -- subscriptions and watchers ----------------------------------------------------------

    def subscribe(
        self,
        callback: Callback,
        keys: str | Key[Any] | Iterable[str | Key[Any]] | None = None,
        pattern: str | Iterable[str] | None = None,
    ) -> Subscription:
        """Call ``callback(changes)`` once per committed batch touching the watched keys.

        ``keys`` (exact keys) and ``pattern`` (one or more ``*`` patterns) filter what is
        delivered; with neither, every change is. ``changes`` holds only the matching changes of
        the batch, in commit order. A callback that raises is logged and reported on
        ``receiver_failed``; the write and the other subscribers are unaffected.
        """
        names = None if keys is None else [self._name(k) for k in _key_list(keys)]
        sub = self._subs.make(self, callback, names, pattern)
        self._refresh_listening()
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        self._subs.remove(sub)
        self._refresh_listening()

    def watch(
        self,
        key: str | Key[Any],
        when: Trigger | Callable[[Any, Any], bool],
        action: Callable[[Change], Any],
    ) -> Subscription:
        """Call ``action(change)`` whenever a change to ``key`` satisfies ``when(old, new)``.

        Use the predicates in :mod:`slateflow.when` (``changed_to``, ``crossed_above``, ...).
        """
        name = self._name(key)
        if not callable(when) or not callable(action):
            raise TypeError(
                f"watch({name!r}, when, action) needs two callables: a predicate over "
                "(old, new) such as when.changed_to('done'), and an action taking the Change"
            )

        def on_change(changes: tuple[Change, ...]) -> None:
            for change in changes:
                if when(change.old, change.new):
                    action(change)

        action_name = getattr(action, "__qualname__", repr(action))
        on_change.__qualname__ = f"watch({name!r}, {when!r}, {action_name})"
        return self.subscribe(on_change, keys=[name])

    # -- async waits -------------------------------------------------------------------------

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
        """Wait until ``predicate(state)`` is truthy and return what it returned.

        The predicate is checked now and after every committed batch touching ``keys`` /
        ``pattern`` (every batch if neither is given), at delivery time, so a condition that is
        true only briefly is still seen. An exception from the predicate is raised here
        unchanged. Raises :class:`WaitTimeoutError` after ``timeout`` seconds.
        """
        return await waits.wait_until(self, predicate, keys, pattern, timeout)

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
        token = self._push_actor(actor)
        try:
            yield actor
        finally:
            self._pop_actor(token)

    def _push_actor(self, actor: Actor | None) -> Token[Actor | None]:
        # No contextmanager here: the Session enters one per resolver run (a hot path).
        token = self._actorvar.set(actor)
        with self._lock:
            self._acting += 1
        return token

    def _pop_actor(self, token: Token[Actor | None]) -> None:
        self._actorvar.reset(token)
        with self._lock:
            self._acting -= 1

    def _admit(
        self, keys: Iterable[str | Key[Any]], source: str, writer: str | None
    ) -> tuple[str, str | None]:
        actor = self._actorvar.get()
        if actor is None:
            return source, writer
        admitted = source, writer
        for key in keys:
            admitted = actor.admit(self._name(key), source, writer)
        return admitted

    def is_fresh(self, name: str) -> bool:
        """Whether resolver ``name`` has a result younger than the ``ttl`` it was written with.

        False when ``<name>:result`` is not set; True for a result written without a ttl. Age is
        measured on this state's clock (pass the Session's clock to ``State(clock=...)`` too).
        """
        row = self._row(result_key(name))
        if row is None:
            return False
        meta = row[4].meta
        ttl = meta.get("ttl") if meta else None
        if not isinstance(ttl, int | float) or isinstance(ttl, bool):
            return True
        return self._now() - row[3] < ttl * 1_000_000_000

    def fresh_for(self, name: str) -> float | None:
        """Seconds (on this state's clock) until resolver ``name``'s result stops being fresh:
        0.0 once stale, None when there is no result or it was written without a ttl."""
        row = self._row(result_key(name))
        if row is None:
            return None
        meta = row[4].meta
        ttl = meta.get("ttl") if meta else None
        if not isinstance(ttl, int | float) or isinstance(ttl, bool):
            return None
        left = ttl * 1_000_000_000 - (self._now() - row[3])
        return max(left, 0) / 1_000_000_000

    # -- transactions ------------------------------------------------------------------------

    def _tx(self) -> Transaction | None:
        """The transaction whose ``with`` block the current context is in, if any.

        Inside the block, state calls go to the transaction (and raise once it is rolled back).
        A task started inside the block inherits its context; once the block has exited, that
        task's reads and writes go to the state again.
        """
        tx = self._txvar.get()
        # After an inner block exits, an outer block may still be open.
        while tx is not None and tx._token is None:
            tx = tx._parent
        return tx

    def transaction(self) -> Transaction:
        """A transaction: ``with state.transaction() as tx: ...`` commits all writes as one batch.

        See :class:`Transaction` for isolation (optimistic, conflict-checked) and nesting.
        """
        return Transaction(self, self._tx() if self._tx_open else None)

    def _enter_tx(self, tx: Transaction) -> Token[Transaction | None]:
        with self._lock:
            self._tx_open += 1
        return self._txvar.set(tx)

    def _exit_tx(self, token: Token[Transaction | None]) -> None:
        self._txvar.reset(token)
        with self._lock:
            self._tx_open -= 1

    # -- governance and schemas --------------------------------------------------------------

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
        """Add a governance rule for ``pattern`` (and/or set ``max_keys``); returns the policy.

        ``state.policy("verify:*", writers=["verify"])`` lets only the ``verify`` resolver write
        its keys; ``state.policy("user:card", secret=True)`` masks a value wherever the state is
        shown. Rules govern later writes; existing values are not re-checked.
        """
        if pattern is None and (read_only or sources or writers or max_bytes or secret):
            given = [
                name
                for name, value in (
                    ("read_only", read_only),
                    ("sources", sources),
                    ("writers", writers),
                    ("max_bytes", max_bytes),
                    ("secret", secret),
                )
                if value
            ]
            raise UsageError(
                f"policy({', '.join(f'{g}=...' for g in given)}) names no key: give the key or "
                "pattern it governs, e.g. state.policy('booking:*', read_only=True)"
            )
        with self._lock:
            if max_keys is not None:
                self._policy.max_keys = max_keys
            if pattern is not None:
                self._policy.add(
                    Rule(
                        pattern,
                        read_only=read_only,
                        sources=name_set(sources),
                        writers=name_set(writers),
                        max_bytes=max_bytes,
                        secret=secret,
                    )
                )
        if secret and self.durable and not isinstance(self._store, SealedStore):
            log.warning(
                "secret values of %r will be stored in clear in %s: open it with "
                "State.open(path, encryption_key=...) to encrypt them",
                pattern,
                getattr(self._store, "path", "the store"),
            )
        return self._policy

    def is_secret(self, key: str | Key[Any]) -> bool:
        """Whether ``key`` is marked secret by the policy."""
        return self._secret(check_key(self._name(key)))

    def declare(self, key: str | Key[Any], type_: Any = None) -> None:
        """Declare the type of a key or ``*`` pattern; later writes are validated against it.

        ``state.declare("booking:party_size", int)``, ``state.declare("*:result", str)``, or
        ``state.declare(BOOKING)`` for a :class:`Key`. The most specific declaration matching a
        key wins. Values already stored under it must match, or :class:`SchemaError` lists them
        and nothing is declared.
        """
        decl = self._schemas.add(key, type_)
        with self._lock:
            self._schemas.activate(decl)
            bad = []
            try:
                # Only keys this declaration wins are checked: a more specific one still
                # governs the others.
                for name, row in self._entries.items():
                    if decl.pattern.matches(name) and self._schemas.find(name) is decl:
                        try:
                            Schemas.check(decl, name, row[0], secret=self._secret(name))
                        except SchemaError as exc:
                            bad.append(str(exc))
            except BaseException:
                self._schemas.deactivate(decl)
                raise
            if bad:
                self._schemas.deactivate(decl)
                raise SchemaError(
                    f"cannot declare {decl.pattern.text!r}: {len(bad)} stored value(s) do not "
                    "match; fix or remove them first:\n" + "\n".join(bad)
                )

    # -- journal -----------------------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """The seq of the last committed batch (0 for a new state)."""
        return self._seq

    def mutations_since(self, cursor: int) -> list[Mutation]:
        """Every mutation committed after ``cursor``, oldest first.

        Raises :class:`CursorExpiredError` when the journal ring no longer holds all of them.
        """
        with self._lock:
            return self._ring.since(cursor, self._seq)

    def add_sink(self, sink: JournalSink) -> None:
        """Feed every later committed batch to ``sink`` as well."""
        if not callable(getattr(sink, "record", None)):
            raise TypeError(f"{sink!r} is not a journal sink (it needs a record(mutations) method)")
        with self._lock:
            self._sinks = (*self._sinks, sink)

    def remove_sink(self, sink: JournalSink) -> None:
        """Stop feeding ``sink``."""
        with self._lock:
            self._sinks = tuple(s for s in self._sinks if s is not sink)

    # -- snapshots and formatting ------------------------------------------------------------

    def snapshot(self, *, redact: bool = False) -> dict[str, Any]:
        """The whole state as JSON-ready data: values, versions, seqs and provenance.

        ``State.restore(snapshot)`` rebuilds it exactly. ``redact=True`` masks secret values
        (for logs and people; a redacted snapshot cannot be restored).
        """
        with self._lock:
            rows = list(self._entries.items())
            seq = self._seq
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
    ) -> State:
        """A new state rebuilt exactly from :meth:`snapshot` output (values, versions, seqs,
        provenance, cursor). Raises :class:`SnapshotError` naming the first bad part."""
        seq, rows = snapshots.parse(snapshot)
        state = cls(policy=policy, journal_size=journal_size, clock=clock, sinks=sinks)
        state._entries.update(rows)
        state._seq = seq
        state._ring.clear(seq)
        return state

    # -- durability ---------------------------------------------------------------------------

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
    ) -> State:
        """Open the durable state kept in the SQLite file at ``path``, creating or recovering it.

        Recovery restores every committed value, version, seq and provenance exactly.
        ``durability="batch"`` (default): a write returns at once and reaches the disk within a
        few milliseconds, grouped with others (a killed process loses the commits of about the
        last 5 ms, ``max_lag``, never half a batch; a writer that outruns the disk waits).
        ``"sync"``: a write returns once its commit is on disk. Close it (or use ``with``) to
        write what is queued. Raises :class:`~slateflow.errors.StoreCorruptError` for a file
        that is not a readable store.

        ``encryption_key`` (needs ``slateflow[crypto]``) encrypts the values of secret keys
        before they reach the file (see :mod:`slateflow.state.sealing`); a file holding such
        values refuses to open without it. Declare secret policies before writing them (pass
        ``policy=``): a value written before its key was marked secret is stored in clear.
        """
        from ..stores.sqlite import SQLiteStore

        policy = policy if policy is not None else Policy()
        sealer = Sealer(encryption_key) if encryption_key is not None else None
        store = SQLiteStore(path, durability=durability)
        backing: Store = store if sealer is None else SealedStore(store, sealer, policy.is_secret)
        try:
            state = cls(
                policy=policy, journal_size=journal_size, clock=clock, sinks=sinks, store=backing
            )
        except BaseException:
            store.close()
            raise
        if sealer is None:
            sealed = next((k for k, row in state._entries.items() if is_sealed(row[0])), None)
            if sealed is not None:
                store.close()
                raise needs_key(path, sealed)
        return state

    @property
    def store(self) -> Store | None:
        """The store keeping this state's commits (None: memory only, no history)."""
        return self._store

    @property
    def durable(self) -> bool:
        """Whether commits reach a disk (a store with ``"batch"`` or ``"sync"`` durability)."""
        return self._store is not None and self._store.durability != "memory"

    def flush(self) -> None:
        """Return once every commit so far is in the store (on disk, for a durable one).

        Raises :class:`~slateflow.errors.StoreError` if the store could not persist them.
        """
        if self._store is not None:
            self._store.sync(self._seq)

    def close(self) -> None:
        """Flush and close the store; later writes raise :class:`~slateflow.errors.StoreClosedError`
        (reads keep working). Idempotent; a state without a store has nothing to close."""
        store = self._store
        if store is None:
            return
        try:
            store.sync(self._seq)
        finally:
            store.close()

    def __enter__(self) -> State:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def compact(self) -> int:
        """Replace the store's history by the current entries; returns the seq compacted to.

        Recovery then starts from this point (faster, smaller file), and ``at(seq)`` can no
        longer reach earlier commits. Without a store there is nothing to compact.
        """
        store = self._store
        with self._lock:
            seq = self._seq
            rows: list[EntryRow] = [
                (key, value, version, row_seq, at, st.source, st.writer, st.confidence, st.meta)
                for key, (value, version, row_seq, at, st) in self._entries.items()
            ]
        if store is not None:
            store.compact(seq, rows)
        return seq

    def at(self, seq: int) -> State:
        """The state as it was right after commit ``seq``: a detached, in-memory copy.

        Needs a store with history (``MemoryStore`` or a durable one). Raises
        :class:`~slateflow.errors.HistoryError` for a seq after the newest commit, before the
        last compaction, or on a state without a store. ``at(state.cursor())`` equals now.
        """
        store = self._store
        if type(seq) is not int or seq < 0:
            raise HistoryError(f"at() needs a commit seq (an int >= 0), got {seq!r}")
        if store is None:
            raise HistoryError(
                f"cannot go back to seq {seq}: this state keeps no history; create it with "
                "State(store=MemoryStore()) or State.open(path)"
            )
        head = self._seq
        if seq > head:
            raise HistoryError(f"seq {seq} is after the newest commit ({head})")
        store.sync(seq)
        loaded = store.read(upto=seq)
        if seq < loaded.base_seq:
            raise HistoryError(
                f"seq {seq} is before the last compaction (seq {loaded.base_seq}); history "
                "before it was dropped"
            )
        past = State(policy=self._policy, journal_size=self._ring.size)
        past._recover(loaded)
        return past

    def _recover(self, loaded: Loaded) -> None:
        """Rebuild entries, seq and the journal ring from a store's contents (at construction)."""
        entries = self._entries
        stamps: dict[tuple[str, str | None, float | None], Stamp] = {}

        def stamp_of(
            source: str, writer: str | None, conf: float | None, meta: dict[str, Any] | None
        ) -> Stamp:
            if meta:
                return Stamp(source, writer, conf, meta)
            stamp = stamps.get((source, writer, conf))
            if stamp is None:
                stamp = stamps[(source, writer, conf)] = Stamp(source, writer, conf, None)
            return stamp

        def known(key: str, where: str) -> None:
            # A stored key is checked the first time it is seen: a file edited by hand must not
            # smuggle in a key the State would refuse.
            try:
                check_key(key)
            except InvalidKeyError as exc:
                raise StoreCorruptError(f"{where}: {exc}; the store is damaged") from None

        for key, value, version, row_seq, at, source, writer, conf, meta in loaded.base:
            known(key, f"the base at seq {loaded.base_seq}")
            entries[key] = (value, version, row_seq, at, stamp_of(source, writer, conf, meta))
        commits = loaded.commits
        size = self._ring.size
        tail = len(commits) - size  # commits from here on may feed the journal ring
        policy = self._policy
        ring: list[RawChange] = []
        seq = loaded.base_seq
        for n, (seq, at, origin, changes) in enumerate(commits):
            for key, value, version, source, writer, conf, meta in changes:
                row = entries.get(key)
                if row is None:
                    known(key, f"commit {seq}")
                stamp = stamp_of(source, writer, conf, meta)
                if version:
                    if version != (row[1] + 1 if row is not None else 1):
                        raise StoreCorruptError(
                            f"commit {seq}: {key!r} jumps to version {version} from "
                            f"{row[1] if row else 0}; the store is damaged"
                        )
                    entries[key] = (value, version, seq, at, stamp)
                elif row is None:
                    raise StoreCorruptError(
                        f"commit {seq} removes {key!r}, which is not set; the store is damaged"
                    )
                else:
                    del entries[key]
                if n >= tail:
                    old = None if row is None else row[0]
                    ring.append(
                        (key, old, value, version, seq, origin, not version, at, stamp, policy)
                    )
        self._seq = seq
        self._ring.clear(commits[tail - 1][0] if 0 < tail <= len(commits) else loaded.base_seq)
        self._ring.append(ring)
        self._ring.trim()

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
        return f"<State {len(self._entries)} keys, seq {self._seq}>"

    # -- scopes ------------------------------------------------------------------------------

    @cached_property
    def app(self) -> ScopedView:
        """Keys under ``app:`` (application-wide configuration and facts)."""
        return ScopedView(self, "app")

    @cached_property
    def user(self) -> ScopedView:
        """Keys under ``user:`` (what is known about the person)."""
        return ScopedView(self, "user")

    @cached_property
    def session(self) -> ScopedView:
        """Keys under ``session:`` (this conversation)."""
        return ScopedView(self, "session")

    @cached_property
    def temp(self) -> ScopedView:
        """Keys under ``temp:`` (scratch; cleared by :meth:`end_turn`)."""
        return ScopedView(self, "temp")

    @cached_property
    def turn(self) -> ScopedView:
        """Keys under ``turn:`` (this turn only; cleared by :meth:`end_turn`)."""
        return ScopedView(self, "turn")

    @cached_property
    def bg(self) -> ScopedView:
        """Keys under ``bg:`` (background work bookkeeping)."""
        return ScopedView(self, "bg")

    @cached_property
    def derived(self) -> ReadOnlyView:
        """Keys under ``derived:``, read-only through this view (writing raises ReadOnlyError):
        values :meth:`derive` computes."""
        return ReadOnlyView(self, "derived")

    def derive(
        self, name: str, fn: Callable[[State], Any], *, reads: Iterable[str | Key[Any]]
    ) -> Derived:
        """Compute ``derived:<name>`` as ``fn(state)`` now and whenever a key in ``reads``
        changes; its provenance (source ``"derived"``, writer ``name``) records the versions of
        the inputs it was computed from. Returns the handle (``close()`` stops it)."""
        return Derived(self, name, fn, reads)


def provenance(state: State, key: str | Key[Any]) -> str | None:
    """The provenance source (``"agent"``, ``"fetch"``, ``"user"``, ...) of ``key``'s value.

    None when the key is not set. The full record is ``state.provenance(key)``.
    """
    record = state.provenance(key)
    return None if record is None else record.source
