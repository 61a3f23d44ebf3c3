"""The voice booking flow of ``examples/voice_booking_flow.py``, specified with the testing kit.

Each test is one call, told turn by turn: what the caller says, what the booking system answers
and when, and where the flow must be after each. No network, no sleeps: the lookup waits on
the session's manual clock.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from slateflow import Flow, ManualClock, Resolver, Session, State, fresh
from slateflow.testing import ConversationScript, assert_provenance, fake_fetch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import voice_booking_flow

        yield voice_booking_flow
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.fixture
def flow(example: ModuleType, slate_clock: ManualClock) -> Flow:
    """The example's flow, over its own availability lookup (0.4 s on the manual clock)."""
    built: Flow = example.booking_flow(example.availability(slate_clock))
    return built


@pytest.mark.anyio
async def test_a_taken_time_is_offered_an_alternative_then_booked_once(
    conversation: ConversationScript, flow: Flow
) -> None:
    await conversation.start(flow)
    conversation.expect_step("slot")

    await conversation.say(booking__date="Saturday", booking__time="19:00")
    await conversation.user("A table on Saturday at seven.")
    conversation.expect_step("check")  # the lookup runs in the background meanwhile
    conversation.expect_refused("book_table", "'booking:confirmed' must be true")

    await conversation.advance(0.4)  # the booking system answers: 19:00 is taken
    conversation.expect_step("offer")
    assert conversation.runner.grounds() == ["Alternative on offer: 19:30."]

    await conversation.say(booking__time="19:30", booking__alternative_accepted=True)
    await conversation.user("Half past seven works.")
    conversation.expect_step("confirm")

    await conversation.say(booking__confirmed=True)
    await conversation.user("Yes, that is right.")
    conversation.expect_step("book")
    await conversation.tool_ok("book_table")
    conversation.expect_complete()
    conversation.expect_refused("book_table", "may run only once")


@pytest.mark.anyio
async def test_an_open_time_goes_straight_to_confirmation(
    conversation: ConversationScript, flow: Flow
) -> None:
    await conversation.start(flow)
    await conversation.say(booking__date="Saturday", booking__time="20:00")
    await conversation.advance(0.4)
    conversation.expect_step("confirm")
    assert conversation.runner.verdict("offer") == "pending"

    await conversation.say(booking__confirmed=True)
    await conversation.tool_ok("book_table")
    conversation.expect_complete()
    assert conversation.runner.verdict("offer") == "skipped"
    assert_provenance(conversation.state, "availability:result", source="fetch", mode="background")


@pytest.mark.anyio
async def test_a_failed_lookup_offers_a_transfer_and_books_nothing(
    conversation: ConversationScript, example: ModuleType
) -> None:
    lookup = conversation.use("availability", fake_fetch())  # held until the test answers
    await conversation.start(example.booking_flow(Resolver.fetch("availability", lookup)))
    await conversation.say(booking__date="Saturday", booking__time="19:00")
    await conversation.fail("availability", "booking system unreachable")

    conversation.expect_step("sorry")
    conversation.expect_refused("book_table")
    conversation.expect_admitted("transfer_to_human")
    await conversation.tool_ok("transfer_to_human")
    conversation.expect_done("sorry")
    assert conversation.runner.unmet_requirements() == ["book"]  # nothing was booked


@pytest.mark.anyio
async def test_freshness_follows_the_manual_clock(
    slate_session: Session, slate_state: State, slate_clock: ManualClock
) -> None:
    quote = Resolver.fetch("quote", fake_fetch(returns=42), ttl=10)
    await slate_session.call(quote)
    assert fresh("quote").evaluate(slate_state)
    await slate_clock.advance(9.9)
    assert fresh("quote").evaluate(slate_state)
    await slate_clock.advance(0.2)
    assert not fresh("quote").evaluate(slate_state)
