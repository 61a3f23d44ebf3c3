"""RayExecutor without Ray installed, and a State refusing to be shipped to another process
(the Ray tests themselves run in a CI step of their own: tests/frameworks/test_ray)."""

from __future__ import annotations

import pickle
import sys

import pytest

from slateflow import State
from slateflow.errors import MissingExtraError, UsageError
from slateflow.orchestrate import AgentStepSpec
from slateflow.orchestrate.ray import RayExecutor


async def double(spec: AgentStepSpec) -> int:
    return 2


@pytest.mark.anyio
async def test_without_ray_the_first_step_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    executor = RayExecutor({"double": double})
    with pytest.raises(MissingExtraError, match=r"slateflow\[ray\]"):
        await executor.execute_step(AgentStepSpec(task_id="t", agent="double"))


def test_a_state_refuses_to_be_pickled_and_says_to_send_its_call_id() -> None:
    state = State()
    state.set("k", 1)
    with pytest.raises(UsageError, match="call id"):
        pickle.dumps(state)
    assert state.get("k") == 1
