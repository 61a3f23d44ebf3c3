"""How a PipecatCall steers a real pipeline: the two context strategies, tool results kept
through rewrites, a turn cut off in a slow extractor, a speculative reply, voice timing (the
floor held, the pause that ends a turn, a reprompt after silence, a filler while a tool runs),
async tools, slateflow keys in pipecat Flows templates, and two contexts sent to the model
before it answers either."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pipecat.frames.frames import LLMContextFrame
from pipecat.processors.aggregators.llm_context import LLMContext

from booking_agent import Booking, BookingAgent
from slateflow import Flow, Step, VoiceTiming, captured
from slateflow.integrations.pipecat import PacedSpeechTimeout, PipecatCall
from slateflow.integrations.pipecat.testing import FakeVoice, ScriptedLLMService, pipecat_call
from slateflow.integrations.tools import Toolbox, tool
from slateflow.resolve import LLMRequest, LLMResponse, ToolCall
from slateflow.state import StateMapping

pytestmark = pytest.mark.asyncio


def booking_call(booking: Booking, **options: Any) -> PipecatCall:
    return PipecatCall(
        booking.flow(),
        LLMContext(),
        toolbox=booking.toolbox(),
        extractors=booking.extractors(),
        system="You are the booking agent of La Maison.",
        **options,
    )


def unanswered_tool_calls(context: LLMContext) -> list[str]:
    """Tool calls with no tool result after them (a provider refuses such a request)."""
    answered = {m.get("tool_call_id") for m in context.get_messages() if m.get("role") == "tool"}
    return [
        c["id"]
        for m in context.get_messages()
        for c in m.get("tool_calls") or ()
        if c["id"] not in answered
    ]


async def test_the_system_strategy_replaces_the_instruction_and_adds_no_message() -> None:
    booking = Booking()
    call = booking_call(booking, strategy="system")
    llm = ScriptedLLMService(BookingAgent(double_book=True))
    async with pipecat_call(call, llm) as caller:
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_quiet()
        booking.lookup.complete({"open": True})
        await caller.wait_quiet()
        await caller.say("Yes, that's right.")
        await caller.wait_ended()
    roles = {m["role"] for m in call.context.get_messages()}
    assert "developer" not in roles
    first, last = llm.requests[0], llm.requests[-1]
    assert first.system.startswith("You are the booking agent of La Maison.\n\n")
    assert "Tell the caller you are checking the book." in first.system
    assert "Thank the caller." in last.system
    assert "Read the booking back" not in last.system  # every line that applies now, only
    assert len(booking.booked) == 1
    assert unanswered_tool_calls(call.context) == []  # each call kept its result


async def test_a_turn_cut_off_in_a_slow_extractor_leaves_nothing_and_is_fed_again() -> None:
    booking = Booking()
    call = booking_call(booking)
    release = asyncio.Event()
    seen: list[str] = []

    class Slow:
        name = "slow"

        async def on_turn(self, conversation: Any, turn: Any) -> None:
            seen.append(turn.text)
            if len(seen) == 1:
                await release.wait()  # the first turn hangs here until the caller cuts in

        async def on_tool(self, conversation: Any, tool: str) -> None:
            return None

        async def on_step_change(self, conversation: Any, since: int) -> None:
            return None

    call.conversation.add_extractor(Slow())
    async with pipecat_call(call, ScriptedLLMService(BookingAgent())) as caller:
        await caller.say("Saturday at seven,")
        await caller.wait_until(lambda: seen, what="the slow extractor")
        await caller.say("for four people.")  # cuts the first turn off mid-extractor
        await caller.wait_quiet()
    conversation = call.conversation
    assert [t.text for t in conversation.cancelled_turns] == ["Saturday at seven,"]
    user = [t.text for t in conversation.transcript if t.speaker == "user"]
    assert user == ["Saturday at seven, for four people."]  # fed again, as one turn
    assert call.state.get("session:turn") == 1
    assert call.state.keys("turn:") == []
    assert call.state.get("booking:party_size") == 4


async def test_a_speculative_reply_is_steered_from_a_preview_that_writes_nothing() -> None:
    booking = Booking()
    call = booking_call(booking)
    llm = ScriptedLLMService(BookingAgent())
    async with pipecat_call(call, llm) as caller:
        await caller.say("Hello.")
        await caller.wait_quiet()
        cursor = call.state.journal.cursor
        turns = call.state.get("session:turn")
        provisional = LLMContext(messages=[*call.context.get_messages()])
        provisional.add_message({"role": "user", "content": "Saturday at seven"})
        await caller.worker.queue_frame(LLMContextFrame(context=provisional, speculation=True))
        await caller.wait_until(lambda: len(llm.requests) == 2, what="the speculative reply")
        await caller.wait_quiet()
        assert call.state.journal.cursor == cursor  # nothing written ...
        assert call.state.get("session:turn") == turns  # ... no turn taken
        assert not call.replies.waiting  # and nothing waits for a hand-over
        tools = sorted(t.name for t in llm.requests[-1].tools)
        assert tools == ["transfer_to_human"]  # but it was steered


def timed_flow(timing: VoiceTiming, *, tool: str | None = None) -> Flow:
    return Flow(
        "timed",
        [
            Step("ask", done=captured("party:size"), posture="Ask how many people.",
                 timing=timing, allow=[tool] if tool else []),
            Step("done", after=["ask"], done=captured("party:confirmed")),
        ],
    )  # fmt: skip


class TalkativeAgent:
    """Speaks a long line for any request (something to barge in on)."""

    async def generate(self, request: LLMRequest) -> LLMResponse:
        developer = [m.content for m in request.messages if m.role == "developer"]
        if developer and "has not answered" in developer[-1]:
            return LLMResponse(text="Are you still there?")
        return LLMResponse(text="How many people will be joining you for dinner tonight?")


async def test_a_step_that_holds_the_floor_is_not_cut_off() -> None:
    call = PipecatCall(timed_flow(VoiceTiming(interruptible=False)), LLMContext())
    voice = FakeVoice(word_seconds=0.02)
    async with pipecat_call(call, ScriptedLLMService(TalkativeAgent()), voice=voice) as caller:
        await caller.say("Hi.")
        await caller.wait_until(lambda: call.activity.bot_speaking, what="the bot to speak")
        await caller.say("Wait,")  # muted: a read-back or a disclosure is said whole
        await caller.wait_quiet()
    assert caller.heard[0] == "How many people will be joining you for dinner tonight?"


async def test_the_pause_that_ends_a_turn_follows_the_active_step() -> None:
    call = PipecatCall(timed_flow(VoiceTiming(end_of_speech_ms=900)), LLMContext())
    paced = PacedSpeechTimeout(call, user_speech_timeout=0.4)
    assert paced.pause == 0.4  # before the call starts: the base pause
    async with pipecat_call(call, ScriptedLLMService(TalkativeAgent())) as caller:
        await caller.say("Hi.")
        await caller.wait_quiet()
        assert paced.pause == 0.9
        await paced.handle_user_turn_started()
        assert paced._user_speech_timeout == 0.9


async def test_silence_after_the_bot_spoke_brings_one_reprompt() -> None:
    timing = VoiceTiming(reprompt_after_ms=50, reprompt="The user has not answered; ask again.")
    call = PipecatCall(timed_flow(timing), LLMContext())
    async with pipecat_call(call, ScriptedLLMService(TalkativeAgent())) as caller:
        await caller.say("Hi.")
        await caller.wait_until(lambda: len(caller.heard) >= 2, what="the reprompt")
        await caller.wait_quiet()
    assert caller.heard == [
        "How many people will be joining you for dinner tonight?",
        "Are you still there?",  # once: the silence that follows brings no second one
    ]


async def test_a_filler_is_said_while_a_tool_runs_past_filler_after_ms() -> None:
    release = asyncio.Event()

    @tool
    async def look_up() -> str:
        """Look the tables up."""
        await release.wait()
        return "two tables free"

    class Caller:
        async def generate(self, request: LLMRequest) -> LLMResponse:
            if request.messages and request.messages[-1].role == "tool":
                return LLMResponse(text="There are two tables free.")
            if any(t.name == "look_up" for t in request.tools):
                return LLMResponse(tool_calls=(ToolCall(id="c1", name="look_up"),))
            return LLMResponse(text="Hm.")

    flow = timed_flow(VoiceTiming(filler_after_ms=30), tool="look_up")
    call = PipecatCall(flow, LLMContext(), toolbox=Toolbox(look_up), filler="One moment.")
    async with pipecat_call(call, ScriptedLLMService(Caller())) as caller:
        await caller.say("Any tables?")
        await caller.wait_until(lambda: "One moment." in caller.heard, what="the filler")
        release.set()
        await caller.wait_until(lambda: "two tables" in caller.heard[-1], what="the answer")
    assert caller.heard.count("One moment.") == 1


async def test_an_async_tool_delivers_its_result_through_pipecats_async_tool_protocol() -> None:
    release = asyncio.Event()

    @tool
    async def look_up() -> str:
        """Look the tables up."""
        await release.wait()
        return "two tables free"

    class Agent:
        async def generate(self, request: LLMRequest) -> LLMResponse:
            if any("two tables free" in m.content for m in request.messages):
                return LLMResponse(text="The lookup is back: two tables free.")
            if any(t.name == "look_up" for t in request.tools) and not any(
                m.tool_calls for m in request.messages
            ):
                return LLMResponse(
                    text="I'm looking that up.",
                    tool_calls=(ToolCall(id="c1", name="look_up"),),
                )
            return LLMResponse(text="Still looking.")

    flow = timed_flow(VoiceTiming(), tool="look_up")
    call = PipecatCall(flow, LLMContext(), toolbox=Toolbox(look_up), async_tools=["look_up"])
    async with pipecat_call(call, ScriptedLLMService(Agent())) as caller:
        await caller.say("Any tables?")
        await caller.wait_until(lambda: caller.heard, what="the first reply")
        release.set()
        await caller.wait_until(lambda: "lookup is back" in caller.heard[-1], what="the result")
    # pipecat's protocol: the tool's own message carries the result (its "started" notice
    # overwritten when nothing came between) or a final developer message does.
    carried = [
        m["role"]
        for m in call.context.get_messages()
        if "two tables free" in str(m.get("content")) and m["role"] != "assistant"
    ]
    assert carried in (["tool"], ["developer"])
    assert unanswered_tool_calls(call.context) == []
    assert caller.heard[0] == "I'm looking that up."  # the model went on meanwhile


async def test_pipecat_flows_templates_read_slateflow_keys_through_a_state_mapping() -> None:
    from pipecat.flows.manager import _PLACEHOLDER

    booking = Booking()
    call = booking_call(booking)
    call.state.update({"booking:date": "Saturday", "booking:party_size": 4})
    state = {"slate": StateMapping(call.state)}

    def render(text: str) -> str:  # what FlowManager does with its state, key by key
        def value(path: str) -> str:
            current: Any = state
            for part in path.split("."):
                current = current[part]
            return str(current)

        return _PLACEHOLDER.sub(lambda m: value(m.group(2)), text)

    assert render("A table for {{ slate.booking.party_size }} on {{ slate.booking.date }}.") == (
        "A table for 4 on Saturday."
    )





async def test_two_contexts_sent_before_the_model_answers_write_a_line_once_both_count() -> None:
    # The caller's words and a tool's result can reach the model together: pipecat runs it
    # once per context frame, and the two replies may be spoken with no pause between them.
    booking = Booking()
    call = booking_call(booking)
    llm = ScriptedLLMService(BookingAgent())
    async with pipecat_call(call, llm) as caller:
        await caller.say("Hello.")
        await caller.wait_quiet()
        before = len(call.context.get_messages())
        words = "Saturday at seven for four, please."
        call.context.add_message({"role": "user", "content": words})
        for _ in range(2):
            await caller.worker.queue_frame(LLMContextFrame(context=call.context))
        await caller.wait_until(lambda: len(llm.requests) == 3, what="both replies")
        await caller.wait_quiet()  # raises if a reply's context were left waiting
        assert not call.replies.waiting
        written = [
            line
            for m in call.context.get_messages()[before:]
            if m.get("role") == "developer"
            for line in m["content"].splitlines()
        ]
        assert written  # the step's posture, written ...
        assert len(written) == len(set(written))  # ... once
