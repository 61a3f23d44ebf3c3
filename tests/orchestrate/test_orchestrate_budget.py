"""Lifecycle events (JSON compatible with layer0's serde tags, old and new field names) and the
WorkflowBudget ledger (soft cap, saturating snapshot, warnings, step limits, loops, time)."""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from slateflow import ManualClock, State
from slateflow.errors import OrchestrationError
from slateflow.orchestrate import WorkflowBudget, budget_event
from slateflow.orchestrate.events import (
    BudgetAction,
    BudgetDecision,
    BudgetEvent,
    BudgetWarning,
    CompactionEvent,
    CompactionPolicy,
    Continue,
    CostIncurred,
    DowngradeModel,
    HaltWorkflow,
    LoopDetected,
    RequestIncrease,
    StepLimitApproaching,
    StepLimitReached,
    TimeoutApproaching,
    TimeoutReached,
)

BUDGET = TypeAdapter(BudgetEvent)
COMPACTION = TypeAdapter(CompactionEvent)
DECISION = TypeAdapter(BudgetDecision)

# What layer0 0.4.1 writes (serde, internally tagged by "type", snake_case).
BUDGET_JSON = [
    {"type": "cost_incurred", "operator": "op", "cost": "0.25", "cumulative": "1.75"},
    {"type": "budget_warning", "workflow": "wf", "spent": "8.0", "limit": "10.0"},
    {"type": "budget_action", "workflow": "wf", "action": "continue"},
    {"type": "budget_action", "workflow": "wf", "action": "halt_workflow"},
    {
        "type": "budget_action",
        "workflow": "wf",
        "action": {"downgrade_model": {"from": "large", "to": "small"}},
    },
    {"type": "budget_action", "workflow": "wf", "action": {"request_increase": {"amount": "5"}}},
    {"type": "step_limit_approaching", "operator": "op", "current": 8, "max": 10},
    {"type": "step_limit_reached", "operator": "op", "total_sub_dispatches": 10},
    {
        "type": "loop_detected",
        "operator": "op",
        "operator_name": "search",
        "consecutive_count": 4,
        "max": 3,
    },
    {"type": "timeout_approaching", "operator": "op", "elapsed": 800, "max_duration": 1000},
    {"type": "timeout_reached", "operator": "op", "elapsed": 1000},
]

COMPACTION_JSON = [
    {
        "type": "context_pressure",
        "operator": "op",
        "fill_percent": 91.5,
        "tokens_used": 915,
        "tokens_available": 85,
    },
    {"type": "pre_compaction_flush", "operator": "op", "scope": "session"},
    {"type": "compaction_complete", "operator": "op", "strategy": "summarise", "tokens_freed": 400},
    {
        "type": "provider_managed",
        "operator": "op",
        "provider": "anthropic",
        "tokens_before": 1000,
        "tokens_after": 300,
        "summary": None,
    },
    {"type": "compaction_failed", "operator": "op", "error": "boom", "strategy": "summarise"},
    {"type": "compaction_skipped", "operator": "op", "reason": "below threshold"},
    {"type": "flush_failed", "operator": "op", "scope": {"agent": "a"}, "key": "k", "error": "x"},
    {
        "type": "compaction_quality",
        "operator": "op",
        "tokens_before": 1000,
        "tokens_after": 300,
        "items_preserved": 12,
        "items_lost": 3,
    },
]


@pytest.mark.parametrize("data", BUDGET_JSON, ids=lambda d: d["type"])
def test_budget_events_round_trip_layer0_json(data: dict[str, Any]) -> None:
    event = BUDGET.validate_json(json.dumps(data))
    assert json.loads(BUDGET.dump_json(event)) == data


@pytest.mark.parametrize("data", COMPACTION_JSON, ids=lambda d: d["type"])
def test_compaction_events_round_trip_layer0_json(data: dict[str, Any]) -> None:
    event = COMPACTION.validate_json(json.dumps(data))
    assert json.loads(COMPACTION.dump_json(event)) == data


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            {"type": "cost_incurred", "agent": "a", "cost": "1", "cumulative": "1"},
            {"type": "cost_incurred", "operator": "a", "cost": "1", "cumulative": "1"},
        ),
        (
            {"type": "step_limit_reached", "agent": "a", "total_tool_calls": 7},
            {"type": "step_limit_reached", "operator": "a", "total_sub_dispatches": 7},
        ),
        (
            {
                "type": "loop_detected",
                "agent": "a",
                "tool_name": "search",
                "consecutive_count": 3,
                "max": 2,
            },
            {
                "type": "loop_detected",
                "operator": "a",
                "operator_name": "search",
                "consecutive_count": 3,
                "max": 2,
            },
        ),
    ],
    ids=["agent", "total_tool_calls", "tool_name"],
)
def test_layer0_0_4_0_field_names_are_read_and_0_4_1_written(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    assert json.loads(BUDGET.dump_json(BUDGET.validate_python(old))) == new


def test_money_is_a_decimal_read_from_strings_or_numbers() -> None:
    event = BUDGET.validate_python(
        {"type": "cost_incurred", "operator": "a", "cost": 0.1, "cumulative": "0.30"}
    )
    assert isinstance(event, CostIncurred)
    assert event.cost == Decimal("0.1")
    assert event.cumulative == Decimal("0.30")


def test_decisions_are_externally_tagged() -> None:
    cases: list[tuple[Any, Any]] = [
        ("continue", Continue()),
        ("halt_workflow", HaltWorkflow()),
        ({"downgrade_model": {"from": "a", "to": "b"}}, DowngradeModel(**{"from": "a"}, to="b")),
        ({"request_increase": {"amount": "2.50"}}, RequestIncrease(amount=Decimal("2.50"))),
    ]
    for data, variant in cases:
        decision = DECISION.validate_python(data)
        assert decision.root == variant
        assert json.loads(DECISION.dump_json(decision)) == data
        assert DECISION.dump_python(BudgetDecision(variant), mode="json") == data
    for bad in ["carry_on", {"downgrade_model": {"to": "b"}}, {"a": 1, "b": 2}, 3]:
        with pytest.raises(ValidationError):
            DECISION.validate_python(bad)


def test_unknown_tags_and_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        BUDGET.validate_python({"type": "cost_exploded", "operator": "a"})
    with pytest.raises(ValidationError):
        BUDGET.validate_python(
            {"type": "timeout_reached", "operator": "a", "elapsed": 1, "extra": 2}
        )
    with pytest.raises(ValidationError):
        BUDGET.validate_python({"type": "timeout_reached", "operator": "a", "elapsed": -1})


def test_compaction_policy_is_snake_case() -> None:
    assert [p.value for p in CompactionPolicy] == [
        "pinned",
        "normal",
        "compress_first",
        "discard_when_done",
    ]
    assert TypeAdapter(CompactionPolicy).validate_json('"compress_first"') is (
        CompactionPolicy.COMPRESS_FIRST
    )


# -- the ledger ------------------------------------------------------------------------------


def test_the_cap_is_soft_and_the_next_check_denies() -> None:
    budget = WorkflowBudget(limit_tokens=1000)
    assert budget.check()
    # Two calls pass the check before either records: both run, and overshoot.
    first, second = budget.check(), budget.check()
    assert first
    assert second
    budget.record(tokens=700)
    budget.record(tokens=700)
    snap = budget.snapshot()
    assert snap.consumed_tokens == 1400
    assert snap.remaining_tokens == 0  # saturates, never negative
    assert snap.exhausted
    assert not budget.check()


def test_cost_limits_warn_once_at_80_percent() -> None:
    seen: list[Any] = []
    state = State()
    budget = WorkflowBudget(limit_cost="10", workflow="panel", state=state, on_event=seen.append)
    budget.record(cost="5", operator="judge")
    assert [type(e) for e in seen] == [CostIncurred]
    budget.record(cost="3.5")
    assert [type(e) for e in seen] == [CostIncurred, CostIncurred, BudgetWarning]
    assert seen[2] == BudgetWarning(workflow="panel", spent=Decimal("8.5"), limit=Decimal("10"))
    budget.record(cost="1")
    assert [type(e) for e in seen].count(BudgetWarning) == 1
    assert budget.check()
    budget.record(cost="0.5")
    assert not budget.check()
    assert budget.snapshot().remaining_cost == Decimal(0)
    # Every event is journaled into the State, in order.
    written = [m for m in state.journal.since(0) if m.key == "workflow:panel:event"]
    assert [m.new["type"] for m in written] == [e.type for e in budget.events]
    assert state.provenance("workflow:panel:event").source == "orchestration"


def test_step_limits_and_loops() -> None:
    budget = WorkflowBudget(max_steps=5, loop_limit=2)
    assert budget.record_step("search", {"q": "a"})
    assert budget.record_step("search", {"q": "a"})
    assert not budget.record_step("search", {"q": "a"})  # a third identical call: a loop
    assert isinstance(budget.events[-1], LoopDetected)
    assert budget.events[-1].consecutive_count == 3
    assert budget.record_step("search", {"q": "b"})  # another input: no loop
    assert not budget.record_step("answer")  # the fifth step reaches the limit
    kinds = [type(e) for e in budget.events]
    assert kinds == [LoopDetected, StepLimitApproaching, StepLimitReached]
    assert budget.events[1] == StepLimitApproaching(operator="workflow", current=4, max=5)
    assert not budget.record_step("more")
    assert [type(e) for e in budget.events].count(StepLimitReached) == 1


@pytest.mark.anyio
async def test_time_limits_on_the_session_clock() -> None:
    clock = ManualClock()
    budget = WorkflowBudget(timeout=10, clock=clock)
    budget.start()
    await clock.advance(7.9)
    assert budget.check_time()
    assert budget.events == []
    await clock.advance(0.2)
    assert budget.check_time()
    assert budget.events == [
        TimeoutApproaching(operator="workflow", elapsed=8100, max_duration=10000)
    ]
    await clock.advance(2)
    assert not budget.check_time()
    assert budget.events[-1] == TimeoutReached(operator="workflow", elapsed=10100)
    assert not budget.check_time()
    assert len(budget.events) == 2
    assert WorkflowBudget().check_time()


def test_the_budget_signal_and_a_broken_receiver() -> None:
    got: list[Any] = []

    def receiver(sender: Any, event: Any) -> None:
        got.append((sender, event))

    def broken(event: Any) -> None:
        raise RuntimeError("receiver bug")

    budget = WorkflowBudget(limit_cost=1, on_event=broken)
    budget_event.connect(receiver, sender=budget)
    try:
        budget.record(cost=1)
    finally:
        budget_event.disconnect(receiver, sender=budget)
    assert [type(e) for _, e in got] == [CostIncurred, BudgetWarning]
    assert all(s is budget for s, _ in got)


def test_bad_arguments() -> None:
    for kwargs in [
        {"limit_tokens": -1},
        {"limit_tokens": 1.5},
        {"limit_cost": "lots"},
        {"limit_cost": float("nan")},
        {"limit_cost": -1},
        {"max_steps": 0},
        {"timeout": 0},
        {"loop_limit": 0},
        {"warn_at": 2},
        {"workflow": ""},
    ]:
        with pytest.raises(OrchestrationError):
            WorkflowBudget(**kwargs)
    budget = WorkflowBudget()
    with pytest.raises(OrchestrationError, match="tokens"):
        budget.record(tokens=-5)
    with pytest.raises(OrchestrationError, match="cost"):
        budget.record(cost=True)  # type: ignore[arg-type]
    assert budget.snapshot().consumed_tokens == 0


@settings(deadline=None, max_examples=30)
@given(calls=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 300)), max_size=40))
def test_no_recorded_usage_is_lost_across_threads(calls: list[tuple[int, int]]) -> None:
    budget = WorkflowBudget(limit_tokens=10_000, limit_cost=100)
    threads = [
        threading.Thread(target=budget.record, kwargs={"tokens": t, "cost": Decimal(c) / 100})
        for t, c in calls
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = budget.snapshot()
    assert snap.consumed_tokens == sum(t for t, _ in calls)
    assert snap.consumed_cost == sum(Decimal(c) / 100 for _, c in calls)
    assert snap.remaining_tokens == max(10_000 - snap.consumed_tokens, 0)
    assert snap.exhausted == (snap.consumed_tokens >= 10_000 or snap.consumed_cost >= 100)


def test_budget_action_wraps_a_decision() -> None:
    action = BudgetAction(workflow="w", action=BudgetDecision(HaltWorkflow()))
    assert json.loads(BUDGET.dump_json(action)) == {
        "type": "budget_action",
        "workflow": "w",
        "action": "halt_workflow",
    }
