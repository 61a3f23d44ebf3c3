"""What steering costs a LiveKit agent before each inference; prints a table.

Run: ``python bench/livekit_bench.py`` (``--quick`` for a smoke run, as CI does). Needs
``pip install 'slateflow[livekit]'``.

An ``AgentSession`` in text mode (LiveKit's own test kit, a scripted model) takes 100 caller
turns of the booking call. For each reply the agent's ``llm_node`` feeds the turn (extractors,
the flow, the context), copies the chat context with every line that applies now and picks the
admitted tools: that time, from entering ``llm_node`` to calling LiveKit's own, is what slateflow
adds before the model can start. Peer in the same run: an ``Agent`` whose ``llm_node`` only
forwards.

Targets (issue 29): median <= 0.5 ms, max <= 2 ms over 100 turns.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from collections.abc import AsyncIterable
from pathlib import Path
from typing import Any

from livekit.agents import Agent, AgentSession

from slateflow import Resolver
from slateflow.demo_flow import booking_flow
from slateflow.integrations.livekit import LiveKitCall, SlateflowAgent
from slateflow.integrations.livekit.testing import ScriptedLLM
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
_entered: list[float] = []
_times: list[float] = []
_default = Agent.default.llm_node


async def _timed_default(agent: Any, *args: Any, **kwargs: Any) -> AsyncIterable[Any]:
    if _entered:
        _times.append(time.perf_counter() - _entered.pop())
    async for chunk in _default(agent, *args, **kwargs):
        yield chunk


class Brief:
    """A model that answers at once with one short line."""

    async def generate(self, request: LLMRequest) -> LLMResponse:
        return LLMResponse(text="Sure.")


@tool
def book_table() -> str:
    """Book the table."""
    return "booked"


class Steered(SlateflowAgent):
    async def llm_node(self, *args: Any, **kwargs: Any) -> AsyncIterable[Any]:  # type: ignore[override]
        _entered.append(time.perf_counter())
        async for chunk in super().llm_node(*args, **kwargs):
            yield chunk


class Forwarding(Agent):
    async def llm_node(self, *args: Any, **kwargs: Any) -> AsyncIterable[Any]:  # type: ignore[override]
        _entered.append(time.perf_counter())
        async for chunk in Agent.default.llm_node(self, *args, **kwargs):
            yield chunk


async def run(turns: int, *, steered: bool) -> list[float]:
    _times.clear()
    _entered.clear()
    call = LiveKitCall(
        booking_flow(Resolver.function("availability", lambda state: {"open": True})),
        toolbox=Toolbox(book_table),
        extractors=listeners(),
        tools=["book_table", "transfer_to_human"],
    )
    agent: Agent = (
        Steered(call, instructions="", tools=call.livekit_tools())
        if steered
        else Forwarding(instructions="")
    )
    call.agent = agent  # type: ignore[assignment]
    async with AgentSession(llm=ScriptedLLM(Brief())) as session:
        call.attach(session)
        await session.start(agent)
        for i in range(turns):
            await session.run(user_input=LINES[i % len(LINES)])
    await call.close()
    return list(_times)


def row(name: str, times: list[float], target: str = "") -> None:
    ms = sorted(t * 1e3 for t in times)
    p95 = ms[max(int(len(ms) * 0.95) - 1, 0)]
    median = statistics.median(ms)
    print(f"{name:<48} {median:>7.3f} {p95:>7.3f} {ms[-1]:>7.3f} {len(ms):>5}  {target}")


async def main(quick: bool) -> None:
    Agent.default.llm_node = _timed_default  # type: ignore[method-assign]
    turns = 20 if quick else 100
    await run(5, steered=True)  # warm up
    measured = await run(turns, steered=True)
    peer = await run(turns, steered=False)
    head = "per reply, before the model starts (ms)"
    print(f"{head:<48} {'median':>7} {'p95':>7} {'max':>7} {'n':>5}")
    row("slateflow steering (turn, flow, context, tools)", measured, "<= 0.5 / max <= 2")
    row("an llm_node that only forwards (peer)", peer, "(peer)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main(parser.parse_args().quick))
