"""The voice booking flow of ``examples/voice_booking_flow.py``, specified with the testing kit.

Each test is one call, told turn by turn: what the caller says, what the booking system answers
and when, and where the flow must be after each. No network, no sleeps: the lookup waits on
the session's manual clock.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from builders import example_module
from slateflow import Flow, ManualClock, Resolver, Session, State, fresh
from slateflow.testing import ConversationScript, assert_provenance, fake_fetch


@pytest.fixture(scope="module")
def voice_booking_flow() -> ModuleType:
    return example_module("voice_booking_flow")


@pytest.fixture
def flow(voice_booking_flow: ModuleType, slate_clock: ManualClock) -> Flow:
    """The example's flow, over its own availability lookup (0.4 s on the manual clock)."""
    built: Flow = voice_booking_flow.booking_flow(voice_booking_flow.availability(slate_clock))
    return built


@pytest.mark.anyio
async def test_a_taken_time_is_offered_an_alternative_then_booked_once(
    slate_script: ConversationScript, flow: Flow
) -> None:
    await slate_script.start(flow)
    slate_script.expect_step("slot")

    await slate_script.say(booking__date="Saturday", booking__time="19:00")
    await slate_script.user("A table on Saturday at seven.")
    slate_script.expect_step("check")  # the lookup runs in the background meanwhile
    slate_script.expect_refused("book_table", "'booking:confirmed' must be true")

    await slate_script.advance(0.4)  # the booking system answers: 19:00 is taken
    slate_script.expect_step("offer")
    assert list(slate_script.runner.brief().grounds) == ["Alternative on offer: 19:30."]

    await slate_script.say(booking__time="19:30", booking__alternative_accepted=True)
    await slate_script.user("Half past seven works.")
    slate_script.expect_step("confirm")

    await slate_script.say(booking__confirmed=True)
    await slate_script.user("Yes, that is right.")
    slate_script.expect_step("book")
    await slate_script.tool_ok("book_table")
    slate_script.expect_complete()
    slate_script.expect_refused("book_table", "may run only once")


@pytest.mark.anyio
async def test_an_open_time_goes_straight_to_confirmation(
    slate_script: ConversationScript, flow: Flow
) -> None:
    await slate_script.start(flow)
    await slate_script.say(booking__date="Saturday", booking__time="20:00")
    await slate_script.advance(0.4)
    slate_script.expect_step("confirm")
    assert slate_script.runner.verdict("offer") == "pending"

    await slate_script.say(booking__confirmed=True)
    await slate_script.tool_ok("book_table")
    slate_script.expect_complete()
    assert slate_script.runner.verdict("offer") == "skipped"
    assert_provenance(slate_script.state, "availability:result", source="fetch", mode="background")


@pytest.mark.anyio
async def test_a_failed_lookup_offers_a_transfer_and_books_nothing(
    slate_script: ConversationScript, voice_booking_flow: ModuleType
) -> None:
    lookup = slate_script.use("availability", fake_fetch())  # held until the test answers
    await slate_script.start(
        voice_booking_flow.booking_flow(Resolver.fetch("availability", lookup))
    )
    await slate_script.say(booking__date="Saturday", booking__time="19:00")
    await slate_script.fail("availability", "booking system unreachable")

    slate_script.expect_step("sorry")
    slate_script.expect_refused("book_table")
    slate_script.expect_admitted("transfer_to_human")
    await slate_script.tool_ok("transfer_to_human")
    slate_script.expect_done("sorry")
    assert list(slate_script.runner.brief().unmet) == ["book"]  # nothing was booked


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
