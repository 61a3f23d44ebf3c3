"""The tracing seam: what slateflow tells a tracer as a call goes on. Off unless installed.

:mod:`slateflow.integrations.otel` installs an OpenTelemetry tracer here (``instrument()``);
with none installed, each place below costs one read of :data:`current`. The places: a user
turn (a span around :meth:`Conversation.user_turn`), a resolver run (around its attempts, in
the run's own task, so it nests under whatever span started it), a model call (around
``llm.generate`` / ``llm.stream`` wherever slateflow calls a model), a tool call (around
``Conversation.run_tool``), a tool admission, every commit of a State (under its lock, in the
writer's thread), and background results handed to the model with a turn's context.

A tracer must be quick and must not raise: it runs inside slateflow's commit path. Flow steps
are not a hook: a tracer listens to :mod:`slateflow.flow.signals` itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["ModelCall", "Tracer", "current", "install"]


class ModelCall(Protocol):
    """What a tracer's model-call context is told once the model answered."""

    def answered(self, response: Any) -> None:
        """The model answered with ``response`` (its model, usage and finish reason)."""


class Tracer(Protocol):
    """Receives what slateflow does (see the module docstring); every method is optional
    work for the tracer, never for slateflow: each must return quickly and never raise."""

    def turn(self, conversation: Any, number: int) -> AbstractContextManager[object]:
        """A context around one user turn of ``conversation``."""

    def run(self, run: Any) -> AbstractContextManager[object]:
        """A context around one resolver run, entered in the run's own task."""

    def model_call(self, llm: Any, request: Any) -> AbstractContextManager[ModelCall]:
        """A context around one call of ``llm``; told the response when it comes."""

    def tool(self, tool: str, call_id: str | None) -> AbstractContextManager[object]:
        """A context around one tool call (``call_id``: the model's id of it, if known)."""

    def admission(self, tool: str, allowed: bool, reason: str | None) -> None:
        """A tool admission was decided."""

    def commit(self, batch: Sequence[Any]) -> None:
        """A State committed ``batch`` (under its lock, in the writer's thread)."""

    def delivered(self, state: Any, results: Sequence[Any], turn: int) -> None:
        """Background ``results`` reached the model with turn ``turn``'s context."""


current: Tracer | None = None
"""The installed tracer, or None (tracing off)."""


def install(tracer: Tracer | None) -> Tracer | None:
    """Make ``tracer`` the one slateflow reports to (None: tracing off); returns the one it
    replaces."""
    global current
    previous, current = current, tracer
    return previous
