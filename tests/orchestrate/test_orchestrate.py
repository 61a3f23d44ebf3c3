"""Orchestration combinators over the executor seam: order, independent failures, bounded
concurrency (measured by a fake that records peak parallelism), pipelines without barriers,
capped loops, and every step's outcome in the State."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from slateflow import Flow, ManualClock, Session, State, Step, resolved
from slateflow.errors import OrchestrationError
from slateflow.orchestrate import (
    AgentExecutor,
    AgentStepSpec,
    LocalExecutor,
    LoopDecision,
    StepOutcome,
    execute_loop,
    execute_parallel,
    execute_pipeline,
)

pytestmark = pytest.mark.anyio


class Recorder:
    """A fake executor: each step takes ``delays[task_id]`` seconds of the manual clock and
    fails when its prompt says "fail"; it records the order steps start and end in, and the
    peak number running at once."""

    def __init__(self, clock: ManualClock, hint: int, delays: dict[str, float] | None = None):
        self.clock = clock
        self.hint = hint
        self.delays = delays or {}
        self.running = 0
        self.peak = 0
        self.started: list[str] = []
        self.ended: list[str] = []

    @property
    def concurrency_hint(self) -> int:
        return self.hint

    async def execute_step(self, spec: AgentStepSpec) -> StepOutcome:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.started.append(spec.task_id)
        try:
            await self.clock.sleep(self.delays.get(spec.task_id, 1.0))
            if spec.prompt == "crash":
                raise RuntimeError("the worker died")
            if spec.prompt == "fail":
                return StepOutcome.failed(spec, "said no")
            return StepOutcome.ok(spec, f"{spec.task_id} done")
        finally:
            self.running -= 1
            self.ended.append(spec.task_id)


def spec(task: str, prompt: str = "", agent: str = "worker") -> AgentStepSpec:
    return AgentStepSpec(task_id=task, agent=agent, prompt=prompt)


async def drive(clock: ManualClock, work: Any) -> Any:
    """Run ``work()`` while moving the manual clock on until it finishes."""
    result: list[Any] = []

    async def run() -> None:
        result.append(await work())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        while not result:
            await clock.advance(0.5)
    return result[0]


def test_the_fake_is_an_executor() -> None:
    assert isinstance(Recorder(ManualClock(), 1), AgentExecutor)
    assert isinstance(LocalExecutor({}), AgentExecutor)


# -- execute_parallel ------------------------------------------------------------------------


async def test_outcomes_come_back_in_input_order_and_fail_independently() -> None:
    clock = ManualClock()
    ex = Recorder(clock, 4, {"a": 3, "b": 1, "c": 2, "d": 1})
    specs = [spec("a"), spec("b", "fail"), spec("c", "crash"), spec("d")]
    outcomes = await drive(clock, lambda: execute_parallel(ex, specs))
    assert [o.task_id for o in outcomes] == ["a", "b", "c", "d"]
    assert [o.success for o in outcomes] == [True, False, False, True]
    assert outcomes[1].error == "said no"
    assert outcomes[2].error == "RuntimeError: the worker died"
    assert set(ex.ended[:2]) == {"b", "d"}  # they finished first, yet come back in place


@pytest.mark.parametrize(("hint", "peak"), [(0, 1), (1, 1), (3, 3), (50, 10)])
async def test_concurrency_is_bounded_by_the_hint(hint: int, peak: int) -> None:
    clock = ManualClock()
    ex = Recorder(clock, hint)
    outcomes = await drive(clock, lambda: execute_parallel(ex, [spec(f"t{i}") for i in range(10)]))
    assert ex.peak == peak
    assert all(o.success for o in outcomes)


async def test_an_executor_that_misbehaves_is_a_failed_step() -> None:
    class Bad:
        concurrency_hint = 2

        async def execute_step(self, spec: AgentStepSpec) -> Any:
            if spec.task_id == "wrong_type":
                return "not an outcome"
            return StepOutcome.ok(AgentStepSpec(task_id="other", agent="x"))

    outcomes = await execute_parallel(Bad(), [spec("wrong_type"), spec("wrong_id")])
    assert outcomes[0].error == "executor Bad returned str, not a StepOutcome"
    assert outcomes[1].error == "executor Bad answered task 'other' for task 'wrong_id'"


async def test_bad_arguments_are_refused_before_anything_runs() -> None:
    clock = ManualClock()
    ex = Recorder(clock, 2)
    with pytest.raises(OrchestrationError, match="repeated: a"):
        await execute_parallel(ex, [spec("a"), spec("a")])
    with pytest.raises(OrchestrationError, match=r"specs\[1\] is 'b', not an AgentStepSpec"):
        await execute_parallel(ex, [spec("a"), "b"])  # type: ignore[list-item]
    ex.hint = -1
    with pytest.raises(OrchestrationError, match="concurrency_hint must be"):
        await execute_parallel(ex, [spec("a")])
    assert ex.started == []
    assert await execute_parallel(ex, []) == []


async def test_every_outcome_lands_in_the_state_and_moves_a_flow() -> None:
    clock = ManualClock()
    state = State()
    ex = Recorder(clock, 2)
    flow = Flow(
        "review",
        [
            Step("wait", done=resolved("r1") & resolved("r2")),
            Step("judge", after=["wait"], terminal=True),
        ],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        outcomes = await drive(
            clock,
            lambda: execute_parallel(
                ex, [spec("r1", agent="alice"), spec("r2", "fail", agent="bob")], state=state
            ),
        )
        assert [o.success for o in outcomes] == [True, False]
        assert state.get("r1:result") == "r1 done"
        assert state.get("r1:status") == "done"
        assert state.get("r2:error") == "said no"
        assert state.get("r2:status") == "error"
        prov = state.provenance("r1:result")
        assert prov is not None
        assert (prov.source, prov.writer, prov.meta["task_id"]) == ("orchestration", "alice", "r1")
        assert runner.active_steps == ["wait"]  # r2 failed: not resolved
        again = await drive(clock, lambda: execute_parallel(ex, [spec("r2")], state=state))
        assert again[0].success
        assert "r2:error" not in state
        assert runner.is_complete


# -- LocalExecutor --------------------------------------------------------------------------


async def test_local_executor_turns_answers_into_outcomes() -> None:
    class Verdict(BaseModel):
        approved: bool

    async def judge(s: AgentStepSpec) -> Verdict:
        return Verdict(approved=s.input == "good")

    ex = LocalExecutor(
        {
            "echo": lambda s: s.prompt,
            "count": lambda s: {"words": len(s.prompt.split())},
            "judge": judge,
            "boom": lambda s: 1 / 0,
            "odd": lambda s: object(),
        },
        concurrency=3,
    )
    specs = [
        AgentStepSpec(task_id="a", agent="echo", prompt="hi"),
        AgentStepSpec(task_id="b", agent="count", prompt="one two"),
        AgentStepSpec(task_id="c", agent="judge", input="good"),
        AgentStepSpec(task_id="d", agent="boom"),
        AgentStepSpec(task_id="e", agent="odd"),
        AgentStepSpec(task_id="f", agent="ghost"),
    ]
    a, b, c, d, e, f = await execute_parallel(ex, specs)
    assert (a.output, a.structured) == ("hi", None)
    assert (b.output, b.structured) == ('{"words": 2}', {"words": 2})
    assert c.structured == {"approved": True}
    assert d.error == "ZeroDivisionError: division by zero"
    assert e.error is not None
    assert e.error.startswith("agent 'odd' answered object, not JSON")
    assert f.error == ("no agent named 'ghost' (known: boom, count, echo, judge, odd); register it")
    assert ex.concurrency_hint == 3
    with pytest.raises(OrchestrationError, match="concurrency"):
        LocalExecutor({}, concurrency=-1)
    with pytest.raises(OrchestrationError, match="not callable"):
        LocalExecutor({"x": 3})  # type: ignore[dict-item]


def test_specs_and_outcomes_are_json_and_checked() -> None:
    s = AgentStepSpec(task_id="t1", agent="a", prompt="p", input={"x": [1, 2]}, max_steps=3)
    assert AgentStepSpec.model_validate_json(s.model_dump_json()) == s
    o = StepOutcome.ok(s, "out", {"k": 1})
    assert StepOutcome.model_validate_json(o.model_dump_json()) == o
    with pytest.raises(ValidationError):
        AgentStepSpec(task_id="bad key with spaces", agent="a")
    with pytest.raises(ValidationError):
        AgentStepSpec(task_id="t", agent="a", max_steps=0)
    with pytest.raises(ValidationError):
        AgentStepSpec(task_id="t", agent="a", extra=1)  # type: ignore[call-arg]


# -- execute_pipeline ------------------------------------------------------------------------


async def test_each_item_runs_its_own_chain_without_barriers() -> None:
    clock = ManualClock()
    ex = Recorder(clock, 8, {"slow-1": 5, "fast-1": 1, "fast-2": 1})

    def first(prev: StepOutcome | None, item: str) -> AgentStepSpec:
        assert prev is None
        return spec(f"{item}-1")

    def second(prev: StepOutcome | None, item: str) -> AgentStepSpec:
        assert prev is not None
        assert prev.task_id == f"{item}-1"
        return spec(f"{item}-2")

    chains = await drive(clock, lambda: execute_pipeline(ex, ["slow", "fast"], [first, second]))
    assert [[o.task_id for o in c] for c in chains] == [
        ["slow-1", "slow-2"],
        ["fast-1", "fast-2"],
    ]
    # No barrier: the fast item's second stage ran before the slow item's first ended.
    assert ex.ended.index("fast-2") < ex.ended.index("slow-1")


async def test_a_stage_returning_none_or_a_failed_step_ends_that_chain_only() -> None:
    clock = ManualClock()
    ex = Recorder(clock, 4)

    async def first(prev: StepOutcome | None, item: str) -> AgentStepSpec | None:
        return None if item == "skip" else spec(f"{item}-1", "fail" if item == "bad" else "")

    def second(prev: StepOutcome | None, item: str) -> AgentStepSpec:
        return spec(f"{item}-2")

    chains = await drive(
        clock, lambda: execute_pipeline(ex, ["skip", "bad", "good"], [first, second])
    )
    assert [[o.task_id for o in c] for c in chains] == [[], ["bad-1"], ["good-1", "good-2"]]
    assert "bad-2" not in ex.started


async def test_pipeline_argument_errors() -> None:
    ex = Recorder(ManualClock(), 1)
    with pytest.raises(OrchestrationError, match="at least one stage"):
        await execute_pipeline(ex, [1], [])
    with pytest.raises(OrchestrationError, match="not callable"):
        await execute_pipeline(ex, [1], ["stage"])  # type: ignore[list-item]
    with pytest.raises(OrchestrationError, match=r"stages\[0\] returned 'oops' for item 0"):
        await execute_pipeline(ex, ["x"], [lambda prev, item: "oops"])
    assert await execute_pipeline(ex, [], [lambda p, i: None]) == []


# -- execute_loop ----------------------------------------------------------------------------


async def test_a_loop_runs_until_approved() -> None:
    clock = ManualClock()
    ex = Recorder(clock, 3)
    rounds: list[list[str]] = []

    def next_round(outcomes: list[StepOutcome]) -> LoopDecision[Any]:
        rounds.append([o.task_id for o in outcomes])
        if len(rounds) == 3:
            return LoopDecision.stop()
        n = len(rounds)
        return LoopDecision.continue_([spec(f"draft{n}"), spec(f"review{n}")])

    last = await drive(clock, lambda: execute_loop(ex, [spec("draft0")], next_round, 10))
    assert rounds == [["draft0"], ["draft1", "review1"], ["draft2", "review2"]]
    assert [o.task_id for o in last] == ["draft2", "review2"]


async def test_a_loop_ends_at_its_cap_or_on_an_empty_round() -> None:
    clock = ManualClock()
    ex = Recorder(clock, 1)
    calls: list[int] = []

    async def forever(outcomes: list[StepOutcome]) -> LoopDecision[Any]:
        calls.append(1)
        return LoopDecision.continue_([spec(f"again{len(calls)}")])

    last = await drive(clock, lambda: execute_loop(ex, [spec("start")], forever, 4))
    assert len(ex.started) == 4
    assert [o.task_id for o in last] == ["again3"]

    def empty(outcomes: list[StepOutcome]) -> LoopDecision[Any]:
        return LoopDecision.continue_([])

    ex2 = Recorder(clock, 1)
    last = await drive(clock, lambda: execute_loop(ex2, [spec("only")], empty, 4))
    assert ex2.started == ["only"]
    assert [o.task_id for o in last] == ["only"]
    assert await execute_loop(ex2, [], empty, 4) == []


async def test_loop_argument_errors() -> None:
    ex = Recorder(ManualClock(), 1)
    for cap in (0, -1, 1.5, None):
        with pytest.raises(OrchestrationError, match="max_iterations"):
            # type: ignore[arg-type]
            await execute_loop(ex, [spec("a")], lambda o: LoopDecision.stop(), cap)
    ex.delays["a"] = 0
    with pytest.raises(OrchestrationError, match="return LoopDecision"):
        # type: ignore[arg-type, return-value]
        await execute_loop(ex, [spec("a")], lambda o: True, 3)


# -- properties --------------------------------------------------------------------------------


@settings(deadline=None, max_examples=60)
@given(
    work=st.lists(
        st.tuples(st.sampled_from(["", "fail", "crash"]), st.integers(1, 5)),
        min_size=1,
        max_size=25,
    ),
    hint=st.integers(0, 6),
)
def test_parallel_keeps_order_bounds_concurrency_and_runs_each_step_once(
    work: list[tuple[str, int]], hint: int
) -> None:
    async def main() -> None:
        clock = ManualClock()
        delays = {f"t{i}": float(d) for i, (_, d) in enumerate(work)}
        ex = Recorder(clock, hint, delays)
        specs = [spec(f"t{i}", prompt) for i, (prompt, _) in enumerate(work)]
        state = State()
        outcomes = await drive(clock, lambda: execute_parallel(ex, specs, state=state))
        assert [o.task_id for o in outcomes] == [s.task_id for s in specs]
        assert [o.success for o in outcomes] == [p == "" for p, _ in work]
        assert ex.peak <= max(hint, 1)
        assert sorted(ex.started) == sorted(s.task_id for s in specs)
        for o in outcomes:
            assert state.get(f"{o.task_id}:status") == ("done" if o.success else "error")

    for backend in ("asyncio", "trio"):
        anyio.run(main, backend=backend)
