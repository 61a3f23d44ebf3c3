"""A State as a replica of a call on a shared store (``State.connect``).

The engine hands every write of a State over a
:class:`~slateflow.stores.shared.SharedStore` to its :class:`Replica`, which keeps the engine's
steps but lets the store decide: the ops are validated here (keys, values, schemas, policies),
sent as one :class:`~slateflow.stores.shared.Proposal` with the versions they depend on, and
applied once the store says what it committed, through the engine's one apply step. Reads
never leave the process.

The commits other processes made come from the store's follower (:meth:`Replica.receive`) or
are fetched when this replica's own commit lands after them; either way each is applied once,
in seq order, through the same step, so subscribers, watchers and flows react to them as to a
local write (in the thread that applied it). Each commit names the one before it: a replica
that finds a history it did not apply resyncs from the store's snapshot and says so
(:class:`~slateflow.errors.StoreDivergedError` on ``receiver_failed``, and the log).

Differences from a local State, all in the docs: an equal value written is still sent (this
replica may be behind); ``modify`` is a compare-and-set loop whose function may run more than
once; a transaction's reads become version checks on the server; the policy of this process
re-checks the commits others made (a process with weaker policies can write what this one
would refuse) and reports a violation instead of refusing it (the store has decided).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import (
    CommitUnknownError,
    PolicyViolation,
    StoreDivergedError,
    StoreError,
    VersionConflictError,
)
from ..stores.shared import (
    Committed,
    Conflict,
    Proposal,
    ProposedChange,
    Remote,
    SharedStore,
    Unchanged,
)
from .keys import Key, key_name
from .provenance import Stamp
from .records import Change, RawChange
from .values import JSON, REMOVED, clean, copy_json, plain

if TYPE_CHECKING:
    from .engine import Engine, Op

_loads = json.loads

__all__ = ["MODIFY_ATTEMPTS", "Replica"]

log = logging.getLogger("slateflow.state")

MODIFY_ATTEMPTS = 100
"""How many times a ``modify`` on a shared State reads, computes and tries to commit before it
gives up with :class:`~slateflow.errors.VersionConflictError`."""

_RECENT = 4096  # commit ids remembered, to check the commits the follower brings again


class Replica:
    """The commit path and the follower's side of a State over a shared store (see the
    module). ``resyncs`` counts the times it found a divergent history and resynced."""

    def __init__(self, engine: Engine, store: SharedStore, head: str) -> None:
        self.engine = engine
        self.store = store
        self.head = head
        """The id of the newest commit applied."""
        self.resyncs = 0
        self._recent: dict[int, str] = {}
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:16]
        self._mine: set[str] = set()  # commits being proposed: their committer applies them

    # -- what the follower calls (from its thread) ------------------------------------------

    def skips(self, seq: int, commit_id: str) -> bool:
        """Whether the follower may skip commit ``seq`` (read without the lock: a hint)."""
        return commit_id in self._mine or seq <= self.engine.seq

    def position(self) -> tuple[int, str]:
        """The seq and id of the newest commit applied."""
        with self.engine.lock:
            return self.engine.seq, self.head

    def receive(self, remotes: Sequence[Remote]) -> None:
        """Apply the commits the store published that this replica has not applied, in order
        (a gap is fetched first), and deliver them."""
        applied: list[tuple[tuple[RawChange, ...], Any]] = []
        with self.engine.lock:
            for remote in remotes:
                self._take(remote, applied)
        self._deliver(applied, True)

    def diverged(self, why: str) -> None:
        """The store no longer holds the history this replica applied: resync from it."""
        applied: list[tuple[tuple[RawChange, ...], Any]] = []
        with self.engine.lock:
            self._resync(why, applied)
        self._deliver(applied, True)

    # -- the commit path ---------------------------------------------------------------------

    def write(
        self, key: str | Key[Any], value: Any, stamp: Stamp, expected_version: int | None
    ) -> int:
        """``State.set`` on a shared State; returns the key's version."""
        engine = self.engine
        name, cleaned = engine.prepare(key, value, stamp)
        expected = None
        if expected_version is not None:
            expected = {name: engine.check_version_arg(name, expected_version)}
        _, versions = self.commit_ops([(name, cleaned, stamp)], "set", expected=expected)
        if versions is not None and versions[0] > 0:
            return versions[0]
        row = engine.entries.get(name)
        return 0 if row is None else row[1]

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
        """:meth:`Engine.commit` on a shared State: the commit's seq."""
        return self.commit_ops(
            ops, origin, expected=expected, reads=reads, deliver=deliver, refresh=refresh
        )[0]

    def commit_ops(
        self,
        ops: Sequence[Op],
        origin: str,
        *,
        expected: Mapping[str, int] | None = None,
        reads: Mapping[str, int] | None = None,
        deliver: bool = True,
        refresh: frozenset[str] = frozenset(),
        conflicts: list[Conflict] | None = None,
    ) -> tuple[int, tuple[int, ...] | None]:
        """Propose ``ops`` and apply what the store committed: the seq and each op's version
        (``None`` when nothing changed or the store had committed it before). A conflict
        catches the replica up, or, with ``conflicts``, is appended there instead (the store
        told the key's value: a retry needs no round trip to read it)."""
        engine = self.engine
        store = self.store
        applied: list[tuple[tuple[RawChange, ...], Any]] = []
        try:
            with engine.lock:
                if store.error is not None:
                    raise store.error
                if engine.policy.max_keys is not None:
                    entries = engine.entries
                    created = {k for k, v, _ in ops if v is not REMOVED and k not in entries}
                    if created:
                        engine.policy.check_count(next(iter(created)),
                                                  len(entries) + len(created))  # fmt: skip
                checks = {**(reads or {}), **(expected or {})}
                proposal = Proposal(
                    f"{self._prefix}-{next(self._ids)}",
                    engine.now(),
                    origin,
                    [_proposed(op, refresh) for op in ops],
                    checks,
                    engine.seq,
                )
                self._mine.add(proposal.commit_id)
                try:
                    outcome = store.propose(proposal)
                except CommitUnknownError:
                    # If it did run, it is on the server already: bring it in now when the
                    # server answers (the follower skipped it as this replica's own).
                    with contextlib.suppress(StoreError):
                        self._catch_up(None, applied)
                    raise
                finally:
                    self._mine.discard(proposal.commit_id)
                if isinstance(outcome, Conflict):
                    if conflicts is None:
                        self._catch_up(None, applied)
                    else:
                        conflicts.append(outcome)
                    raise _conflict(outcome, expected or {}, checks)
                if isinstance(outcome, Unchanged):
                    self._catch_up(outcome.seq, applied)
                    return engine.seq, None
                if outcome.versions is None:  # committed before: its reply had been lost
                    self._catch_up(outcome.seq, applied)
                    return outcome.seq, None
                for remote in outcome.missed:  # sent along: no round trip to fetch them
                    if remote.seq < outcome.seq:
                        self._take(remote, applied)
                self._catch_up(outcome.seq - 1, applied)
                if engine.seq != outcome.seq - 1 or outcome.prev != self.head:
                    self._resync(
                        f"this replica's commit {outcome.seq} follows commit {outcome.prev!r}, "
                        f"but the replica applied {self.head!r} at seq {engine.seq}",
                        applied,
                    )
                    return outcome.seq, outcome.versions
                batch = self._batch(ops, outcome, proposal.at_ns, origin)
                applied.append((batch, engine._apply(batch)))
                self._applied(outcome.seq, proposal.commit_id)
                return outcome.seq, outcome.versions
        finally:
            self._deliver(applied, deliver)

    def modify(
        self, key: str | Key[Any], default: Any, fn: Callable[[Any], Any], stamp: Stamp
    ) -> Any:
        """``State.modify`` as a compare-and-set loop: read this replica, compute, commit if
        the key is still at the version read; else run ``fn`` again on the value the store
        said the key holds (one round trip an attempt: another process writing the key in a
        tight loop would win every race against a replica catching up first)."""
        engine = self.engine
        name = key_name(key)
        told: Conflict | None = None
        conflicts: list[Conflict] = []
        for _ in range(MODIFY_ATTEMPTS):
            with engine.lock:
                row = engine.row(name)
                version = 0 if row is None else row[1]
                if told is not None and told.version > version:
                    version = told.version
                    current = clean(default, name) if told.value is None else _loads(told.value)
                else:
                    current = copy_json(row[0]) if row is not None else clean(default, name)
                target, cleaned = engine.prepare(key, fn(current), stamp)
                try:
                    self.commit_ops([(target, cleaned, stamp)], "modify",
                                    expected={name: version}, deliver=False,
                                    conflicts=conflicts)  # fmt: skip
                except VersionConflictError:
                    told = conflicts[-1]
                    continue
            engine.deliver()
            return copy_json(cleaned)
        engine.deliver()
        raise VersionConflictError(
            f"modify of {name!r} gave up after {MODIFY_ATTEMPTS} attempts: other processes kept "
            "changing it between the read and the commit; retry later or shard the key"
        )

    def retrying(self, attempt: Callable[[], Any]) -> Any:
        """Run ``attempt`` (a write that checks the versions it read) until no other process
        changed them in between (each conflict catches this replica up)."""
        for _ in range(MODIFY_ATTEMPTS - 1):
            try:
                return attempt()
            except VersionConflictError:
                continue
        return attempt()

    def sync(self) -> int:
        """Apply every commit the store holds that this replica has not: the seq reached."""
        applied: list[tuple[tuple[RawChange, ...], Any]] = []
        try:
            with self.engine.lock:
                self._catch_up(None, applied)
                return self.engine.seq
        finally:
            self._deliver(applied, True)

    # -- applying (under the engine's lock) ------------------------------------------------------

    def _catch_up(self, upto: int | None, applied: list[Any]) -> None:
        """Apply the store's commits up to ``upto`` (its newest when None)."""
        if upto is None:
            upto = self.store.head()[0]
        if self.engine.seq >= upto:
            return
        missing = self.store.fetch(self.engine.seq, upto)
        if missing and missing[0].seq == self.engine.seq + 1:
            for remote in missing:
                self._take(remote, applied)
        if self.engine.seq < upto:
            self._resync(
                f"the store no longer holds commits {self.engine.seq + 1} to {upto} "
                "(compacted past this replica)",
                applied,
            )

    def _take(self, remote: Remote, applied: list[Any]) -> None:
        engine = self.engine
        seq = engine.seq
        if remote.seq <= seq:
            known = self._recent.get(remote.seq)
            if known is not None and known != remote.commit_id:
                self._resync(
                    f"the store holds commit {remote.commit_id!r} at seq {remote.seq}, where this "
                    f"replica applied {known!r}",
                    applied,
                )
            return
        if remote.seq > seq + 1:
            self._catch_up(remote.seq - 1, applied)
            if engine.seq >= remote.seq or engine.seq != remote.seq - 1:
                return  # a resync brought the replica past it, or could not reach it
        if remote.prev != self.head:
            self._resync(
                f"commit {remote.seq} follows commit {remote.prev!r}, but this replica applied "
                f"{self.head!r} at seq {seq}",
                applied,
            )
            return
        batch, failures = engine.apply_locked(remote.commit)
        applied.append((batch, failures))
        self._applied(remote.seq, remote.commit_id)
        self._recheck(batch)

    def _applied(self, seq: int, commit_id: str) -> None:
        self.head = commit_id
        recent = self._recent
        recent[seq] = commit_id
        if len(recent) > _RECENT:
            del recent[next(iter(recent))]

    def _recheck(self, batch: tuple[RawChange, ...]) -> None:
        """Check another process's commit against this process's policy: report, not refuse."""
        policy = self.engine.policy
        if not policy.active:
            return
        for c in batch:
            try:
                policy.check(c[0], c[2], c[8], removing=c[6])
            except PolicyViolation as exc:
                changes = tuple(map(Change.wrap, batch))
                log.warning("slateflow: commit %d of %s breaks this process's policy: %s",
                            c[4], self.store, exc)  # fmt: skip
                self.engine.delivery._send_failure(self.store, exc, changes)

    def _resync(self, why: str, applied: list[Any]) -> None:
        """Replace the replica by the store's snapshot, as one batch of what differs."""
        engine = self.engine
        snapshot = self.store.snapshot()
        loaded = snapshot.loaded
        entries = engine.entries
        seq = loaded.base_seq
        at = engine.now()
        policy = engine.policy
        fresh = {row[0]: row for row in loaded.base}
        changes: list[RawChange] = []
        for key, row in list(entries.items()):
            if key not in fresh:
                changes.append((key, row[0], None, 0, seq, "resync", True, at, row[4], policy))
        for key, value, version, _, row_at, source, writer, conf, meta in loaded.base:
            old = entries.get(key)
            if old is None or old[1] != version or old[0] != value:
                stamp = Stamp(source, writer, conf, meta)
                changes.append(
                    (key, None if old is None else old[0], value, version, seq, "resync", False,
                     row_at, stamp, policy)
                )  # fmt: skip
        lost = engine.seq
        self.resyncs += 1
        error = StoreDivergedError(
            f"{self.store}: {why}; resynced from the server's snapshot at seq {seq} (this "
            f"replica was at seq {lost}; {len(changes)} keys differ)"
        )
        log.warning("slateflow: %s", error)
        self._recent.clear()
        self.head = snapshot.head
        if changes:
            batch = tuple(changes)
            applied.append((batch, engine._apply(batch)))
            engine.delivery._send_failure(self.store, error, tuple(map(Change.wrap, batch)))
        else:
            engine.seq = seq
            engine.delivery._send_failure(self.store, error, ())

    def _batch(
        self, ops: Sequence[Op], outcome: Committed, at: int, origin: str
    ) -> tuple[RawChange, ...]:
        """The rows of this replica's own commit, as the store committed them."""
        entries = self.engine.entries
        policy = self.engine.policy
        seq = outcome.seq
        touched: dict[str, JSON] = {}
        changes: list[RawChange] = []
        assert outcome.versions is not None
        for (key, value, stamp), version in zip(ops, outcome.versions, strict=True):
            if version < 0:
                continue
            if key in touched:
                old = touched[key]
            else:
                row = entries.get(key)
                old = None if row is None else row[0]
            removed = version == 0
            new = None if removed else value
            touched[key] = new
            changes.append((key, old, new, version, seq, origin, removed, at, stamp, policy))
        return tuple(changes)

    def _deliver(self, applied: Iterable[tuple[tuple[RawChange, ...], Any]], deliver: bool) -> None:
        engine = self.engine
        for batch, failures in applied:
            if failures:
                engine._report_sink_failures(failures, batch)
        if deliver:
            engine.deliver()

    def __repr__(self) -> str:
        return f"<Replica of {self.store!r} at seq {self.engine.seq}>"


def _proposed(op: Op, refresh: frozenset[str]) -> ProposedChange:
    key, value, stamp = op
    removed = value is REMOVED
    return ProposedChange(
        key,
        None if removed else plain(value),
        removed,
        stamp.source,
        stamp.writer,
        stamp.confidence,
        stamp.meta,
        key in refresh,
    )


def _conflict(
    outcome: Conflict, expected: Mapping[str, int], checks: Mapping[str, int]
) -> VersionConflictError:
    key, have = outcome.key, outcome.version
    want = checks.get(key)
    if key in expected:
        return VersionConflictError(
            f"{key!r} is at version {have}, not the expected {want}; read it again and retry"
        )
    return VersionConflictError(
        f"{key!r} is at version {have}, not the read {want}; another writer changed it after "
        "this transaction read it; run the transaction again"
    )
