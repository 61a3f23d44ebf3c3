"""pipecat Flows' restaurant reservation and its slateflow port, side by side under one harness.

Four versions (pipecat Flows in its Python and YAML forms; slateflow's port as code and as
data, ``examples/restaurant_reservation.py``) run in the same pipeline with the same scripted
model and the same caller, in two timings: the caller waits for each answer; and the caller
talks over the bot while the availability check runs. What each version did is asserted here
and written up in ``docs/pipecat.md``.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pipecat.flows import Flow as PipecatFlow
from pipecat.flows import FlowConfig, FlowManager
from pipecat.processors.aggregators.llm_context import LLMContext

from slateflow.integrations.pipecat import PipecatCall
from slateflow.integrations.pipecat.testing import (
    Caller,
    ScriptedLLMService,
    pipecat_call,
    run_pipeline,
)
from slateflow.resolve import LLMRequest, LLMResponse, ToolCall

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[2] / "examples"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(EXAMPLES))
import restaurant_reservation as port  # noqa: E402
from restaurant import python_form, tools  # noqa: E402

TIMES = {"five": "5:00 PM", "seven": "7:00 PM", "nine": "9:00 PM", "ten": "10:00 PM"}


@dataclass
class RestaurantModel:
    """A scripted model for the reservation: reads its instructions and the caller's words,
    calls the tools it is offered."""

    requests: list[LLMRequest] = field(default_factory=list)
    calls: int = 0

    async def generate(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        told, since = "", []
        for message in request.messages:
            if message.role == "user":
                since = []
                told = ""
            if message.role in ("developer", "system"):
                told += "\n" + message.content
            since.append(message)
        told = (request.system or "") + told
        user = next((m.content.lower() for m in reversed(request.messages) if m.role == "user"), "")
        called = {c.name for m in since for c in m.tool_calls}
        offered = {t.name for t in request.tools}
        time = next((t for word, t in TIMES.items() if word in user), None)
        wants_size = "four" in user and "collect_party_size" not in called
        if "collect_party_size" in offered and wants_size:
            return self._call("collect_party_size", size=4)
        if "check_availability" in offered and time and "check_availability" not in called:
            return self._call("check_availability", time=time, party_size=4)
        if "end_conversation" in offered and "all" in user and "end_conversation" not in called:
            return self._call("end_conversation")
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "tool" and "checking" in last.content:
            return LLMResponse(text="One moment, let me check that time for you.")
        cues = (
            ("Thank them", "Thank you for calling La Maison, goodbye!"),
            ("Confirm the reservation",
             f"You're booked for four at {self._time(request)}. Anything else?"),
            ("Apologize", "Sorry, that time is taken. We have 9:00 PM or 10:00 PM."),
            ("checking", "Let me check that time for you."),
            ("what time", "What time would you like to dine?"),
            ("Warmly greet", "Hello! How many people are in your party?"),
        )  # fmt: skip
        for line in reversed(told.splitlines()):  # the newest instruction decides
            for cue, answer in cues:
                if cue in line:
                    return LLMResponse(text=answer)
        return LLMResponse(text="Sure.")

    def _call(self, name: str, **arguments: Any) -> LLMResponse:
        import json

        self.calls += 1
        call = ToolCall(id=f"call_{self.calls}", name=name, arguments=json.dumps(arguments))
        return LLMResponse(tool_calls=(call,))

    @staticmethod
    def _time(request: LLMRequest) -> str:
        asked = [
            t
            for m in request.messages
            for c in m.tool_calls
            if c.name == "check_availability"
            for t in [c.parsed().get("time")]
        ]
        return asked[-1] if asked else "?"


@dataclass
class Outcome:
    heard: list[str]
    overlaps: int
    ended: bool
    booked_at: str | None
    silence: float
    """Seconds the caller waited, after asking for seven, before the bot said anything."""


async def play(caller: Caller, *, talk_over: bool) -> float:
    """The caller: a table for four; seven (taken); nine; that's all. Between turns the caller
    waits for the answer, a background check's too. Returns the silence after "seven"."""
    await caller.say("Hi, a table for four, please.")
    await caller.wait_quiet(resolvers=True)
    await caller.say("Seven PM, please.")
    asked = time.monotonic()
    if talk_over:  # the caller talks while the availability check runs
        await caller.wait_until(
            lambda: caller.monitor.tools or caller.voice.speaking, what="the check or the bot"
        )
        await caller.begin_speaking()
        await caller.wait_until(lambda: not caller.voice.speaking, what="the bot to stop")
        await caller.finish_speaking("Sorry, is there parking nearby?")
    await caller.wait_quiet(resolvers=True)
    silence = caller.answered_after(asked)
    assert silence is not None, "the bot never answered the caller's time"
    await caller.say("Nine PM then, please.")
    await caller.wait_quiet(resolvers=True)
    await caller.say("That's all, thanks.")
    await caller.wait_quiet(resolvers=True)
    return silence


async def pipecat_flows(form: str, *, talk_over: bool) -> Outcome:
    context = LLMContext()
    llm = ScriptedLLMService(RestaurantModel())
    async with run_pipeline(llm, context) as (caller, worker, pair):
        manager = FlowManager(worker=worker, llm=llm, context_aggregator=pair)
        if form == "yaml":
            config = FlowConfig.from_file(HERE / "restaurant" / "flow.yaml")
            node = PipecatFlow(config, handlers=tools).initial_node
        else:
            node = python_form.initial_node()
        await manager.initialize(node)
        await caller.wait_quiet()
        silence = await play(caller, talk_over=talk_over)
        await caller.wait_ended()  # the end node's post action hangs up
        booked = _last_time(context) if manager.current_node == "end" else None
    return Outcome(caller.heard, len(caller.overlaps), caller.ended, booked, silence)


async def slateflow_port(form: str, *, talk_over: bool) -> Outcome:
    lookup = port.availability()
    as_data = form == "data"
    flow = port.restaurant_flow_from_data(lookup) if as_data else port.restaurant_flow(lookup)
    call = PipecatCall(flow, LLMContext(), toolbox=port.TOOLS, system=port.ROLE)
    async with pipecat_call(call, ScriptedLLMService(RestaurantModel())) as caller:
        await caller.say("Hello?")
        await caller.wait_quiet(resolvers=True)
        silence = await play(caller, talk_over=talk_over)
        await caller.wait_ended()  # the goodbye was spoken: the call hangs up
    state = call.state
    free = (state.get("availability:result") or {}).get("available")
    booked = state.get("booking:time") if free and call.conversation.is_over else None
    return Outcome(caller.heard, len(caller.overlaps), caller.ended, booked, silence)


def _last_time(context: LLMContext) -> str | None:
    for message in reversed(context.get_messages()):
        for call in message.get("tool_calls") or ():
            if call["function"]["name"] == "check_availability":
                found = re.search(r'"time": "([^"]+)"', call["function"]["arguments"])
                return found[1] if found else None
    return None


@pytest.mark.asyncio
@pytest.mark.parametrize("talk_over", [False, True], ids=["caller waits", "caller talks over"])
@pytest.mark.parametrize("form", ["python", "yaml"])
async def test_pipecat_flows_books_nine(form: str, talk_over: bool) -> None:
    outcome = await pipecat_flows(form, talk_over=talk_over)
    assert outcome.booked_at == "9:00 PM"
    assert outcome.overlaps == 0
    assert outcome.ended
    assert outcome.heard[-1] == "Thank you for calling La Maison, goodbye!"
    if not talk_over:  # the check runs inside the tool call: silence until it returns
        assert outcome.silence >= tools.CHECK_SECONDS


@pytest.mark.asyncio
@pytest.mark.parametrize("talk_over", [False, True], ids=["caller waits", "caller talks over"])
@pytest.mark.parametrize("form", ["code", "data"])
async def test_the_slateflow_port_books_nine(form: str, talk_over: bool) -> None:
    outcome = await slateflow_port(form, talk_over=talk_over)
    assert outcome.booked_at == "9:00 PM"
    assert outcome.overlaps == 0
    assert outcome.ended
    assert outcome.heard[-1] == "Thank you for calling La Maison, goodbye!"
    # The check runs in the background: the bot says it is checking at once, and tells the
    # answer (seven is taken) when it lands, even after the caller's question.
    assert outcome.silence < port.CHECK_SECONDS
    assert any("taken" in line for line in outcome.heard)

