"""What steering costs a pipecat pipeline before each inference; prints a table.

Run: ``python bench/pipecat_bench.py`` (``--quick`` for a smoke run, as CI does). Needs
``pip install 'slateflow[pipecat]'``.

A real pipeline (user aggregator, the call's steering processor, a scripted LLM service, a fake
voice, the tap, the assistant aggregator) takes 100 caller turns of the booking call. For each
context on its way to the model the steering processor feeds the turn to the conversation
(extractors, the flow, the context), writes the developer message and the advertised tools;
that time, measured around it inside the running pipeline, is the overhead slateflow adds
before the model can start. Peer in the same run: a pipecat processor that only forwards the
frame (what the slot costs with nothing in it).

Targets (issue 29): median <= 0.5 ms, max <= 2 ms over 100 turns.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from loguru import logger

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from pipecat.frames.frames import Frame, LLMContextFrame
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

    from slateflow import Resolver
    from slateflow.demo_flow import booking_flow
    from slateflow.integrations.pipecat import PipecatCall
    from slateflow.integrations.pipecat.testing import (
        FakeVoice,
        ScriptedLLMService,
        pipecat_call,
        run_pipeline,
    )
    from slateflow.integrations.tools import Toolbox, tool
    from slateflow.resolve import LLMRequest, LLMResponse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from booking_parts import listeners

LINES = [
    "Saturday at seven for four people, please.",
    "Hmm, let me think about it.",
    "Is there parking nearby?",
    "And do you have a terrace?",
]


class Brief:
    """A model that answers at once with one short line."""

    async def generate(self, request: LLMRequest) -> LLMResponse:
        return LLMResponse(text="Sure.")


@tool
def book_table() -> str:
    """Book the table."""
    return "booked"


class Timed(FrameProcessor):  # type: ignore[misc]
    """Forwards every frame; ``wrapped``, when given, handles context frames (timed)."""

    def __init__(self, wrapped: Any = None) -> None:
        super().__init__(name="timed")
        self.wrapped = wrapped
        self.times: list[float] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame) and direction is FrameDirection.DOWNSTREAM:
            began = time.perf_counter()
            if self.wrapped is not None:
                await self.wrapped(frame.context)
            self.times.append(time.perf_counter() - began)
        await self.push_frame(frame, direction)


async def steering(turns: int) -> list[float]:
    call = PipecatCall(
        booking_flow(Resolver.function("availability", lambda state: {"open": True})),
        LLMContext(),
        toolbox=Toolbox(book_table),
        extractors=listeners(),
        tools=["book_table", "transfer_to_human"],
    )
    times: list[float] = []
    steer = call.steer

    async def timed_steer(context: LLMContext, *, speculation: bool = False) -> list[Frame]:
        began = time.perf_counter()
        try:
            return await steer(context, speculation=speculation)
        finally:
            times.append(time.perf_counter() - began)

    call.steer = timed_steer  # type: ignore[method-assign]
    async with pipecat_call(
        call, ScriptedLLMService(Brief()), voice=FakeVoice(word_seconds=0)
    ) as caller:
        for i in range(turns):
            await caller.say(LINES[i % len(LINES)])
            await caller.wait_quiet(settle=0.002)
    return times


async def forwarding(turns: int) -> list[float]:
    slot = Timed()
    async with run_pipeline(
        ScriptedLLMService(Brief()),
        LLMContext(),
        before_llm=[slot],
        voice=FakeVoice(word_seconds=0),
    ) as (caller, _, _):
        for i in range(turns):
            await caller.say(LINES[i % len(LINES)])
            await caller.wait_quiet(settle=0.002)
    return slot.times


def row(name: str, times: list[float], target: str = "") -> None:
    ms = sorted(t * 1e3 for t in times)
    p95 = ms[int(len(ms) * 0.95) - 1]
    median = statistics.median(ms)
    print(f"{name:<48} {median:>7.3f} {p95:>7.3f} {ms[-1]:>7.3f} {len(ms):>5}  {target}")


async def main(quick: bool) -> None:
    turns = 20 if quick else 100
    await steering(5)  # warm up: imports, first compiles
    measured = await steering(turns)
    peer = await forwarding(turns)
    head = "per context on its way to the model (ms)"
    print(f"{head:<48} {'median':>7} {'p95':>7} {'max':>7} {'n':>5}")
    row("slateflow steering (turn, flow, context, tools)", measured, "<= 0.5 / max <= 2")
    row("a processor that only forwards (peer)", peer, "(peer)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    asyncio.run(main(parser.parse_args().quick))
