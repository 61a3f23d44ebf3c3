"""A restaurant booking in LiveKit Agents, offline: ``python examples/livekit_booking.py``.

Needs ``pip install 'slateflow[livekit]'`` (LiveKit Agents is asyncio-only). No keys, no room:
the session runs in text mode (what LiveKit's own test kit does) with a scripted model. What a
production agent writes is the wiring below, with a real STT, LLM, TTS and a room::

    call = LiveKitCall(booking_flow(lookup), toolbox=toolbox,
                       extractors=[slots, answers], instructions=SYSTEM)
    session = AgentSession(llm=..., stt=..., tts=..., vad=...)
    call.attach(session)
    await session.start(call.agent, room=ctx.room)

The call: the model tries to book before the read-back (refused: LiveKit hands it
``ToolError(reason)``); the availability lookup lands while the line is quiet and is told once
the session is idle; the caller confirms; the model books twice in one reply (booked once); the
session shuts down after the goodbye.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from livekit.agents import AgentSession

from slateflow import Resolver
from slateflow.demo_flow import booking_flow
from slateflow.integrations.livekit import LiveKitCall
from slateflow.integrations.livekit.testing import ScriptedLLM
from slateflow.integrations.tools import Toolbox, tool
from slateflow.testing import fake_fetch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from booking_parts import BookingAgent, listeners

SYSTEM = "You are the booking agent of La Maison. Keep answers short."
BOOKED: list[str] = []


@tool
async def book_table() -> str:
    """Book the table the caller confirmed."""
    BOOKED.append("R-1")
    return "booked (reference R-1)"


@tool
def transfer_to_human() -> str:
    """Hand the call to a person."""
    return "transferring"


async def main(say: Any = print) -> LiveKitCall:
    """The call, narrated: what the caller types and what the agent answers."""
    lookup = fake_fetch()  # the booking system: the script answers it
    call = LiveKitCall(
        booking_flow(Resolver.fetch("availability", lookup), mode="background"),
        toolbox=Toolbox(book_table, transfer_to_human),
        extractors=listeners(),
        instructions=SYSTEM,
        idle_grace=0.05,
    )
    model = ScriptedLLM(BookingAgent(eager_book=True, double_book=True))
    async with AgentSession(llm=model) as session:
        call.attach(session)
        await session.start(call.agent)

        told = asyncio.Event()  # the agent said something
        session.on("conversation_item_added", lambda event: told.set())

        async def turn(text: str) -> None:
            say(f'caller: "{text}"')
            result = await session.run(user_input=text)
            for event in result.events:
                item = event.item
                if item.type == "function_call_output":
                    say(f"  tool {item.name}: {item.output}")
                elif item.type == "message":
                    say(f"  agent: {item.text_content}")

        await turn("Saturday at seven for four people, please.")
        say("the booking system answers (the line is quiet): open")
        told.clear()
        lookup.complete({"open": True})
        await asyncio.wait_for(told.wait(), 10)  # the agent tells it once the session is idle
        say(f"  agent: {session.history.items[-1].text_content}")
        await turn("Yes, that's right.")
        await call.wait_ended(timeout=10)  # the session shuts down after the goodbye
    say(f"booked: {len(BOOKED)} time(s); the call is over: {call.conversation.is_over}")
    return call


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main())
