"""slateflow: a reactive state blackboard for conversational and voice agents.

The :class:`State` is the core: a governed, observable key-value store that resolvers, extractors,
tools and people write to (with provenance), and that flows react to through change signals.

This namespace holds what an app writes; everything else lives in its layer's subpackage
(``slateflow.state``, ``slateflow.resolve``, ``slateflow.flow``, ``slateflow.conversation``,
``slateflow.stores``, ``slateflow.errors``).
"""

from . import errors as errors
from .conversation import Conversation
from .errors import SlateError
from .flow import (
    Digression,
    Flow,
    FlowStack,
    RepairPolicy,
    Step,
    VoiceTiming,
    active,
    all_,
    always,
    any_,
    before,
    between,
    called_ok,
    captured,
    commit,
    custom,
    done,
    edge,
    entered,
    eq,
    failed,
    fresh,
    ge,
    gt,
    is_set,
    is_true,
    le,
    lt,
    never,
    not_,
    once,
    pending,
    require,
    reset,
    resolved,
    run,
    told,
)
from .resolve import (
    ManualClock,
    Resolver,
    Retry,
    Scheduling,
    Session,
)
from .state import (
    Change,
    Key,
    Policy,
    State,
)
from .stores import (
    MemoryStore,
    SQLiteStore,
)

__version__ = "0.1.0"

__all__ = [
    "Change",
    "Conversation",
    "Digression",
    "Flow",
    "FlowStack",
    "Key",
    "ManualClock",
    "MemoryStore",
    "Policy",
    "RepairPolicy",
    "Resolver",
    "Retry",
    "SQLiteStore",
    "Scheduling",
    "Session",
    "SlateError",
    "State",
    "Step",
    "VoiceTiming",
    "active",
    "all_",
    "always",
    "any_",
    "before",
    "between",
    "called_ok",
    "captured",
    "commit",
    "custom",
    "done",
    "edge",
    "entered",
    "eq",
    "failed",
    "fresh",
    "ge",
    "gt",
    "is_set",
    "is_true",
    "le",
    "lt",
    "never",
    "not_",
    "once",
    "pending",
    "require",
    "reset",
    "resolved",
    "run",
    "told",
]
