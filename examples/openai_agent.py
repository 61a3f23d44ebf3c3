"""A booking agent on a real model: ``python examples/openai_agent.py``.

Set ``OPENAI_BASE_URL``, ``OPENAI_MODEL`` and ``OPENAI_API_KEY`` to use any OpenAI-compatible
server (OpenAI, vLLM, llama.cpp's server, Ollama, LM Studio, Gemini's OpenAI endpoint, ...);
``AVAILABILITY_URL`` points the availability lookup at a service of yours (by default a small
one this script serves on 127.0.0.1). Needs ``pip install 'slateflow[openai,http,tools]'``.

The agent loop is the one to copy: each caller line goes through ``conversation.user_turn``
(the flow advances, background results arrive), the model gets the turn's context as its
instructions and, as tools, only those the flow admits now; the model's tool calls run through
the :class:`~slateflow.integrations.tools.Toolbox` (validated, admitted, recorded, their
arguments filling the booking), and the loop goes on until the model answers in words. The
availability lookup is an HTTP resolver the flow starts in the background when the day is
known; its answer reaches the model with the next turn. The caller's lines are scripted
(``--interactive`` to type them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio

from slateflow import (
    Conversation,
    Flow,
    Resolver,
    Session,
    State,
    Step,
    called_ok,
    captured,
    commit,
    is_true,
    resolved,
    run,
)
from slateflow.conversation import TurnContext, overwrite
from slateflow.integrations.openai import OpenAIModel
from slateflow.integrations.tools import Toolbox, tool
from slateflow.resolve import LLM, LLMRequest, Message

CALLER = (
    "Hi, I'd like a table for 4 people on 2026-12-01.",
    "What times do you have?",
    "09:30 please.",
    "Yes, that's right.",
)
SYSTEM = (
    "You are the phone agent of a restaurant. Speak briefly. Follow the instructions below; "
    "use the tools to record what the caller says and to book."
)
MAX_STEPS = 6  # model calls a turn may take (tool rounds), so a confused model cannot loop


# -- the tools: their schemas come from the hints and the docstrings ---------------------------


@tool(fills={"party": "booking:party", "day": ("booking:date", overwrite())})
def note_booking(party: int, day: str) -> str:
    """Record the party size and the day the caller asked for.

    Args:
        party: How many people are coming.
        day: The day, as YYYY-MM-DD.
    """
    return f"noted: {party} people on {day}"


@tool(fills={"time": ("booking:time", overwrite())})
def choose_time(time: str) -> str:
    """Record the time the caller picked from the free times.

    Args:
        time: The time, as HH:MM.
    """
    return f"noted: {time}"


@tool(fills={"yes": "booking:confirmed"})
def confirm(yes: bool) -> str:
    """Record the caller's answer to the read-back of the booking.

    Args:
        yes: True when the caller said the booking is right.
    """
    return "confirmed" if yes else "not confirmed"


@tool
async def book() -> dict[str, Any]:
    """Book the table that the caller confirmed."""
    return {"booked": True, "reference": "R-1042"}


def booking_flow(lookup: Resolver) -> Flow:
    """Details, then the free times (looked up in the background), the pick, the read-back,
    the booking, the goodbye."""
    return Flow(
        "booking",
        [
            Step(
                "details",
                done=captured("booking:party", "booking:date"),
                posture="Ask for the party size and the day; call note_booking with them.",
                allow=["note_booking"],
            ),
            Step(
                "times",
                after=["details"],
                done=resolved("availability"),
                on_enter=run(lookup, "background"),
                posture="Tell the caller you are checking which times are free.",
            ),
            Step(
                "pick",
                after=["times"],
                done=captured("booking:time"),
                posture="Offer the free times; call choose_time with the caller's pick.",
                ground="Free times: {availability:result.slots}.",
                allow=["choose_time"],
            ),
            Step(
                "confirm",
                after=["pick"],
                done=is_true("booking:confirmed"),
                posture="Read the booking back and ask if it is right; call confirm with the "
                "answer.",
                ground="Booking: {booking:party} people on {booking:date} at {booking:time}.",
                allow=["confirm"],
            ),
            Step(
                "book",
                after=["confirm"],
                done=called_ok("book"),
                posture="Book it now: call book.",
                allow=["book"],
            ),
            Step(
                "bye",
                after=["book"],
                terminal=True,
                posture="Tell the caller the table is booked and say goodbye.",
            ),
        ],
        constraints=[commit("book", until=is_true("booking:confirmed"))],
    )


# -- the agent loop ----------------------------------------------------------------------------


async def answer(
    llm: LLM,
    toolbox: Toolbox,
    conversation: Conversation,
    context: TurnContext,
    history: list[Message],
    out: Callable[[str], object],
) -> str:
    """The model's reply to the caller's last line, running the tool calls it makes."""
    for _ in range(MAX_STEPS):
        request = LLMRequest(
            system=f"{SYSTEM}\n\n{context.full_prompt}",
            messages=tuple(history),
            tools=toolbox.specs(context.tools),  # only what the flow admits now
        )
        response = await llm.generate(request)
        if not response.tool_calls:
            history.append(Message(role="assistant", content=response.text))
            return response.text
        history.append(
            Message(role="assistant", content=response.text, tool_calls=response.tool_calls)
        )
        for outcome in await toolbox.call_all(conversation, response.tool_calls):
            out(f"  [tool {outcome.tool}: {outcome.status}: {outcome.content}]")
            history.append(outcome.message())
        context = conversation.context_now()  # the flow may have moved on
    return "Sorry, let me get a colleague to help you."


async def call(
    lines: Sequence[str] | None,
    *,
    model: str,
    base_url: str | None,
    api_key: str | None,
    availability_url: str,
    out: Callable[[str], object] = print,
) -> State:
    """Run one call; returns its State."""
    state = State()
    toolbox = Toolbox(note_booking, choose_time, confirm, book)
    lookup = Resolver.http(
        "availability",
        "GET",
        availability_url + "/slots",
        params={"date": "{booking:date}"},
        timeout=5.0,
    )
    llm = OpenAIModel(model, base_url=base_url, api_key=api_key)
    async with llm, Session(state) as session:
        conversation = Conversation(session, tools=toolbox.names)
        conversation.run_flow(booking_flow(lookup))
        history: list[Message] = []
        for line in caller(lines):
            out(f"caller: {line}")
            history.append(Message(role="user", content=line))
            context = await conversation.user_turn(line)
            reply = await answer(llm, toolbox, conversation, context, history, out)
            out(f"agent:  {reply}")
            conversation.agent_said(reply)
            if state.get("flow:booking:over"):
                break
            # The caller takes a moment to answer: lookups in flight may land meanwhile.
            with anyio.move_on_after(2.0):
                await session.wait_idle()
    booked = state.get("tool:book:result")
    out(f"booked: {json.dumps(booked)}" if booked else "not booked")
    return state


def caller(lines: Sequence[str] | None) -> Iterator[str]:
    if lines is not None:
        yield from lines
        return
    while True:
        try:
            said = input("you: ").strip()
        except EOFError:
            return
        if said:
            yield said


# -- a small availability service, so the example runs with only a model ------------------------


class _Availability(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        day = parse_qs(parts.query).get("date", [""])[0]
        body = json.dumps({"date": day, "slots": ["09:00", "09:30", "12:00"]}).encode()
        self.send_response(200 if parts.path == "/slots" else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@contextmanager
def availability_service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Availability)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interactive", action="store_true", help="type the caller's lines")
    parser.add_argument("--trio", action="store_true", help="run on trio instead of asyncio")
    args = parser.parse_args(argv)
    model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
    base_url = os.environ.get("OPENAI_BASE_URL")
    api_key = os.environ.get("OPENAI_API_KEY")
    if api_key is None and base_url is None:
        print("set OPENAI_API_KEY (and OPENAI_BASE_URL / OPENAI_MODEL for another server)")
        return 2
    lines = None if args.interactive else CALLER
    with availability_service() as local:
        url = os.environ.get("AVAILABILITY_URL", local)
        state = anyio.run(
            lambda: call(
                lines, model=model, base_url=base_url, api_key=api_key, availability_url=url
            ),
            backend="trio" if args.trio else "asyncio",
        )
    return 0 if state.get("tool:book:result") else 1


if __name__ == "__main__":
    sys.exit(main())
