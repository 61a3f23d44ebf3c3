"""The Conversation: the call over a Session, and all a voice adapter needs to talk to.

A Session runs resolvers; a Conversation owns the turns, contexts, extractors, the flows that
govern them, tool admission, the inbox, interruptions and voice timing over it. One
conversation per Session; the Session knows nothing of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from builders import conversation_on, session_on
from slateflow import Flow, ManualClock, Resolver, Session, State, Step, VoiceTiming, is_set, once
from slateflow.conversation import Conversation, Extract, integer_near
from slateflow.errors import SessionError

pytestmark = pytest.mark.anyio


def booking() -> Flow:
    return Flow(
        "booking",
        [
            Step(
                "size",
                done=is_set("b:size"),
                posture="Ask how many people.",
                allow=["lookup"],
                timing=VoiceTiming(end_of_speech_ms=800),
            ),
            Step("book", after=["size"], done=is_set("booking:id"), allow=["book_table"]),
        ],
        constraints=[once("book_table")],
    )


async def test_a_session_carries_one_conversation() -> None:
    async with session_on() as session:
        conversation = Conversation(session, tools=["book_table"])
        assert conversation.state is session.state
        assert conversation.session is session
        with pytest.raises(SessionError, match="already has a conversation"):
            Conversation(session)
    async with session_on() as other:
        Conversation(other)  # another session, another call


async def test_the_conversations_options_shape_its_turns() -> None:
    async with conversation_on(tools=["lookup"], redact=None) as conversation:
        assert conversation.tools == ("lookup",)
        assert conversation.redact is None
        ctx = await conversation.user_turn("card 4111 1111 1111 1111")
        assert ctx.turn.text == "card 4111 1111 1111 1111"


async def test_a_conversation_made_before_the_session_opens_works_once_it_does() -> None:
    session = Session(State(), clock=ManualClock())
    conversation = Conversation(session)
    with pytest.raises(SessionError, match="not open"):
        await conversation.user_turn("too early")
    async with session:
        ctx = await conversation.user_turn("hello")
        assert ctx.turn.number == 1
        assert [t.text for t in conversation.transcript] == ["hello"]


async def test_a_voice_adapter_needs_only_the_conversation() -> None:
    state = State()
    spoken: list[str] = []
    async with session_on(state) as session:
        conversation = Conversation(
            session, tools=["book_table", "lookup"], on_delivery=lambda r: spoken.append(r.name)
        )
        conversation.add_extractor(Extract("b").field("size", integer_near(["people"])).build())
        runner = conversation.run_flow(booking())
        ctx = await conversation.user_turn("hi")
        assert ctx.postures == ("Ask how many people.",)
        assert state.get("session:voice_timing") is not None
        assert not conversation.admit("book_table", record=False)
        ctx = await conversation.user_turn("four people please")
        assert state.get("b:size") == 4
        assert runner.active_steps == ["book"]
        async with conversation.claim("book_table") as claim:
            assert claim.allowed
            assert claim.once
            state.set("booking:id", "B-1")
        assert not conversation.admit("book_table")  # once: it ran
        conversation.begin_interruption()
        assert conversation.interrupting
        conversation.end_interruption(turn_follows=False)
        assert not conversation.interrupting
        said = conversation.agent_said("Booked for four.")
        assert said.speaker == "agent"
        assert runner.is_complete


async def test_extractors_read_the_conversations_transcript() -> None:
    seen: list[Any] = []

    class Probe:
        name = "probe"

        async def on_turn(self, conversation: Any, turn: Any) -> None:
            seen.append((conversation, [t.text for t in conversation.transcript]))

        async def on_tool(self, conversation: Any, tool: str) -> None: ...
        async def on_step_change(self, conversation: Any, since: int) -> None: ...

    async with conversation_on() as conversation:
        conversation.add_extractor(Probe())
        await conversation.user_turn("one")
    assert seen == [(conversation, ["one"])]


async def test_background_results_delivered_to_the_conversation_wait_in_its_inbox() -> None:
    async def tables(state: State) -> dict[str, int]:
        return {"free": 2}

    async with session_on() as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("tables", tables), conversation.deliver)
        await session.wait_idle()
        assert [r.name for r in conversation.inbox.peek()] == ["tables"]
        ctx = conversation.context_now()
        assert [d.name for d in ctx.deliveries] == ["tables"]
        assert conversation.take_deliveries() == []


async def test_a_background_result_nobody_delivers_stays_in_the_state_only() -> None:
    async def tables(state: State) -> dict[str, int]:
        return {"free": 2}

    async with session_on() as session:
        conversation = Conversation(session)
        ack = session.background(Resolver.fetch("tables", tables))
        assert ack == {"status": "running", "resolver": "tables"}
        await session.wait_idle()
        assert session.state.get("tables:result") == {"free": 2}
        assert conversation.inbox.peek() == []


async def test_a_conversation_needs_a_session() -> None:
    with pytest.raises(TypeError, match="Session"):
        Conversation(State())  # type: ignore[arg-type]


async def test_only_flows_run_by_the_conversation_govern_its_turns() -> None:
    state = State()
    async with session_on(state) as session:
        conversation = Conversation(session)
        apart = booking().start(session)  # runs in the session, governs no conversation
        ctx = await conversation.user_turn("hi")
        assert ctx.postures == ()
        assert apart.active_steps == ["size"]
        apart.close()
        runner = conversation.run_flow(booking())
        ctx = await conversation.user_turn("hi again")
        assert ctx.postures == ("Ask how many people.",)
        assert runner.active_steps == ["size"]
