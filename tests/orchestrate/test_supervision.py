"""Supervised agents: the hierarchy (typed errors, unchanged on error), handles (messages,
results, status), restart counting that resets on success, stop and escalate, and cancelling
a parent cancels its children."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from slateflow.errors import OrchestrationError, SupervisionError
from slateflow.orchestrate import (
    AgentOrchestrator,
    AgentStatus,
    DefaultSupervisor,
    SupervisorAction,
    is_retryable,
)

pytestmark = pytest.mark.anyio


class Flaky(Exception):
    retryable = True


class Fatal(Exception):
    retryable = False


class Scripted:
    """An agent answering from a shared script: a value, or an exception to raise."""

    built = 0

    def __init__(self, script: list[Any]) -> None:
        Scripted.built += 1
        self.script = script

    async def prompt(self, messages: Sequence[str]) -> Any:
        await anyio.lowlevel.checkpoint()
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return f"{step}: {' '.join(messages)}"


class Blocking:
    """An agent that waits until cancelled."""

    def __init__(self, started: anyio.Event) -> None:
        self.started = started

    async def prompt(self, messages: Sequence[str]) -> Any:
        self.started.set()
        await anyio.sleep_forever()


def test_the_hierarchy_and_its_typed_errors() -> None:
    orch = AgentOrchestrator()
    orch.add_agent("parent", lambda: Scripted([]))
    orch.add_child("child1", "parent", lambda: Scripted([]))
    orch.add_child("child2", "parent", lambda: Scripted([]))
    assert orch.parent_of("child1") == "parent"
    assert orch.parent_of("parent") is None
    assert orch.children_of("parent") == ["child1", "child2"]
    assert orch.children_of("child1") == []
    assert orch.children_of("ghost") is None
    assert orch.names() == ["parent", "child1", "child2"]
    assert "child2" in orch
    with pytest.raises(OrchestrationError, match="parent agent 'missing' of 'c' is not registered"):
        orch.add_child("c", "missing", lambda: Scripted([]))
    with pytest.raises(OrchestrationError, match="agent 'parent' is already registered"):
        orch.add_agent("parent", lambda: Scripted([]))
    with pytest.raises(OrchestrationError, match="already registered"):
        orch.add_child("child1", "parent", lambda: Scripted([]))
    # Nothing changed.
    assert orch.names() == ["parent", "child1", "child2"]
    assert orch.children_of("parent") == ["child1", "child2"]
    with pytest.raises(OrchestrationError, match="running orchestrator"):
        orch.spawn("parent")


async def test_messages_results_and_status() -> None:
    async with AgentOrchestrator() as orch:
        orch.add_agent("echo", lambda: Scripted(["one", "two"]))
        handle = orch.spawn("echo")
        assert handle.status is AgentStatus.RUNNING
        assert await handle.send_message("hello") == "one: hello"
        assert await handle.send_messages(["a", "b"]) == "two: a b"
        assert await handle.await_result() is AgentStatus.COMPLETED
        assert handle.is_done
        with pytest.raises(SupervisionError, match="'echo' has ended"):
            await handle.send_message("late")
        with pytest.raises(OrchestrationError, match="'ghost' is not registered"):
            orch.spawn("ghost")


async def test_restarts_count_consecutive_failures_and_reset_on_success() -> None:
    Scripted.built = 0
    script: list[Any] = [Flaky("1"), Flaky("2"), "ok", Flaky("3"), Flaky("4"), Flaky("5")]
    async with AgentOrchestrator(supervisor=DefaultSupervisor(max_restarts=2)) as orch:
        orch.add_agent("flaky", lambda: Scripted(script))
        handle = orch.spawn("flaky")
        for expected in ("1", "2"):
            with pytest.raises(Flaky, match=expected):
                await handle.send_message("x")
        assert handle.restarts == 2
        assert await handle.send_message("x") == "ok: x"
        assert handle.restarts == 0  # a success resets the count
        for expected in ("3", "4"):
            with pytest.raises(Flaky, match=expected):
                await handle.send_message("x")
        assert handle.status is AgentStatus.RUNNING
        with pytest.raises(Flaky, match="5"):  # a third failure in a row: stopped
            await handle.send_message("x")
        with pytest.raises(SupervisionError, match="failed"):
            await handle.await_result()
        assert handle.status is AgentStatus.FAILED
        assert isinstance(handle.error, Flaky)
    assert Scripted.built == 5  # the first agent and four restarts


async def test_a_fatal_error_stops_and_without_a_policy_errors_escalate() -> None:
    async with AgentOrchestrator(supervisor=DefaultSupervisor()) as orch:
        orch.add_agent("fatal", lambda: Scripted([Fatal("no")]))
        handle = orch.spawn("fatal")
        with pytest.raises(Fatal):
            await handle.send_message("x")
        with pytest.raises(SupervisionError):
            await handle.await_result()
        assert handle.status is AgentStatus.FAILED
    async with AgentOrchestrator() as orch:
        orch.add_agent("stubborn", lambda: Scripted([Fatal("a"), "fine"]))
        handle = orch.spawn("stubborn")
        with pytest.raises(Fatal):
            await handle.send_message("x")
        assert await handle.send_message("y") == "fine: y"  # escalated: it goes on
        assert await handle.await_result() is AgentStatus.COMPLETED


async def test_cancelling_a_parent_cancels_its_children() -> None:
    started = [anyio.Event() for _ in range(3)]
    async with AgentOrchestrator() as orch:
        orch.add_agent("lead", lambda: Blocking(started[0]))
        orch.add_child("helper", "lead", lambda: Blocking(started[1]))
        orch.add_child("sub", "helper", lambda: Blocking(started[2]))
        orch.add_agent("other", lambda: Scripted(["still here"]))
        handles = [orch.spawn(n) for n in ("lead", "helper", "sub")]
        other = orch.spawn("other")
        results: list[Any] = []

        async def ask(i: int) -> None:
            try:
                await handles[i].send_message("work")
            except SupervisionError as exc:
                results.append(str(exc))

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(ask, i)
            with anyio.fail_after(5):
                for event in started:
                    await event.wait()
            handles[0].cancel()
        assert sorted(results) == [f"agent '{n}' was cancelled" for n in ("helper", "lead", "sub")]
        assert [h.status for h in handles] == [AgentStatus.CANCELLED] * 3
        assert other.status is AgentStatus.RUNNING  # not below the lead
        assert await other.send_message("?") == "still here: ?"
        assert await handles[0].await_result() is AgentStatus.CANCELLED


async def test_queued_messages_are_answered_when_the_agent_ends() -> None:
    async with AgentOrchestrator(supervisor=DefaultSupervisor()) as orch:
        orch.add_agent("once", lambda: Scripted([Fatal("stop")]))
        handle = orch.spawn("once")
        outcomes: list[str] = []

        async def ask(text: str) -> None:
            try:
                await handle.send_message(text)
            except (Fatal, SupervisionError) as exc:
                outcomes.append(type(exc).__name__)

        async with anyio.create_task_group() as tg:
            for text in ("a", "b", "c"):
                tg.start_soon(ask, text)
        assert sorted(outcomes) == ["Fatal", "SupervisionError", "SupervisionError"]


def test_retryable_errors_and_the_default_policy() -> None:
    assert is_retryable(Flaky())
    assert not is_retryable(Fatal())
    assert is_retryable(TimeoutError())
    assert is_retryable(ConnectionResetError())
    assert not is_retryable(ValueError())
    policy = DefaultSupervisor()
    assert policy.on_agent_error("a", TimeoutError()) is SupervisorAction.RESTART
    assert policy.on_agent_error("a", KeyError()) is SupervisorAction.STOP
    with pytest.raises(OrchestrationError):
        DefaultSupervisor(max_restarts=-1)
