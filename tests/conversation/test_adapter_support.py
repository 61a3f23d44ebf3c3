"""What a voice framework adapter relies on from the conversation, so it needs no glue of its
own: a hold that expires when an interruption brings no words, idempotent turns per message
id, a preview that writes nothing, "the call is over" as a property and a wait, a context for
a pushed result, and a between-turns context that waits for a turn in flight."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from builders import booking, conversation_on
from slateflow import Conversation, Resolver, Scheduling, Session, State
from slateflow.errors import WaitTimeoutError
from slateflow.resolve import BackgroundResult, ManualClock
from slateflow.testing import fake_fetch

pytestmark = pytest.mark.anyio


async def landed(
    conversation: Conversation, name: str, scheduling: Scheduling, value: Any = None
) -> None:
    """A background lookup that answers at once has landed for the conversation."""
    answer = fake_fetch(returns=value if value is not None else {"open": True})
    conversation.session.background(
        Resolver.fetch(name, answer), conversation.deliver, scheduling
    )
    await conversation.session.clock.advance(0)  # type: ignore[attr-defined]


# -- a hold expires when the interruption brings no words ----------------------------------


async def test_an_interruption_with_no_words_releases_what_it_held_after_hold_for() -> None:
    pushed: list[BackgroundResult] = []
    waiting: list[BackgroundResult] = []
    clock = ManualClock()
    async with conversation_on(
        clock=clock, on_delivery=pushed.append, on_waiting=waiting.append, hold_for=1.5
    ) as conversation:
        conversation.begin_interruption()
        await landed(conversation, "urgent", Scheduling.INTERRUPT)
        await landed(conversation, "later", Scheduling.WHEN_IDLE)
        conversation.end_interruption()  # a turn should follow ... but none comes
        await clock.advance(1.4)
        assert (pushed, waiting) == ([], [])  # still held for the turn
        await clock.advance(0.1)
        assert [r.name for r in pushed] == ["urgent"]
        assert [r.name for r in waiting] == ["later"]
        assert [r.name for r in conversation.inbox.peek()] == ["later"]


async def test_a_turn_that_comes_in_time_takes_what_the_hold_kept() -> None:
    pushed: list[BackgroundResult] = []
    clock = ManualClock()
    async with conversation_on(
        clock=clock, on_delivery=pushed.append, hold_for=1.0
    ) as conversation:
        conversation.begin_interruption()
        await landed(conversation, "urgent", Scheduling.INTERRUPT)
        conversation.end_interruption()
        context = await conversation.user_turn("sorry, go on")
        assert [d.name for d in context.deliveries] == ["urgent"]
        await clock.advance(5)
        assert pushed == []  # the expired timer found nothing held: nothing twice
        assert clock.pending == 0


async def test_a_new_interruption_restarts_the_hold() -> None:
    pushed: list[BackgroundResult] = []
    clock = ManualClock()
    async with conversation_on(
        clock=clock, on_delivery=pushed.append, hold_for=1.0
    ) as conversation:
        conversation.begin_interruption()
        await landed(conversation, "urgent", Scheduling.INTERRUPT)
        conversation.end_interruption()
        await clock.advance(0.8)
        conversation.begin_interruption()  # talking again: no release meanwhile
        await clock.advance(5)
        assert pushed == []
        conversation.end_interruption()
        await clock.advance(1.0)
        assert [r.name for r in pushed] == ["urgent"]


@pytest.mark.parametrize("hold_for", [0, -1, float("nan"), float("inf"), "2", True])
async def test_a_bad_hold_for_is_refused_naming_it(hold_for: Any) -> None:
    async with Session(State()) as session:
        with pytest.raises(ValueError, match="hold_for"):
            Conversation(session, hold_for=hold_for)


# -- idempotent turns per message id ---------------------------------------------------------


async def test_the_same_message_id_is_one_turn() -> None:
    async with conversation_on() as conversation:
        first = await conversation.user_turn("a table for two", message_id="m1")
        again = await conversation.user_turn("a table for two", message_id="m1")
        assert again is first
        assert conversation.state.get("session:turn") == 1
        assert [t.text for t in conversation.transcript] == ["a table for two"]
        other = await conversation.user_turn("at seven", message_id="m2")
        assert other.turn.number == 2


async def test_a_message_fed_twice_at_once_is_handled_once() -> None:
    async with conversation_on() as conversation:
        contexts: list[Any] = []

        async def feed() -> None:
            contexts.append(await conversation.user_turn("hello", message_id="m1"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            tg.start_soon(feed)
        assert contexts[0] is contexts[1]
        assert conversation.state.get("session:turn") == 1


async def test_a_turn_that_was_not_taken_may_be_fed_again_with_its_id() -> None:
    async with conversation_on() as conversation:
        with anyio.CancelScope() as scope:
            scope.cancel()  # the barge-in cancels the task that runs the turn
            await conversation.user_turn("hello", message_id="m1")
        assert conversation.state.get("session:turn") is None
        context = await conversation.user_turn("hello", message_id="m1")
        assert context.turn.number == 1


async def test_a_bad_message_id_is_refused() -> None:
    async with conversation_on() as conversation:
        with pytest.raises(TypeError, match="message_id"):
            await conversation.user_turn("hi", message_id="")


# -- a preview writes nothing ----------------------------------------------------------------


async def test_a_preview_writes_nothing_and_takes_nothing() -> None:
    async with conversation_on() as conversation:
        conversation.run_flow(booking())
        before = await conversation.user_turn("hello")
        await landed(conversation, "tables", Scheduling.WHEN_IDLE)
        cursor = conversation.state.journal.cursor
        preview = conversation.preview("hmm, let me think")
        assert conversation.state.journal.cursor == cursor  # nothing committed
        assert [r.name for r in conversation.inbox.peek()] == ["tables"]  # nothing taken
        assert before.status == "pending"  # the last context is still pending
        assert [d.name for d in preview.deliveries] == ["tables"]
        preview.handed_over()  # no hand-over: nothing happens
        preview.dropped()
        assert before.status == "pending"


async def test_a_preview_matches_the_turn_when_the_turn_moves_nothing() -> None:
    async with conversation_on(tools=["book_table"]) as conversation:
        conversation.run_flow(booking(grounds=True))
        await conversation.user_turn("hello")
        preview = conversation.preview("hmm")
        actual = await conversation.user_turn("hmm")
        assert (preview.all_lines, preview.lines, preview.tools) == (
            actual.all_lines,
            actual.lines,
            actual.tools,
        )


async def test_a_preview_differs_from_a_turn_that_moves_the_flow() -> None:
    async with conversation_on() as conversation:
        conversation.run_flow(booking())
        await conversation.user_turn("hello")
        preview = conversation.preview("two of us")
        conversation.state.set("b:size", 2, source="extraction")  # what an extractor read
        actual = await conversation.user_turn("two of us")
        assert preview.postures != actual.postures


# -- the call is over ------------------------------------------------------------------------


async def test_the_call_is_over_once_the_goodbye_was_handed_over() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        assert not conversation.is_over  # no flow yet
        conversation.run_flow(booking())
        state.update({"b:size": 2, "b:ok": True, "b:booked": True})
        assert not conversation.is_over
        async with anyio.create_task_group() as tg:
            over: list[bool] = []

            async def hang_up() -> None:
                await conversation.wait_over()
                over.append(True)

            tg.start_soon(hang_up)
            await conversation.session.clock.advance(0)  # type: ignore[attr-defined]
            assert over == []
            await conversation.user_turn("great, thanks")  # the goodbye turn
        assert conversation.is_over
        assert over == [True]
        await conversation.wait_over()  # already over: returns at once


async def test_waiting_for_the_end_of_a_call_that_never_ends_times_out_naming_the_flow() -> None:
    async with conversation_on() as conversation:
        conversation.run_flow(booking())
        with pytest.raises(WaitTimeoutError, match="'booking'"):
            await conversation.wait_over(timeout=3)


# -- a context for a pushed result -----------------------------------------------------------


async def test_a_context_for_a_pushed_result_carries_it_and_a_drop_returns_it() -> None:
    pushed: list[BackgroundResult] = []
    async with conversation_on(on_delivery=pushed.append) as conversation:
        await landed(conversation, "urgent", Scheduling.INTERRUPT)
        (result,) = pushed
        context = conversation.context_for(result)
        assert [d.name for d in context.deliveries] == ["urgent"]
        assert any(line.startswith("Result of urgent") for line in context.lines)
        context.dropped()  # the bot was cut off before it said it
        assert [r.name for r in conversation.inbox.peek()] == ["urgent"]
        with pytest.raises(TypeError, match="BackgroundResult"):
            conversation.context_for("urgent")  # type: ignore[arg-type]


# -- a between-turns context waits for a turn in flight ---------------------------------------


async def test_a_between_turns_context_waits_for_the_turn_in_flight() -> None:
    clock = ManualClock()
    async with conversation_on(clock=clock) as conversation:
        release = anyio.Event()

        class Slow:
            name = "slow"

            async def on_turn(self, conversation: Any, turn: Any) -> None:
                await release.wait()

            async def on_tool(self, conversation: Any, tool: str) -> None:
                return None

            async def on_step_change(self, conversation: Any, since: int) -> None:
                return None

        conversation.add_extractor(Slow())
        order: list[str] = []

        async def turn() -> None:
            await conversation.user_turn("hello")
            order.append("turn")

        async def between() -> None:
            context = await conversation.context_between_turns()
            order.append(f"between after turn {context.turn.number}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(turn)
            await clock.advance(0)
            tg.start_soon(between)
            await clock.advance(0)
            assert order == []  # the turn holds it
            release.set()
        assert order == ["turn", "between after turn 1"]
