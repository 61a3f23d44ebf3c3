"""The ``state`` layer: the governed blackboard every other layer reads and writes."""

from . import when
from .actors import Actor
from .derived import Derived
from .journal import Journal
from .keys import MAX_KEY_LENGTH, Key, Pattern, error_key, result_key, status_key
from .mapping import StateMapping
from .policy import Policy, Rule
from .provenance import Provenance, source_of
from .records import SECRET_MASK, Change, Entry
from .scopes import SCOPES, ReadOnlyView, ScopedView
from .sinks import JournalSink, JsonlSink, MemorySink
from .snapshots import SNAPSHOT_FORMAT
from .state import State
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
    "Pattern",
    "Policy",
    "Provenance",
    "ReadOnlyView",
    "Rule",
    "ScopedView",
    "State",
    "StateMapping",
    "Subscription",
    "Transaction",
    "Transition",
    "error_key",
    "result_key",
    "source_of",
    "status_key",
    "when",
]
