"""Turns that survive cancellation and errors: a voice framework cancels the task running a turn
on every barge-in, and an extractor or a flow may raise. The turn is then not taken: its turn
keys never reach the next turn, it leaves the transcript, and the flows do not count it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slateflow import (
    Digression,
    Flow,
    FlowStack,
    ManualClock,
    RepairPolicy,
    Resolver,
    Session,
    State,
    Step,
    captured,
    is_set,
)
from slateflow.conversation import Extract, integer_near, one_of
from slateflow.flow import Admission

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

    async def _on_turn(self, session: Session, turn: Any) -> None:
        if self.armed:
            self.reached.set()
            await self.release.wait()

    async def _on_tool(self, session: Session, tool: str) -> None:
        return None

    async def _on_step_change(self, session: Session, since: int) -> None:
        return None


def topics() -> Any:
    return Extract("topic").field_to("parking", "turn:topic:parking", one_of(["parking"])).build()


async def cancelled_turn(session: Session, stall: Stall, text: str) -> None:
    """Run ``user_turn(text)`` and cancel it once it reaches the stalling extractor."""
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def turn() -> None:
            with scope:
                await session.conversation.user_turn(text)

        tg.start_soon(turn)
        await stall.reached.wait()
        scope.cancel()
    stall.armed = False


async def test_a_cancelled_turn_leaves_no_turn_keys_and_the_next_turn_acts_on_its_own() -> None:
    state = State()
    stall = Stall()
    async with Session(state, clock=ManualClock()) as session:
        session.conversation.add_extractor(topics())  # writes turn:topic:parking
        session.conversation.add_extractor(stall)
        stack = session.run_flow(FlowStack(plan(), [Digression("parking", is_set(
            "turn:topic:parking"), faq())]))  # fmt: skip
        await cancelled_turn(session, stall, "is there parking?")
        assert state.keys("turn:") == []
        assert state.get("session:turn") is None
        assert session.conversation.transcript == []
        assert [t.text for t in session.conversation.cancelled_turns] == ["is there parking?"]
        ctx = await session.conversation.user_turn("a table for four people")
        assert stack.overlay is None  # the cancelled turn's topic does not answer this one
        assert ctx.turn.number == 1
        assert state.get("session:turn") == 1
        assert [t.text for t in session.conversation.transcript] == ["a table for four people"]


async def test_a_cancelled_turn_is_not_counted_by_repair() -> None:
    state = State()
    stall = Stall()
    async with Session(state, clock=ManualClock()) as session:
        runner = session.run_flow(plan())
        await session.conversation.user_turn("hmm")
        session.conversation.add_extractor(stall)
        await cancelled_turn(session, stall, "uh")
        assert not state.get("repair:ask:reprompt", False)
        ctx = await session.conversation.user_turn("what?")
        assert state.get("repair:ask:reprompt") is True  # two turns stuck, not three
        assert ctx.reprompts
        assert runner.turns == 2


async def test_a_cancelled_turn_keeps_what_its_extractors_wrote_and_hands_nothing_over() -> None:
    state = State()
    stall = Stall()
    async with Session(state, clock=ManualClock()) as session:
        session.conversation.add_extractor(
            Extract("b").field("size", integer_near(["people"])).build()
        )
        session.conversation.add_extractor(stall)
        session.background(Resolver.fetch("tables", _answer))
        await session.clock.advance(0)  # type: ignore[attr-defined]
        await cancelled_turn(session, stall, "four people")
        assert state.get("b:size") == 4  # the caller did say it
        assert len(session.conversation.inbox) == 1  # no context was built: the result still waits
        ctx = await session.conversation.user_turn("so?")
        assert [d.name for d in ctx.deliveries] == ["tables"]


async def _answer(state: State) -> dict[str, int]:
    return {"free": 2}


async def test_a_flow_that_raises_ends_the_turn_cleanly_and_the_error_reaches_the_caller() -> None:
    state = State()

    class Broken:
        closed = False
        calls = 0

        def begin_turn(self) -> None: ...
        def abort_turn(self) -> None:
            Broken.aborted = True

        async def on_turn(self) -> None:
            Broken.calls += 1
            if Broken.calls == 1:
                raise RuntimeError("flow bug")

        def on_tool_ok(self, tool: str) -> None: ...
        def postures(self) -> list[str]:
            return []

        grounds = reprompts = unmet_requirements = known_tools = postures

        def admit(self, tool: str, *, record: bool = True) -> Admission:
            return Admission(tool, True)

        def voice_timing(self) -> Any:
            return None

        def told_marker(self) -> Any:
            return None

        def close(self) -> None: ...

        def _run_in(self, session: Session, /, *, enforcement: Any) -> Any:
            return self

    async with Session(state, clock=ManualClock()) as session:
        session.run_flow(Broken())  # type: ignore[arg-type]
        state.set("turn:topic", "x")
        with pytest.raises(RuntimeError, match="flow bug"):
            await session.conversation.user_turn("hello")
        assert Broken.aborted
        assert state.keys("turn:") == []
        assert session.conversation.transcript == []
        ctx = await session.conversation.user_turn("hello again")
        assert ctx.turn.number == 1


@settings(deadline=None, max_examples=25)
@given(st.lists(st.booleans(), min_size=1, max_size=8))
def test_any_mix_of_completed_and_cancelled_turns_leaves_a_clean_call(
    cancels: list[bool],
) -> None:
    async def main() -> None:
        state = State()
        async with Session(state, clock=ManualClock()) as session:
            session.conversation.add_extractor(topics())
            for i, cancel in enumerate(cancels):
                if cancel:
                    stall = Stall()
                    session.conversation.add_extractor(stall)
                    await cancelled_turn(session, stall, f"parking {i}")
                    stall.armed = False  # it stays, passive
                else:
                    await session.conversation.user_turn(f"turn {i}")
                assert state.keys("turn:") == []
            said = [f"turn {i}" for i, c in enumerate(cancels) if not c]
            assert [t.text for t in session.conversation.transcript] == said
            assert [t.number for t in session.conversation.transcript] == list(
                range(1, len(said) + 1)
            )
            assert state.get("session:turn") == (len(said) or None)

    for backend in ("asyncio", "trio"):
        anyio.run(main, backend=backend)
