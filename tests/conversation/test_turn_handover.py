"""What the model was told, and when: the two-phase hand-over of a turn context, the steps whose
postures reached the model (``told``), the confirmation idiom built on it, redelivery, what
the agent actually said, results that wait, and interruptions followed by the caller's turn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from builders import ASK, READ_BACK, conversation_on, session_on
from builders import booking as shared_booking
from slateflow import (
    Conversation,
    Digression,
    Flow,
    FlowStack,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    captured,
    is_set,
    is_true,
    told,
)
from slateflow.conversation import Extract, integer_near, one_of, true_only, yes_no
from slateflow.errors import SessionError, WaitTimeoutError
from slateflow.resolve import BackgroundResult
from slateflow.testing import fake_fetch

pytestmark = pytest.mark.anyio


def booking() -> Flow:
    return shared_booking(terminal_book=True, book_posture="Book it.")


def slot() -> Any:
    return Extract("b").field("size", integer_near(["people", "for"])).build()


def confirmation() -> Any:
    """The docs' idiom: a yes confirms only once the read-back reached the model."""
    return (
        Extract("answer")
        .field_to("yes", "b:ok", yes_no(), true_only().accept_when(told("confirm")))
        .build()
    )


async def open_call(state: State, **options: Any) -> tuple[Conversation, Any]:
    session = await Session(state, clock=ManualClock()).start()
    conversation = Conversation(session, **options)
    conversation.add_extractor(slot())
    conversation.add_extractor(confirmation())
    return conversation, conversation.run_flow(booking())


# -- the confirmation idiom ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "said", ["Four people at 7 pm, please", "yes, four people", "Four people. Yes!"]
)
async def test_a_yes_in_the_slot_turn_never_confirms_the_booking(said: str) -> None:
    state = State()
    conversation, runner = await open_call(state)
    session = conversation.session
    try:
        ctx = await conversation.user_turn(said)
        assert runner.active_steps == ["confirm"]
        assert ctx.postures == (READ_BACK,)
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert "b:ok" not in state
        assert runner.told_steps == []
    finally:
        await session.aclose()


async def test_the_booking_is_confirmed_only_by_a_yes_after_the_read_back_was_handed_over() -> None:
    state = State()
    conversation, runner = await open_call(state)
    session = conversation.session
    try:
        read_back = await conversation.user_turn("four people")
        assert read_back.status == "pending"
        assert not told("confirm").evaluate(state)
        read_back.handed_over()
        assert read_back.status == "handed_over"
        assert state.get("flow:booking:told") == ["confirm"]
        assert told("confirm").evaluate(state)
        assert told("confirm", "booking").evaluate(state)
        assert not told("confirm", "other").evaluate(state)
        await conversation.user_turn("yes, that's right")
        assert state.get("b:ok") is True
        assert runner.active_steps == []
        assert runner.is_complete
    finally:
        await session.aclose()


async def test_building_the_next_turn_counts_the_last_context_as_handed_over() -> None:
    # A simple loop never confirms: the next turn does it, before its words are read.
    state = State()
    conversation, _ = await open_call(state)
    session = conversation.session
    try:
        await conversation.user_turn("four people")
        await conversation.user_turn("yes please")
        assert state.get("b:ok") is True
    finally:
        await session.aclose()


async def test_a_step_entered_while_the_caller_talked_then_a_digression_is_never_told() -> None:
    state = State()
    faq = Flow("faq", [Step("answer", terminal=True, posture="Parking is free.")])
    session = await Session(state, clock=ManualClock()).start()
    conversation = Conversation(session)
    try:
        conversation.add_extractor(slot())
        conversation.add_extractor(confirmation())
        conversation.add_extractor(
            Extract("topic").field_to("parking", "turn:parking", one_of(["parking"])).build()
        )
        stack = conversation.run_flow(
            FlowStack(booking(), [Digression("parking", is_set("turn:parking"), faq)])
        )
        entered = await conversation.user_turn("we are four people")
        entered.dropped()  # the caller talked over the read-back: it never reached the model
        assert entered.status == "dropped"
        detour = await conversation.user_turn("is there parking?")
        assert stack.overlay == "parking"
        assert detour.postures == ("Parking is free.",)
        back = await conversation.user_turn("yes")  # answers the parking line: no read-back yet
        assert "b:ok" not in state
        assert stack.overlay is None
        assert back.postures == (READ_BACK,)  # the main flow takes over: now it is asked
        await conversation.user_turn("yes, book it")  # and this yes answers it
        assert state.get("b:ok") is True
    finally:
        await session.aclose()


async def test_told_is_cleared_when_the_step_is_entered_again() -> None:
    from slateflow import reset

    state = State()
    plan = Flow(
        "booking",
        [
            Step("ask", done=captured("b:size"), posture=ASK),
            Step("confirm", after=["ask"], done=is_true("b:ok"), posture=READ_BACK),
            Step("book", after=["confirm"], terminal=True),
        ],
        constraints=[reset("ask").when(is_true("b:changed"))],
    )
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(plan)
        state.set("b:size", 4)
        conversation.context_now().handed_over()
        assert runner.told_steps == ["confirm"]
        state.set("b:changed", True)  # the caller changed their mind: asked again
        assert runner.told_steps == []
        assert state.get("flow:booking:told") == []


async def test_told_round_trips_as_json_and_explains_itself() -> None:
    from slateflow.flow import Guard

    guard = told("confirm", "booking")
    assert Guard.from_json(guard.to_json()) == guard
    assert Guard.from_json(told("confirm").to_json()) == told("confirm")
    assert "'confirm'" in guard.describe()
    assert guard.keys_read() == frozenset({"flow:booking:told"})


async def test_a_flow_step_can_wait_for_its_own_question_to_be_told() -> None:
    state = State()
    plan = Flow(
        "booking",
        [
            Step("ask", done=captured("b:size"), posture=ASK),
            Step(
                "confirm",
                after=["ask"],
                done=is_true("b:ok") & told("confirm"),
                posture=READ_BACK,
            ),
            Step("book", after=["confirm"], terminal=True),
        ],
    )
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(plan)
        state.update({"b:size": 4, "b:ok": True})  # a yes heard before the question
        assert runner.active_steps == ["confirm"]
        conversation.context_now().handed_over()
        assert runner.is_complete


# -- the hand-over ------------------------------------------------------------------------------


async def lookup_session(**options: Any) -> tuple[Conversation, State, Any]:
    state = State()
    session = await Session(state, clock=ManualClock()).start()
    conversation = Conversation(session, **options)
    fetch = fake_fetch(returns={"free": 2})
    session.background(Resolver.fetch("tables", fetch), conversation.deliver)
    await session.clock.advance(0)  # type: ignore[attr-defined]
    return conversation, state, fetch


async def test_a_dropped_context_gives_its_results_back_for_the_next_one() -> None:
    conversation, _, _ = await lookup_session()
    session = conversation.session
    try:
        first = conversation.context_now()
        assert [d.name for d in first.deliveries] == ["tables"]
        assert len(conversation.inbox) == 0  # taken, pending
        first.dropped()
        second = conversation.context_now()
        assert [d.name for d in second.deliveries] == ["tables"]
        assert second.lines == first.lines  # nothing of the dropped one counts as said
        second.handed_over()
        third = conversation.context_now()
        assert third.deliveries == ()
        assert not any("tables" in line for line in third.lines)
    finally:
        await session.aclose()


async def test_explicit_handover_drops_what_the_loop_did_not_confirm() -> None:
    conversation, _, _ = await lookup_session(handover="explicit")
    session = conversation.session
    try:
        first = await conversation.user_turn("hello")
        assert [d.name for d in first.deliveries] == ["tables"]
        second = await conversation.user_turn("hello?")  # first was never confirmed
        assert first.status == "dropped"
        assert [d.name for d in second.deliveries] == ["tables"]
        second.handed_over()
        assert (await conversation.user_turn("ok")).deliveries == ()
    finally:
        await session.aclose()


async def test_a_context_is_settled_once() -> None:
    conversation, _, _ = await lookup_session()
    session = conversation.session
    try:
        ctx = conversation.context_now()
        ctx.handed_over()
        ctx.handed_over()  # idempotent
        with pytest.raises(SessionError, match="already handed over"):
            ctx.dropped()
        other = conversation.context_now()
        other.dropped()
        with pytest.raises(SessionError, match="already dropped"):
            other.handed_over()
    finally:
        await session.aclose()


async def test_full_prompt_has_every_line_and_prompt_only_the_new_ones() -> None:
    async with conversation_on() as conversation:
        conversation.run_flow(booking())
        first = await conversation.user_turn("hi")
        again = await conversation.user_turn("hmm")
        assert again.prompt == ""  # nothing new: an appending loop adds nothing
        assert again.full_prompt == first.full_prompt  # a replacing loop sends all of it
        assert again.full_prompt.splitlines()[0] == ASK


async def test_a_result_the_bot_was_cut_off_from_saying_is_redelivered() -> None:
    pushed: list[BackgroundResult] = []
    state = State()
    async with session_on(state) as session:
        conversation = Conversation(session, on_delivery=pushed.append)
        session.background(
            Resolver.fetch("tables", fake_fetch(returns={"free": 2})),
            conversation.deliver,
            scheduling="interrupt",
        )
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert [r.name for r in pushed] == ["tables"]
        conversation.begin_interruption()  # the bot was cut off while saying it
        conversation.redeliver(pushed[0])
        conversation.end_interruption()
        ctx = await conversation.user_turn("sorry, what?")
        assert [d.name for d in ctx.deliveries] == ["tables"]
        ctx.handed_over()
        assert (await conversation.user_turn("ok")).deliveries == ()
        with pytest.raises(TypeError, match="BackgroundResult"):
            conversation.redeliver("tables")  # type: ignore[arg-type]


async def test_what_the_agent_said_joins_the_transcript_and_confirms_its_context() -> None:
    state = State()
    conversation, runner = await open_call(state)
    session = conversation.session
    try:
        ctx = await conversation.user_turn("four people, card 4111 1111 1111 1111")
        line = conversation.agent_said("Four people, is that right? Card ending 1111.")
        assert ctx.status == "handed_over"
        assert runner.told_steps == ["confirm"]
        assert line.speaker == "agent"
        assert line.number == 1
        assert [(t.speaker, t.number) for t in conversation.transcript] == [
            ("user", 1),
            ("agent", 1),
        ]
        await conversation.user_turn("yes")  # extractors read the caller's words only
        assert state.get("b:ok") is True
        assert [t.speaker for t in conversation.transcript] == ["user", "agent", "user"]
    finally:
        await session.aclose()


async def test_extractors_never_read_what_the_agent_said() -> None:
    seen: list[Any] = []
    async with conversation_on() as conversation:
        conversation.add_extractor(
            Extract("size").field("n", integer_near(["people"])).window(3).build()
        )
        conversation.add_extractor(
            Extract("probe").field("x", _Probe(seen.append)).window(3).build()
        )
        await conversation.user_turn("hello")
        conversation.agent_said("For how many people?")
        await conversation.user_turn("four people")
        assert seen[-1] == "hello four people"


class _Probe:
    def __new__(cls, see: Any) -> Any:
        from slateflow.conversation import Recognition, Recognizer

        class Probe(Recognizer):
            def recognize(self, text: str) -> Recognition | None:
                see(text)
                return None

            def describe(self) -> str:
                return "a probe"

        return Probe()


# -- results that wait ---------------------------------------------------------------------------


async def test_the_loop_is_told_when_a_result_waits_between_turns() -> None:
    waiting: list[str] = []
    fetch = fake_fetch()
    async with session_on() as session:
        conversation = Conversation(session, on_waiting=lambda r: waiting.append(r.name))
        session.background(Resolver.fetch("tables", fetch), conversation.deliver)
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert waiting == []
        fetch.complete({"free": 2})
        found = await conversation.wait_for_delivery(timeout=5)
        assert [r.name for r in found] == ["tables"]
        assert waiting == ["tables"]
        assert [d.name for d in conversation.context_now().deliveries] == ["tables"]


async def test_waiting_for_a_delivery_times_out_on_the_session_clock() -> None:
    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("tables", fake_fetch()), conversation.deliver)
        with pytest.raises(WaitTimeoutError, match="running: tables"):
            await conversation.wait_for_delivery(timeout=3)
        assert clock.monotonic() == 3  # the manual clock jumped, nobody hung


async def test_a_silent_result_does_not_wake_the_loop() -> None:
    waiting: list[str] = []
    async with session_on() as session:
        conversation = Conversation(session, on_waiting=lambda r: waiting.append(r.name))
        session.background(
            Resolver.fetch("log", fake_fetch(returns=1)), conversation.deliver, scheduling="silent"
        )
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert waiting == []
        with pytest.raises(WaitTimeoutError):
            await conversation.wait_for_delivery(timeout=1)


# -- interruptions -------------------------------------------------------------------------------


@asynccontextmanager
async def interrupt_lookup() -> AsyncIterator[tuple[Conversation, Any, list[str]]]:
    """A session whose 'tables' lookup (interrupt scheduling, held until the test answers) is
    in flight; yields the session, the fake and the names spoken at once (on_delivery)."""
    pushed: list[str] = []
    fetch = fake_fetch()
    async with session_on() as session:
        conversation = Conversation(session, on_delivery=lambda r: pushed.append(r.name))
        session.background(
            Resolver.fetch("tables", fetch), conversation.deliver, scheduling="interrupt"
        )
        await session.clock.advance(0)  # type: ignore[attr-defined]
        yield conversation, fetch, pushed


async def test_a_result_held_during_an_interruption_goes_into_the_callers_turn() -> None:
    async with interrupt_lookup() as (conversation, fetch, pushed):
        session = conversation.session
        conversation.begin_interruption()
        fetch.complete({"free": 2})
        await session.clock.advance(0)  # type: ignore[attr-defined]
        conversation.end_interruption()
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert pushed == []  # the model does not answer twice
        ctx = await conversation.user_turn("do you have a table?")
        assert [d.name for d in ctx.deliveries] == ["tables"]
        assert any(
            line.startswith("Result of") and "(tell the caller now)" in line for line in ctx.lines
        )
        assert pushed == []


async def test_a_result_landing_after_the_interruption_but_before_the_turn_waits_too() -> None:
    async with interrupt_lookup() as (conversation, fetch, pushed):
        session = conversation.session
        conversation.begin_interruption()
        conversation.end_interruption()  # the caller's words are being transcribed
        fetch.complete({"free": 2})
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert pushed == []
        ctx = await conversation.user_turn("one more thing")
        assert [d.name for d in ctx.deliveries] == ["tables"]
        # After that turn, interrupt results are spoken at once again.
        session.background(
            Resolver.fetch("menu", fake_fetch(returns=1)), conversation.deliver, "interrupt"
        )
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert pushed == ["menu"]


async def test_a_false_alarm_speaks_the_held_result_at_once() -> None:
    async with interrupt_lookup() as (conversation, fetch, pushed):
        session = conversation.session
        conversation.begin_interruption()
        fetch.complete({"free": 2})
        await session.clock.advance(0)  # type: ignore[attr-defined]
        conversation.end_interruption(turn_follows=False)  # a cough
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert pushed == ["tables"]
        assert (await conversation.user_turn("sorry")).deliveries == ()


async def test_a_context_dropped_by_an_interruption_loses_nothing() -> None:
    fetch = fake_fetch()
    async with session_on() as session:
        conversation = Conversation(session)
        conversation.add_extractor(slot())
        runner = conversation.run_flow(booking())
        session.background(Resolver.fetch("tables", fetch), conversation.deliver)
        await session.clock.advance(0)  # type: ignore[attr-defined]
        fetch.complete({"free": 2})
        ctx = await conversation.user_turn("hi")
        assert [d.name for d in ctx.deliveries] == ["tables"]
        conversation.begin_interruption()  # barge-in before the model got it
        ctx.dropped()
        conversation.end_interruption()
        again = await conversation.user_turn("four people")
        assert [d.name for d in again.deliveries] == ["tables"]
        assert runner.active_steps == ["confirm"]


async def test_a_loop_waiting_for_a_result_wakes_when_it_lands() -> None:
    fetch = fake_fetch()
    async with session_on() as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("tables", fetch), conversation.deliver)
        await session.clock.advance(0)  # type: ignore[attr-defined]
        found: list[list[BackgroundResult]] = []
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                found.append(await conversation.wait_for_delivery())

            tg.start_soon(wait)
            await session.clock.advance(0)  # type: ignore[attr-defined]
            assert found == []
            fetch.complete({"free": 1})
        assert [r.name for r in found[0]] == ["tables"]


async def test_a_loop_is_not_woken_for_results_held_for_the_callers_coming_turn() -> None:
    waiting: list[str] = []
    fetch = fake_fetch()
    async with session_on() as session:
        conversation = Conversation(session, on_waiting=lambda r: waiting.append(r.name))
        session.background(Resolver.fetch("tables", fetch), conversation.deliver)
        await session.clock.advance(0)  # type: ignore[attr-defined]
        conversation.begin_interruption()
        fetch.complete({"free": 2})
        conversation.end_interruption()  # their words come next
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert waiting == []  # a context_now() now would answer before the caller is heard
        ctx = await conversation.user_turn("is there a table?")
        assert [d.name for d in ctx.deliveries] == ["tables"]
        assert waiting == []


# -- a digression's answer must be told before it gives the floor back --------------------------

WHERE = "We are at 12 Harbour Street."


def where_stack() -> FlowStack:
    address = Flow("address", [Step("answer", terminal=True, posture=WHERE)])
    return FlowStack(booking(), [Digression("address", is_set("turn:where"), address)])


def where_extractor() -> Any:
    return Extract("where").field_to("where", "turn:where", one_of(["where"])).build()


@pytest.mark.parametrize("lost", ["dropped", "superseded"])
async def test_a_digression_keeps_the_floor_until_its_answer_was_told(lost: str) -> None:
    async with conversation_on(handover="explicit") as conversation:
        conversation.add_extractor(where_extractor())
        stack = conversation.run_flow(where_stack())
        asked = await conversation.user_turn("where are you?")
        assert asked.postures == (WHERE,)
        if lost == "dropped":
            asked.dropped()  # the reply was cancelled before the model spoke
        # "superseded": two messages fed in one reply; building the next context drops it
        again = await conversation.user_turn("four people")
        assert stack.overlay == "address"  # the question is not lost ...
        assert again.postures == (WHERE,)  # ... its answer is said again
        again.handed_over()
        assert conversation.state.get("flow:address:told") == ["answer"]
        back = await conversation.user_turn("ok")
        assert stack.overlay is None  # told: now it gives the floor back
        assert back.postures != (WHERE,)


async def test_with_the_default_handover_a_digression_told_once_closes_at_the_next_turn() -> None:
    async with conversation_on() as conversation:
        conversation.add_extractor(where_extractor())
        stack = conversation.run_flow(where_stack())
        await conversation.user_turn("where are you?")
        await conversation.user_turn("thanks")  # the loop moved on: the answer was used
        assert stack.overlay is None


async def test_a_second_question_before_the_first_answer_was_told_gets_both_answers() -> None:
    parking = Flow("parking", [Step("answer", terminal=True, posture="Parking is free.")])
    address = Flow("address", [Step("answer", terminal=True, posture=WHERE)])
    stack = FlowStack(
        booking(),
        [
            Digression("address", is_set("turn:where"), address),
            Digression("parking", is_set("turn:parking"), parking),
        ],
    )
    async with conversation_on(handover="explicit") as conversation:
        conversation.add_extractor(where_extractor())
        conversation.add_extractor(
            Extract("topic").field_to("parking", "turn:parking", one_of(["parking"])).build()
        )
        runner = conversation.run_flow(stack)
        asked = await conversation.user_turn("where are you?")
        asked.dropped()  # cut off before the address was said
        both = await conversation.user_turn("and is there parking?")
        assert runner.overlay == "parking"
        assert both.postures == (WHERE, "Parking is free.")  # neither question is lost
        both.handed_over()
        after = await conversation.user_turn("great")
        assert runner.overlay is None
        assert WHERE not in after.postures
