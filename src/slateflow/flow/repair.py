"""Repair: what a flow does when the caller is stuck on a step.

A step with ``repair=RepairPolicy(reprompt_after=2, escalate_after=4)`` counts the turns it stays
active without completing. After ``reprompt_after`` turns the runner raises
``repair:{step}:reprompt``; after ``escalate_after`` it raises ``repair:{step}:escalate``, also
sets the ``flag`` key if given, and, with ``escalate_to="handoff"``, completes the stuck step and
enters ``handoff``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RepairPolicy", "escalate_key", "reprompt_key"]


def reprompt_key(step: str) -> str:
    """The key raised when ``step`` asks for a reprompt: ``repair:{step}:reprompt``."""
    return f"repair:{step}:reprompt"


def escalate_key(step: str) -> str:
    """The key raised when ``step`` escalates: ``repair:{step}:escalate``."""
    return f"repair:{step}:escalate"


class RepairPolicy(BaseModel):
    """Reprompt after ``reprompt_after`` turns stuck on a step, escalate after ``escalate_after``.

    ``escalate_to`` names a step to route to on escalation (the stuck step counts as done and
    the named step is entered from it); ``flag`` names a key set to True on escalation. Turns
    are counted by ``on_turn`` (``conversation.user_turn``), not by tool calls, and not the turn
    whose words entered the step. The reprompt key goes back to False once the step is no
    longer active; the escalate key and ``flag`` stay True (a guard may route on them) until
    the step is reset or the flow restarts.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reprompt_after: int = Field(default=2, ge=1)
    escalate_after: int = Field(default=4, ge=1)
    escalate_to: str | None = None
    flag: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> RepairPolicy:
        if self.escalate_after < self.reprompt_after:
            raise ValueError(
                f"escalate_after ({self.escalate_after}) must be >= reprompt_after "
                f"({self.reprompt_after}): a caller is reprompted before being handed on"
            )
        return self
