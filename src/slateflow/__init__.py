"""slateflow: a reactive state blackboard for conversational and voice agents.

The :class:`State` is the core: a governed, observable key-value store that resolvers, extractors,
tools and people write to (with provenance), and that flows react to through change signals.

This namespace holds what an app writes; everything else lives in its layer's subpackage
(``slateflow.state``, ``slateflow.resolve``, ``slateflow.flow``, ``slateflow.conversation``,
``slateflow.stores``, ``slateflow.errors``). Names that used to be here still import, with a
``DeprecationWarning`` naming their new address, for one release.
"""

from importlib import import_module
from typing import Any

# The conversation layer registers its Call as the sessions' default conversation.
from . import conversation as conversation
from . import errors as errors
from . import guards as guards
from .errors import (
    SlateError,
)
from .flow import (
    Digression,
    Flow,
    FlowRunner,
    FlowStack,
    RepairPolicy,
    Step,
    VoiceTiming,
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
    "Digression",
    "Flow",
    "FlowRunner",
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

# Names that moved to their layer's subpackage: (subpackage, name there).
_MOVED: dict[str, tuple[str, str]] = {
    "Admission": ("flow", "Admission"),
    "BackgroundResult": ("resolve", "BackgroundResult"),
    "Clock": ("resolve", "Clock"),
    "CursorExpiredError": ("errors", "CursorExpiredError"),
    "Dispatch": ("resolve", "Run"),
    "DispatchRejectedError": ("errors", "DispatchRejectedError"),
    "Edge": ("flow", "Edge"),
    "Enforcement": ("flow", "Enforcement"),
    "Entry": ("state", "Entry"),
    "Explanation": ("flow", "Explanation"),
    "FlowDefinitionError": ("errors", "FlowDefinitionError"),
    "FlowError": ("errors", "FlowError"),
    "FlowExplanation": ("flow", "FlowExplanation"),
    "FlowFormatError": ("errors", "FlowFormatError"),
    "Ground": ("flow", "Ground"),
    "Guard": ("flow", "Guard"),
    "GuardFormatError": ("errors", "GuardFormatError"),
    "HistoryError": ("errors", "HistoryError"),
    "InvalidKeyError": ("errors", "InvalidKeyError"),
    "JournalSink": ("state", "JournalSink"),
    "JsonlSink": ("state", "JsonlSink"),
    "KeyExistsError": ("errors", "KeyExistsError"),
    "LLM": ("resolve", "LLM"),
    "LLMRequest": ("resolve", "LLMRequest"),
    "LLMResponse": ("resolve", "LLMResponse"),
    "MAX_KEY_LENGTH": ("state", "MAX_KEY_LENGTH"),
    "Marking": ("flow", "Marking"),
    "MemorySink": ("state", "MemorySink"),
    "MissingKeyError": ("errors", "MissingKeyError"),
    "Mutation": ("state", "Mutation"),
    "OnEnter": ("flow", "OnEnter"),
    "Pattern": ("state", "Pattern"),
    "PolicyViolation": ("errors", "PolicyViolation"),
    "Provenance": ("state", "Provenance"),
    "ReadOnlyError": ("errors", "ReadOnlyError"),
    "ReadOnlyView": ("state", "ReadOnlyView"),
    "RecoveryError": ("errors", "RecoveryError"),
    "ResolverCancelledError": ("errors", "ResolverCancelledError"),
    "ResolverDefinitionError": ("errors", "ResolverDefinitionError"),
    "ResolverError": ("errors", "ResolverError"),
    "ResolverTimeoutError": ("errors", "ResolverTimeoutError"),
    "Rule": ("state", "Rule"),
    "Run": ("resolve", "Run"),
    "SCOPES": ("state", "SCOPES"),
    "SECRET_MASK": ("state", "SECRET_MASK"),
    "SNAPSHOT_FORMAT": ("state", "SNAPSHOT_FORMAT"),
    "SchemaError": ("errors", "SchemaError"),
    "ScopedView": ("state", "ScopedView"),
    "SessionError": ("errors", "SessionError"),
    "SnapshotError": ("errors", "SnapshotError"),
    "StackRunner": ("flow", "StackRunner"),
    "StateValueError": ("errors", "StateValueError"),
    "StoreClosedError": ("errors", "StoreClosedError"),
    "StoreCorruptError": ("errors", "StoreCorruptError"),
    "StoreError": ("errors", "StoreError"),
    "Subscription": ("state", "Subscription"),
    "SystemClock": ("resolve", "SystemClock"),
    "Template": ("resolve", "Template"),
    "TemplateError": ("errors", "TemplateError"),
    "TextAgent": ("resolve", "TextAgent"),
    "ToolCallError": ("errors", "ToolCallError"),
    "ToolClaim": ("conversation", "ToolClaim"),
    "ToolResult": ("conversation", "ToolResult"),
    "Transaction": ("state", "Transaction"),
    "TransactionError": ("errors", "TransactionError"),
    "Trigger": ("state", "Transition"),
    "Turn": ("resolve", "Turn"),
    "TurnContext": ("resolve", "TurnContext"),
    "Usage": ("resolve", "Usage"),
    "Verdict": ("flow", "Verdict"),
    "VersionConflictError": ("errors", "VersionConflictError"),
    "Violation": ("flow", "Violation"),
    "WaitTimeoutError": ("errors", "WaitTimeoutError"),
    "Watcher": ("resolve", "Watcher"),
    "call": ("resolve", "call"),
    "error_key": ("state", "error_key"),
    "provenance": ("state", "provenance"),
    "result_key": ("state", "result_key"),
    "signals": ("flow", "signals"),
    "status_key": ("state", "status_key"),
    "when": ("state", "when"),
}


def __getattr__(name: str) -> Any:
    entry = _MOVED.get(name)
    if entry is None:
        raise AttributeError(f"module 'slateflow' has no attribute {name!r}")
    from .deprecation import moved

    module, new = entry
    where = f"slateflow.{module}.{new}"
    return moved(
        "slateflow",
        name,
        {name: (where, lambda: getattr(import_module(f"slateflow.{module}"), new))},
    )
