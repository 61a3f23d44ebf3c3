"""Workflow: the combinators with a budget, a State, a policy and a stream of milestones.

``Workflow.builder(executor).with_budget(budget).with_store(state).build()`` makes one;
``await workflow.phase("review", specs)`` runs a named fan-out, ``parallel``, ``pipeline`` and
``loop`` run the combinators, ``log`` notes a milestone. Every step is checked against the
budget first (a step the budget or the step/loop limits refuse is a failed outcome, not run),
and the budget's events go through the policy: ``halt_workflow`` cancels the running steps and
refuses the rest, ``downgrade_model`` switches the :class:`SwappableLLM` later LLM calls use.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from decimal import Decimal
from typing import Annotated, Any, Literal

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, Field

from ..errors import OrchestrationError
from ..resolve.llm import LLM, LLMDelta, LLMRequest, LLMResponse
from ..state import State
from .budget import WorkflowBudget, budget_event
from .combinators import (
    LoopDecision,
    PipelineStage,
    await_result,
    execute_loop,
    execute_parallel,
    execute_pipeline,
)
from .events import (
    BudgetAction,
    BudgetDecision,
    BudgetWarning,
    Continue,
    DowngradeModel,
    HaltWorkflow,
    LoopDetected,
    RequestIncrease,
    StepLimitReached,
    TimeoutReached,
)
from .metered import MeteredLLM, charge
from .spec import AgentExecutor, AgentStepSpec, StepOutcome

__all__ = [
    "BudgetPolicy",
    "SwappableLLM",
    "Workflow",
    "WorkflowBuilder",
    "WorkflowEvent",
    "default_policy",
]

log = logging.getLogger("slateflow.orchestrate")


class _Milestone(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow: str


class PhaseStart(_Milestone):
    """A named phase started with ``steps`` steps."""

    type: Literal["phase_start"] = "phase_start"
    phase: str
    steps: int


class PhaseEnd(_Milestone):
    """A named phase ended: how many steps ``succeeded`` and ``failed``."""

    type: Literal["phase_end"] = "phase_end"
    phase: str
    succeeded: int
    failed: int


class Log(_Milestone):
    """A note from the workflow's code."""

    type: Literal["log"] = "log"
    message: str


class BudgetExhausted(_Milestone):
    """The budget refused a step: what was consumed of what."""

    type: Literal["budget_exhausted"] = "budget_exhausted"
    consumed_tokens: int
    consumed_cost: str


WorkflowEvent = Annotated[
    PhaseStart | PhaseEnd | Log | BudgetExhausted, Field(discriminator="type")
]
"""A workflow milestone (tagged by ``"type"``: phase_start, phase_end, log, budget_exhausted)."""

BudgetPolicy = Callable[[Any], BudgetDecision | None]
"""Turns a budget event into a decision (None: nothing to decide)."""


def default_policy(event: Any) -> BudgetDecision | None:
    """Halt on a reached step limit, a loop or a timeout; go on after a warning."""
    if isinstance(event, StepLimitReached | LoopDetected | TimeoutReached):
        return BudgetDecision(HaltWorkflow())
    if isinstance(event, BudgetWarning):
        return BudgetDecision(Continue())
    return None


class SwappableLLM:
    """An :class:`~slateflow.LLM` that forwards to one of several, switchable at run time:
    give it to your LLM resolvers, and a ``downgrade_model`` decision moves them all to the
    cheaper model. Given to a workflow with a budget (``with_llm`` and ``with_budget``), every
    call's token usage (or its estimate) is recorded in that budget, under the model's name."""

    def __init__(self, models: dict[str, LLM], current: str) -> None:
        if current not in models:
            raise OrchestrationError(f"SwappableLLM: {current!r} is not among {sorted(models)}")
        self.models = dict(models)
        self.current = current
        self.budget: WorkflowBudget | None = None
        """The budget its calls are charged to (set by the workflow it is given to)."""

    def swap(self, to: str) -> None:
        """Use the model named ``to`` from now on."""
        if to not in self.models:
            raise OrchestrationError(f"SwappableLLM: no model {to!r} (have {sorted(self.models)})")
        self.current = to

    async def generate(self, request: LLMRequest, /) -> LLMResponse:
        """The current model's answer (charged to the workflow's budget when it has one)."""
        name = self.current
        response = await self.models[name].generate(request)
        if self.budget is not None:
            charge(self.budget, request, response, operator=name)
        return response

    def stream(self, request: LLMRequest, /) -> AsyncIterator[LLMDelta | LLMResponse]:
        """Stream from the current model (which must be able to)."""
        model = self.models[self.current]
        stream = getattr(model, "stream", None)
        if not callable(stream):
            raise OrchestrationError(
                f"SwappableLLM: the current model {self.current!r} cannot stream; give every "
                "model a stream method, or call without stream=True"
            )
        if self.budget is not None:
            return MeteredLLM(model, self.budget, operator=self.current).stream(request)
        result: AsyncIterator[LLMDelta | LLMResponse] = stream(request)
        return result


class _Guarded:
    """The workflow's executor: checks the budget and the halt flag before each step."""

    def __init__(self, workflow: Workflow) -> None:
        self.workflow = workflow
        self.done: dict[str, StepOutcome] = {}
        """Outcomes of the steps that finished, so a halted phase keeps them."""

    @property
    def concurrency_hint(self) -> int:
        return self.workflow.executor.concurrency_hint

    async def execute_step(self, spec: AgentStepSpec, /) -> StepOutcome:
        wf = self.workflow
        if wf.halted:
            return StepOutcome.failed(spec, f"workflow {wf.id!r} was halted: {wf.halt_reason}")
        budget = wf.budget
        if budget is not None:
            if not budget.check():
                wf._exhausted()
                return StepOutcome.failed(spec, f"workflow {wf.id!r}: the budget is exhausted")
            if not budget.record_step(spec.agent, spec.input, operator=spec.agent):
                return StepOutcome.failed(
                    spec, f"workflow {wf.id!r}: refused by the budget's step or loop limit"
                )
            if not budget.check_time(operator=spec.agent):
                return StepOutcome.failed(spec, f"workflow {wf.id!r}: out of time")
        if wf.halted:  # the checks above may have halted it
            return StepOutcome.failed(spec, f"workflow {wf.id!r} was halted: {wf.halt_reason}")
        outcome = await wf.executor.execute_step(spec)
        if isinstance(outcome, StepOutcome):
            self.done[spec.task_id] = outcome
        return outcome


class Workflow:
    """A typed orchestration facade; build one with :meth:`builder`. See the module docs."""

    def __init__(
        self,
        executor: AgentExecutor,
        *,
        id: str = "workflow",
        budget: WorkflowBudget | None = None,
        state: State | None = None,
        policy: BudgetPolicy = default_policy,
        llm: SwappableLLM | None = None,
        approve_increase: Callable[[Decimal], bool] | None = None,
    ) -> None:
        self.executor = executor
        self.approve_increase = approve_increase
        """Decides a ``request_increase`` (the amount in): True raises ``limit_cost`` by it."""
        self.id = id
        self.budget = budget
        self.state = state
        self.policy = policy
        self.llm = llm
        if llm is not None and budget is not None:
            llm.budget = budget  # its calls count against the budget they are decided on
        self.history: list[Any] = []
        """Every milestone, oldest first."""
        self.decisions: list[BudgetDecision] = []
        """Every decision the policy took, oldest first."""
        self.halted = False
        self.halt_reason = ""
        self._guarded = _Guarded(self)
        self._scopes: set[anyio.CancelScope] = set()
        self._streams: list[MemoryObjectSendStream[Any]] = []
        self._told_exhausted = False
        if budget is not None:
            # Weak: a workflow nobody holds any more is not kept alive by its budget.
            budget_event.connect(self._on_budget_event, sender=budget)

    @staticmethod
    def builder(executor: AgentExecutor) -> WorkflowBuilder:
        """Start building a workflow over ``executor`` (the one thing it needs)."""
        return WorkflowBuilder(executor)

    # -- milestones --------------------------------------------------------------------------

    def events(self) -> MemoryObjectReceiveStream[Any]:
        """A stream of the milestones from now on (``async for event in workflow.events()``);
        it ends when :meth:`close` is called."""
        send, receive = anyio.create_memory_object_stream[Any](math.inf)
        self._streams.append(send)
        return receive

    def _emit(self, event: Any) -> None:
        self.history.append(event)
        for stream in self._streams:
            stream.send_nowait(event)

    def log(self, message: str) -> None:
        """Note a milestone."""
        self._emit(Log(workflow=self.id, message=message))

    def _exhausted(self) -> None:
        if self._told_exhausted or self.budget is None:
            return
        self._told_exhausted = True
        snap = self.budget.snapshot()
        self._emit(
            BudgetExhausted(
                workflow=self.id,
                consumed_tokens=snap.consumed_tokens,
                consumed_cost=str(snap.consumed_cost),
            )
        )

    # -- the budget policy ---------------------------------------------------------------------

    def _on_budget_event(self, sender: Any, event: Any) -> None:
        if isinstance(event, BudgetAction):
            return  # our own decisions, echoed
        decision = self.policy(event)
        if decision is None:
            return
        self.decisions.append(decision)
        if self.budget is not None:
            self.budget._emit([BudgetAction(workflow=self.id, action=decision)])
        action = decision.root
        if isinstance(action, HaltWorkflow):
            self.halt(f"the budget policy halted it after {event.type}")
        elif isinstance(action, DowngradeModel):
            if self.llm is None:
                log.warning("workflow %r: downgrade_model with no SwappableLLM", self.id)
            else:
                self.llm.swap(action.to)
        elif isinstance(action, RequestIncrease):
            self._increase(action.amount)

    def _increase(self, amount: Decimal) -> None:
        """Act on a ``request_increase``: the approver raises the cost cap, or it is refused
        with the reason (a milestone either way)."""
        budget = self.budget
        why = ""
        if budget is None or budget.limit_cost is None:
            why = "the budget has no cost limit to raise"
        elif self.approve_increase is None:
            why = "no approver (WorkflowBuilder.approve_increase)"
        else:
            try:
                approved = bool(self.approve_increase(amount))
            except Exception as exc:  # an approver that fails refuses
                approved, why = False, f"the approver raised {type(exc).__name__}: {exc}"
            if approved:
                budget.limit_cost = budget.limit_cost + amount
                self.log(f"budget increase of {amount} approved: limit_cost {budget.limit_cost}")
                return
            why = why or "the approver declined"
        self.log(f"budget increase of {amount} refused: {why}")

    def halt(self, reason: str = "halted") -> None:
        """Cancel the running steps (their outcomes: failed, "cancelled") and refuse the rest."""
        self.halted = True
        self.halt_reason = reason
        for scope in list(self._scopes):
            scope.cancel()

    # -- running --------------------------------------------------------------------------------

    async def _guard(self, specs: Sequence[AgentStepSpec], run: Any) -> list[StepOutcome]:
        """Run ``run()`` so that halting cancels it; cancelled steps come back failed."""
        for spec in specs:  # a task id run before must not answer for this run
            self._guarded.done.pop(spec.task_id, None)
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                result: list[StepOutcome] = await run()
                return result
            finally:
                self._scopes.discard(scope)
        done = self._guarded.done
        return [
            done.get(s.task_id)
            or StepOutcome.failed(
                s, f"cancelled: workflow {self.id!r} was halted: {self.halt_reason}"
            )
            for s in specs
        ]

    async def parallel(self, specs: Iterable[AgentStepSpec]) -> list[StepOutcome]:
        """``execute_parallel`` under the workflow's budget, State and policy."""
        specs = list(specs)
        return await self._guard(
            specs, lambda: execute_parallel(self._guarded, specs, state=self.state)
        )

    async def phase(self, name: str, specs: Iterable[AgentStepSpec]) -> list[StepOutcome]:
        """A named :meth:`parallel`, between ``phase_start`` and ``phase_end`` milestones."""
        specs = list(specs)
        self._emit(PhaseStart(workflow=self.id, phase=name, steps=len(specs)))
        outcomes = await self.parallel(specs)
        ok = sum(o.success for o in outcomes)
        self._emit(PhaseEnd(workflow=self.id, phase=name, succeeded=ok, failed=len(outcomes) - ok))
        return outcomes

    async def pipeline(
        self, items: Iterable[Any], stages: Sequence[PipelineStage]
    ) -> list[list[StepOutcome]]:
        """``execute_pipeline`` under the workflow's budget, State and policy (halting ends
        every chain; the steps already done are kept)."""
        result: list[list[StepOutcome]] | None = None
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                result = await execute_pipeline(self._guarded, items, stages, state=self.state)
            finally:
                self._scopes.discard(scope)
        return result if result is not None else []

    async def loop(
        self,
        initial: Iterable[AgentStepSpec],
        next: Callable[[list[StepOutcome]], Any],
        max_iterations: int,
    ) -> list[StepOutcome]:
        """``execute_loop`` under the workflow's budget, State and policy; a halted workflow
        ends the loop."""
        initial = list(initial)

        async def until_halted(outcomes: list[StepOutcome]) -> LoopDecision[Any]:
            if self.halted:
                return LoopDecision.stop()
            decision: LoopDecision[Any] = await await_result(next, outcomes)
            return decision

        return await self._guard(
            initial,
            lambda: execute_loop(
                self._guarded, initial, until_halted, max_iterations, state=self.state
            ),
        )

    def close(self) -> None:
        """End the event streams and stop listening to the budget."""
        for stream in self._streams:
            stream.close()
        self._streams.clear()
        if self.budget is not None:
            budget_event.disconnect(self._on_budget_event, sender=self.budget)

    def __repr__(self) -> str:
        return f"<Workflow {self.id!r}{' halted' if self.halted else ''}>"


class WorkflowBuilder:
    """Builds a :class:`Workflow`: the executor is required, the rest optional."""

    def __init__(self, executor: AgentExecutor) -> None:
        if not isinstance(executor, AgentExecutor):
            raise OrchestrationError(
                f"Workflow.builder needs an AgentExecutor (execute_step, concurrency_hint), "
                f"got {executor!r}"
            )
        self._executor = executor
        self._options: dict[str, Any] = {}

    def with_id(self, workflow_id: str) -> WorkflowBuilder:
        """Name the workflow (its milestones and budget actions carry the name)."""
        if type(workflow_id) is not str or not workflow_id:
            raise OrchestrationError(f"a workflow id is a non-empty string, got {workflow_id!r}")
        self._options["id"] = workflow_id
        return self

    def with_budget(self, budget: WorkflowBudget) -> WorkflowBuilder:
        """Check every step against ``budget`` and apply the policy to its events."""
        if not isinstance(budget, WorkflowBudget):
            raise OrchestrationError(f"with_budget takes a WorkflowBudget, got {budget!r}")
        self._options["budget"] = budget
        return self

    def with_store(self, state: State) -> WorkflowBuilder:
        """Write every step's progress into ``state``."""
        if not isinstance(state, State):
            raise OrchestrationError(f"with_store takes a State, got {state!r}")
        self._options["state"] = state
        return self

    def with_policy(self, policy: BudgetPolicy) -> WorkflowBuilder:
        """Decide about budget events with ``policy`` (default :func:`default_policy`)."""
        if not callable(policy):
            raise OrchestrationError("with_policy takes a callable from event to decision")
        self._options["policy"] = policy
        return self

    def with_llm(self, llm: SwappableLLM) -> WorkflowBuilder:
        """The switchable LLM a ``downgrade_model`` decision acts on."""
        if not isinstance(llm, SwappableLLM):
            raise OrchestrationError(f"with_llm takes a SwappableLLM, got {llm!r}")
        self._options["llm"] = llm
        return self

    def approve_increase(self, approver: Callable[[Decimal], bool]) -> WorkflowBuilder:
        """Decide ``request_increase`` decisions with ``approver(amount)``: True raises the
        budget's ``limit_cost`` by the amount; False (or without an approver) refuses it, with
        the reason in the milestones."""
        if not callable(approver):
            raise OrchestrationError("approve_increase takes a callable from amount to bool")
        self._options["approve_increase"] = approver
        return self

    def build(self) -> Workflow:
        """The workflow."""
        return Workflow(self._executor, **self._options)
