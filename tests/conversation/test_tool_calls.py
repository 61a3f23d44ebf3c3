"""Tool calls claim their admission: a reply's concurrent calls of a ``once`` tool cannot both get
through, identical concurrent calls share one execution, and a failed call leaves the tool free.

Voice frameworks run the tool calls of one model reply concurrently; these tests do the same
with a task group, and hold tools open on events (never sleeps) to make the calls overlap.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slateflow import Conversation, Flow, Session, State, Step, called_ok, commit, is_true, once
from slateflow.conversation import ToolResult
from slateflow.errors import SessionError, ToolCallError

pytestmark = pytest.mark.anyio


def booking(*, enforcement: str = "enforce") -> tuple[State, Conversation, Any]:
    state = State()
    flow = Flow(
        "booking",
        [
            Step("collect", allow=["book_table", "lookup", "pay"], done=called_ok("book_table")),
            Step("bye", terminal=True),
        ],
        constraints=[once("book_table"), commit("pay", until=is_true("confirmed"))],
    )
    conversation = Conversation(Session(state))
    return state, conversation, (flow, enforcement)


class Desk:
    """A tool that counts its executions and can be held open until released."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.inside = 0
        self.peak = 0
        self.gate: anyio.Event | None = None
        self.started = anyio.Event()
        self.fail_first = False

    async def book(self, party: int, time: str = "19:00") -> str:
        key = f"{party}@{time}"
        self.runs[key] += 1
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        self.started.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_first and sum(self.runs.values()) == 1:
                raise RuntimeError("the restaurant's API timed out")
            return f"booked {key}"
        finally:
            self.inside -= 1


async def reply(conversation: Conversation, *calls: tuple[str, Any, dict[str, Any]]) -> list[Any]:
    """Run one model reply's tool calls concurrently, as a voice framework does; each slot holds
    the ToolResult or the exception its call raised."""
    results: list[Any] = [None] * len(calls)

    async def one(i: int, tool: str, fn: Any, args: dict[str, Any]) -> None:
        try:
            results[i] = await conversation.run_tool(tool, fn, args)
        except Exception as exc:
            results[i] = exc

    async with anyio.create_task_group() as tg:
        for i, (tool, fn, args) in enumerate(calls):
            tg.start_soon(one, i, tool, fn, args)
    return results


async def test_two_different_calls_of_a_once_tool_in_one_reply_book_once() -> None:
    _state, conversation, (flow, _) = booking()
    desk = Desk()
    async with conversation.session:
        runner = conversation.run_flow(flow)
        results = await reply(
            conversation,
            ("book_table", desk.book, {"party": 4}),
            ("book_table", desk.book, {"party": 5}),
        )
    admitted = [r for r in results if r.allowed]
    refused = [r for r in results if not r.allowed]
    assert len(admitted) == 1
    assert len(refused) == 1
    assert sum(desk.runs.values()) == 1  # one booking, not two
    assert desk.peak == 1
    assert "may run only once" in refused[0].reason
    assert runner.is_complete


async def test_identical_calls_in_one_reply_share_one_execution() -> None:
    _, conversation, (flow, _) = booking()
    desk = Desk()
    desk.gate = anyio.Event()
    async with conversation.session:
        conversation.run_flow(flow)
        async with anyio.create_task_group() as tg:
            results: list[ToolResult] = []

            async def call(args: dict[str, Any]) -> None:
                results.append(await conversation.run_tool("book_table", desk.book, args))

            tg.start_soon(call, {"party": 4, "time": "20:00"})
            tg.start_soon(call, {"time": "20:00", "party": 4})  # same call, keys reordered
            await desk.started.wait()
            await anyio.lowlevel.checkpoint()
            desk.gate.set()
    assert desk.runs == {"4@20:00": 1}
    assert [r.value for r in results] == ["booked 4@20:00", "booked 4@20:00"]
    assert sorted(r.shared for r in results) == [False, True]
    assert all(r.allowed for r in results)


async def test_a_failed_call_leaves_a_once_tool_free_for_the_waiting_one() -> None:
    _, conversation, (flow, _) = booking()
    desk = Desk()
    desk.fail_first = True
    async with conversation.session:
        conversation.run_flow(flow)
        results = await reply(
            conversation,
            ("book_table", desk.book, {"party": 4}),
            ("book_table", desk.book, {"party": 5}),
        )
    errors = [r for r in results if isinstance(r, Exception)]
    booked = [r for r in results if isinstance(r, ToolResult)]
    assert [str(e) for e in errors] == ["the restaurant's API timed out"]
    assert len(booked) == 1
    assert booked[0].allowed
    assert sum(desk.runs.values()) == 2


async def test_callers_sharing_a_failed_call_get_a_tool_call_error() -> None:
    _, conversation, (flow, _) = booking()
    desk = Desk()
    desk.fail_first = True
    desk.gate = anyio.Event()
    async with conversation.session:
        conversation.run_flow(flow)
        results: list[Any] = []

        async def call() -> None:
            try:
                results.append(await conversation.run_tool("book_table", desk.book, {"party": 2}))
            except Exception as exc:
                results.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            tg.start_soon(call)
            await desk.started.wait()
            await anyio.lowlevel.checkpoint()
            desk.gate.set()
    assert desk.runs == {"2@19:00": 1}
    first, second = results
    assert isinstance(first, RuntimeError)
    assert isinstance(second, ToolCallError)
    assert "'book_table' failed in the identical call" in str(second)
    assert second.__cause__ is first


async def test_a_claim_holds_a_once_tool_until_its_block_ends() -> None:
    _, conversation, (flow, _) = booking()
    order: list[str] = []
    async with conversation.session:
        conversation.run_flow(flow)
        inside = anyio.Event()
        release = anyio.Event()

        async def first() -> None:
            async with conversation.claim("book_table") as call:
                assert call
                order.append("first in")
                inside.set()
                await release.wait()
                order.append("first out")

        async def second() -> None:
            await inside.wait()
            async with conversation.claim("book_table") as call:
                order.append(f"second {'admitted' if call else 'refused'}")
                assert "only once" in call.reason

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            tg.start_soon(second)
            await inside.wait()
            for _ in range(5):
                await anyio.lowlevel.checkpoint()
            order.append("released")
            release.set()
    assert order == ["first in", "released", "first out", "second refused"]


async def test_a_claim_marked_failed_is_not_counted() -> None:
    _, conversation, (flow, _) = booking()
    async with conversation.session:
        runner = conversation.run_flow(flow)
        async with conversation.claim("book_table") as call:
            call.fail()  # no table free: ran, but did not succeed
        assert runner.active_steps == ["collect"]
        async with conversation.claim("book_table") as again:
            assert again
        assert runner.is_complete  # counted: collect done, the terminal step reached
        async with conversation.claim("book_table") as third:
            assert not third


async def test_an_exception_in_a_claim_reports_nothing() -> None:
    _, conversation, (flow, _) = booking()
    async with conversation.session:
        runner = conversation.run_flow(flow)
        with pytest.raises(ValueError, match="card declined"):
            async with conversation.claim("book_table"):
                raise ValueError("card declined")
        assert runner.active_steps == ["collect"]
        assert await conversation.run_tool("book_table", lambda: "booked") == ToolResult(
            "book_table", True, "booked"
        )


async def test_calls_of_an_unlimited_tool_run_concurrently() -> None:
    _, conversation, (flow, _) = booking()
    desk = Desk()
    desk.gate = anyio.Event()
    async with conversation.session:
        conversation.run_flow(flow)
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.run_tool, "lookup", desk.book, {"party": 1})
            tg.start_soon(conversation.run_tool, "lookup", desk.book, {"party": 2})
            while desk.inside < 2:
                await anyio.lowlevel.checkpoint()
            desk.gate.set()
    assert desk.peak == 2


async def test_a_refused_call_runs_nothing_and_says_why() -> None:
    _, conversation, (flow, _) = booking()
    ran: list[str] = []
    async with conversation.session:
        conversation.run_flow(flow)
        result = await conversation.run_tool("pay", lambda: ran.append("pay"))
        other = await conversation.run_tool("transfer", lambda: ran.append("transfer"))
    assert ran == []
    assert not result.allowed
    assert "first, 'confirmed' must be true" in result.reason
    assert not other.allowed
    assert "not part of the current step" in other.reason


async def test_in_observe_mode_a_breach_runs_flagged_and_audited() -> None:
    _, conversation, (flow, _) = booking()
    async with conversation.session:
        runner = conversation.run_flow(flow, enforcement="observe")
        result = await conversation.run_tool("pay", lambda amount: f"paid {amount}", {"amount": 5})
    assert result.allowed
    assert result.violation
    assert result.value == "paid 5"
    assert [v.tool for v in runner.violations] == ["pay"]


async def test_a_tool_call_with_no_flow_is_admitted() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)
        result = await conversation.run_tool("anything", lambda: 42)
    assert result == ToolResult("anything", True, 42)


@pytest.mark.parametrize(
    ("tool", "fn", "args", "error"),
    [
        ("", lambda: 1, None, SessionError),
        (3, lambda: 1, None, SessionError),
        ("t", "not callable", None, TypeError),
        ("t", lambda: 1, [("a", 1)], TypeError),
    ],
)
async def test_bad_tool_calls_are_refused_with_a_clear_error(
    tool: Any, fn: Any, args: Any, error: type[Exception]
) -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)
        with pytest.raises(error, match=r"run_tool"):
            await conversation.run_tool(tool, fn, args)


# -- what makes two calls one, and a call that ran but failed ---------------------------------


class Party:
    """An argument object whose repr hides its contents (as many do)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __repr__(self) -> str:
        return "<Party>"


async def test_calls_whose_arguments_only_print_the_same_are_not_shared() -> None:
    _, conversation, _ = booking()
    gate = anyio.Event()
    sizes: list[int] = []

    async def lookup(party: Party) -> int:
        sizes.append(party.size)
        await gate.wait()
        return party.size

    async with conversation.session, anyio.create_task_group() as tg:
        results: list[ToolResult] = []

        async def call(party: Party) -> None:
            results.append(await conversation.run_tool("lookup", lookup, {"party": party}))

        tg.start_soon(call, Party(2))
        tg.start_soon(call, Party(6))
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        gate.set()
    assert sorted(sizes) == [2, 6]  # each ran: neither got the other's result
    assert sorted(r.value for r in results) == [2, 6]
    assert not any(r.shared for r in results)


async def test_a_tool_that_returns_its_failure_leaves_a_once_tool_free() -> None:
    from slateflow.conversation import ToolFailed

    _, conversation, (flow, _) = booking()
    tries: list[int] = []

    def book_table(party: int) -> Any:
        tries.append(party)
        if len(tries) == 1:
            return ToolFailed("no table is free at 7")
        return "table 12"

    async with conversation.session:
        runner = conversation.run_flow(flow)
        first = await conversation.run_tool("book_table", book_table, {"party": 4})
        assert first.allowed
        assert first.failed
        assert first.value == "no table is free at 7"
        assert "collect" in runner.active_steps  # not counted as booked
        second = await conversation.run_tool("book_table", book_table, {"party": 4})
        assert second.allowed  # the retry is admitted: the once tool never succeeded
        assert not second.failed
        assert second.value == "table 12"
        third = await conversation.run_tool("book_table", book_table, {"party": 4})
        assert not third.allowed  # now it succeeded once


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ("circular", "Circular reference"),
        ("huge", "4300"),
        ("tuple_key", "keys must be"),
    ],
)
async def test_arguments_no_data_can_hold_are_refused_naming_the_tool(
    arguments: str, why: str
) -> None:
    circular: list[Any] = []
    circular.append(circular)
    value = {
        "circular": circular,
        "huge": 10**5000,
        "tuple_key": {(1, 2): "x"},
    }[arguments]
    _, conversation, _ = booking()
    ran: list[Any] = []
    async with conversation.session:
        with pytest.raises(ToolCallError, match=rf"tool 'lookup'.*{why}") as raised:
            await conversation.run_tool("lookup", ran.append, {"value": value})
    assert "4,300 digits" in str(raised.value)
    assert ran == []


json_leaves = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["a", "b", "1"])
json_args = st.dictionaries(
    st.sampled_from(["x", "y"]),
    st.recursive(json_leaves, lambda kids: st.lists(kids, max_size=2), max_leaves=4),
    max_size=2,
)


@settings(max_examples=60, deadline=None)
@given(first=json_args, second=json_args)
def test_concurrent_calls_share_exactly_when_their_arguments_are_equal_as_data(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    import json

    runs: list[dict[str, Any]] = []

    async def main() -> list[ToolResult]:
        _, conversation, _ = booking()
        gate = anyio.Event()

        async def lookup(**args: Any) -> int:
            runs.append(args)
            await gate.wait()
            return len(runs)

        results: list[ToolResult] = []
        async with conversation.session, anyio.create_task_group() as tg:

            async def call(args: dict[str, Any]) -> None:
                results.append(await conversation.run_tool("lookup", lookup, args))

            tg.start_soon(call, first)
            tg.start_soon(call, second)
            while not runs:
                await anyio.lowlevel.checkpoint()
            for _ in range(5):
                await anyio.lowlevel.checkpoint()
            gate.set()
        return results

    results = anyio.run(main)
    same = json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert len(runs) == (1 if same else 2)
    assert sum(r.shared for r in results) == (1 if same else 0)
