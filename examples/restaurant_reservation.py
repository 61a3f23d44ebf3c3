"""pipecat Flows' restaurant reservation in slateflow.

Run it: ``python examples/restaurant_reservation.py`` (``--trio`` on trio; ``--write-json``
first rewrites ``restaurant_reservation.json``).

The same conversation as pipecat's ``examples/flows/restaurant_reservation.py`` (and its YAML
form): greet and take the party size, ask for a time (5 PM to 10 PM), check availability,
confirm, or offer other times when the one asked for is taken, and end the call. The pipecat
version moves from node to node when a function returns; this one is a plan whose steps
advance when the facts they wait for are in the State, whoever wrote them: the model's tool
arguments fill them, and the availability check runs in the background, again whenever the
caller picks another time, while the conversation goes on.

The plan is data too: ``restaurant_flow(...).to_json()`` is what ``restaurant_reservation.json``
holds, and ``Flow.from_json(data, resolvers=[...])`` reads it back (the YAML form's twin).

Run alone, it plays the call with a scripted model on the conversation (no framework, no
model key); ``tests/frameworks/test_pipecat`` runs it in a real pipecat pipeline beside
pipecat Flows' own version.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
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
    called_ok,
    captured,
    edge,
    eq,
    resolved,
    run,
)
from slateflow.conversation import overwrite
from slateflow.integrations.tools import Toolbox, tool

HERE = Path(__file__).resolve().parent
BOOKED = {"7:00 PM", "8:00 PM"}
OPEN = ["5:00 PM", "6:00 PM", "7:00 PM", "8:00 PM", "9:00 PM", "10:00 PM"]
CHECK_SECONDS = 0.5  # the reservation system's latency
ROLE = (
    "You are a restaurant reservation assistant for La Maison, an upscale French restaurant. "
    "Be casual and friendly. This is a voice conversation, so avoid special characters and emojis."
)


# -- the tools the model calls ------------------------------------------------------------------


@tool(fills={"size": "booking:party_size"})
def collect_party_size(size: int) -> str:
    """Record the number of people in the party.

    Args:
        size: Number of people in the party. Must be between 1 and 12.
    """
    return f"party of {size} noted"


@tool(fills={"time": ("booking:time", overwrite())})
def check_availability(time: str, party_size: int) -> str:
    """Check availability for requested time.

    Args:
        time: Requested reservation time in "HH:MM AM/PM" format, between 5 PM and 10 PM.
        party_size: Number of people in the party.
    """
    return f"checking {time}"  # the flow's check runs in the background


@tool
def end_conversation() -> str:
    """End the conversation."""
    return "ending"


TOOLS = Toolbox(collect_party_size, check_availability, end_conversation)


# -- the reservation system and the plan --------------------------------------------------------


def availability(delay: float = CHECK_SECONDS, clock: ManualClock | None = None) -> Resolver:
    """The reservation system: is the time asked for free (re-run when the caller picks another
    time), and which others are. It takes ``delay`` seconds (on ``clock`` when given)."""

    async def check(state: State) -> dict[str, Any]:
        await (clock.sleep(delay) if clock is not None else anyio.sleep(delay))
        time = state["booking:time"]
        free = time not in BOOKED
        others = [t for t in OPEN if t not in BOOKED]
        return {"available": free, "alternatives": [] if free else others}

    return Resolver.fetch("availability", check, reads=["booking:time"], reactive=True)


def restaurant_flow(lookup: Resolver) -> Flow:
    """The plan of the call: the nodes of pipecat's version, as steps."""
    free = eq("availability:result.available", True)
    taken = eq("availability:result.available", False)
    return Flow(
        "restaurant",
        [
            Step("initial", done=captured("booking:party_size"), allow=["collect_party_size"],
                 posture="Warmly greet the customer and ask how many people are in their party. "
                         "This is your only job for now; if the customer asks for something "
                         "else, politely remind them you can't do it."),
            Step("get_time", after=["initial"], done=captured("booking:time"),
                 allow=["check_availability"],
                 posture="Ask what time they'd like to dine. Restaurant is open 5 PM to 10 PM."),
            Step("check", after=["get_time"], done=resolved("availability"),
                 on_enter=run(lookup, "background"), allow=["check_availability"],
                 posture="Tell them you are checking that time."),
            Step("confirm", after=[edge("check", when=free, live=True)],
                 done=called_ok("end_conversation"), allow=["end_conversation"],
                 posture="Confirm the reservation details and ask if they need anything else. "
                         "When the customer says they're all set, call end_conversation.",
                 ground="Reservation: {booking:party_size} people at {booking:time}."),
            Step("no_availability", after=[edge("check", when=taken, live=True)],
                 done=called_ok("end_conversation"),
                 allow=["check_availability", "end_conversation"],
                 posture="Apologize that the requested time is not available and suggest the "
                         "alternatives. If they pick one, check its availability. If they'd "
                         "rather not book, call end_conversation.",
                 ground="Free instead: {availability:result.alternatives}."),
            Step("end", after=["confirm", "no_availability"], join="any", terminal=True,
                 posture="Thank them and end the conversation."),
        ],
    )  # fmt: skip


def restaurant_flow_from_data(lookup: Resolver) -> Flow:
    """The same plan, read from ``restaurant_reservation.json`` (the YAML form's twin)."""
    data = json.loads((HERE / "restaurant_reservation.json").read_text(encoding="utf-8"))
    return Flow.from_json(data, resolvers=[lookup])


# -- a call, played on the conversation alone ----------------------------------------------------


async def main(say: Any = print) -> State:
    """The call: four people at 7 PM (taken), then 9 PM, then all set."""
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, tools=TOOLS.names)
        runner = conversation.run_flow(restaurant_flow(availability(clock=clock)))

        async def model_calls(name: str, **arguments: Any) -> None:
            outcome = await TOOLS.call(conversation, name, arguments)
            say(f"  model calls {name}({arguments}): {outcome.content}")
            await clock.advance(1.0)  # the reservation system answers meanwhile
            for line in conversation.context_now().lines:
                say(f"    model is told: {line}")

        for line in (await conversation.user_turn("Hi, a table for four, please.")).lines:
            say(f"    model is told: {line}")
        await model_calls("collect_party_size", size=4)
        await model_calls("check_availability", time="7:00 PM", party_size=4)
        await model_calls("check_availability", time="9:00 PM", party_size=4)
        await model_calls("end_conversation")
        say(f"done: {', '.join(runner.done_steps)}; over: {runner.is_complete}")
    return state


if __name__ == "__main__":
    if "--write-json" in sys.argv:  # regenerate the data form from the plan above
        data = restaurant_flow(availability()).to_json()
        text = json.dumps(data, indent=2) + "\n"
        (HERE / "restaurant_reservation.json").write_text(text, encoding="utf-8")
    anyio.run(main, backend="trio" if "--trio" in sys.argv else "asyncio")
