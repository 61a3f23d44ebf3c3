"""Turns that survive cancellation and errors: a voice framework cancels the task running a turn
on every barge-in, and an extractor or a flow may raise. The turn is then not taken: its turn
keys never reach the next turn, it leaves the transcript, and the flows do not count it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import conversation_on, session_on
from slateflow import (
    Conversation,
    Digression,
    Flow,
    FlowStack,
    RepairPolicy,
    Resolver,
    Session,
    State,
    Step,
    captured,
    is_set,
    is_true,
)
from slateflow.conversation import Extract, integer_near, one_of

pytestmark = pytest.mark.anyio

ASK = "Ask how many people."


def plan() -> Flow:
    return Flow(
        "booking",
        [
            Step(
                "ask",
                done=captured("b:size"),
                posture=ASK,
                repair=RepairPolicy(reprompt_after=2, escalate_after=10),
            ),
            Step("done", after=["ask"], terminal=True, posture="Thank them."),
        ],
    )


def faq() -> Flow:
    return Flow("faq", [Step("answer", terminal=True, posture="Parking is free.")])


class Stall:
    """An extractor that stalls the turn until released (a slow LLM extractor, say)."""

    name = "stall"

    def __init__(self) -> None:
        self.reached = anyio.Event()
        self.release = anyio.Event()
        self.armed = True

    async def on_turn(self, session: Session, turn: Any) -> None:
        if self.armed:
            self.reached.set()
            await self.release.wait()

    async def on_tool(self, session: Session, tool: str) -> None:
        return None

    async def on_step_change(self, session: Session, since: int) -> None:
        return None


def topics() -> Any:
    return Extract("topic").field_to("parking", "turn:topic:parking", one_of(["parking"])).build()


async def cancelled_turn(conversation: Conversation, stall: Stall, text: str) -> None:
    """Run ``user_turn(text)`` and cancel it once it reaches the stalling extractor."""
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def turn() -> None:
            with scope:
                await conversation.user_turn(text)

        tg.start_soon(turn)
        await stall.reached.wait()
        scope.cancel()
    stall.armed = False


async def test_a_cancelled_turn_leaves_no_turn_keys_and_the_next_turn_acts_on_its_own() -> None:
    state = State()
    stall = Stall()
    async with session_on(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(topics())  # writes turn:topic:parking
        conversation.add_extractor(stall)
        stack = conversation.run_flow(FlowStack(plan(), [Digression("parking", is_set(
            "turn:topic:parking"), faq())]))  # fmt: skip
        await cancelled_turn(conversation, stall, "is there parking?")
        assert state.keys("turn:") == []
        assert state.get("session:turn") is None
        assert conversation.transcript == []
        assert [t.text for t in conversation.cancelled_turns] == ["is there parking?"]
        ctx = await conversation.user_turn("a table for four people")
        assert stack.overlay is None  # the cancelled turn's topic does not answer this one
        assert ctx.turn.number == 1
        assert state.get("session:turn") == 1
        assert [t.text for t in conversation.transcript] == ["a table for four people"]


async def test_a_cancelled_turn_is_not_counted_by_repair() -> None:
    state = State()
    stall = Stall()
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(plan())
        await conversation.user_turn("hmm")
        conversation.add_extractor(stall)
        await cancelled_turn(conversation, stall, "uh")
        assert not state.get("repair:ask:reprompt", False)
        ctx = await conversation.user_turn("what?")
        assert state.get("repair:ask:reprompt") is True  # two turns stuck, not three
        assert ctx.reprompts
        assert runner.turns == 2


async def test_a_cancelled_turn_keeps_what_its_extractors_wrote_and_hands_nothing_over() -> None:
    state = State()
    stall = Stall()
    async with session_on(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(Extract("b").field("size", integer_near(["people"])).build())
        conversation.add_extractor(stall)
        session.background(Resolver.fetch("tables", _answer), conversation.deliver)
        await session.clock.advance(0)  # type: ignore[attr-defined]
        await cancelled_turn(conversation, stall, "four people")
        assert state.get("b:size") == 4  # the caller did say it
        assert len(conversation.inbox) == 1  # no context was built: the result still waits
        ctx = await conversation.user_turn("so?")
        assert [d.name for d in ctx.deliveries] == ["tables"]


async def _answer(state: State) -> dict[str, int]:
    return {"free": 2}


async def test_a_flow_that_raises_ends_the_turn_cleanly_and_the_error_reaches_the_caller() -> None:
    state = State()
    flow = Flow("f", [Step("listen", done=is_true("never"), posture="Listen.")])
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(flow)
        calls: list[str] = []
        counted = runner.on_turn
        aborted = runner.abort_turn

        async def on_turn() -> None:  # the flow's own code fails on the first turn
            calls.append("turn")
            if len(calls) == 1:
                raise RuntimeError("flow bug")
            await counted()

        def abort_turn() -> None:
            calls.append("aborted")
            aborted()

        runner.on_turn = on_turn  # type: ignore[method-assign]
        runner.abort_turn = abort_turn  # type: ignore[method-assign]
        state.set("turn:topic", "x")
        with pytest.raises(RuntimeError, match="flow bug"):
            await conversation.user_turn("hello")
        assert calls == ["turn", "aborted"]
        assert state.keys("turn:") == []
        assert conversation.transcript == []
        ctx = await conversation.user_turn("hello again")
        assert ctx.turn.number == 1
        assert ctx.postures == ("Listen.",)
        assert runner.turns == 1  # the failed turn was never counted


@settings(deadline=None, max_examples=25)
@given(st.lists(st.booleans(), min_size=1, max_size=8))
def test_any_mix_of_completed_and_cancelled_turns_leaves_a_clean_call(
    cancels: list[bool],
) -> None:
    async def main() -> None:
        state = State()
        async with session_on(state) as session:
            conversation = Conversation(session)
            conversation.add_extractor(topics())
            for i, cancel in enumerate(cancels):
                if cancel:
                    stall = Stall()
                    conversation.add_extractor(stall)
                    await cancelled_turn(conversation, stall, f"parking {i}")
                    stall.armed = False  # it stays, passive
                else:
                    await conversation.user_turn(f"turn {i}")
                assert state.keys("turn:") == []
            said = [f"turn {i}" for i, c in enumerate(cancels) if not c]
            assert [t.text for t in conversation.transcript] == said
            assert [t.number for t in conversation.transcript] == list(range(1, len(said) + 1))
            assert state.get("session:turn") == (len(said) or None)

    for backend in ("asyncio", "trio"):
        anyio.run(main, backend=backend)
