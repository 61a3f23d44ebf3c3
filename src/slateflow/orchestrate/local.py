"""LocalExecutor: runs each step with an agent function in this process."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel

from ..errors import OrchestrationError
from .spec import AgentStepSpec, StepOutcome

__all__ = ["AgentFunction", "LocalExecutor"]

AgentFunction = Callable[[AgentStepSpec], Any | Awaitable[Any]]
"""An agent run in process: takes the spec, returns (or awaits) its answer."""


class LocalExecutor:
    """An :class:`AgentExecutor` that runs steps in this process, with ``agents`` by name.

    An agent is a function (sync or async) of the :class:`AgentStepSpec`. Its answer becomes
    the outcome: a ``str`` is the output; a pydantic model, dict, list, number or bool is the
    ``structured`` value (and its JSON the output); a :class:`StepOutcome` is used as it is.
    An exception is a failed outcome naming it; an unknown agent is a failed outcome listing
    the known ones. ``concurrency`` is its ``concurrency_hint``.
    """

    def __init__(self, agents: Mapping[str, AgentFunction], *, concurrency: int = 8) -> None:
        if type(concurrency) is not int or concurrency < 0:
            raise OrchestrationError(
                f"LocalExecutor: concurrency must be a whole number >= 0, got {concurrency!r}"
            )
        for name, fn in agents.items():
            if not callable(fn):
                raise OrchestrationError(f"LocalExecutor: agent {name!r} is {fn!r}, not callable")
        self.agents = dict(agents)
        self._concurrency = concurrency

    @property
    def concurrency_hint(self) -> int:
        """How many steps this executor runs at once."""
        return self._concurrency

    async def execute_step(self, spec: AgentStepSpec, /) -> StepOutcome:
        """Run ``spec`` with its agent; never raises for the step's own failure."""
        agent = self.agents.get(spec.agent)
        if agent is None:
            known = ", ".join(sorted(self.agents)) or "none"
            return StepOutcome.failed(
                spec, f"no agent named {spec.agent!r} (known: {known}); register it"
            )
        try:
            answer = agent(spec)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            return StepOutcome.failed(spec, f"{type(exc).__name__}: {exc}")
        return outcome_of(spec, answer)


def outcome_of(spec: AgentStepSpec, answer: Any) -> StepOutcome:
    """The outcome of ``spec`` whose agent answered ``answer`` (see :class:`LocalExecutor`)."""
    if isinstance(answer, StepOutcome):
        return answer
    if isinstance(answer, str):
        return StepOutcome.ok(spec, answer)
    if isinstance(answer, BaseModel):
        answer = answer.model_dump(mode="json")
    try:
        text = json.dumps(answer, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return StepOutcome.failed(
            spec, f"agent {spec.agent!r} answered {type(answer).__name__}, not JSON: {exc}"
        )
    return StepOutcome.ok(spec, text, answer)
