"""The ``state`` layer: the governed blackboard every other layer reads and writes."""

from typing import Any

from ..deprecation import deprecated
from . import when
from .actors import Actor
from .derived import Derived
from .freshness import fresh_for, is_fresh
from .history import Journal
from .journal import JournalSink, JsonlSink, MemorySink
from .keys import MAX_KEY_LENGTH, Key, Pattern, error_key, result_key, status_key
from .policy import Policy, Rule
from .provenance import Provenance
from .records import SECRET_MASK, Change, Entry, Mutation
from .scopes import SCOPES, ReadOnlyView, ScopedView, end_turn
from .store import SNAPSHOT_FORMAT, State, source_of
from .subscriptions import Subscription
from .transaction import Transaction
from .when import Transition

__all__ = [
    "MAX_KEY_LENGTH",
    "SCOPES",
    "SECRET_MASK",
    "SNAPSHOT_FORMAT",
    "Actor",
    "Change",
    "Derived",
    "Entry",
    "Journal",
    "JournalSink",
    "JsonlSink",
    "Key",
    "MemorySink",
    "Mutation",
    "Pattern",
    "Policy",
    "Provenance",
    "ReadOnlyView",
    "Rule",
    "ScopedView",
    "State",
    "Subscription",
    "Transaction",
    "Transition",
    "end_turn",
    "error_key",
    "fresh_for",
    "is_fresh",
    "result_key",
    "source_of",
    "status_key",
    "when",
]


def __getattr__(name: str) -> Any:
    if name == "Trigger":
        from ..deprecation import moved

        return moved(
            "slateflow.state", name, {name: ("slateflow.state.Transition", lambda: Transition)}
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@deprecated("slateflow.state.source_of(state, key)")
def provenance(state: State, key: str | Key[Any]) -> str | None:
    """The former name of :func:`source_of` (it shadowed the ``provenance`` module)."""
    return source_of(state, key)
