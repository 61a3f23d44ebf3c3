"""The executor seam: what one step of orchestrated agent work is, what it came to, and who runs
it.

The combinators (``execute_parallel``, ``execute_pipeline``, ``execute_loop``) only ever call
``executor.execute_step(spec)``; where the step runs (in this process, on a worker fleet, on a
durable engine) is the executor's business, so the same orchestration scales without change.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from ..state.keys import check_key

__all__ = ["AgentExecutor", "AgentStepSpec", "StepOutcome"]


class AgentStepSpec(BaseModel):
    """One unit of agent work, independent of where it runs.

    ``task_id`` names the step: its outcome lands in the State as ``{task_id}:result`` or
    ``{task_id}:error`` (so it must make valid keys). ``agent`` names who runs it; ``prompt``
    and ``input`` are what it is given; ``max_steps`` caps the agent's own loop;
    ``output_schema`` (a JSON schema) asks for a structured answer; ``model`` picks the LLM;
    ``metadata`` is carried along untouched.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str = Field(min_length=1)
    agent: str = Field(min_length=1)
    prompt: str = ""
    input: JsonValue = None
    max_steps: int | None = Field(default=None, ge=1)
    output_schema: dict[str, JsonValue] | None = None
    model: str | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @field_validator("task_id")
    @classmethod
    def _key_safe(cls, value: str) -> str:
        check_key(f"{value}:result")
        return value


class StepOutcome(BaseModel):
    """What one step came to: ``success`` with its ``output`` (text) and ``structured`` value,
    or not, with the ``error`` message. An executor returns one for every step, never raising."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    agent: str
    output: str = ""
    success: bool
    structured: JsonValue = None
    error: str | None = None

    @classmethod
    def ok(cls, spec: AgentStepSpec, output: str = "", structured: Any = None) -> StepOutcome:
        """A successful outcome of ``spec``."""
        return cls(
            task_id=spec.task_id,
            agent=spec.agent,
            output=output,
            success=True,
            structured=structured,
        )

    @classmethod
    def failed(cls, spec: AgentStepSpec, error: str) -> StepOutcome:
        """A failed outcome of ``spec`` with ``error``."""
        return cls(task_id=spec.task_id, agent=spec.agent, success=False, error=error)


@runtime_checkable
class AgentExecutor(Protocol):
    """Runs agent steps: ``async execute_step(spec) -> StepOutcome``.

    It never raises for a failed step: a failure is an outcome (``success=False``). (If it does
    raise, the combinators turn the exception into a failed outcome for that step.)
    ``concurrency_hint`` is how many steps it runs well at once; the combinators never run
    more than that (0 counts as 1).
    """

    @property
    def concurrency_hint(self) -> int:
        """How many steps this executor runs well at once (0 counts as 1)."""

    async def execute_step(self, spec: AgentStepSpec, /) -> StepOutcome:
        """Run one step; a failure is an outcome with ``success=False``, not an exception."""
