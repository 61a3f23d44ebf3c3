"""Resolvers and the Session: named async sources whose results land in the State.

A resolver named ``verify`` writes ``verify:status`` (``running``, then ``done``, ``error`` or
``cancelled``), and ``verify:result`` or ``verify:error``, with provenance, whether it runs in
call mode (``await session.call(resolver)``), dispatch mode (``session.dispatch``) or
background mode (``session.background``).
"""

from .background import (
    AckFormatter,
    BackgroundResult,
    Deliver,
    ResultFormatter,
    Scheduling,
    ToModel,
    default_ack,
    default_result,
)
from .clock import Clock, ManualClock, SystemClock, settle
from .freshness import fresh_for, is_fresh
from .http import HTTPPool, current_pool
from .llm import (
    LLM,
    LLMDelta,
    LLMRequest,
    LLMResponse,
    Message,
    StreamingLLM,
    ToolCall,
    ToolSpec,
    Usage,
    estimate_usage,
)
from .resolver import CONFLICT_POLICIES, OnConflict, Resolver, ResolverOptions, TextAgent
from .retry import HTTP_RETRY, NO_RETRY, Retry
from .run import Mode, Run, RunStatus
from .runtime import Runtime
from .session import Session
from .template import Template
from .watchers import Watcher

__all__ = [
    "CONFLICT_POLICIES",
    "HTTP_RETRY",
    "LLM",
    "NO_RETRY",
    "AckFormatter",
    "BackgroundResult",
    "Clock",
    "Deliver",
    "HTTPPool",
    "LLMDelta",
    "LLMRequest",
    "LLMResponse",
    "ManualClock",
    "Message",
    "Mode",
    "OnConflict",
    "Resolver",
    "ResolverOptions",
    "ResultFormatter",
    "Retry",
    "Run",
    "RunStatus",
    "Runtime",
    "Scheduling",
    "Session",
    "StreamingLLM",
    "SystemClock",
    "Template",
    "TextAgent",
    "ToModel",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "Watcher",
    "current_pool",
    "default_ack",
    "default_result",
    "estimate_usage",
    "fresh_for",
    "is_fresh",
    "settle",
]
