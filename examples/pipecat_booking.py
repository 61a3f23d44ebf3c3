"""A restaurant booking in a real pipecat pipeline, offline: ``python examples/pipecat_booking.py``.

Needs ``pip install 'slateflow[pipecat]'`` (pipecat is asyncio-only). No keys, no audio: a
scripted model stands in for the LLM service and a fake voice for TTS and the output transport,
and a caller talks to it. What a production bot writes is the wiring below, with a real STT,
LLM, TTS and transport in the pipeline::

    call = PipecatCall(booking_flow(lookup), context, toolbox=toolbox,
                       extractors=[slots, answers], system=SYSTEM)
    call.register_tools(llm)
    user = LLMUserAggregatorParams(user_mute_strategies=[FloorHold(call)],
                                   user_turn_strategies=UserTurnStrategies(
                                       stop=[PacedSpeechTimeout(call)]))
    pair = LLMContextAggregatorPair(context, user_params=user)
    pipeline = Pipeline([transport.input(), stt, pair.user(), call.steering, llm, tts,
                         transport.output(), call.tap, pair.assistant()])

The call: the caller asks for a table; the availability lookup runs in the background and lands
while the caller is talking over the bot; slateflow holds it until the caller's question is
answered and tells it in that answer; the model tries to book before the read-back (refused with
the flow's reason) and twice at once after it (booked once); the call hangs up after the goodbye.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from pathlib import Path
from typing import Any

from loguru import logger

with warnings.catch_warnings():  # pipecat's own modules warn about their deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from pipecat.processors.aggregators.llm_context import LLMContext

    from slateflow import Resolver
    from slateflow.demo_flow import booking_flow
    from slateflow.integrations.pipecat import PipecatCall
    from slateflow.integrations.pipecat.testing import (
        FakeVoice,
        ScriptedLLMService,
        pipecat_call,
    )
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


async def main(say: Any = print) -> PipecatCall:
    """The call, narrated: what the caller says and what they hear."""
    lookup = fake_fetch()  # the booking system: the script answers it at the worst moment
    call = PipecatCall(
        booking_flow(Resolver.fetch("availability", lookup), mode="background"),
        LLMContext(),
        toolbox=Toolbox(book_table, transfer_to_human),
        extractors=listeners(),
        system=SYSTEM,
    )
    model = ScriptedLLMService(BookingAgent(eager_book=True, double_book=True))
    voice = FakeVoice(word_seconds=0.01)
    async with pipecat_call(call, model, voice=voice) as caller:
        said = 0

        async def hear() -> None:
            nonlocal said
            for line in caller.heard[said:]:
                say(f"  bot:    {line or '(cut off before a word)'}")
            said = len(caller.heard)

        say('caller: "Saturday at seven for four people, please."')
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_until(lambda: voice.speaking)
        say("caller talks over the bot; meanwhile the booking system answers: open")
        await caller.begin_speaking()
        lookup.complete({"open": True})
        await caller.finish_speaking("Is there parking, by the way?")
        say('caller: "Is there parking, by the way?"')
        await caller.wait_quiet()
        await hear()
        say('caller: "Yes, that\'s right."')
        await caller.say("Yes, that's right.")
        await caller.wait_ended()
        await hear()
    say(f"booked: {len(BOOKED)} time(s); the call is over: {call.conversation.is_over}")
    say(f"the bot spoke over the caller: {len(caller.overlaps)} time(s)")
    return call


if __name__ == "__main__":
    logger.remove()  # pipecat logs every frame at DEBUG
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(main())
