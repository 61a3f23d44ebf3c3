"""The engine under a State: the one commit path, validate → version → provenance → journal →
store → deliver.

Every write reaches the engine: ``State.set`` / ``update`` / ``modify`` / ``remove`` /
``rename`` / ``clear_prefix``, a transaction's commit, a resolver's or a flow's own keys
(:meth:`Engine.commit_owned`), and a commit made elsewhere that a replica applies
(:meth:`Engine.apply`). The steps, in order (2 to 5 under the engine's lock):

1. **validate**: key, value (JSON), declared schema, policy (:meth:`prepare`, done by the caller
   before it hands over its ops, so a refused write holds no lock);
2. **version**: conditional versions are checked, then each op becomes a change with its key's
   next version (an equal value is a no-op: no version, no record); nothing is written yet;
3. **provenance**: the op's :class:`Stamp` and the commit time go into the change;
4. **store**: the batch goes to the store, which may refuse it (nothing was written, so the
   state is as it was);
5. **apply** (:meth:`Engine._apply`, the one place rows are written): the rows change, the
   cursor moves on, the batch joins the journal ring, feeds the sinks and is queued for
   delivery if a receiver watches one of its keys;
6. **deliver**: after the lock is released, the batch is sent on ``state.changed`` to its
   receivers, in the order they connected (see :mod:`slateflow.state.delivery`).

On a State shared through a store several processes use (``State.connect``), steps 2 to 4
are the store's: :attr:`Engine.shared` (a :class:`~slateflow.state.replica.Replica`) proposes
the validated ops, the store checks versions, drops no-ops and decides seq and versions, and
the replica applies what it committed through step 5.

The State is the façade users call; the flow and resolve layers use the engine's public
methods, never the State's private names.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import tracing
from ..errors import (
    StoreCorruptError,
    VersionConflictError,
)
from ..stores.base import Store
from ..stores.records import ChangeRow, CommitRow, Loaded
from .chains import depth as chain_depth
from .context import WriteContext
from .delivery import Delivery
from .keys import Key, check_key
from .policy import Policy
from .provenance import Stamp
from .records import Change, RawChange
from .recovery import follow, recover
from .ring import Ring
from .schema import Schemas
from .sinks import JournalSink
from .validation import Op, Validator
from .values import BIG_INT, JSON, REMOVED, Prefix, plain, same

if TYPE_CHECKING:
    from .replica import Replica

__all__ = ["Engine", "Op", "Row"]

Row = tuple[JSON, int, int, int, Stamp]
"""One stored entry: ``(value, version, seq, at_ns, stamp)``. A plain tuple keeps a key small."""

_STRICT = (dict, list, float)
_BIG = BIG_INT  # ints from here on are checked by prepare (a digit cap)
_wrap = Change.wrap


def _equal(old: JSON, new: JSON) -> bool:
    """Whether writing ``new`` over ``old`` changes nothing (1 == 1.0 == True is not equal)."""
    if old is new:
        return True
    if old == new:
        t = type(old)
        if t is type(new):
            return t not in _STRICT or same(old, new)
        if t is Prefix or type(new) is Prefix:
            return same(plain(old), plain(new))
    return False


class Engine:
    """The commit path of one State, and what the runtime layers need from it.

    Thread-safe: every commit runs under :attr:`lock` (re-entrant), and delivery happens after
    it is released, from one thread at a time. Attributes the State's readers use directly:
    :attr:`entries` (key → :data:`Row`; read-only outside the engine), :attr:`seq`;
    :attr:`context` says who writes and into which transaction.
    """

    def __init__(
        self,
        owner: object,
        *,
        policy: Policy,
        journal_size: int,
        clock: Callable[[], float] | None,
    ) -> None:
        self.entries: dict[str, Row] = {}
        self.lock = threading.RLock()
        self.seq = 0
        self.ring = Ring(journal_size)
        self._records = self.ring.records
        self._journaling = journal_size > 0
        self.sinks: tuple[JournalSink, ...] = ()
        self.policy = policy
        self.schemas = Schemas()
        # Commit times are integer nanoseconds: time.time_ns is the cheapest clock call.
        self.now: Callable[[], int] = (
            # A user clock is read at microsecond precision, as Provenance shows it.
            time.time_ns if clock is None else (lambda: round(clock() * 1_000_000) * 1000)
        )
        # Step 1, validation, is the Validator's; its methods are the engine's own names.
        validator = Validator(self.entries, policy, self.schemas)
        self.validator = validator
        self.default_stamp = validator.default_stamp
        self.stamp = validator.stamp
        self.secret = validator.secret
        self.check_new_key = validator.check_new_key
        self.prepare = validator.prepare
        self.check_remove = validator.check_remove
        self.check_version_arg = validator.check_version_arg
        self.stage_update = validator.stage_update
        self.context = WriteContext(self.lock, id(self))
        """Who writes, and into which transaction (a
        :class:`~slateflow.state.context.WriteContext`)."""
        self.delivery = Delivery(owner, self.lock)
        self.store: Store | None = None
        self.sync = False
        self.shared: Replica | None = None
        """The replica's commit path when the store is shared (``State.connect``): every write
        goes through it (:mod:`slateflow.state.replica`)."""

    # -- the commit path ---------------------------------------------------------------------

    def write(
        self, key: str | Key[Any], value: Any, stamp: Stamp, expected_version: int | None
    ) -> int:
        """Commit one write of ``key`` (validated here); returns the key's version.

        The one-op form of :meth:`commit`, the State's hot path: the same steps, without
        building a batch. A scalar over an existing key of an ungoverned state skips validation.
        """
        if self.shared is not None:
            return self.shared.write(key, value, stamp, expected_version)
        entries = self.entries
        policy = self.policy
        # acquire/release costs a third of a with-block on CPython 3.11.
        lock = self.lock
        lock.acquire()
        try:
            store = self.store
            if store is not None and store.error is not None:
                raise store.error
            try:
                row = entries.get(key)  # type: ignore[arg-type]
            except TypeError:  # an unhashable key: prepare names the problem
                row = None
            t = type(value)
            # Only str keys are stored, so a row found for a str means a valid key.
            if (
                row is not None
                and type(key) is str
                and (t is str or t is bool or value is None or (t is int and -_BIG < value < _BIG))
                and not self.schemas.decls
                and not policy.active
            ):
                name: str = key
                cleaned = value
            else:
                name, cleaned = self.prepare(key, value, stamp)
                row = entries.get(name)
            if expected_version is not None:
                have = 0 if row is None else row[1]
                if have != self.check_version_arg(name, expected_version):
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
                if old is cleaned or _equal(old, cleaned):
                    return row[1]
                version = row[1] + 1
            # Read before the seq moves on, in case a user clock raises.
            at = self.now()
            seq = self.seq + 1
            if store is not None:
                # Before anything is applied: a store that refuses the commit leaves the
                # state exactly as it was.
                row_out = (name, cleaned, version, stamp.source, stamp.writer, stamp.confidence,
                           stamp.meta)  # fmt: skip
                store.append((seq, at, "set", (row_out,)))
            # A plain tuple: it becomes a Change only if someone reads it.
            change: RawChange = (name, old, cleaned, version, seq, "set", False, at, stamp, policy)
            # _apply for one change, inlined: this is the hot path of State.set (the general
            # loop cost it a fifth). Same steps, same order.
            entries[name] = (cleaned, version, seq, at, stamp)
            self.seq = seq
            if self._journaling:
                records = self._records
                records.append(change)
                if not seq & 63:  # trimming every 64th commit bounds the overshoot
                    self.ring.trim()
            delivery = self.delivery
            now = False
            if delivery.listening:
                subs = delivery.subscriptions
                if (
                    name in subs.by_key
                    or subs.everything
                    or (subs.by_pattern and subs.watched(name))
                ):
                    if delivery.claim():
                        now = True
                    else:
                        delivery.pending.append(((change,), chain_depth()))
            failures = self._feed_sinks((change,)) if self.sinks else None
            if tracing.current is not None:
                tracing.current.commit((change,))
        finally:
            lock.release()
        if failures:
            self._report_sink_failures(failures, (change,))
        if now:
            delivery.deliver_now((change,), chain_depth())
        elif delivery.pending:
            delivery.deliver()
        if self.sync:
            self.store.sync(seq)  # type: ignore[union-attr]
        return version

    def commit_owned(
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
        """Commit a runtime batch (a resolver's or a flow's own keys) with a prebuilt stamp.

        Validated like any write (keys, values, schemas, policies) but not fenced by an actor nor
        routed into a transaction: the runtime writes its keys as itself, whoever's code is
        running. Keys in ``refresh`` are written even when their value is unchanged (a new run
        produced it: its provenance and age must be the new run's). With ``deliver=False`` the
        caller delivers later (:meth:`deliver`). ``trusted=True`` skips the value check and
        copy: only for fresh plain JSON the caller built and will not change (keys and policies
        are still checked). Returns the commit's seq.
        """
        policy = self.policy
        if (
            trusted
            and self.store is None
            and not refresh
            and not policy.active
            and policy.max_keys is None
        ):
            return self._commit_trusted(writes, stamp, origin, deliver)
        ops: list[Op] = []
        add = ops.append
        if trusted:
            entries = self.entries
            for key, value in writes.items():
                if key not in entries:
                    self.check_new_key(key)
                if policy.active:
                    policy.check(key, plain(value), stamp)
                add((key, value, stamp))
        else:
            prepare = self.prepare
            for key, value in writes.items():
                add((*prepare(key, value, stamp), stamp))
        for key in removes:
            self.check_remove(key, stamp)
            add((key, REMOVED, stamp))
        return self.commit(ops, origin, refresh=refresh, deliver=deliver)

    def _commit_trusted(
        self, writes: Mapping[str, Any], stamp: Stamp, origin: str, deliver: bool
    ) -> int:
        """:meth:`commit` of trusted values on an ungoverned State with no store, without
        building ops first (a flow's progress, on every step)."""
        entries = self.entries
        for key in writes:
            if key not in entries:
                self.check_new_key(key)  # before anything changes
        changes: list[RawChange] = []
        add = changes.append
        lock = self.lock
        lock.acquire()
        try:
            seq = self.seq + 1
            at = self.now()
            policy = self.policy
            for key, value in writes.items():
                row = entries.get(key)
                if row is None:
                    old, version = None, 1
                else:
                    old = row[0]
                    if type(value) is Prefix:
                        if type(old) is Prefix and old.n == value.n and _equal(old, value):
                            continue
                    elif old is value or (old == value and _equal(old, value)):
                        continue
                    version = row[1] + 1
                add((key, old, value, version, seq, origin, False, at, stamp, policy))
            if not changes:
                return self.seq
            batch = tuple(changes)
            failures = self._apply(batch)
        finally:
            lock.release()
        if failures or self.sync or (deliver and self.delivery.pending):
            return self._after(batch, seq, deliver, failures)
        return seq

    def commit(
        self,
        ops: Sequence[Op],
        origin: str,
        *,
        expected: Mapping[str, int] | None = None,
        reads: Mapping[str, int] | None = None,
        deliver: bool = True,
        refresh: frozenset[str] = frozenset(),
    ) -> int:
        """Apply validated ``ops`` as one batch: one seq, one journal batch, one signal.

        Every check that depends on the current state happens before anything is written, so a
        failure leaves everything as it was. Returns the commit's seq (the current cursor when
        nothing changed).
        """
        if self.shared is not None:
            return self.shared.commit(
                ops, origin, expected=expected, reads=reads, deliver=deliver, refresh=refresh
            )
        entries = self.entries
        policy = self.policy
        store = self.store
        lock = self.lock
        lock.acquire()
        try:
            if store is not None and store.error is not None:
                raise store.error
            if expected or reads:
                self._check_versions(expected, reads)
            if policy.max_keys is not None:
                created = {k for k, v, _ in ops if v is not REMOVED and k not in entries}
                gone = {k for k, v, _ in ops if v is REMOVED and k in entries}
                if created:
                    policy.check_count(next(iter(created)), len(entries) + len(created) - len(gone))
            seq = self.seq + 1
            at = self.now()
            changes: list[RawChange] = []
            add = changes.append
            # The rows this batch has already changed (a key written twice sees its first write).
            touched: dict[str, tuple[JSON, int] | None] = {}
            for key, value, stamp in ops:
                if key in touched:
                    seen = touched[key]
                    old, have = (None, 0) if seen is None else seen
                else:
                    row = entries.get(key)
                    old, have = (None, 0) if row is None else (row[0], row[1])
                if value is REMOVED:
                    if not have:
                        continue
                    touched[key] = None
                    add((key, old, None, 0, seq, origin, True, at, stamp, policy))
                    continue
                if have:
                    # The common case, a new value, costs one `==` (a Prefix, only a length).
                    if type(value) is Prefix:
                        unchanged = type(old) is Prefix and old.n == value.n and _equal(old, value)
                    else:
                        unchanged = old is value or (old == value and _equal(old, value))
                    if unchanged and key not in refresh:
                        continue
                touched[key] = (value, have + 1)
                add((key, old, value, have + 1, seq, origin, False, at, stamp, policy))
            if not changes:
                return self.seq
            if store is not None:
                rows: list[ChangeRow] = [
                    (c[0], plain(c[2]), c[3], c[8].source, c[8].writer, c[8].confidence, c[8].meta)
                    for c in changes
                ]
                store.append((seq, at, origin, tuple(rows)))
            batch = tuple(changes)
            failures = self._apply(batch)
        finally:
            lock.release()
        if failures or self.sync or (deliver and self.delivery.pending):
            return self._after(batch, seq, deliver, failures)
        return seq

    def apply(self, commit: CommitRow) -> int:
        """Apply a commit another process made (its seq, versions and stamps as they are).

        For a replica: the commit goes through the same rows, journal, sinks and delivery as a
        local one, but it is neither validated (its maker did that) nor handed to the store
        (it came from there). Raises :class:`StoreCorruptError` if its seq or a version does
        not follow what this engine holds. Returns the commit's seq.
        """
        with self.lock:
            batch, failures = self.apply_locked(commit)
        return self._after(batch, commit[0], True, failures)

    def apply_locked(
        self, commit: CommitRow
    ) -> tuple[tuple[RawChange, ...], list[tuple[object, Exception]] | None]:
        """:meth:`apply` without the delivery, for a caller holding :attr:`lock`: the batch
        applied and the sinks' failures (it reports them and delivers after releasing)."""
        seq, at, origin, rows = commit
        if seq != self.seq + 1:
            raise StoreCorruptError(
                f"commit {seq} does not follow seq {self.seq}; fetch the commits in between"
            )
        entries = dict(self.entries) if len({r[0] for r in rows}) < len(rows) else None
        view = self.entries if entries is None else entries
        changes: list[RawChange] = []
        for key, value, version, source, writer, conf, meta in rows:
            row = follow(view, key, version, seq)
            stamp = Stamp(source, writer, conf, meta)
            old = None if row is None else row[0]
            if entries is not None:  # a key twice in one commit: the second sees the first
                if version:
                    entries[key] = (value, version, seq, at, stamp)
                else:
                    del entries[key]
            changes.append(
                (key, old, value, version, seq, origin, not version, at, stamp, self.policy)
            )
        batch = tuple(changes)
        return batch, self._apply(batch)

    def _check_versions(
        self, expected: Mapping[str, int] | None, reads: Mapping[str, int] | None
    ) -> None:
        entries = self.entries
        for label, versions in (("expected", expected), ("read", reads)):
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

    def _apply(self, batch: tuple[RawChange, ...]) -> list[tuple[object, Exception]] | None:
        """Under the lock, the one place batches are written (``write`` inlines it for its one
        change, the hot path of ``State.set``): the batch's rows change, the cursor moves to its
        seq, it joins the journal ring, is queued for delivery if a receiver watches one of its
        keys, and feeds the sinks. Returns the sinks' failures (reported after the lock is
        released)."""
        entries = self.entries
        for c in batch:
            if c[6]:
                del entries[c[0]]
            else:
                entries[c[0]] = (c[2], c[3], c[4], c[7], c[8])
        self.seq = batch[0][4]
        if self._journaling:
            records = self._records
            records.extend(batch)
            if len(records) > self.ring.limit:
                self.ring.trim()
        delivery = self.delivery
        if delivery.listening:
            subs = delivery.subscriptions
            by_key = subs.by_key
            patterned = subs.by_pattern
            for c in batch:
                if subs.everything or c[0] in by_key or (patterned and subs.watched(c[0])):
                    delivery.pending.append((batch, chain_depth()))
                    break
        if tracing.current is not None:
            tracing.current.commit(batch)
        return self._feed_sinks(batch) if self.sinks else None

    def _after(
        self,
        batch: tuple[RawChange, ...],
        seq: int,
        deliver: bool,
        failures: list[tuple[object, Exception]] | None,
    ) -> int:
        """After the lock: report sink failures, deliver, and wait for a sync store."""
        if failures:
            self._report_sink_failures(failures, batch)
        if deliver and self.delivery.pending:
            self.delivery.deliver()
        if self.sync:
            self.store.sync(seq)  # type: ignore[union-attr]
        return seq

    def deliver(self) -> None:
        """Deliver what commits made with ``deliver=False`` queued (a no-op when nothing is)."""
        if self.delivery.pending:
            self.delivery.deliver()

    # -- sinks -------------------------------------------------------------------------------

    def _feed_sinks(self, raw: tuple[RawChange, ...]) -> list[tuple[object, Exception]]:
        failures: list[tuple[object, Exception]] = []
        batch = tuple(map(_wrap, raw))
        for sink in self.sinks:
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
            self.delivery.report_failure(sink, exc, batch)

    def add_sink(self, sink: JournalSink) -> None:
        """Feed every later committed batch to ``sink`` as well."""
        if not callable(getattr(sink, "record", None)):
            raise TypeError(f"{sink!r} is not a journal sink (it needs a record(changes) method)")
        with self.lock:
            self.sinks = (*self.sinks, sink)

    def remove_sink(self, sink: JournalSink) -> None:
        """Stop feeding ``sink``."""
        with self.lock:
            self.sinks = tuple(s for s in self.sinks if s is not sink)

    # -- reads the runtime needs -------------------------------------------------------------

    def row(self, key: str) -> Row | None:
        """The stored row of ``key`` (no copy: never mutate its value), None when absent."""
        row = self.entries.get(key)
        if row is None:
            check_key(key)  # an invalid key is an error, not merely absent
        return row

    def versions(self) -> dict[str, int]:
        """Every key's version, read in one consistent view."""
        with self.lock:
            return {key: row[1] for key, row in self.entries.items()}

    # -- recovery ----------------------------------------------------------------------------

    def recover(self, loaded: Loaded) -> None:
        """Rebuild entries, seq and the journal ring from a store's contents (at construction)."""
        recover(self, loaded)

    def load(self, rows: Mapping[str, Row], seq: int) -> None:
        """Start from ``rows`` at ``seq`` with an empty journal (a restored snapshot, at
        construction: nothing is journaled, stored or delivered)."""
        with self.lock:
            self.entries.update(rows)
            self.seq = seq
            self.ring.clear(seq)
