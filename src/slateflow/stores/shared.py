"""The seam of a store several processes share: the store decides the order, replicas follow.

A State over a :class:`SharedStore` keeps every key in memory, as a replica: reads never leave
the process. Each write becomes a :class:`Proposal` the store commits in one round trip: it
checks the versions the write depends on, drops the changes that change nothing, gives each
key its next version and the commit the next seq, and says what it did (:class:`Committed`,
:class:`Unchanged` or :class:`Conflict`). The commits other processes make reach the replica as
:class:`Remote` records, in seq order, each naming the commit before it, so a replica that finds
a history it did not follow can tell.

The records are plain data: the store never sees the State's classes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .base import Store
from .records import CommitRow, Loaded

__all__ = [
    "Committed",
    "Conflict",
    "Proposal",
    "ProposedChange",
    "Remote",
    "Replica",
    "SharedStore",
    "Snapshot",
    "Unchanged",
]


class ProposedChange(NamedTuple):
    """One key of a proposal: its new value (``removed``: the key goes), the stamp's parts, and
    ``refresh`` (write it even when the value is unchanged: a new run produced it)."""

    key: str
    value: Any
    removed: bool
    source: str
    writer: str | None
    confidence: float | None
    meta: dict[str, Any] | None
    refresh: bool = False


@dataclass(slots=True)
class Proposal:
    """A batch a replica asks the store to commit: ``commit_id`` makes sending it twice safe;
    ``checks`` are the versions it depends on (key → version, 0: the key must be absent);
    ``after`` is the seq the replica has applied (a store may send the few commits between it
    and this one along with the outcome, sparing a round trip to fetch them)."""

    commit_id: str
    at_ns: int
    origin: str
    changes: Sequence[ProposedChange]
    checks: dict[str, int] = field(default_factory=dict)
    after: int = 0


class Committed(NamedTuple):
    """The store committed the proposal as ``seq``, after the commit ``prev`` (its id);
    ``versions`` holds each change's new version in order (``-1``: unchanged, dropped; ``0``:
    removed). A proposal the store had already committed (sent again after a lost reply)
    comes back with ``versions=None`` and its original seq. ``missed``: commits between the
    proposal's ``after`` and this one, if the store sent them along."""

    seq: int
    prev: str
    versions: tuple[int, ...] | None
    missed: tuple[Remote, ...] = ()


class Unchanged(NamedTuple):
    """Every change of the proposal was a no-op: nothing was committed; ``seq`` and ``head``
    are the store's newest commit and its id."""

    seq: int
    head: str


class Conflict(NamedTuple):
    """A checked version did not hold: ``key`` is at ``version`` in the store, holding
    ``value`` (its JSON text; None when absent or not told); nothing was committed."""

    key: str
    version: int
    value: str | None = None


class Remote(NamedTuple):
    """A commit as the store holds it: its seq, id, the id of the commit before it, the rows."""

    seq: int
    commit_id: str
    prev: str
    commit: CommitRow


class Snapshot(NamedTuple):
    """Everything a store holds for the call now: ``loaded`` (its entries as a base at the
    newest seq) and ``head``, that commit's id."""

    loaded: Loaded
    head: str


class Replica(Protocol):
    """What a store's follower calls on a replica it follows (from the follower's thread)."""

    def position(self) -> tuple[int, str]:
        """The seq and commit id the replica has applied last."""
        ...

    def skips(self, seq: int, commit_id: str) -> bool:
        """Whether the replica needs no copy of commit ``seq`` (it applied it, or made it and
        applies it itself): a cheap answer without locks, so the follower can skip decoding."""
        ...

    def receive(self, remotes: Sequence[Remote]) -> None:
        """Commits the store published, in seq order (some may be applied already)."""
        ...

    def diverged(self, why: str) -> None:
        """The store no longer holds the history the replica applied (``why`` says how)."""
        ...


@runtime_checkable
class SharedStore(Store, Protocol):
    """A store shared by several processes (see the module): it decides the order."""

    call_id: str

    def propose(self, proposal: Proposal) -> Committed | Unchanged | Conflict:
        """Commit ``proposal`` in one round trip; raises ``StoreError`` when the server cannot
        be reached (nothing was committed) or the outcome stays unknown (say so)."""
        ...

    def fetch(self, after: int, upto: int | None = None) -> list[Remote]:
        """The commits with ``after < seq <= upto`` the store still holds, in order."""
        ...

    def head(self) -> tuple[int, str]:
        """The seq and id of the store's newest commit (``(0, "")`` for a new call)."""
        ...

    def snapshot(self) -> Snapshot:
        """The call's entries and newest commit, read at one moment."""
        ...

    def follow(self, replica: Replica) -> Callable[[], None]:
        """Hand every later commit to ``replica`` (see :class:`Replica`); returns the function
        that stops it."""
        ...
