"""The parts of the offline voice booking examples (pipecat, LiveKit) and their tests: what
the agent reads from the caller's words (:func:`listeners`), and :class:`BookingAgent`, the
scripted model they talk to.

The agent reads the instructions it was given since it last spoke (the system instruction and the
developer messages a slateflow adapter writes) and the caller's words, and calls only the tools it
is offered, as a model does. ``eager_book`` makes it try to book on the first turn (offered or
not); ``double_book`` makes it emit the booking twice in one reply. Swap it for a real model
(``slateflow.integrations.openai.OpenAIModel``) and nothing else changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slateflow import active
from slateflow.conversation import Extract, datetime, integer_near, overwrite, true_only, yes_no
from slateflow.resolve import LLMRequest, LLMResponse, ManualClock, Message, ToolCall

__all__ = ["BookingAgent", "listeners"]


def listeners(asked: Callable[[str], Any] = active) -> list[Any]:
    """What the agent reads from the caller's words: the slot, and the answers to the
    questions of the booking flow, accepted while ``asked(step)`` holds (``active``, or
    ``told``: once the question reached the model)."""
    when = datetime(ManualClock())  # "now" is 2026-01-01, a Thursday
    slots = (
        Extract("slots")
        .field_to("date", "booking:date", when.pick("weekday").map(str.capitalize))
        .field_to("time", "booking:time", when.pick("time"), overwrite())
        .field_to("party_size", "booking:party_size", integer_near(["people", "us"]))
        .build()
    )
    answers = (
        Extract("answers")
        .field_to("alternative", "booking:alternative_accepted", yes_no(),
                  true_only().accept_when(asked("offer")))
        .field_to("confirmed", "booking:confirmed", yes_no(),
                  true_only().accept_when(asked("confirm")))
        .build()
    )  # fmt: skip
    return [slots, answers]


def _instructions(request: LLMRequest) -> str:
    """What the model was told since it last spoke: the system instruction and the developer
    messages after its last reply."""
    told: list[str] = [request.system or ""]
    for message in request.messages:
        if message.role == "assistant" and message.content:
            told = [request.system or ""]
        elif message.role in ("developer", "system"):
            told.append(message.content)
    return "\n".join(told)


def _decoded(content: str) -> str:
    """A tool result as text (pipecat sends results JSON-encoded)."""
    try:
        value = json.loads(content)
    except ValueError:
        return content
    return value if isinstance(value, str) else content


def _last(request: LLMRequest, role: str) -> Message | None:
    return next((m for m in reversed(request.messages) if m.role == role), None)


@dataclass
class BookingAgent:
    """A scripted restaurant agent. ``eager_book``: it calls ``book_table`` on the first turn,
    offered or not; ``double_book``: it emits the booking twice in one reply."""

    eager_book: bool = False
    double_book: bool = False
    requests: list[LLMRequest] = field(default_factory=list)
    _calls: int = 0

    def _call(self, *names: str) -> LLMResponse:
        calls = []
        for name in names:
            self._calls += 1
            calls.append(ToolCall(id=f"call_{self._calls}", name=name, arguments="{}"))
        return LLMResponse(tool_calls=tuple(calls))

    async def generate(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        say = LLMResponse
        offered = {t.name for t in request.tools}
        told = _instructions(request)
        results = []  # the tool results the model has not answered yet
        for message in reversed(request.messages):
            if message.role == "tool":
                results.append(_decoded(message.content))
            elif message.role != "developer" and not message.tool_calls:
                break
        if results:
            if any(r.startswith("booked") for r in results):
                return say(text="You're all booked. Thank you for calling, goodbye!")
            if any(r.startswith("Refused") for r in results):
                return say(text="Sorry, I can't book that just yet.")
        if self.eager_book and len(self.requests) == 1:
            return self._call("book_table")
        if "book_table" in offered:  # the flow offers it once the caller confirmed
            return self._call(*(["book_table"] * (2 if self.double_book else 1)))
        if "Result of availability" in told:
            head = "Good news, that time is free." if "open: yes" in told else "That time is taken."
            if "Booking:" in told:
                booking = told.split("Booking:", 1)[1].split("\n", 1)[0].strip()
                return say(text=f"{head} To confirm: {booking} Shall I book it?")
            return say(text=head)
        if "Read the booking back" in told:
            booking = told.split("Booking:", 1)[1].split("\n", 1)[0].strip()
            return say(text=f"To confirm: {booking} Shall I book it?")
        if "checking" in told:
            return say(text="Let me check that for you, one moment please.")
        if "Thank the caller" in told:
            return say(text="Thank you for calling, goodbye!")
        if "Ask which day and time" in told:
            return say(text="Which day and time would you like?")
        user = _last(request, "user")
        return say(text=f"I heard: {user.content if user else ''}.")
