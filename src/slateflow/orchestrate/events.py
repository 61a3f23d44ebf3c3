"""Lifecycle events: the vocabulary budgets and context compaction are coordinated in.

Pydantic models whose JSON round-trips with layer0's (the Rust crate the seeds describe):

- :data:`BudgetEvent` and :data:`CompactionEvent` are internally tagged by ``"type"`` in
  snake_case (``{"type": "cost_incurred", "operator": "a", ...}``). Both the 0.4.0 field names
  (``agent``, ``tool_name``, ``total_tool_calls``) and the 0.4.1 ones (``operator``,
  ``operator_name``, ``total_sub_dispatches``) are read; the 0.4.1 ones are written.
- :data:`BudgetDecision` is externally tagged, like serde's default: ``"continue"``,
  ``"halt_workflow"``, ``{"downgrade_model": {"from": "a", "to": "b"}}``,
  ``{"request_increase": {"amount": "2.50"}}``.
- Money is a ``Decimal`` (written as a string, as ``rust_decimal`` writes it; numbers are read
  too); durations are whole milliseconds.

Use them with ``pydantic.TypeAdapter(BudgetEvent)``: ``.validate_json(...)`` and
``.dump_json(...)``.
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    RootModel,
    model_serializer,
    model_validator,
)

__all__ = [
    "BudgetAction",
    "BudgetDecision",
    "BudgetEvent",
    "BudgetWarning",
    "CompactionComplete",
    "CompactionEvent",
    "CompactionFailed",
    "CompactionPolicy",
    "CompactionQuality",
    "CompactionSkipped",
    "ContextPressure",
    "Continue",
    "CostIncurred",
    "DowngradeModel",
    "FlushFailed",
    "HaltWorkflow",
    "LoopDetected",
    "PreCompactionFlush",
    "ProviderManaged",
    "RequestIncrease",
    "StepLimitApproaching",
    "StepLimitReached",
    "TimeoutApproaching",
    "TimeoutReached",
]

Money = Annotated[Decimal, PlainSerializer(str, return_type=str, when_used="json")]
"""An amount of money: a Decimal, written to JSON as a string ("0.0125")."""
Millis = Annotated[int, Field(ge=0)]
"""A duration in whole milliseconds."""

_OPERATOR = AliasChoices("operator", "agent")  # 0.4.1 name first, 0.4.0 name second


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


# -- budget decisions (externally tagged) ------------------------------------------------------


class Continue(BaseModel):
    """Go on as normal: JSON ``"continue"``."""

    model_config = ConfigDict(frozen=True)


class HaltWorkflow(BaseModel):
    """Stop the whole workflow (its running steps are cancelled): JSON ``"halt_workflow"``."""

    model_config = ConfigDict(frozen=True)


class DowngradeModel(BaseModel):
    """Switch later LLM calls from one model to a cheaper one:
    ``{"downgrade_model": {"from": "big", "to": "small"}}``."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    from_: str = Field(alias="from")
    to: str


class RequestIncrease(BaseModel):
    """Ask the caller for more budget: ``{"request_increase": {"amount": "2.50"}}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    amount: Money


_UNIT: dict[str, type[BaseModel]] = {"continue": Continue, "halt_workflow": HaltWorkflow}
_DATA: dict[str, type[BaseModel]] = {
    "downgrade_model": DowngradeModel,
    "request_increase": RequestIncrease,
}
_DecisionKind = Continue | HaltWorkflow | DowngradeModel | RequestIncrease


class BudgetDecision(RootModel[_DecisionKind]):
    """What the orchestrator decides about budget pressure (``.root`` is the variant).

    Build one with ``BudgetDecision(Continue())`` or read one from JSON; compare variants with
    ``isinstance(decision.root, HaltWorkflow)``.
    """

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _external_tag(cls, data: Any) -> Any:
        if isinstance(data, BaseModel):
            return data
        if isinstance(data, str):
            if data not in _UNIT:
                raise ValueError(
                    f"unknown budget decision {data!r}; one of {sorted([*_UNIT, *_DATA])}"
                )
            return _UNIT[data]()
        if isinstance(data, dict) and len(data) == 1:
            ((tag, body),) = data.items()
            if tag in _DATA:
                return _DATA[tag].model_validate(body)
            if tag in _UNIT and body in (None, {}):
                return _UNIT[tag]()
        raise ValueError(
            f'a budget decision is "continue", "halt_workflow", or an object with one key '
            f"of {sorted(_DATA)}; got {data!r}"
        )

    @model_serializer(mode="wrap")
    def _write_tag(self, handler: Any, info: Any) -> Any:
        root = self.root
        for tag, kind in _UNIT.items():
            if isinstance(root, kind):
                return tag
        for tag, kind in _DATA.items():
            if isinstance(root, kind):
                mode = "json" if info.mode_is_json() else "python"
                return {tag: root.model_dump(mode=mode, by_alias=True)}
        return handler(self)  # pragma: no cover - every variant is tagged above


# -- budget events (internally tagged by "type") -----------------------------------------------


class CostIncurred(_Event):
    """A model call cost ``cost``; ``cumulative`` so far."""

    type: Literal["cost_incurred"] = "cost_incurred"
    operator: str = Field(validation_alias=_OPERATOR)
    cost: Money
    cumulative: Money


class BudgetWarning(_Event):
    """A workflow is nearing its budget: ``spent`` of ``limit``."""

    type: Literal["budget_warning"] = "budget_warning"
    workflow: str
    spent: Money
    limit: Money


class BudgetAction(_Event):
    """What the orchestrator decided for a workflow."""

    type: Literal["budget_action"] = "budget_action"
    workflow: str
    action: BudgetDecision


class StepLimitApproaching(_Event):
    """An operator's sub-dispatch count nears its limit."""

    type: Literal["step_limit_approaching"] = "step_limit_approaching"
    operator: str = Field(validation_alias=_OPERATOR)
    current: int = Field(ge=0)
    max: int = Field(ge=0)


class StepLimitReached(_Event):
    """An operator reached its step limit."""

    type: Literal["step_limit_reached"] = "step_limit_reached"
    operator: str = Field(validation_alias=_OPERATOR)
    total_sub_dispatches: int = Field(
        ge=0, validation_alias=AliasChoices("total_sub_dispatches", "total_tool_calls")
    )


class LoopDetected(_Event):
    """The same call (name and input) repeated ``consecutive_count`` times, over ``max``."""

    type: Literal["loop_detected"] = "loop_detected"
    operator: str = Field(validation_alias=_OPERATOR)
    operator_name: str = Field(validation_alias=AliasChoices("operator_name", "tool_name"))
    consecutive_count: int = Field(ge=0)
    max: int = Field(ge=0)


class TimeoutApproaching(_Event):
    """An operator's elapsed time nears its timeout (milliseconds)."""

    type: Literal["timeout_approaching"] = "timeout_approaching"
    operator: str = Field(validation_alias=_OPERATOR)
    elapsed: Millis
    max_duration: Millis


class TimeoutReached(_Event):
    """An operator reached its timeout (milliseconds)."""

    type: Literal["timeout_reached"] = "timeout_reached"
    operator: str = Field(validation_alias=_OPERATOR)
    elapsed: Millis


BudgetEvent = Annotated[
    CostIncurred
    | BudgetWarning
    | BudgetAction
    | StepLimitApproaching
    | StepLimitReached
    | LoopDetected
    | TimeoutApproaching
    | TimeoutReached,
    Field(discriminator="type"),
]
"""Any budget event (use with ``pydantic.TypeAdapter``)."""


# -- compaction ------------------------------------------------------------------------------


class ContextPressure(_Event):
    """The context window is filling."""

    type: Literal["context_pressure"] = "context_pressure"
    operator: str = Field(validation_alias=_OPERATOR)
    fill_percent: float = Field(ge=0)
    tokens_used: int = Field(ge=0)
    tokens_available: int = Field(ge=0)


class PreCompactionFlush(_Event):
    """Memory in ``scope`` is flushed before compaction."""

    type: Literal["pre_compaction_flush"] = "pre_compaction_flush"
    operator: str = Field(validation_alias=_OPERATOR)
    scope: JsonValue


class CompactionComplete(_Event):
    """Compaction finished, freeing ``tokens_freed``."""

    type: Literal["compaction_complete"] = "compaction_complete"
    operator: str = Field(validation_alias=_OPERATOR)
    strategy: str
    tokens_freed: int = Field(ge=0)


class ProviderManaged(_Event):
    """The model provider compacted the context itself."""

    type: Literal["provider_managed"] = "provider_managed"
    operator: str = Field(validation_alias=_OPERATOR)
    provider: str
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    summary: JsonValue = None


class CompactionFailed(_Event):
    """Compaction failed."""

    type: Literal["compaction_failed"] = "compaction_failed"
    operator: str = Field(validation_alias=_OPERATOR)
    error: str
    strategy: str


class CompactionSkipped(_Event):
    """Compaction was skipped on purpose."""

    type: Literal["compaction_skipped"] = "compaction_skipped"
    operator: str = Field(validation_alias=_OPERATOR)
    reason: str


class FlushFailed(_Event):
    """A pre-compaction flush of ``key`` in ``scope`` failed."""

    type: Literal["flush_failed"] = "flush_failed"
    operator: str = Field(validation_alias=_OPERATOR)
    scope: JsonValue
    key: str
    error: str


class CompactionQuality(_Event):
    """What a compaction kept and lost."""

    type: Literal["compaction_quality"] = "compaction_quality"
    operator: str = Field(validation_alias=_OPERATOR)
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    items_preserved: int = Field(ge=0)
    items_lost: int = Field(ge=0)


CompactionEvent = Annotated[
    ContextPressure
    | PreCompactionFlush
    | CompactionComplete
    | ProviderManaged
    | CompactionFailed
    | CompactionSkipped
    | FlushFailed
    | CompactionQuality,
    Field(discriminator="type"),
]
"""Any compaction event (use with ``pydantic.TypeAdapter``)."""


class CompactionPolicy(StrEnum):
    """How a message survives compaction (JSON: the snake_case name)."""

    PINNED = "pinned"
    """Never compacted: decisions, constraints, the user's instructions."""
    NORMAL = "normal"
    """Compacted as usual (the default)."""
    COMPRESS_FIRST = "compress_first"
    """Compressed first: verbose output, logs."""
    DISCARD_WHEN_DONE = "discard_when_done"
    """Dropped when the tool or session that produced it ends."""
