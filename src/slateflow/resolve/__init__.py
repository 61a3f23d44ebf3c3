"""Resolvers and the Session: named async sources whose results land in the State.

A resolver named ``verify`` writes ``verify:status`` (``running``, then ``done``, ``error`` or
``cancelled``), and ``verify:result`` or ``verify:error``, with provenance, whether it runs in
call mode (``await resolver.resolve(state)``), dispatch mode (``session.dispatch``) or background
mode (``session.background``).
"""

from importlib import import_module
from typing import Any

from ..state.freshness import fresh_for, is_fresh
from .background import (
    AckFormatter,
    BackgroundResult,
    Deliver,
    ResultFormatter,
    Scheduling,
    default_ack,
    default_result,
)
from .clock import Clock, ManualClock, SystemClock
from .inbox import Inbox
from .llm import LLM, LLMRequest, LLMResponse, Usage
from .loop import SessionLoop
from .resolver import CONFLICT_POLICIES, OnConflict, Resolver, ResolverOptions, TextAgent, call
from .retry import Retry
from .run import Mode, Run, RunStatus
from .session import Session
from .template import Template
from .turns import Turn, TurnContext
from .watchers import Watcher

Dispatch = Run
"""The handle ``session.dispatch`` returns (the same class as :class:`Run`)."""

__all__ = [
    "CONFLICT_POLICIES",
    "LLM",
    "AckFormatter",
    "BackgroundResult",
    "Clock",
    "Deliver",
    "Dispatch",
    "Inbox",
    "LLMRequest",
    "LLMResponse",
    "ManualClock",
    "Mode",
    "OnConflict",
    "Resolver",
    "ResolverOptions",
    "ResultFormatter",
    "Retry",
    "Run",
    "RunStatus",
    "Scheduling",
    "Session",
    "SessionLoop",
    "SystemClock",
    "Template",
    "TextAgent",
    "Turn",
    "TurnContext",
    "Usage",
    "Watcher",
    "call",
    "default_ack",
    "default_result",
    "fresh_for",
    "is_fresh",
]


def __getattr__(name: str) -> Any:
    if name in ("ToolClaim", "ToolResult"):
        from ..deprecation import moved

        def load() -> Any:
            # The deprecated address of names that moved up a layer: resolved by name, for one
            # release, so this layer does not import the one above it.
            return getattr(import_module("slateflow.conversation"), name)

        return moved("slateflow.resolve", name, {name: (f"slateflow.conversation.{name}", load)})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
