"""MemoryStore: every commit kept in a list, for time travel and restart tests in one process."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from ..errors import StoreClosedError, StoreError
from .base import Durability
from .records import CommitRow, EntryRow, Loaded

__all__ = ["MemoryStore"]


class MemoryStore:
    """A store that keeps every committed batch in memory (nothing survives the process).

    A plain ``State()`` keeps no history at all; ``State(store=MemoryStore())`` keeps every
    commit, so ``state.journal.at(seq)`` works, and a second ``State(store=same_store)`` recovers
    the
    first one exactly (handy to test resumption without a file). It also keeps workflow
    checkpoints. Memory grows with every commit until ``state.journal.compact()``.
    """

    durability: Durability = "memory"

    def __init__(self) -> None:
        self.error: Exception | None = None
        self._base_seq = 0
        self._base: list[EntryRow] = []
        self._commits: list[CommitRow] = []
        self._checkpoints: dict[str, str] = {}
        self._lock = threading.Lock()

    def load(self) -> Loaded:
        """Everything the store holds (raises ``StoreCorruptError`` for a damaged store)."""
        with self._lock:
            self.error = None  # a recovering State owns the store from here on
            return Loaded(self._base_seq, list(self._base), list(self._commits))

    def read(self, upto: int | None = None) -> Loaded:
        """The base and the commits up to ``upto`` (default: all), without side effects."""
        with self._lock:
            commits = [c for c in self._commits if upto is None or c[0] <= upto]
            return Loaded(self._base_seq, list(self._base), commits)

    def append(self, commit: CommitRow) -> None:
        """Accept one committed batch (called under the State's lock, in seq order)."""
        head = self._commits[-1][0] if self._commits else self._base_seq
        if commit[0] != head + 1:
            # Raised to the stale State only (the State has applied nothing yet); the State
            # that recovered the store last keeps writing.
            raise StoreError(
                f"memory store: commit {commit[0]} does not follow {head}; two States are "
                "writing to one store (give each its own, or recover a copy)"
            )
        self._commits.append(commit)

    def sync(self, seq: int | None = None) -> None:
        """Return once every commit up to ``seq`` (default: all appended) is durable."""
        if self.error is not None and not isinstance(self.error, StoreClosedError):
            raise self.error

    def commits(self, after: int = 0, upto: int | None = None) -> Iterator[CommitRow]:
        """The stored commits with ``after < seq <= upto``, in order."""
        with self._lock:
            rows = list(self._commits)
        for row in rows:
            if row[0] > after and (upto is None or row[0] <= upto):
                yield row

    def compact(self, seq: int, entries: list[EntryRow]) -> None:
        """Replace the history up to ``seq`` by ``entries`` (the state as of ``seq``)."""
        with self._lock:
            self._base_seq = seq
            self._base = list(entries)
            self._commits = [c for c in self._commits if c[0] > seq]

    def close(self) -> None:
        """Persist what is queued and release the store; later appends are refused."""
        self.error = StoreClosedError(
            "the memory store was closed; recover it with State(store=...) to write again"
        )

    def copy(self) -> MemoryStore:
        """A copy of everything stored so far: what a restart would find if the process died
        now. Recover it with ``State(store=store.copy())`` to test resumption in-process."""
        twin = MemoryStore()
        with self._lock:
            twin._base_seq = self._base_seq
            twin._base = list(self._base)
            twin._commits = list(self._commits)
            twin._checkpoints = dict(self._checkpoints)
        return twin

    def load_checkpoint(self, workflow_id: str) -> str | None:
        """The checkpoint saved under ``key``, or None."""
        return self._checkpoints.get(workflow_id)

    def save_checkpoint(self, workflow_id: str, data: str) -> None:
        """Save ``data`` as the checkpoint under ``key`` (replacing one saved before)."""
        self._checkpoints[workflow_id] = data

    def delete_checkpoint(self, workflow_id: str) -> None:
        """Forget the checkpoint under ``key`` (nothing when there is none)."""
        self._checkpoints.pop(workflow_id, None)

    def __repr__(self) -> str:
        return f"<MemoryStore {len(self._commits)} commits after seq {self._base_seq}>"
