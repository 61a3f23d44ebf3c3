"""Fan-out, pipelines and loops over an :class:`AgentExecutor`, as code.

A developer writes the shape of the work (three reviewers in parallel, then a judge, until it
is approved), so it is reproducible, testable and bounded, whatever a model decides. Every
combinator runs at most ``executor.concurrency_hint`` steps at once (0 counts as 1), turns a
crashing step into a failed :class:`StepOutcome` without dropping the others, and, given a
``state``, writes each step's progress there like a resolver's: ``{task_id}:status``
(``running``, then ``done`` or ``error``) and ``{task_id}:result`` or ``{task_id}:error``,
with provenance source ``"orchestration"`` and the agent as writer. Flows and guards see
orchestration progress like any other result (``resolved("review_1")``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio

from ..errors import OrchestrationError, SlateError
from ..state import State
from ..state.keys import error_key, result_key, status_key
from .spec import AgentExecutor, AgentStepSpec, StepOutcome

__all__ = [
    "LoopDecision",
    "PipelineStage",
    "execute_loop",
    "execute_parallel",
    "execute_pipeline",
    "run_step",
]

log = logging.getLogger("slateflow.orchestrate")

T = TypeVar("T")

PipelineStage = Callable[[StepOutcome | None, Any], AgentStepSpec | None]
"""A pipeline stage: given the previous stage's outcome (None before the first) and the item,
the next step to run, or None to end this item's chain."""


def step_limiter(executor: AgentExecutor) -> anyio.CapacityLimiter:
    hint = getattr(executor, "concurrency_hint", 1)
    if type(hint) is not int or hint < 0:
        raise OrchestrationError(
            f"{type(executor).__name__}.concurrency_hint must be a whole number >= 0, got {hint!r}"
        )
    return anyio.CapacityLimiter(max(hint, 1))


def check_specs(specs: Iterable[Any], where: str) -> list[AgentStepSpec]:
    checked = list(specs)
    for i, spec in enumerate(checked):
        if not isinstance(spec, AgentStepSpec):
            raise OrchestrationError(f"{where}: specs[{i}] is {spec!r}, not an AgentStepSpec")
    return checked


def _record_start(state: State | None, spec: AgentStepSpec) -> None:
    if state is None:
        return
    try:
        state.set(
            status_key(spec.task_id),
            "running",
            source="orchestration",
            writer=spec.agent,
            meta={"task_id": spec.task_id},
        )
    except SlateError as exc:
        log.error("step %r: its status could not be written: %s", spec.task_id, exc)


def _record_end(state: State | None, outcome: StepOutcome) -> None:
    if state is None:
        return
    task = outcome.task_id
    meta = {"task_id": task}
    try:
        if outcome.success:
            value = outcome.structured if outcome.structured is not None else outcome.output
            state.update(
                {result_key(task): value, status_key(task): "done"},
                source="orchestration",
                writer=outcome.agent,
                meta=meta,
                remove=error_key(task),
            )
        else:
            state.update(
                {error_key(task): outcome.error or "failed", status_key(task): "error"},
                source="orchestration",
                writer=outcome.agent,
                meta=meta,
                remove=result_key(task),
            )
    except SlateError as exc:
        log.error("step %r: its outcome could not be written: %s", task, exc)


async def run_step(
    executor: AgentExecutor,
    spec: AgentStepSpec,
    *,
    state: State | None = None,
    limiter: anyio.CapacityLimiter | None = None,
) -> StepOutcome:
    """Run one step through ``executor``: never raises for the step's own failure (an
    exception from the executor becomes a failed outcome naming it), records it in ``state``
    when given, and waits for a slot of ``limiter`` when given."""
    _record_start(state, spec)
    try:
        if limiter is None:
            result = await executor.execute_step(spec)
        else:
            async with limiter:
                result = await executor.execute_step(spec)
        if not isinstance(result, StepOutcome):
            outcome = StepOutcome.failed(
                spec,
                f"executor {type(executor).__name__} returned {type(result).__name__}, "
                "not a StepOutcome",
            )
        elif result.task_id != spec.task_id:
            outcome = StepOutcome.failed(
                spec,
                f"executor {type(executor).__name__} answered task {result.task_id!r} "
                f"for task {spec.task_id!r}",
            )
        else:
            outcome = result
    except Exception as exc:
        # A crashing branch is a failed step, not a failed fan-out.
        log.warning("step %r crashed in its executor: %r", spec.task_id, exc)
        outcome = StepOutcome.failed(spec, f"{type(exc).__name__}: {exc}")
    except anyio.get_cancelled_exc_class():
        # The State must not say "running" for ever about a step that was cancelled.
        _record_end(state, StepOutcome.failed(spec, "cancelled"))
        raise
    _record_end(state, outcome)
    return outcome


def check_unique_ids(checked: list[AgentStepSpec], where: str, why: str) -> None:
    ids = [s.task_id for s in checked]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise OrchestrationError(
            f"{where}: task ids must be unique ({why}); repeated: {', '.join(dupes)}"
        )


async def execute_parallel(
    executor: AgentExecutor,
    specs: Iterable[AgentStepSpec],
    *,
    state: State | None = None,
) -> list[StepOutcome]:
    """Run ``specs`` at once, at most ``concurrency_hint`` at a time; the outcomes come back in
    the order of ``specs``, each step succeeding or failing on its own."""
    checked = check_specs(specs, "execute_parallel")
    check_unique_ids(checked, "execute_parallel", "their outcomes share keys")
    outcomes: list[StepOutcome | None] = [None] * len(checked)
    if not checked:
        return []
    limiter: anyio.CapacityLimiter | None = step_limiter(executor)
    assert limiter is not None
    if limiter.total_tokens >= len(checked):
        limiter = None  # every branch fits: no slot to wait for (and no checkpoint each)

    async def branch(i: int, spec: AgentStepSpec) -> None:
        outcomes[i] = await run_step(executor, spec, state=state, limiter=limiter)

    async with anyio.create_task_group() as tg:
        for i, spec in enumerate(checked):
            tg.start_soon(branch, i, spec)
    return [o for o in outcomes if o is not None]


async def execute_pipeline(
    executor: AgentExecutor,
    items: Iterable[Any],
    stages: Sequence[PipelineStage],
    *,
    state: State | None = None,
) -> list[list[StepOutcome]]:
    """Run each item through ``stages`` as its own chain, all chains at once (no barrier
    between stages: one item's second stage may run before another's first).

    A stage returning None, or a failed step, ends that item's chain. A stage function that
    raises ends only its own chain, with a failed outcome saying why (``task_id``
    ``"pipeline:<item>:<stage>"``); the other chains go on. Returns each item's outcomes, in
    item order.
    """
    stages = list(stages)
    if not stages:
        raise OrchestrationError("execute_pipeline needs at least one stage")
    for i, stage in enumerate(stages):
        if not callable(stage):
            raise OrchestrationError(f"execute_pipeline: stages[{i}] is {stage!r}, not callable")
    work = list(items)
    chains: list[list[StepOutcome]] = [[] for _ in work]
    if not work:
        return chains
    limiter = step_limiter(executor)

    async def chain(i: int, item: Any) -> None:
        previous: StepOutcome | None = None
        for n, stage in enumerate(stages):
            try:
                spec = await await_result(stage, previous, item)
            except Exception as exc:
                name = getattr(stage, "__name__", f"stage {n}")
                chains[i].append(
                    StepOutcome(
                        task_id=f"pipeline:{i}:{n}",
                        agent=str(name),
                        success=False,
                        error=f"stages[{n}] ({name}) raised {type(exc).__name__}: {exc}",
                    )
                )
                return
            if spec is None:
                return
            if not isinstance(spec, AgentStepSpec):
                raise OrchestrationError(
                    f"execute_pipeline: stages[{n}] returned {spec!r} for item {i}; a stage "
                    "returns an AgentStepSpec or None"
                )
            previous = await run_step(executor, spec, state=state, limiter=limiter)
            chains[i].append(previous)
            if not previous.success:
                return

    try:
        async with anyio.create_task_group() as tg:
            for i, item in enumerate(work):
                tg.start_soon(chain, i, item)
    except BaseExceptionGroup as group:
        # A stage that returned nonsense is the caller's mistake: raise it as itself.
        mistakes, rest = group.split(OrchestrationError)
        if mistakes is not None and rest is None:
            raise _first(mistakes) from None
        raise
    return chains


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


async def await_result(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, awaited when it returns an awaitable (sync or async callbacks alike)."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass(frozen=True, slots=True)
class LoopDecision(Generic[T]):
    """What ``execute_loop``'s ``next`` decides after a round: ``LoopDecision.continue_(specs)``
    runs another round with ``specs``; ``LoopDecision.stop()`` ends the loop."""

    specs: tuple[AgentStepSpec, ...] | None

    @classmethod
    def continue_(cls, specs: Iterable[AgentStepSpec]) -> LoopDecision[Any]:
        """Run another round with ``specs`` (an empty round ends the loop)."""
        return cls(tuple(specs))

    @classmethod
    def stop(cls) -> LoopDecision[Any]:
        """End the loop."""
        return cls(None)

    @property
    def stops(self) -> bool:
        """Whether this decision ends the loop."""
        return self.specs is None


async def execute_loop(
    executor: AgentExecutor,
    initial: Iterable[AgentStepSpec],
    next: Callable[[list[StepOutcome]], LoopDecision[Any] | Awaitable[LoopDecision[Any]]],
    max_iterations: int,
    *,
    state: State | None = None,
) -> list[StepOutcome]:
    """Run rounds until ``next`` says stop, a round has no specs, or ``max_iterations`` rounds
    ran, whichever comes first. Each round is an ``execute_parallel`` (a barrier); ``next``
    (sync or async) sees the round's outcomes. Returns the last round's outcomes.

    The cap is mandatory: a model that never approves must not loop for ever.
    """
    if type(max_iterations) is not int or max_iterations < 1:
        raise OrchestrationError(
            f"execute_loop: max_iterations must be a whole number >= 1, got {max_iterations!r}"
        )
    if not callable(next):
        raise OrchestrationError("execute_loop: next must be a callable taking the outcomes")
    specs = check_specs(initial, "execute_loop")
    last: list[StepOutcome] = []
    for _ in range(max_iterations):
        if not specs:
            break
        last = await execute_parallel(executor, specs, state=state)
        decision = await await_result(next, last)
        if not isinstance(decision, LoopDecision):
            raise OrchestrationError(
                f"execute_loop: next returned {decision!r}; return LoopDecision.continue_(specs) "
                "or LoopDecision.stop()"
            )
        if decision.specs is None:
            break
        specs = check_specs(decision.specs, "execute_loop")
    return last
