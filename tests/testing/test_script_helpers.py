"""The conversation script's helpers for barge-in, tool calls and between-turns contexts, and
the kit's promise that nothing awaited in a test hangs on a manual clock nobody moves."""

from __future__ import annotations

import anyio
import pytest

from builders import conversation_on, voice_booking
from slateflow import Conversation, Resolver, Scheduling, Session, State
from slateflow.errors import SessionError, WaitTimeoutError
from slateflow.integrations.tools import Toolbox, tool
from slateflow.resolve import ManualClock
from slateflow.testing import ConversationScript, fake_fetch

pytestmark = pytest.mark.anyio


def book_table_box(clock: ManualClock, booked: list[str], *, delay: float = 0.0) -> Toolbox:
    @tool
    async def book_table(day: str) -> str:
        """Book a table for the caller."""
        if delay:
            await clock.sleep(delay)  # a slow booking system, on the test's manual clock
        booked.append(day)
        return f"booked for {day}"

    return Toolbox(book_table)


async def test_a_tool_sleeping_on_the_manual_clock_finishes_without_anyone_moving_time() -> None:
    clock = ManualClock()
    booked: list[str] = []
    async with conversation_on(clock=clock, tools=["book_table"]) as conversation:
        box = book_table_box(clock, booked, delay=2.0)
        with anyio.fail_after(10):  # a real-time guard only: the wait itself must not hang
            outcome = await box.call(conversation, "book_table", {"day": "Tuesday"})
    assert (outcome.status, outcome.value, booked) == ("done", "booked for Tuesday", ["Tuesday"])
    assert clock.monotonic() == 2.0


async def test_a_tool_slower_than_its_timeout_times_out_on_the_manual_clock() -> None:
    clock = ManualClock()
    booked: list[str] = []
    async with conversation_on(clock=clock, tools=["book_table"]) as conversation:
        box = book_table_box(clock, booked, delay=60.0)
        with anyio.fail_after(10):
            outcome = await box.call(conversation, "book_table", {"day": "Tuesday"})
    assert outcome.status == "timeout"
    assert booked == []
    assert clock.monotonic() == 30.0  # the toolbox's default timeout, jumped to


async def test_a_resolver_called_in_the_test_task_finishes_on_the_manual_clock() -> None:
    clock = ManualClock()
    async with Session(State(clock=clock), clock=clock) as session:
        slow = Resolver.fetch("slow", fake_fetch(returns=7, delay=3.0, clock=clock))
        with anyio.fail_after(10):
            assert await session.call(slow) == 7
    assert clock.monotonic() == 3.0


async def test_a_call_nothing_can_end_fails_naming_the_resolver_instead_of_hanging() -> None:
    clock = ManualClock()
    never = anyio.Event()

    async def stuck(state: State) -> None:
        await never.wait()

    async with Session(State(clock=clock), clock=clock) as session:
        with anyio.fail_after(10), pytest.raises(WaitTimeoutError, match="resolver 'stuck'"):
            await session.call(Resolver.fetch("stuck", stuck))
        assert session.state.get("stuck:status") == "cancelled"


async def test_without_autojump_time_still_waits_for_advance() -> None:
    clock = ManualClock(autojump=False)
    async with Session(State(clock=clock), clock=clock) as session:
        slow = Resolver.fetch("slow", fake_fetch(returns=7, delay=3.0, clock=clock))
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.call, slow)
            await clock.advance(2.9)
            assert session.state.get("slow:status") == "running"
            await clock.advance(0.1)
        assert session.state.get("slow:result") == 7


async def test_the_script_calls_tools_through_the_flow_and_books_once_under_parallel_calls() -> (
    None
):
    clock = ManualClock()
    booked: list[str] = []
    tools = ["book_table", "transfer_to_human"]
    async with conversation_on(clock=clock, tools=tools) as conversation:
        box = book_table_box(clock, booked, delay=0.5)
        script = ConversationScript(conversation, toolbox=box)
        lookup = script.use("availability", fake_fetch())
        await script.start(voice_booking(Resolver.fetch("availability", lookup)))
        early = await script.call_tool("book_table", {"day": "Saturday"})
        assert early.status == "refused"
        assert "Refused" in early.content
        await script.say(booking__date="Saturday", booking__time="19:00", booking__party_size=4)
        await script.resolve("availability", {"open": True})
        await script.say(booking__confirmed=True)
        twice = await script.call_tools(
            ("book_table", {"day": "Saturday"}), ("book_table", {"day": "Saturday"})
        )
        assert [o.status for o in twice] == ["done", "done"]
        assert booked == ["Saturday"]  # identical concurrent calls share one execution
        assert [o.shared for o in twice].count(True) == 1
        script.expect_complete()


async def test_the_script_fails_clearly_when_it_has_no_tools() -> None:
    async with conversation_on() as conversation:
        script = ConversationScript(conversation)
        with pytest.raises(AssertionError, match="use_tools"):
            await script.call_tool("book_table")


async def test_a_result_landing_while_the_caller_talks_over_the_bot_waits_for_their_turn() -> (
    None
):
    clock = ManualClock()
    delivered: list[object] = []
    async with conversation_on(clock=clock, on_delivery=delivered.append) as conversation:
        script = ConversationScript(conversation)
        lookup = fake_fetch()
        script.use("availability", lookup)
        availability = Resolver.fetch("availability", lookup)
        conversation.session.background(
            availability, conversation.deliver, Scheduling.INTERRUPT
        )
        await script.interrupt()
        await script.resolve("availability", {"open": True})
        assert delivered == []  # held while the caller talks
        context = await script.user("is the terrace open?")
        assert delivered == []
        assert any("availability" in line for line in context.all_lines)
        assert not conversation.interrupting


async def test_noise_ends_the_interruption_and_delivers_what_it_held() -> None:
    clock = ManualClock()
    delivered: list[object] = []
    async with conversation_on(clock=clock, on_delivery=delivered.append) as conversation:
        script = ConversationScript(conversation)
        lookup = script.use("availability", fake_fetch())
        conversation.session.background(
            Resolver.fetch("availability", lookup), conversation.deliver, Scheduling.INTERRUPT
        )
        await script.interrupt()
        await script.resolve("availability", {"open": True})
        assert delivered == []
        await script.noise()
        assert len(delivered) == 1
        with pytest.raises(AssertionError, match="interrupt"):
            await script.noise()


async def test_between_turns_tells_what_landed_while_the_line_was_quiet() -> None:
    clock = ManualClock()
    async with conversation_on(clock=clock) as conversation:
        script = ConversationScript(conversation)
        lookup = script.use("availability", fake_fetch())
        await script.user("hello")
        script.agent("Let me check that for you.")
        conversation.session.background(
            Resolver.fetch("availability", lookup), conversation.deliver
        )
        await script.resolve("availability", {"open": True})
        context = await script.between_turns()
        assert script.context is context
        line = script.expect_told("availability")
        assert "open" in line
        assert [t.text for t in conversation.transcript][-1] == "Let me check that for you."


async def test_conversation_of_finds_a_sessions_conversation_and_names_one_without() -> None:
    async with conversation_on() as conversation:
        assert Conversation.of(conversation.session) is conversation
    clock = ManualClock()
    async with Session(State(clock=clock), clock=clock) as session:
        with pytest.raises(SessionError, match="Conversation\\(session\\)"):
            Conversation.of(session)
