"""The booking call in a real pipecat pipeline (offline: a scripted model, a fake voice, a
caller), in the three timings that are hard for a voice agent: the availability lookup lands
while the caller talks over the bot, while the bot speaks, and while the line is quiet. In each:
the bot never starts speaking while the caller talks, the result reaches the model exactly once,
an early ``book_table`` is refused with the flow's reason, the booking happens exactly once
(also when the model emits it twice in one reply), and the call ends after the goodbye."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext

from booking_agent import Booking, BookingAgent
from slateflow.integrations.pipecat import PipecatCall
from slateflow.integrations.pipecat.testing import (
    Caller,
    FakeVoice,
    ScriptedLLMService,
    pipecat_call,
)

pytestmark = pytest.mark.asyncio

TIMINGS = ["talking over the bot", "while the bot speaks", "while the line is quiet"]


def make_call(booking: Booking, **options: Any) -> PipecatCall:
    return PipecatCall(
        booking.flow(),
        LLMContext(),
        toolbox=booking.toolbox(),
        extractors=booking.extractors(),
        system="You are the booking agent of La Maison.",
        **options,
    )


def told(call: PipecatCall, text: str) -> int:
    """How many messages of the context tell the model ``text``."""
    return sum(text in str(m.get("content")) for m in call.context.get_messages())


def tool_results(call: PipecatCall) -> list[str]:
    """The tool results the model got (pipecat sends each as JSON)."""
    return [
        json.loads(m["content"]) for m in call.context.get_messages() if m.get("role") == "tool"
    ]


async def the_lookup_lands(caller: Caller, booking: Booking, timing: str) -> None:
    """The caller asks for a table; the availability lookup lands in the given timing."""
    voice = caller.voice
    await caller.say("Saturday at seven for four people, please.")
    if timing == "talking over the bot":
        await caller.wait_until(lambda: voice.speaking, what="the bot to speak")
        await caller.begin_speaking()
        booking.lookup.complete({"open": True})
        await caller.finish_speaking("Is there parking, by the way?")
    elif timing == "while the bot speaks":
        await caller.wait_until(lambda: voice.speaking, what="the bot to speak")
        booking.lookup.complete({"open": True})
    else:
        await caller.wait_quiet()
        booking.lookup.complete({"open": True})
    await caller.wait_quiet()


@pytest.mark.parametrize("timing", TIMINGS)
async def test_the_booking_call_in_each_timing(timing: str) -> None:
    booking = Booking()
    call = make_call(booking)
    agent = BookingAgent(eager_book=True, double_book=True)
    voice = FakeVoice(word_seconds=0.01)
    async with pipecat_call(call, ScriptedLLMService(agent), voice=voice) as caller:
        await the_lookup_lands(caller, booking, timing)
        # The model tried to book on the first turn: refused, with the flow's reason.
        assert tool_results(call)[0].startswith("Refused: 'book_table' is not permitted yet")
        assert booking.booked == []
        assert "free" in caller.heard[-1]  # the result was told ...
        assert told(call, "Result of availability") == 1  # ... exactly once
        await caller.say("Yes, that's right.")
        await caller.wait_ended()
    assert len(booking.booked) == 1  # the model emitted the booking twice: it ran once
    results = tool_results(call)
    assert sum(r.startswith("booked") for r in results) == 1
    assert results[-1].startswith("Refused: 'book_table' has already run")  # the second call
    assert caller.heard[-1] == "You're all booked. Thank you for calling, goodbye!"
    assert not voice.speaking
    assert call.conversation.is_over
    assert call.ended
    assert caller.overlaps == []  # the bot never started speaking over the caller


async def test_only_the_admitted_tools_are_advertised_each_turn() -> None:
    booking = Booking()
    call = make_call(booking)
    llm = ScriptedLLMService(BookingAgent())
    async with pipecat_call(call, llm) as caller:
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_quiet()
        booking.lookup.complete({"open": True})
        await caller.wait_quiet()
        await caller.say("Yes, that's right.")
        await caller.wait_ended()
    offered = [sorted(t.name for t in r.tools) for r in llm.requests]
    assert offered[0] == ["transfer_to_human"]  # no booking before the read-back
    assert ["book_table", "transfer_to_human"] in offered
    assert offered[-1] == ["transfer_to_human"]  # after the booking only the ambient tool


async def test_an_idle_result_is_told_when_the_line_is_quiet_without_a_caller_turn() -> None:
    booking = Booking()
    call = make_call(booking, idle_grace=0.05)
    async with pipecat_call(call, ScriptedLLMService(BookingAgent())) as caller:
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_quiet()
        turns = call.state.get("session:turn")
        booking.lookup.complete({"open": False, "alternative": "19:30"})
        await caller.wait_until(lambda: "taken" in " ".join(caller.heard), what="the result")
        assert call.state.get("session:turn") == turns  # no caller turn was needed


async def test_a_delivery_cut_off_before_a_word_is_told_again() -> None:
    booking = Booking()
    call = make_call(booking, idle_grace=0.05)
    voice = FakeVoice(word_seconds=0.05)
    async with pipecat_call(call, ScriptedLLMService(BookingAgent()), voice=voice) as caller:
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_quiet()
        booking.lookup.complete({"open": True})
        await caller.wait_until(lambda: told(call, "Result of availability") == 1)
        await caller.wait_until(lambda: voice.speaking, what="the bot to speak the result")
        cut = len(caller.heard)
        await caller.begin_speaking()  # before its first word
        await caller.finish_speaking("Sorry, go on.")
        await caller.wait_quiet()
        # The cut-off delivery left the context (the model never got it) and was told again.
        assert caller.heard[cut] == ""
        assert told(call, "Result of availability") == 1
        assert "free" in " ".join(caller.heard[cut:])
        assert call.state.get("booking:confirmed") is None


async def test_a_yes_said_over_a_read_back_that_was_never_heard_does_not_count() -> None:
    booking = Booking(answers_when="told")
    call = make_call(booking, idle_grace=0.05)
    voice = FakeVoice(word_seconds=0.05)
    async with pipecat_call(call, ScriptedLLMService(BookingAgent()), voice=voice) as caller:
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_quiet()
        booking.lookup.complete({"open": True})
        await caller.wait_until(lambda: voice.speaking, what="the bot to read back")
        cut = len(caller.heard)
        await caller.begin_speaking()  # cuts the read-back off before its first word
        await caller.finish_speaking("Yes.")
        await caller.wait_quiet()
        assert call.state.get("booking:confirmed") is None  # the read-back was not told
        assert "To confirm" in " ".join(caller.heard[cut:])  # it is read back now ...
        await caller.say("Yes.")
        await caller.wait_ended()  # ... and this yes books
    assert len(booking.booked) == 1


async def test_an_interrupted_turn_leaves_its_facts_and_the_context_in_order() -> None:
    booking = Booking()
    call = make_call(booking)
    voice = FakeVoice(word_seconds=0.02)
    async with pipecat_call(call, ScriptedLLMService(BookingAgent()), voice=voice) as caller:
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_until(lambda: voice.speaking, what="the bot to speak")
        await caller.wait_until(lambda: len(voice._words) >= 2, what="two words")
        await caller.begin_speaking()
        # The caller talks on while pipecat records what the bot said before being cut off.
        await caller.wait_until(
            lambda: any(m["role"] == "assistant" for m in call.context.get_messages()),
            what="the cut-off reply in the context",
        )
        await caller.finish_speaking("Actually, make it 8 pm.")
        await caller.wait_quiet()
    assert (call.state.get("booking:date"), call.state.get("booking:time")) == (
        "Saturday",
        "20:00",
    )
    roles = [(m["role"], str(m.get("content"))[:12]) for m in call.context.get_messages()]
    assert roles[:4] == [
        ("user", "Saturday at "),
        ("developer", "Tell the cal"),
        ("assistant", "Let me"),  # what the caller heard before cutting in
        ("user", "Actually, ma"),
    ]
    agent = [t.text for t in call.conversation.transcript if t.speaker == "agent"]
    assert agent[0] == "Let me"
