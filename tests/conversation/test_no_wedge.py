"""Nothing a flow author writes wedges a call: a flow action may run a tool through the tool
desk (or report one) while the turn that started it is being handled, and a call that would wait
for itself (a once-only tool calling itself, a shared execution sharing its own result, a turn
from inside a turn) is refused with a ``SessionError`` that says why.

Each test runs under ``anyio.fail_after(SAFETY)``: a safety net that turns a regression (a
deadlock) into a failure instead of a hung run; a working call never comes near it.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from slateflow import Conversation, Flow, Resolver, Session, State, Step, called_ok, once, run
from slateflow.errors import SessionError

pytestmark = pytest.mark.anyio

SAFETY = 10.0


def pay_flow(action: Any) -> Flow:
    return Flow(
        "checkout",
        [
            Step("pay", allow=["charge"], on_enter=run(action, "call"), done=called_ok("charge")),
            Step("bye", after=["pay"], terminal=True),
        ],
        constraints=[once("charge")],
    )


async def test_a_call_mode_action_that_books_through_the_tool_desk_lets_the_turn_return() -> None:
    charged: list[int] = []
    async with Session(State()) as session:
        conversation = Conversation(session)

        def charge(amount: int) -> None:
            charged.append(amount)

        async def pay(state: State) -> Any:
            result = await conversation.run_tool("charge", charge, {"amount": 10})
            return result.allowed

        runner = conversation.run_flow(pay_flow(Resolver.fetch("pay", pay)))
        with anyio.fail_after(SAFETY):
            ctx = await conversation.user_turn("pay it please")
        assert charged == [10]
        assert session.state.get("pay:result") is True
        assert "pay" in runner.done_steps
        assert runner.is_complete  # booked from the step: the flow moved on to its end
        assert ctx.turn.number == 1


async def test_a_call_mode_action_that_claims_a_tool_and_reports_it_lets_the_turn_return() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)

        async def pay(state: State) -> str:
            async with conversation.claim("charge") as claim:
                assert claim.allowed
            await conversation.tool_ok("charge")  # reported again by hand: still no wedge
            return "paid"

        runner = conversation.run_flow(pay_flow(Resolver.fetch("pay", pay)))
        with anyio.fail_after(SAFETY):
            await conversation.user_turn("go ahead")
        assert "pay" in runner.done_steps


async def test_tool_hooks_run_for_a_tool_booked_inside_a_turn() -> None:
    seen: list[str] = []

    class Hook:
        name = "audit"

        async def on_turn(self, conversation: Conversation, turn: Any) -> None:
            return None

        async def on_tool(self, conversation: Conversation, tool: str) -> None:
            seen.append(tool)

        async def on_step_change(self, conversation: Conversation, since: int) -> None:
            return None

    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.add_extractor(Hook())

        async def pay(state: State) -> Any:
            return (await conversation.run_tool("charge", lambda: "ok")).value

        conversation.run_flow(pay_flow(Resolver.fetch("pay", pay)))
        with anyio.fail_after(SAFETY):
            await conversation.user_turn("pay")
    assert seen == ["charge"]


async def test_a_once_tool_whose_function_calls_the_same_tool_is_refused_not_wedged() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.run_flow(pay_flow(Resolver.fetch("noop", _noop)))

        async def charge() -> str:
            await conversation.run_tool("charge", lambda: "inner")
            return "outer"

        with anyio.fail_after(SAFETY), pytest.raises(SessionError, match="inside its own call"):
            await conversation.run_tool("charge", charge)
        # The refusal released the hold: the tool can be called again, and runs.
        with anyio.fail_after(SAFETY):
            again = await conversation.run_tool("charge", lambda: "again")
        assert again.value == "again"


async def test_a_claim_inside_a_claim_of_the_same_once_tool_is_refused() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.run_flow(pay_flow(Resolver.fetch("noop", _noop)))
        with anyio.fail_after(SAFETY), pytest.raises(SessionError, match="'charge'"):
            async with conversation.claim("charge"), conversation.claim("charge"):
                pass


async def test_an_identical_call_from_inside_its_own_execution_is_refused() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)

        async def lookup(day: str) -> str:
            await conversation.run_tool("lookup", lookup, {"day": day})
            return "free"

        with anyio.fail_after(SAFETY), pytest.raises(SessionError, match="same arguments"):
            await conversation.run_tool("lookup", lookup, {"day": "monday"})


async def test_a_once_tool_called_from_a_task_its_function_starts_is_refused() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.run_flow(pay_flow(Resolver.fetch("noop", _noop)))

        async def charge() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(conversation.run_tool, "charge", lambda: "inner")

        with anyio.fail_after(SAFETY), pytest.raises(Exception) as raised:  # noqa: PT011
            await conversation.run_tool("charge", charge)
        assert "inside its own call" in repr(raised.value)


async def test_a_user_turn_from_inside_a_turn_is_refused() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)

        async def nested(state: State) -> None:
            await conversation.user_turn("hello again")

        conversation.run_flow(pay_flow(Resolver.fetch("nested", nested)))
        with anyio.fail_after(SAFETY):
            await conversation.user_turn("hello")
        assert "from inside a turn" in session.state.get("nested:error")


async def test_a_turn_waits_for_hooks_run_by_a_tool_reported_from_another_task() -> None:
    # Reports from outside a turn still wait their turn: serialised, not re-entered.
    order: list[str] = []
    release = anyio.Event()

    class Slow:
        name = "slow"

        async def on_turn(self, conversation: Conversation, turn: Any) -> None:
            order.append("turn")

        async def on_tool(self, conversation: Conversation, tool: str) -> None:
            order.append("tool begins")
            await release.wait()
            order.append("tool ends")

        async def on_step_change(self, conversation: Conversation, since: int) -> None:
            return None

    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.add_extractor(Slow())
        with anyio.fail_after(SAFETY):
            async with anyio.create_task_group() as tg:
                tg.start_soon(conversation.tool_ok, "lookup")
                await _until(lambda: order == ["tool begins"])
                tg.start_soon(conversation.user_turn, "hi")
                await anyio.lowlevel.checkpoint()
                assert order == ["tool begins"]  # the turn waits for the hooks
                release.set()
    assert order == ["tool begins", "tool ends", "turn"]


async def _noop(state: State) -> None:
    return None


async def _until(ready: Any) -> None:
    while not ready():
        await anyio.lowlevel.checkpoint()
