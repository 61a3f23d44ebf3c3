"""The store seam: what the State asks of the place its commits live."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from .records import CommitRow, EntryRow, Loaded

__all__ = ["CheckpointStore", "Durability", "Store"]

Durability: TypeAlias = Literal["memory", "batch", "sync"]
"""How far a commit has gone when ``set`` returns.

``"memory"``: nowhere (a process exit loses it). ``"batch"``: queued for a background writer that
commits groups of batches to disk within a few milliseconds (a crash of the process loses at most
those queued commits, a bounded backlog). ``"sync"``: the commit's transaction is on disk (fsynced).
"""


@runtime_checkable
class Store(Protocol):
    """Where a State's committed batches live.

    The State calls ``append`` inside its commit, under its lock, once per committed batch and in
    seq order; it must be quick (queue the work, do the I/O elsewhere). With ``durability ==
    "sync"`` the State then calls ``sync(seq)`` outside its lock, so ``set`` returns only once
    the commit is durable. A store that can no longer persist sets ``error``; the State checks it
    before each commit and refuses the write (nothing is applied) by raising it.
    """

    durability: Durability
    error: Exception | None

    def load(self) -> Loaded:
        """Everything the store holds (raises ``StoreCorruptError`` for a damaged store)."""
        ...

    def read(self, upto: int | None = None) -> Loaded:
        """The base and the commits up to ``upto`` (default: all), without side effects; for
        time travel and replays."""
        ...

    def append(self, commit: CommitRow) -> None:
        """Accept one committed batch (called under the State's lock, in seq order)."""
        ...

    def sync(self, seq: int | None = None) -> None:
        """Return once every commit up to ``seq`` (default: all appended) is durable; raise the
        store's error if it could not be persisted."""
        ...

    def commits(self, after: int = 0, upto: int | None = None) -> Iterator[CommitRow]:
        """The stored commits with ``after < seq <= upto``, in order."""
        ...

    def compact(self, seq: int, entries: list[EntryRow]) -> None:
        """Replace the history up to ``seq`` by ``entries`` (the state as of ``seq``)."""
        ...

    def close(self) -> None:
        """Persist what is queued and release the store; later appends are refused."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Keeps workflow checkpoints (JSON text) by workflow id; used by resumable fan-outs."""

    def load_checkpoint(self, workflow_id: str) -> str | None:
        """The checkpoint saved for ``workflow_id``, or None."""
        ...

    def save_checkpoint(self, workflow_id: str, data: str) -> None:
        """Save (replace) the checkpoint of ``workflow_id`` durably."""
        ...

    def delete_checkpoint(self, workflow_id: str) -> None:
        """Forget the checkpoint of ``workflow_id`` (no error if there is none)."""
        ...
