"""What grows with a call's length is bounded: the transcript, the extractors' histories and the
background results waiting for the model (a newer result of a resolver replaces its older one)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from builders import conversation_on, session_on
from slateflow import Conversation, ManualClock, Resolver, Scheduling, Session, State
from slateflow.conversation import Extract, Inbox, LLMExtractor, party_size
from slateflow.errors import ExtractDefinitionError
from slateflow.resolve import BackgroundResult
from slateflow.testing import ScriptedLLM

pytestmark = pytest.mark.anyio


async def test_the_transcript_keeps_the_last_turns_and_numbering_goes_on() -> None:
    state = State()
    async with session_on(state) as session:
        conversation = Conversation(session, max_transcript=5)
        for n in range(1, 13):
            await conversation.user_turn(f"turn {n}")
            conversation.agent_said(f"reply {n}")
        assert len(conversation.transcript) == 5
        assert [t.text for t in conversation.transcript][-2:] == ["turn 12", "reply 12"]
        assert state.get("session:turn") == 12
        # Only agent turns left in the window would not lose the count either.
        for _ in range(6):
            conversation.agent_said("hm")
        assert all(t.speaker == "agent" for t in conversation.transcript)
        context = await conversation.user_turn("one more")
        assert context.turn.number == 13


async def test_cancelled_turns_are_bounded_too() -> None:
    state = State()

    class Stall:
        """An extractor that never finishes: the voice framework cancels the turn."""

        name = "stall"
        started = anyio.Event()

        async def on_turn(self, session: Session, turn: Any) -> None:
            Stall.started.set()
            await anyio.sleep_forever()

        async def on_tool(self, session: Session, tool: str) -> None: ...
        async def on_step_change(self, session: Session, since: int) -> None: ...

    async with conversation_on(state, max_transcript=3) as conversation:
        conversation.add_extractor(Stall())
        for n in range(8):
            Stall.started = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(conversation.user_turn, f"lost {n}")
                await Stall.started.wait()
                tg.cancel_scope.cancel()  # the caller barged in
        assert [t.text for t in conversation.cancelled_turns] == [
            "lost 5",
            "lost 6",
            "lost 7",
        ]
        assert conversation.transcript == []


@pytest.mark.parametrize("bad", [0, -1, 2.5, None])
def test_bounds_must_be_positive_ints(bad: Any) -> None:
    session = Session(State())
    with pytest.raises(ValueError, match="max_transcript"):
        Conversation(session, max_transcript=bad)
    with pytest.raises(ValueError, match="max_waiting"):
        Conversation(session, max_waiting=bad)


async def test_an_extractor_keeps_the_last_runs() -> None:
    extractor = Extract("booking").field("size", party_size()).keep_history(3).build()
    state = State()
    for n in range(2, 9):
        extractor.extract(state, f"for {n} people")
    assert len(extractor.history) == 3
    assert [r.decisions[0].value for r in extractor.history] == [6, 7, 8]
    with pytest.raises(ExtractDefinitionError, match="keep_history"):
        Extract("x").keep_history(0)


async def test_an_llm_extractor_keeps_the_last_runs() -> None:
    from pydantic import BaseModel

    class Booking(BaseModel):
        size: int | None = None

    llm = ScriptedLLM([f'{{"size": {n}}}' for n in range(10)])
    extractor = LLMExtractor("booking", llm, Booking, max_history=2)
    state = State()
    for n in range(4):
        await extractor.extract(state, f"for {n}")
    assert len(extractor.history) == 2
    with pytest.raises(ExtractDefinitionError, match="max_history"):
        LLMExtractor("booking", llm, Booking, max_history=0)


# -- background results waiting for the model ------------------------------------------------


def result(name: str, value: Any, seq: int = 0) -> BackgroundResult:
    return BackgroundResult(
        name=name,
        status="completed",
        value=value,
        response={"result": value},
        seq=seq,
        scheduling=Scheduling.WHEN_IDLE,
    )


def test_a_newer_result_of_a_resolver_replaces_the_waiting_one() -> None:
    inbox = Inbox()
    for n in range(20_000):
        inbox.put(result("prices", n, seq=n + 1))
    inbox.put(result("weather", "sun"))
    assert [(r.name, r.value) for r in inbox.peek()] == [("prices", 19_999), ("weather", "sun")]
    assert inbox.coalesced == 19_999


def test_past_the_limit_the_oldest_result_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inbox = Inbox(limit=3)
    with caplog.at_level(logging.WARNING, logger="slateflow.conversation"):
        for name in ("a", "b", "c", "d", "e"):
            inbox.put(result(name, name))
    assert [r.name for r in inbox.peek()] == ["c", "d", "e"]
    assert inbox.dropped == 2
    assert "the oldest, from 'a', is dropped" in caplog.text


def test_a_restored_result_a_newer_one_replaced_stays_out() -> None:
    inbox = Inbox()
    inbox.put(result("prices", "old"))
    taken = inbox.take()
    inbox.put(result("prices", "new"))
    inbox.restore(taken)  # the context carrying "old" was dropped
    assert [r.value for r in inbox.take()] == ["new"]


async def test_a_session_hands_the_model_only_the_newest_result_of_each_resolver() -> None:
    state = State()
    clock = ManualClock()
    quotes = iter(range(100))

    async def quote(state: State) -> int:
        return next(quotes)

    resolver = Resolver.fetch("quote", quote)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        for _ in range(50):
            session.background(resolver, conversation.deliver)
            await session.wait_idle()
        context = await conversation.user_turn("so?")
    lines = [line for line in context.lines if "quote" in line]
    assert len(lines) == 1
    assert lines[0].endswith(": 49.")
