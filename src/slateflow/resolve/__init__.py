"""Resolvers and the Session: named async sources whose results land in the State.

A resolver named ``verify`` writes ``verify:status`` (``running``, then ``done``, ``error`` or
``cancelled``), and ``verify:result`` or ``verify:error``, with provenance, whether it runs in
call mode (``await resolver.resolve(state)``), dispatch mode (``session.dispatch``) or background
mode (``session.background``).
"""

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

__all__ = [
    "CONFLICT_POLICIES",
    "LLM",
    "AckFormatter",
    "BackgroundResult",
    "Clock",
    "Deliver",
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

