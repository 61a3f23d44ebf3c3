"""A whole voice call, turn by turn: ``python examples/voice_call.py`` (``--trio`` for trio).

What a voice loop (pipecat, LiveKit, a Gemini Live or OpenAI Realtime loop) does with
slateflow, through a :class:`~slateflow.Conversation` over the session: each time the caller
finishes speaking it calls ``await conversation.user_turn(text)`` and puts ``context.prompt``
in front of the model (building the next context counts this one as handed over); it asks
``conversation.admit(tool)`` before a tool runs and reports ``await conversation.tool_ok(tool)``
after; it tells the conversation when the caller talks over the agent
(``begin_interruption`` / ``end_interruption``), and speaks what ``on_delivery`` hands it. It
reads ``session:voice_timing`` for the pacing.

In between, slateflow does the rest: it redacts the transcript, reads the slots out of the
caller's words, starts the availability check the moment the slot is complete, takes a side
question about parking without losing the booking, hands the check's answer over once, even
when it lands while the caller is talking (in the reply to what the caller said over the agent,
not before it), and takes a "yes" as a confirmation only after the read-back was told.

A manual clock stands in for time, so the run is instant and prints the same every time.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from slateflow import (
    Conversation,
    Digression,
    Flow,
    FlowStack,
    ManualClock,
    RepairPolicy,
    Resolver,
    Session,
    State,
    Step,
    VoiceTiming,
    called_ok,
    captured,
    commit,
    eq,
    is_set,
    is_true,
    require,
    resolved,
    told,
)
from slateflow.conversation import (
    Extract,
    Extractor,
    TurnContext,
    datetime,
    integer_near,
    one_of,
    overwrite,
    true_only,
    yes_no,
)
from slateflow.resolve import BackgroundResult

TOOLS = ["book_table", "transfer_to_human"]


def availability(clock: ManualClock) -> Resolver:
    """The booking system: 0.8 s to answer; 19:00 is free."""

    async def check(state: State) -> dict[str, Any]:
        await clock.sleep(0.8)
        return {"open": state["booking:time"] == "19:00"}

    return Resolver.fetch("availability", check, reads=["booking:time"])


def booking_flow() -> Flow:
    """The main task: collect the slot, wait for the check, confirm, book once."""
    return Flow(
        "booking",
        [
            Step(
                "ask",
                done=captured("booking:date", "booking:time", "booking:party_size"),
                posture="Ask for the day, the time and how many people.",
                ground="Known so far: day {booking:date?given:missing}, time "
                "{booking:time?given:missing}, party size {booking:party_size?given:missing}.",
                repair=RepairPolicy(reprompt_after=2, escalate_after=4, escalate_to="handoff"),
                timing=VoiceTiming(reprompt_after_ms=6000, end_of_speech_ms=700),
            ),
            Step(
                "check",
                after=["ask"],
                done=resolved("availability"),
                posture="Tell the caller you are checking the book.",
                timing=VoiceTiming(filler_after_ms=1500),
            ),
            Step(
                "confirm",
                after=["check"],
                gate=eq("availability:result.open", True),
                done=is_true("booking:confirmed"),
                posture="Read the booking back and ask the caller to confirm.",
                ground="Booking: {booking:date} at {booking:time} for {booking:party_size}.",
                timing=VoiceTiming(interruptible=False),
            ),
            Step(
                "book",
                after=["confirm"],
                done=called_ok("book_table"),
                posture="Book the table now.",
                allow=["book_table"],
            ),
            Step("goodbye", after=["book"], terminal=True, posture="Thank the caller."),
            Step("handoff", terminal=True, posture="Transfer the caller to a person."),
        ],
        constraints=[commit("book_table", until=is_true("booking:confirmed")), require("book")],
        ambient=["transfer_to_human"],
    )


def side_flows() -> list[Digression]:
    """A question about parking (then back to the booking), and a cancel (the call ends)."""
    answer = "Answer: there is free parking behind the building."
    faq = Flow("faq", [Step("answer", terminal=True, posture=answer)])
    cancel = Flow(
        "cancel", [Step("farewell", terminal=True, posture="Say goodbye; nothing was booked.")]
    )
    return [
        Digression("parking", is_set("turn:topic:parking"), faq, then="previous"),
        Digression("cancel", is_set("turn:topic:cancel"), cancel, then="terminate"),
    ]


def extractors(clock: ManualClock) -> list[Extractor]:
    """The slot (its completion starts the availability check), the confirmation, and the
    topics that start a digression (``turn:`` keys: they last one turn)."""
    when = datetime(clock)

    slot = (
        Extract("booking")
        .field("date", when.pick("weekday").map(str.capitalize))
        .field("time", when.pick("time"), overwrite())
        .field("party_size", integer_near(["people", "us", "party", "for"]))
        .on_complete(availability(clock), "background", scheduling="interrupt")
        .build()
    )
    # A yes confirms only once the read-back reached the model: not a "yes" said before it.
    answers = (
        Extract("answers")
        .field_to(
            "confirmed",
            "booking:confirmed",
            yes_no(),
            true_only().accept_when(told("confirm", "booking")),
        )
        .build()
    )
    topics = (
        Extract("topic")
        .field_to("parking", "turn:topic:parking", one_of({"parking": ["parking", "park"]}))
        .field_to("cancel", "turn:topic:cancel", one_of({"cancel": ["cancel", "never mind"]}))
        .build()
    )
    return [slot, answers, topics]


async def call(clock: ManualClock, lines: list[str], say: Any) -> tuple[State, Session]:
    """One call: the caller's ``lines`` in order (``"<interrupt>"`` marks the caller talking
    over the agent while the clock runs on); returns the final State and the session."""
    state = State(clock=clock)
    pushed: list[BackgroundResult] = []

    def speak_now(result: BackgroundResult) -> None:
        pushed.append(result)
        say(f"    >> spoken at once ({result.scheduling.value}): {result.response}")

    def told(context: TurnContext) -> None:
        for line in context.lines:
            say(f"    model is told: {line}")

    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, tools=TOOLS, on_delivery=speak_now)
        for extractor in extractors(clock):
            conversation.add_extractor(extractor)
        stack = conversation.run_flow(FlowStack(booking_flow(), side_flows()))
        for line in lines:
            if line == "<interrupt>":
                say("  (the caller talks over the agent)")
                conversation.begin_interruption()
                await clock.advance(1.0)
                say(f"    flow moved on meanwhile: active {stack.active_steps}")
                conversation.end_interruption()  # their words come next, as a turn
                continue
            if line.startswith("<tool "):
                tool = line[6:-1]
                admission = conversation.admit(tool)
                if admission:
                    say(f"  model calls {tool}: it runs")
                    await conversation.tool_ok(tool)
                else:
                    say(f"  model calls {tool}: refused: {admission.reason}")
                continue
            say(f'caller: "{line}"')
            context = await conversation.user_turn(line)
            if context.turn.text != line:
                say(f'    transcript: "{context.turn.text}"')
            if stack.overlay:
                say(f"    digression: {stack.overlay}")
            told(context)
            timing = state.get("session:voice_timing")
            if timing:
                say(f"    voice timing: {timing}")
    return state, session


async def main(say: Any = print) -> tuple[State, State]:
    """Two calls: one books a table (with a side question and an interruption), one cancels."""
    say("== call 1")
    booked, _ = await call(
        ManualClock(),
        [
            "Hi, I'd like a table.",
            "Is there parking?",
            "Saturday at 7 pm for four people, card 4111 1111 1111 1111.",
            "<interrupt>",
            "Sorry, do you have high chairs?",
            "Yes, that's right.",
            "<tool book_table>",
            "<tool book_table>",
        ],
        say,
    )
    say("== call 2")
    cancelled, _ = await call(
        ManualClock(),
        ["Hello, a table for two please.", "Actually, never mind.", "<tool book_table>"],
        say,
    )
    return booked, cancelled


if __name__ == "__main__":
    anyio.run(main, backend="trio" if "--trio" in sys.argv else "asyncio")
