"""Persistence for the State: snapshots, durable files, flush and close, compaction, time travel.

A part of the :class:`~slateflow.state.State` façade (a mixin): it holds no state of its own and
works through the State's engine and its store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self

from ..stores.base import Durability, Store
from . import snapshots
from .facade import Facade
from .journal import JournalSink
from .policy import Policy
from .sealing import EncryptionKey, SealedStore, Sealer, is_sealed, needs_key

if TYPE_CHECKING:
    pass

__all__ = ["Persistence"]

log = logging.getLogger("slateflow.state")


class Persistence(Facade):
    """Snapshots, durable files and history: the State's methods that reach its store."""

    # -- snapshots ---------------------------------------------------------------------------

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
        state._entries.update(rows)
        state._engine.seq = seq
        state._engine.ring.clear(seq)
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
    ) -> Self:
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
        return self._engine.store

    @property
    def durable(self) -> bool:
        """Whether commits reach a disk (a store with ``"batch"`` or ``"sync"`` durability)."""
        return self._engine.store is not None and self._engine.store.durability != "memory"

    def flush(self) -> None:
        """Return once every commit so far is in the store (on disk, for a durable one).

        Raises :class:`~slateflow.errors.StoreError` if the store could not persist them.
        """
        if self._engine.store is not None:
            self._engine.store.sync(self._engine.seq)

    def close(self) -> None:
        """Flush and close the store; later writes raise :class:`~slateflow.errors.StoreClosedError`
        (reads keep working). Idempotent; a state without a store has nothing to close."""
        store = self._engine.store
        if store is None:
            return
        try:
            store.sync(self._engine.seq)
        finally:
            store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
