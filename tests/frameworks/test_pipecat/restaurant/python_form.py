"""pipecat Flows' restaurant reservation in its Python form (the shape of pipecat's own
example): nodes made by functions, each tool returning its result and the next node."""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat.flows import FlowManager, NodeConfig
from restaurant.tools import BOOKED, CHECK_SECONDS, OPEN

ROLE = (
    "You are a restaurant reservation assistant for La Maison, an upscale French restaurant. "
    "Be casual and friendly. This is a voice conversation, so avoid special characters and emojis."
)


async def collect_party_size(
    flow_manager: FlowManager, size: int
) -> tuple[dict[str, Any], NodeConfig]:
    """Record the number of people in the party.

    Args:
        size (int): Number of people in the party. Must be between 1 and 12.
    """
    flow_manager.state["party_size"] = size
    return {"size": size, "status": "success"}, time_node()


async def check_availability(
    flow_manager: FlowManager, time: str, party_size: int
) -> tuple[dict[str, Any], NodeConfig]:
    """Check availability for requested time.

    Args:
        time (str): Requested reservation time in "HH:MM AM/PM" format, 5 PM to 10 PM.
        party_size (int): Number of people in the party.
    """
    await asyncio.sleep(CHECK_SECONDS)  # the reservation system's latency
    free = time not in BOOKED
    others = [t for t in OPEN if t not in BOOKED]
    result = {"time": time, "available": free, "alternative_times": [] if free else others}
    return result, confirm_node() if free else no_availability_node(others)


async def end_conversation(flow_manager: FlowManager) -> tuple[None, NodeConfig]:
    """End the conversation."""
    return None, end_node()


def initial_node() -> NodeConfig:
    return NodeConfig(
        name="initial",
        role_message=ROLE,
        task_messages=[{"role": "developer", "content": (
            "Warmly greet the customer and ask how many people are in their party. This is "
            "your only job for now; if the customer asks for something else, politely remind "
            "them you can't do it.")}],
        functions=[collect_party_size],
    )  # fmt: skip


def time_node() -> NodeConfig:
    return NodeConfig(
        name="get_time",
        task_messages=[{"role": "developer", "content":
                        "Ask what time they'd like to dine. Restaurant is open 5 PM to 10 PM."}],
        functions=[check_availability],
    )  # fmt: skip


def confirm_node() -> NodeConfig:
    return NodeConfig(
        name="confirm",
        task_messages=[{"role": "developer", "content": (
            "Confirm the reservation details and ask if they need anything else. When the "
            "customer says they're all set, call end_conversation.")}],
        functions=[end_conversation],
    )  # fmt: skip


def no_availability_node(alternatives: list[str]) -> NodeConfig:
    return NodeConfig(
        name="no_availability",
        task_messages=[{"role": "developer", "content": (
            "Apologize that the requested time is not available and suggest these alternative "
            f"times: {', '.join(alternatives)}. If they pick one, check its availability. If "
            "they'd rather not book, call end_conversation.")}],
        functions=[check_availability, end_conversation],
    )  # fmt: skip


def end_node() -> NodeConfig:
    return NodeConfig(
        name="end",
        task_messages=[{"role": "developer", "content": "Thank them and end the conversation."}],
        functions=[],
        post_actions=[{"type": "end_conversation"}],
    )
