"""The booking call in LiveKit Agents, with LiveKit's own test kit (``session.run``,
``RunResult.expect``) in text mode: a scripted model, no room, no audio. The turn is fed once
(typed text reaches ``llm_node`` only), an early ``book_table`` is refused with
``ToolError(reason)``, a result landing while the line is quiet is told once the session is
idle, the booking happens once under two calls in one reply, and the session shuts down after
the goodbye."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from livekit.agents import AgentSession, llm
from livekit.agents.voice.events import UserStateChangedEvent

from booking_agent import Booking, BookingAgent
from slateflow import Flow, Step, VoiceTiming, captured
from slateflow.integrations.livekit import LiveKitCall
from slateflow.integrations.livekit.agent import PREVIEW_MARK
from slateflow.integrations.livekit.testing import ScriptedLLM
from slateflow.resolve import LLMResponse

pytestmark = pytest.mark.asyncio

SYSTEM = "You are the booking agent of La Maison."


def booking_call(booking: Booking, **options: Any) -> LiveKitCall:
    return LiveKitCall(
        booking.flow(),
        toolbox=booking.toolbox(),
        extractors=booking.extractors(),
        instructions=SYSTEM,
        idle_grace=0.05,
        **options,
    )


@asynccontextmanager
async def running(call: LiveKitCall, model: Any) -> AsyncIterator[AgentSession]:
    async with AgentSession(llm=ScriptedLLM(model)) as session:
        call.attach(session)
        await session.start(call.agent)
        yield session


class Said:
    """What the agent says, as LiveKit adds it to the conversation."""

    def __init__(self, session: AgentSession) -> None:
        self.lines: list[str] = []
        self._new = asyncio.Event()
        session.on("conversation_item_added", self._added)

    def _added(self, event: Any) -> None:
        if getattr(event.item, "role", None) == "assistant":
            self.lines.append(event.item.text_content)
            self._new.set()

    async def next(self, timeout: float = 10.0) -> str:
        """The next line the agent says (bounded: LiveKit runs on real time)."""
        seen = len(self.lines)
        async with asyncio.timeout(timeout):
            while len(self.lines) == seen:
                self._new.clear()
                await self._new.wait()
        return self.lines[seen]


def assistant_lines(session: AgentSession) -> list[str]:
    return [
        item.text_content
        for item in session.history.items
        if getattr(item, "role", None) == "assistant"
    ]


async def test_the_booking_call_end_to_end() -> None:
    booking = Booking()
    call = booking_call(booking)
    model = BookingAgent(eager_book=True, double_book=True)
    async with running(call, model) as session:
        said = Said(session)
        result = await session.run(user_input="Saturday at seven for four people, please.")
        result.expect.next_event().is_function_call(name="book_table")
        refused = result.expect.next_event().is_function_call_output(is_error=True).event()
        assert refused.item.output.startswith("Refused: 'book_table' is not permitted yet")
        result.expect.next_event().is_message(role="assistant")
        result.expect.no_more_events()
        assert call.state.get("session:turn") == 1  # typed text was fed once

        booking.lookup.complete({"open": True})  # lands while the line is quiet
        told = await said.next()  # told once the session is idle, with no caller turn
        assert told == "Good news, that time is free. To confirm: Saturday at 19:00 for 4. " + (
            "Shall I book it?"
        )

        result = await session.run(user_input="Yes, that's right.")
        result.expect.contains_function_call(name="book_table")
        result.expect.contains_message(role="assistant")
        await call.wait_ended(timeout=10)  # the session shuts down after the goodbye
    assert len(booking.booked) == 1  # two calls in one reply: booked once
    assert assistant_lines(session)[-1] == "You're all booked. Thank you for calling, goodbye!"
    assert call.conversation.is_over


async def test_only_the_admitted_tools_are_offered_with_every_line_each_reply() -> None:
    booking = Booking()
    call = booking_call(booking)
    model = BookingAgent()
    async with running(call, model) as session:
        await session.run(user_input="Saturday at seven for four people, please.")
        await session.run(user_input="Is there parking?")
    first, second = model.requests[0], model.requests[1]
    assert [t.name for t in first.tools] == ["transfer_to_human"]
    # LiveKit keeps no injected context between replies: every line that applies is sent
    # again, not only the new ones.
    assert "Tell the caller you are checking the book." in first.system
    assert "Tell the caller you are checking the book." in second.system


async def test_a_result_landing_while_the_caller_speaks_waits_for_their_turn() -> None:
    booking = Booking()
    call = booking_call(booking)
    async with running(call, BookingAgent()) as session:
        await session.run(user_input="Saturday at seven for four people, please.")
        heard = len(assistant_lines(session))
        speaking = UserStateChangedEvent(old_state="listening", new_state="speaking")
        session.emit("user_state_changed", speaking)
        booking.lookup.complete({"open": True})
        await call.state.wait_for("availability:result", timeout=10)
        assert call.conversation.interrupting
        assert [r.name for r in call.conversation.inbox.peek()] == ["availability"]  # held
        assert len(assistant_lines(session)) == heard  # nothing said over the caller
        done = UserStateChangedEvent(old_state="speaking", new_state="listening")
        session.emit("user_state_changed", done)
        result = await session.run(user_input="Sorry, is there parking?")
        reply = result.expect.next_event().is_message(role="assistant").event().item
        assert "free" in reply.text_content  # told in the answer to the caller's turn
        assert model_told_once(call)


def model_told_once(call: LiveKitCall) -> bool:
    deliveries = call.state.get("session:delivered") or {}
    return all(count == 1 for count in deliveries.values()) if deliveries else True


async def test_a_reply_from_a_step_that_holds_the_floor_cannot_be_interrupted() -> None:
    flow = Flow(
        "readback",
        [Step("read", done=captured("ok"), posture="Read the booking back.",
              timing=VoiceTiming(interruptible=False))],
    )  # fmt: skip
    call = LiveKitCall(flow, instructions=SYSTEM)

    class Handle:
        allow_interruptions = True

    class Model:
        async def generate(self, request: Any) -> LLMResponse:
            return LLMResponse(text="A table for four on Saturday at seven.")

    async with running(call, Model()) as session:
        await session.run(user_input="Hello.")
        handle = Handle()
        call.pace(handle)  # type: ignore[arg-type]
    assert handle.allow_interruptions is False


async def test_an_early_reply_is_kept_when_the_turn_changes_nothing_and_redone_when_it_does() -> (
    None
):
    booking = Booking()
    call = booking_call(booking)
    async with running(call, BookingAgent()) as session:
        await session.run(user_input="Hello.")
        agent = call.agent
        # The turn moves nothing: the preview LiveKit's early reply was steered by stands.
        quiet = llm.ChatMessage(role="user", content=["Hmm."])
        agent._previews[quiet.id] = call.conversation.preview("Hmm.")
        turn_ctx = llm.ChatContext.empty()
        await agent.on_user_turn_completed(turn_ctx, quiet)
        assert turn_ctx.items == []  # unchanged: LiveKit keeps the early reply
        # The turn fills the slot: the plan moved, the early reply must go.
        moving = llm.ChatMessage(role="user", content=["Saturday at seven for four people."])
        agent._previews[moving.id] = call.conversation.preview(moving.text_content)
        turn_ctx = llm.ChatContext.empty()
        await agent.on_user_turn_completed(turn_ctx, moving)
        assert [i.text_content for i in turn_ctx.items] == [PREVIEW_MARK]
        assert call.state.get("booking:party_size") == 4
