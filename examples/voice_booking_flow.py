"""A voice booking flow: ``python examples/voice_booking_flow.py`` (``--trio`` for trio).

The conversation plan collects a slot, checks availability in the background, confirms or
offers another time, and commits the booking once. Nothing here calls "next step": each step
advances the moment its guard holds, whoever wrote the keys it reads (the extractor, the
availability lookup finishing in the background, a tool). The model is told the active steps'
postures and grounds each turn, and its tool calls are admitted or refused with a reason it can
act on.

A manual clock stands in for time, so the run is instant and prints the same every time.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    any_,
    called_ok,
    captured,
    commit,
    edge,
    eq,
    failed,
    is_true,
    require,
    resolved,
    run,
)
from slateflow.flow import FlowRunner


def availability(clock: ManualClock) -> Resolver:
    """The booking system: 7 pm on Saturday is taken, 7:30 pm is free (answers in 0.4 s)."""

    async def check(state: State) -> dict[str, Any]:
        await clock.sleep(0.4)
        wanted = state["booking:time"]
        if wanted == "19:00":
            return {"open": False, "alternative": "19:30"}
        return {"open": True}

    return Resolver.fetch("availability", check, reads=["booking:date", "booking:time"])


def booking_flow(lookup: Resolver) -> Flow:
    """The conversation plan of a table booking."""
    return Flow(
        "booking",
        [
            Step(
                "slot",
                done=captured("booking:date", "booking:time"),
                posture="Ask which day and time the caller would like.",
                ground="Known so far: date {booking:date?not yet}, time {booking:time?not yet}.",
            ),
            Step(
                "check",
                after=["slot"],
                done=any_(resolved("availability"), failed("availability")),
                on_enter=run(lookup, "background"),
                posture="Say you are checking the book; keep the caller company meanwhile.",
            ),
            Step(
                "offer",
                after=[edge("check", when=eq("availability:result.open", False))],
                done=is_true("booking:alternative_accepted"),
                posture="That time is taken: offer the alternative and ask if it suits.",
                ground="Alternative on offer: {availability:result.alternative}.",
            ),
            Step(
                "confirm",
                after=[edge("check", when=eq("availability:result.open", True)), "offer"],
                join="any",
                done=is_true("booking:confirmed"),
                posture="Read the booking back and ask the caller to confirm.",
                ground="Booking: {booking:date} at {booking:time}.",
            ),
            Step(
                "book",
                after=["confirm"],
                done=called_ok("book_table"),
                allow=["book_table"],
                posture="Book the table now.",
            ),
            Step(
                "sorry",
                after=[edge("check", when=failed("availability"))],
                done=called_ok("transfer_to_human"),
                allow=["transfer_to_human"],
                posture="Apologise: the book cannot be checked now; offer a transfer to a person.",
            ),
            Step("goodbye", after=["book"], terminal=True, posture="Thank the caller."),
        ],
        constraints=[commit("book_table", until=is_true("booking:confirmed")), require("book")],
        ambient=["transfer_to_human"],
    )


def tell_the_model(runner: FlowRunner, conversation: Conversation, say: Any) -> None:
    """What the voice loop would put in the model's context this turn."""
    say(f"    active: {', '.join(runner.active_steps) or 'none'}")
    brief = runner.brief()
    for line in brief.postures + brief.grounds:
        say(f"    model is told: {line}")
    for result in conversation.take_deliveries():
        say(f"    delivered ({result.scheduling.value}): {result.response}")


def try_tool(runner: FlowRunner, tool: str, say: Any) -> bool:
    """The model calls ``tool``: admitted, it runs and the flow hears of its success."""
    admission = runner.admit(tool)
    if not admission:
        say(f"    {tool} refused: {admission.reason}")
        return False
    say(f"    {tool} runs")
    runner.on_tool_ok(tool)
    return True


async def main(say: Any = print) -> State:
    """Drive the flow through a short simulated call; return the final State."""
    state = State()
    clock = ManualClock()
    flow = booking_flow(availability(clock)).compile(tools=["book_table", "transfer_to_human"])
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)  # where the flow's background results wait
        runner = conversation.run_flow(flow)
        say("agent: Hello! What can I book for you?")
        tell_the_model(runner, conversation, say)

        say('caller: "A table on Saturday at seven."')
        # The extractor writes the slots it recognised; the flow moves on by itself.
        state.update(
            {"booking:date": "Saturday", "booking:time": "19:00"},
            source="extraction",
            writer="slots",
            confidence=0.9,
        )
        await runner.on_turn()
        tell_the_model(runner, conversation, say)
        try_tool(runner, "book_table", say)  # too early: nothing is confirmed

        await clock.advance(0.4)  # the booking system answers
        await runner.wait_for_step("offer")
        tell_the_model(runner, conversation, say)

        say('caller: "Half past seven works."')
        state.update(
            {"booking:time": "19:30", "booking:alternative_accepted": True},
            source="extraction",
            writer="slots",
        )
        await runner.on_turn()
        tell_the_model(runner, conversation, say)

        say('caller: "Yes, that is right."')
        state.set("booking:confirmed", True, source="extraction", writer="yes_no")
        await runner.on_turn()
        tell_the_model(runner, conversation, say)
        try_tool(runner, "book_table", say)
        try_tool(runner, "book_table", say)  # a second booking is refused
        await runner.wait_complete()
        say(f"flow complete: {runner.is_complete}; done: {', '.join(runner.done_steps)}")
    return state


if __name__ == "__main__":
    anyio.run(main, backend="trio" if "--trio" in sys.argv else "asyncio")
