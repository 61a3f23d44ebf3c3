"""The tools of pipecat Flows' restaurant reservation in its YAML form: direct functions, the
next node chosen by the config from the ``status`` they report."""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat.flows import TRANSITION_IN_YAML, FlowManager

BOOKED = {"7:00 PM", "8:00 PM"}
OPEN = ["5:00 PM", "6:00 PM", "7:00 PM", "8:00 PM", "9:00 PM", "10:00 PM"]
CHECK_SECONDS = 0.5


async def collect_party_size(flow_manager: FlowManager, size: int) -> tuple[dict[str, Any], Any]:
    """Record the number of people in the party.

    Args:
        size (int): Number of people in the party. Must be between 1 and 12.
    """
    flow_manager.state["party_size"] = size
    return {"size": size, "status": "success"}, TRANSITION_IN_YAML


async def check_availability(
    flow_manager: FlowManager, time: str, party_size: int
) -> tuple[dict[str, Any], Any]:
    """Check availability for requested time.

    Args:
        time (str): Requested reservation time in "HH:MM AM/PM" format, 5 PM to 10 PM.
        party_size (int): Number of people in the party.
    """
    await asyncio.sleep(CHECK_SECONDS)  # the reservation system's latency
    free = time not in BOOKED
    others = [t for t in OPEN if t not in BOOKED]
    status = "available" if free else "unavailable"
    result = {"time": time, "status": status, "alternative_times": [] if free else others}
    return result, TRANSITION_IN_YAML


async def end_conversation(flow_manager: FlowManager) -> tuple[None, Any]:
    """End the conversation."""
    return None, TRANSITION_IN_YAML
