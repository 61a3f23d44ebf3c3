"""The State's former names, kept for one release: each warns with its new address.

The journal's methods moved to ``state.journal`` (``since``, ``add_sink``, ``remove_sink``,
``at``, ``compact``); freshness to ``slateflow.resolve.is_fresh(state, name)`` /
``fresh_for(state, name)``; clearing the turn scopes to ``slateflow.state.end_turn(state)``
(a Call does it at the end of every turn); derived values to
``slateflow.state.Derived(state, name, fn, reads=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from ..deprecation import deprecated
from .derived import Derived
from .freshness import fresh_for, is_fresh
from .journal import JournalSink
from .keys import Key
from .records import Mutation
from .scopes import end_turn

if TYPE_CHECKING:
    from .history import Journal
    from .store import State

__all__ = ["StateAliases"]


class StateAliases:
    """The deprecated names of ``State``."""

    if TYPE_CHECKING:

        @property
        def journal(self) -> Journal: ...

    def _self(self) -> State:
        return cast("State", self)

    @deprecated("state.journal.since(cursor)")
    def mutations_since(self, cursor: int) -> list[Mutation]:
        """Every mutation committed after ``cursor``."""
        return self.journal.since(cursor)

    @deprecated("state.journal.add_sink(sink)")
    def add_sink(self, sink: JournalSink) -> None:
        """Feed every later committed batch to ``sink``."""
        self.journal.add_sink(sink)

    @deprecated("state.journal.remove_sink(sink)")
    def remove_sink(self, sink: JournalSink) -> None:
        """Stop feeding ``sink``."""
        self.journal.remove_sink(sink)

    @deprecated("state.journal.at(seq)")
    def at(self, seq: int) -> State:
        """The state as it was right after commit ``seq``."""
        return self.journal.at(seq)

    @deprecated("state.journal.compact()")
    def compact(self) -> int:
        """Replace the store's history by the current entries."""
        return self.journal.compact()

    @deprecated("slateflow.state.end_turn(state) (a Call clears the turn scopes itself)")
    def end_turn(self) -> int:
        """Clear the ``turn:`` and ``temp:`` scopes in one batch."""
        return end_turn(self._self())

    @deprecated("slateflow.resolve.is_fresh(state, name)")
    def is_fresh(self, name: str) -> bool:
        """Whether resolver ``name``'s result is younger than its ttl."""
        return is_fresh(self._self(), name)

    @deprecated("slateflow.resolve.fresh_for(state, name)")
    def fresh_for(self, name: str) -> float | None:
        """Seconds until resolver ``name``'s result stops being fresh."""
        return fresh_for(self._self(), name)

    @deprecated("slateflow.state.Derived(state, name, fn, reads=...)")
    def derive(
        self, name: str, fn: Callable[[State], Any], *, reads: Iterable[str | Key[Any]]
    ) -> Derived:
        """Compute ``derived:<name>`` as ``fn(state)`` whenever a key in ``reads`` changes."""
        return Derived(self._self(), name, fn, reads)
