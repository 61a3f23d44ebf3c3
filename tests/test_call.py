"""The Call: the conversation over a Session, and all a voice adapter needs to talk to.

A Session runs resolvers; a Call owns the turns, contexts, extractors, tool admission, the inbox,
interruptions and voice timing over it. One Call per Session (``session.conversation`` is the
same object, made with the session's options when nobody made one); the Session's old
conversation methods still work for a release, warning with the new name.
"""

from __future__ import annotations

from typing import Any

import pytest

from slateflow import Flow, ManualClock, Resolver, Session, State, Step, VoiceTiming, is_set, once
from slateflow.conversation import Call, Extract, integer_near
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


async def test_a_call_is_the_sessions_one_conversation() -> None:
    async with Session(State(), clock=ManualClock()) as session:
        call = Call(session, tools=["book_table"])
        assert session.conversation is call
        assert Call.of(session) is call
        assert call.state is session.state
        with pytest.raises(SessionError, match="already has a conversation"):
            Call(session)


async def test_a_session_makes_its_call_from_its_own_options_when_asked() -> None:
    async with Session(State(), clock=ManualClock(), tools=["lookup"], redact=None) as session:
        call = Call.of(session)
        assert call.tools == ("lookup",)
        assert call.redact is None
        ctx = await call.user_turn("card 4111 1111 1111 1111")
        assert ctx.turn.text == "card 4111 1111 1111 1111"


async def test_a_call_made_before_the_session_opens_opens_with_it() -> None:
    session = Session(State(), clock=ManualClock())
    call = Call(session)
    async with session:
        ctx = await call.user_turn("hello")
        assert ctx.turn.number == 1
        assert [t.text for t in call.transcript] == ["hello"]


async def test_a_voice_adapter_needs_only_the_call() -> None:
    state = State()
    spoken: list[str] = []
    async with Session(state, clock=ManualClock()) as session:
        call = Call(session, tools=["book_table"], on_delivery=lambda r: spoken.append(r.name))
        call.add_extractor(Extract("b").field("size", integer_near(["people"])).build())
        runner = call.run_flow(booking())
        ctx = await call.user_turn("hi")
        assert ctx.postures == ("Ask how many people.",)
        assert state.get("session:voice_timing") is not None
        assert not call.admit("book_table", record=False)
        ctx = await call.user_turn("four people please")
        assert state.get("b:size") == 4
        assert runner.active_steps == ["book"]
        async with call.claim("book_table") as claim:
            assert claim.allowed
            assert claim.once
            state.set("booking:id", "B-1")
        assert not call.admit("book_table")  # once: it ran
        call.begin_interruption()
        assert call.interrupting
        call.end_interruption(turn_follows=False)
        assert not call.interrupting
        said = call.agent_said("Booked for four.")
        assert said.speaker == "agent"
        assert runner.is_complete


async def test_extractors_read_the_calls_transcript() -> None:
    seen: list[Any] = []

    class Probe:
        name = "probe"

        async def _on_turn(self, call: Any, turn: Any) -> None:
            seen.append((call, [t.text for t in call.transcript]))

        async def _on_tool(self, call: Any, tool: str) -> None: ...
        async def _on_step_change(self, call: Any, since: int) -> None: ...

    async with Session(State(), clock=ManualClock()) as session:
        call = Call(session)
        call.add_extractor(Probe())
        await call.user_turn("one")
    assert seen == [(call, ["one"])]


async def test_background_results_wait_in_the_calls_inbox() -> None:
    async def tables(state: State) -> dict[str, int]:
        return {"free": 2}

    async with Session(State(), clock=ManualClock()) as session:
        call = Call(session)
        session.background(Resolver.fetch("tables", tables))
        await session.wait_idle()
        assert [r.name for r in call.inbox.peek()] == ["tables"]
        ctx = call.context_now()
        assert [d.name for d in ctx.deliveries] == ["tables"]
        assert call.take_deliveries() == []


async def test_a_call_needs_a_session() -> None:
    with pytest.raises(TypeError, match="Session"):
        Call(State())  # type: ignore[arg-type]


async def test_a_call_made_after_the_flows_started_takes_them_up() -> None:
    state = State()
    async with Session(state, clock=ManualClock()) as session:
        runner = session.run_flow(booking())
        call = Call(session)
        ctx = await call.user_turn("hi")
        assert ctx.postures == ("Ask how many people.",)
        assert runner.active_steps == ["size"]


async def test_a_call_replaces_the_sessions_own_conversation_while_it_is_unused() -> None:
    async with Session(State(), clock=ManualClock()) as session:
        made = session.conversation
        call = Call(session)
        assert session.conversation is call is not made
        await call.user_turn("hello")
        with pytest.raises(SessionError, match="already has a conversation"):
            Call(session)
