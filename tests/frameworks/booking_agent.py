"""The booking call the voice-framework tests run: the demo's booking flow, its extractors, a
``book_table`` tool that counts bookings, and the scripted model of the examples
(``examples/booking_parts.py``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slateflow import Resolver, active, told
from slateflow.demo_flow import booking_flow
from slateflow.integrations.tools import Toolbox, tool
from slateflow.testing import Fake, fake_fetch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from booking_parts import BookingAgent, listeners

__all__ = ["Booking", "BookingAgent"]

TOOLS = ("book_table", "transfer_to_human")


@dataclass
class Booking:
    """One call's parts: the flow, the lookup the test answers, the tools and extractors."""

    lookup: Fake = field(default_factory=fake_fetch)
    booked: list[dict[str, Any]] = field(default_factory=list)
    answers_when: str = "active"
    """When a yes counts: while its step is ``"active"``, or once its question was ``"told"``."""

    def flow(self) -> Any:
        return booking_flow(Resolver.fetch("availability", self.lookup), mode="background")

    def toolbox(self) -> Toolbox:
        booked = self.booked

        @tool
        async def book_table(date: str = "", time: str = "") -> str:
            """Book the table the caller confirmed."""
            booked.append({"date": date, "time": time})
            return f"booked (reference R-{len(booked)})"

        @tool
        def transfer_to_human() -> str:
            """Hand the call to a person."""
            return "transferring"

        return Toolbox(book_table, transfer_to_human)

    def extractors(self) -> list[Any]:
        return listeners(told if self.answers_when == "told" else active)
