"""RayExecutor on a real local Ray: steps on async actors and tasks, JSON only back,
cancellation, dead workers and actors, a worker writing into the call's State by id."""

from __future__ import annotations

import os
import uuid
from typing import Any

import anyio
import pytest
import ray

import ray_agents
from redis_support import wait_for_state
from slateflow import State
from slateflow.errors import OrchestrationError
from slateflow.orchestrate import AgentStepSpec, execute_parallel
from slateflow.orchestrate.ray import CALL_METADATA, RayExecutor, call_state

pytestmark = pytest.mark.anyio

AGENTS = {
    name: getattr(ray_agents, name)
    for name in (
        "meet",
        "meet_sync",
        "double",
        "text",
        "model",
        "not_json",
        "broken",
        "die",
        "die_sync",
        "burn",
        "hang",
        "write",
    )
}


def meeting(size: int) -> tuple[Any, str]:
    name = f"meeting-{uuid.uuid4().hex[:8]}"
    return ray_agents.Meeting.options(name=name).remote(size), name


async def get(ref: Any) -> Any:
    """A Ray value, waited for in a thread (bounded)."""
    return await anyio.to_thread.run_sync(lambda: ray.get(ref, timeout=60))


def spec(task_id: str, agent: str, input: Any = None, **metadata: Any) -> AgentStepSpec:
    return AgentStepSpec(task_id=task_id, agent=agent, input=input, metadata=metadata)


async def test_two_hundred_io_bound_steps_run_at_once_on_the_actor_pool() -> None:
    _, name = meeting(200)  # nobody leaves the meeting before all 200 are in it
    specs = [spec(f"t{i}", "meet", i, meeting=name) for i in range(200)]
    with RayExecutor(AGENTS, actors=2, actor_concurrency=100) as executor:
        outcomes = await execute_parallel(executor, specs)
    assert [o.task_id for o in outcomes] == [s.task_id for s in specs]
    assert all(o.success for o in outcomes), [o.error for o in outcomes if not o.success][:3]
    assert [o.structured["n"] for o in outcomes] == [2 * i for i in range(200)]  # type: ignore[index]
    assert len({o.structured["pid"] for o in outcomes}) == 2  # type: ignore[index]


async def test_a_blocking_agent_runs_in_a_thread_and_does_not_stop_its_actor() -> None:
    _, name = meeting(4)
    specs = [spec(f"s{i}", "meet_sync", i, meeting=name) for i in range(4)]
    with RayExecutor(AGENTS, actors=1, actor_concurrency=8) as executor:
        outcomes = await execute_parallel(executor, specs)
    assert [o.structured for o in outcomes] == [{"n": i} for i in range(4)]


async def test_answers_come_back_as_json_like_the_local_executor() -> None:
    with RayExecutor(AGENTS) as executor:
        said = await executor.execute_step(spec("a", "text", "Ada"))
        booked = await executor.execute_step(spec("b", "model"))
        odd = await executor.execute_step(spec("c", "not_json"))
        failed = await executor.execute_step(spec("d", "broken", "two"))
    assert (said.success, said.output) == (True, "hello Ada")
    assert booked.structured == {"table": 4}
    assert booked.output == '{"table": 4}'
    assert not odd.success
    assert "not JSON" in (odd.error or "")
    assert not failed.success
    assert failed.error == "ValueError: no table for two"


async def test_an_unknown_agent_is_a_failed_outcome_naming_the_known_ones() -> None:
    with RayExecutor({"double": ray_agents.double}) as executor:
        outcome = await executor.execute_step(spec("x", "nobody"))
    assert not outcome.success
    assert "'nobody'" in (outcome.error or "")
    assert "double" in (outcome.error or "")


async def test_an_actor_that_dies_fails_its_step_and_is_replaced_for_later_ones() -> None:
    with RayExecutor(AGENTS, actors=1) as executor:
        dead = await executor.execute_step(spec("d", "die"))
        after = await executor.execute_step(spec("e", "double", 21))
    assert not dead.success
    assert "died" in (dead.error or "")
    assert "'d'" in (dead.error or "")
    assert after.success
    assert after.structured == {"n": 42}


async def test_a_cpu_bound_worker_that_dies_fails_only_its_own_step() -> None:
    _, name = meeting(2)
    with RayExecutor(AGENTS, cpu_bound=["die_sync", "burn"]) as executor:
        outcomes = await execute_parallel(
            executor,
            [
                spec("dies", "die_sync"),
                spec("m1", "meet", 1, meeting=name),
                spec("m2", "meet", 2, meeting=name),
                spec("sum", "burn", 1000),
            ],
        )
    dies, m1, m2, burned = outcomes
    assert not dies.success
    assert "died" in (dies.error or "")
    assert m1.success
    assert m2.success
    assert burned.structured is not None
    assert burned.structured["sum"] == sum(range(1000))
    assert burned.structured["pid"] != os.getpid()  # type: ignore[index]


async def test_cancelling_the_awaiting_task_cancels_the_step_on_its_actor() -> None:
    where, name = meeting(1)
    with RayExecutor(AGENTS) as executor:
        async with anyio.create_task_group() as tg:
            tg.start_soon(executor.execute_step, spec("h", "hang", meeting=name))
            assert await get(where.marked.remote("started"))
            tg.cancel_scope.cancel()
        assert await get(where.marked.remote("cancelled"))
        # the pool still serves steps afterwards
        assert (await executor.execute_step(spec("n", "double", 1))).structured == {"n": 2}


async def test_a_worker_writes_into_the_call_state_it_connects_to_by_id(
    redis_url: str, call_id: str
) -> None:
    with State.connect(redis_url, call_id) as state:
        with RayExecutor(AGENTS, call=state) as executor:
            outcome = await executor.execute_step(spec("lookup", "write", {"party": 4}))
        assert outcome.success, outcome.error
        wait_for_state(state, lambda s: s.get("lookup:seen") is not None, timeout=30)
        seen = state.get("lookup:seen")
    assert seen["input"] == {"party": 4}
    assert seen["by"] != os.getpid()


def test_the_executor_needs_a_shared_state_to_pass_a_call_along() -> None:
    with pytest.raises(OrchestrationError, match="State shared on Redis"):
        RayExecutor(AGENTS, call=State())


def test_a_step_without_a_call_address_says_how_to_give_one() -> None:
    with pytest.raises(OrchestrationError, match="call=state"):
        call_state(spec("s", "write"))
    assert CALL_METADATA == "slateflow.call"


def test_bad_arguments_name_what_to_pass() -> None:
    with pytest.raises(OrchestrationError, match="actors must be"):
        RayExecutor(AGENTS, actors=0)
    with pytest.raises(OrchestrationError, match="'nope'"):
        RayExecutor(AGENTS, cpu_bound=["nope"])
    with pytest.raises(OrchestrationError, match="max_retries"):
        RayExecutor(AGENTS, max_retries=-1)


async def test_a_closed_executor_refuses_new_steps() -> None:
    executor = RayExecutor(AGENTS)
    executor.close()
    with pytest.raises(OrchestrationError, match="closed"):
        await executor.execute_step(spec("a", "double", 1))
