"""The Orchestrator protocol (LocalOrchestrator) and the Workflow facade: phases and their
milestones, the budget checked before each step, and the policy's decisions acted on (halt
cancels running steps, downgrade switches the model later LLM calls use)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anyio
import pytest

from slateflow import ManualClock, Resolver, State
from slateflow.errors import DispatchError, OrchestrationError
from slateflow.orchestrate import (
    AgentStepSpec,
    LocalExecutor,
    LocalOrchestrator,
    LoopDecision,
    Orchestrator,
    QueryPayload,
    SignalPayload,
    StepOutcome,
    SwappableLLM,
    Workflow,
    WorkflowBudget,
)
from slateflow.orchestrate.events import (
    BudgetAction,
    BudgetDecision,
    BudgetWarning,
    DowngradeModel,
    HaltWorkflow,
    LoopDetected,
    RequestIncrease,
)
from slateflow.testing import ScriptedLLM

pytestmark = pytest.mark.anyio


# -- the Orchestrator protocol ---------------------------------------------------------------


async def test_dispatch_and_dispatch_many() -> None:
    async def double(x: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return x * 2

    def boom(x: Any) -> Any:
        raise ValueError("no")

    orch = LocalOrchestrator({"double": double, "boom": boom}, concurrency=2)
    assert isinstance(orch, Orchestrator)
    assert await orch.dispatch("double", 21) == 42
    with pytest.raises(DispatchError, match="agent 'boom' failed: ValueError: no") as raised:
        await orch.dispatch("boom", 1)
    assert raised.value.agent == "boom"
    assert isinstance(raised.value.__cause__, ValueError)
    results = await orch.dispatch_many([("double", 1), ("boom", 2), ("ghost", 3), ("double", 4)])
    assert results[0] == 2
    assert results[3] == 8
    assert isinstance(results[1], DispatchError)
    assert isinstance(results[2], DispatchError)
    assert str(results[2]) == "no agent 'ghost' (known: boom, double)"


async def test_signals_are_accepted_at_once_and_read_in_order() -> None:
    orch = LocalOrchestrator({})
    state = {"approved": False}
    orch.register("panel", on_query=lambda q: {"approved": state["approved"], "q": q.query_type})
    await orch.signal("panel", SignalPayload(signal_type="feedback", data="shorter"))
    await orch.signal("panel", SignalPayload(signal_type="approve"))
    received = orch.signals("panel")
    assert (await received.receive()).data == "shorter"
    state["approved"] = (await received.receive()).signal_type == "approve"
    assert await orch.query("panel", QueryPayload(query_type="status")) == {
        "approved": True,
        "q": "status",
    }
    with pytest.raises(OrchestrationError, match="no workflow 'other'"):
        await orch.signal("other", SignalPayload(signal_type="x"))
    with pytest.raises(OrchestrationError, match="already registered"):
        orch.register("panel")
    orch.register("quiet")
    with pytest.raises(OrchestrationError, match="answers no queries"):
        await orch.query("quiet", QueryPayload(query_type="x"))
    orch.close()
    with pytest.raises(OrchestrationError, match="no workflow 'panel'"):
        await orch.signal("panel", SignalPayload(signal_type="late"))


# -- the Workflow facade ---------------------------------------------------------------------


def reviewers(calls: list[str] | None = None) -> LocalExecutor:
    def review(spec: AgentStepSpec) -> dict[str, Any]:
        if calls is not None:
            calls.append(spec.task_id)
        return {"approved": "sources" in str(spec.input)}

    return LocalExecutor({"reviewer": review, "judge": review}, concurrency=3)


def panel(n: int = 3, draft: str = "draft") -> list[AgentStepSpec]:
    return [AgentStepSpec(task_id=f"r{i}", agent="reviewer", input=draft) for i in range(n)]


async def test_phases_emit_milestones_and_write_the_state() -> None:
    state = State()
    wf = Workflow.builder(reviewers()).with_id("panel").with_store(state).build()
    with wf.events() as stream:
        outcomes = await wf.phase("review", panel())
        wf.log("reviews in")
        wf.close()
        events = [e async for e in stream]
    assert [e.type for e in events] == ["phase_start", "phase_end", "log"]
    assert events[0].steps == 3
    assert (events[1].succeeded, events[1].failed) == (3, 0)
    assert [o.structured for o in outcomes] == [{"approved": False}] * 3
    assert state.get("r0:result") == {"approved": False}
    assert wf.history == events


async def test_the_budget_refuses_steps_once_exhausted() -> None:
    calls: list[str] = []
    budget = WorkflowBudget(limit_tokens=100, workflow="panel")

    def costly(spec: AgentStepSpec) -> str:
        calls.append(spec.task_id)
        budget.record(tokens=60, operator=spec.agent)
        return "ok"

    ex = LocalExecutor({"reviewer": costly}, concurrency=1)
    wf = Workflow.builder(ex).with_id("panel").with_budget(budget).build()
    outcomes = await wf.phase("review", panel(3))
    # Soft cap: the second call was admitted at 60 of 100 and overshot; the third is refused.
    assert len(calls) == 2
    refused = [o for o in outcomes if not o.success]
    assert [o.task_id for o in refused] == sorted({"r0", "r1", "r2"} - set(calls))
    assert refused[0].error == "workflow 'panel': the budget is exhausted"
    assert [e.type for e in wf.history] == ["phase_start", "budget_exhausted", "phase_end"]
    assert wf.history[1].consumed_tokens == 120


async def test_halt_cancels_running_steps_and_refuses_the_rest() -> None:
    clock = ManualClock()
    state = State()
    started = anyio.Event()
    wf: Workflow

    async def slow(spec: AgentStepSpec) -> str:
        started.set()
        await clock.sleep(10)  # nobody moves the clock: only a halt ends this
        return "late"

    async def stopper(spec: AgentStepSpec) -> str:
        await started.wait()
        wf.halt("the caller hung up")
        return "stopped it"

    ex = LocalExecutor({"slow": slow, "stopper": stopper}, concurrency=4)
    wf = Workflow.builder(ex).with_id("w").with_store(state).build()
    with anyio.fail_after(5):
        outcomes = await wf.phase(
            "work",
            [AgentStepSpec(task_id="a", agent="slow"), AgentStepSpec(task_id="b", agent="stopper")],
        )
    assert wf.halted
    assert outcomes[0].error == "cancelled: workflow 'w' was halted: the caller hung up"
    assert outcomes[1].output == "stopped it"  # finished before the halt took effect: kept
    assert state.get("a:status") == "error"  # never left "running"
    assert state.get("a:error") == "cancelled"
    later = await wf.parallel([AgentStepSpec(task_id="d", agent="stopper")])
    assert later[0].error == "workflow 'w' was halted: the caller hung up"


async def test_the_default_policy_halts_a_loop() -> None:
    budget = WorkflowBudget(loop_limit=1, workflow="w")
    ex = LocalExecutor({"quick": lambda spec: "quick"}, concurrency=1)
    wf = Workflow.builder(ex).with_id("w").with_budget(budget).build()
    specs = [AgentStepSpec(task_id=t, agent="quick", input=1) for t in ("b", "c")]
    outcomes = await wf.phase("work", specs)
    assert wf.halted
    assert isinstance(wf.decisions[0].root, HaltWorkflow)
    # Whichever ran first finished; the repeat was the loop, refused.
    assert sorted((o.success, o.output) for o in outcomes) == [(False, ""), (True, "quick")]
    assert any(isinstance(e, LoopDetected) for e in budget.events)
    assert any(isinstance(e, BudgetAction) for e in budget.events)


async def test_downgrade_swaps_the_model_later_llm_calls_use() -> None:
    big, small = ScriptedLLM(["from big"], model="big"), ScriptedLLM(["from small"], model="small")
    llm = SwappableLLM({"big": big, "small": small}, "big")
    budget = WorkflowBudget(limit_cost="1.00", workflow="w")

    def policy(event: Any) -> BudgetDecision | None:
        if isinstance(event, BudgetWarning):
            return BudgetDecision(DowngradeModel(**{"from": "big"}, to="small"))
        return None

    state = State()
    summary = Resolver.llm("summary", llm, "Summarise")

    async def summarise(spec: AgentStepSpec) -> str:
        text: str = await summary.resolve(state)
        budget.record(cost="0.85")
        return text

    ex = LocalExecutor({"summariser": summarise}, concurrency=1)
    wf = Workflow.builder(ex).with_budget(budget).with_policy(policy).with_llm(llm).build()
    first = await wf.parallel([AgentStepSpec(task_id="s1", agent="summariser")])
    assert first[0].output == "from big"
    assert llm.current == "small"  # 0.85 of 1.00 crossed the warning: downgraded
    budget.limit_cost = None  # (let the next call through)
    second = await wf.parallel([AgentStepSpec(task_id="s2", agent="summariser")])
    assert second[0].output == "from small"


async def test_a_loop_until_approved_within_the_workflow() -> None:
    wf = Workflow.builder(reviewers()).build()
    drafts = iter(["v2", "v3 with sources"])

    def again(outcomes: list[StepOutcome]) -> LoopDecision[Any]:
        if all(o.structured["approved"] for o in outcomes):  # type: ignore[index]
            return LoopDecision.stop()
        return LoopDecision.continue_(panel(2, next(drafts)))

    last = await wf.loop(panel(2, "v1"), again, 5)
    assert [o.structured for o in last] == [{"approved": True}] * 2


async def test_pipeline_under_the_workflow() -> None:
    wf = Workflow.builder(reviewers()).build()

    def stage(prev: StepOutcome | None, item: str) -> AgentStepSpec | None:
        return AgentStepSpec(task_id=f"{item}_review", agent="reviewer", input=item)

    chains = await wf.pipeline(["a", "b_with_sources"], [stage])
    assert [[o.structured for o in c] for c in chains] == [
        [{"approved": False}],
        [{"approved": True}],
    ]


def test_builder_errors() -> None:
    with pytest.raises(OrchestrationError, match="needs an AgentExecutor"):
        Workflow.builder("executor")  # type: ignore[arg-type]
    builder = Workflow.builder(reviewers())
    with pytest.raises(OrchestrationError, match="with_budget takes a WorkflowBudget"):
        builder.with_budget(100)  # type: ignore[arg-type]
    with pytest.raises(OrchestrationError, match="with_store takes a State"):
        builder.with_store({})  # type: ignore[arg-type]
    with pytest.raises(OrchestrationError, match="non-empty"):
        builder.with_id("")
    with pytest.raises(OrchestrationError, match="not among"):
        SwappableLLM({}, "big")


def _ask_for_more(event: Any) -> BudgetDecision | None:
    if isinstance(event, BudgetWarning):
        return BudgetDecision(RequestIncrease(amount="2.00"))
    return None


async def run_costly(wf: Workflow, budget: WorkflowBudget) -> None:
    await wf.parallel([AgentStepSpec(task_id="s1", agent="worker")])


def costly_executor(budget: WorkflowBudget) -> LocalExecutor:
    def work(spec: AgentStepSpec) -> str:
        budget.record(cost="0.90")
        return "done"

    return LocalExecutor({"worker": work}, concurrency=1)


async def test_an_approved_budget_increase_raises_the_cost_limit() -> None:
    budget = WorkflowBudget(limit_cost="1.00", workflow="w")
    asked: list[Any] = []
    wf = (
        Workflow.builder(costly_executor(budget))
        .with_budget(budget)
        .with_policy(_ask_for_more)
        .approve_increase(lambda amount: asked.append(amount) or True)
        .build()
    )
    await run_costly(wf, budget)
    assert [str(a) for a in asked] == ["2.00"]
    assert str(budget.limit_cost) == "3.00"
    assert any("approved" in getattr(e, "message", "") for e in wf.history)


@pytest.mark.parametrize("approver", [None, lambda amount: False], ids=["none", "declined"])
async def test_a_budget_increase_without_approval_is_refused_with_the_reason(
    approver: Any,
) -> None:
    budget = WorkflowBudget(limit_cost="1.00", workflow="w")
    builder = Workflow.builder(costly_executor(budget)).with_budget(budget)
    builder = builder.with_policy(_ask_for_more)
    if approver is not None:
        builder = builder.approve_increase(approver)
    wf = builder.build()
    await run_costly(wf, budget)
    assert str(budget.limit_cost) == "1.00"
    (note,) = [e.message for e in wf.history if "refused" in getattr(e, "message", "")]
    assert note.startswith("budget increase of 2.00 refused: ")
    assert ("no approver" in note) is (approver is None)


async def test_a_pipeline_stage_that_raises_ends_only_its_own_chain() -> None:
    wf = Workflow.builder(reviewers()).build()

    def stage(prev: StepOutcome | None, item: str) -> AgentStepSpec | None:
        if item == "bad":
            raise ValueError("cannot build a step for this one")
        return AgentStepSpec(task_id=f"{item}_review", agent="reviewer", input=item)

    chains = await wf.pipeline(["a", "bad", "c_with_sources"], [stage])
    assert [o.success for o in chains[0]] == [True]
    (failed,) = chains[1]
    assert not failed.success
    assert failed.task_id == "pipeline:1:0"
    assert "ValueError: cannot build a step for this one" in (failed.error or "")
    assert chains[2][0].structured == {"approved": True}


async def test_a_swappable_llm_streams_from_its_current_model() -> None:
    from slateflow.errors import OrchestrationError
    from slateflow.resolve import LLMRequest, LLMResponse

    class Plain:
        async def generate(self, request: LLMRequest) -> LLMResponse:
            return LLMResponse(text="plain")

    llm = SwappableLLM({"big": ScriptedLLM(["from big"]), "plain": Plain()}, "big")
    answer = Resolver.llm("answer", llm, "Hi", stream=True)
    assert await answer.resolve(State()) == "from big"
    llm.swap("plain")
    with pytest.raises(OrchestrationError, match="cannot stream"):
        llm.stream(LLMRequest(prompt="x"))


async def test_a_workflows_llm_calls_are_charged_to_its_budget_with_reported_usage() -> None:
    from slateflow.resolve import LLMResponse, Usage

    big = ScriptedLLM([LLMResponse(text="ok", usage=Usage(input_tokens=30, output_tokens=10))])
    llm = SwappableLLM({"big": big}, "big")
    budget = WorkflowBudget(limit_tokens=1000, workflow="w")
    Workflow.builder(LocalExecutor({}, concurrency=1)).with_budget(budget).with_llm(llm).build()
    await Resolver.llm("ask", llm, "Hi").resolve(State())
    assert budget.snapshot().consumed_tokens == 40  # what the server reported


async def test_a_call_with_unknown_usage_is_charged_its_estimate_never_nothing() -> None:
    from slateflow.orchestrate import MeteredLLM

    budget = WorkflowBudget(limit_tokens=1000, workflow="w")
    llm = MeteredLLM(ScriptedLLM(["a reply of twenty ch"]), budget, output_per_1k="2.00")
    await Resolver.llm("ask", llm, "A question of 26 letters?").resolve(State())
    snapshot = budget.snapshot()
    assert snapshot.consumed_tokens == 7 + 5  # estimated: ~4 characters a token
    assert snapshot.consumed_cost == pytest.approx(Decimal("0.01"))  # 5 tokens at 2.00 / 1k


async def test_a_streamed_call_is_charged_once_when_it_ends() -> None:
    from slateflow.orchestrate import MeteredLLM

    budget = WorkflowBudget(workflow="w")
    llm = MeteredLLM(ScriptedLLM(["one two three"]), budget)
    answer = Resolver.llm("answer", llm, "Count", stream=True)
    assert await answer.resolve(State()) == "one two three"
    assert budget.snapshot().consumed_tokens == 2 + 4
