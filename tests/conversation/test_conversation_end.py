"""The end of a call told truthfully: after a terminating digression the explanation shows no
active step and every tool refused, observe mode audits what was called after the end, and
"the call is over" comes only once the goodbye was handed to the model."""

from __future__ import annotations

from typing import Any

import pytest

from builders import booking as shared_booking
from builders import conversation_on, session_on
from slateflow import (
    Conversation,
    Digression,
    Flow,
    FlowStack,
    State,
    Step,
    is_true,
)
from slateflow.flow import OVER_KEY, signals

pytestmark = pytest.mark.anyio

TOOLS = ["book_table", "transfer"]


def booking() -> Flow:
    return shared_booking(confirm=None, ask_tools=("transfer",))


def stack() -> FlowStack:
    cancel = Flow("cancel", [Step("farewell", terminal=True, posture="Say goodbye.")])
    return FlowStack(booking(), [Digression("cancel", is_true("turn:cancel"), cancel, "terminate")])


async def terminated(conversation: Conversation, **options: Any) -> Any:
    runner = conversation.run_flow(stack(), **options)
    conversation.state.set("turn:cancel", True)
    ctx = await conversation.user_turn("cancel it")
    return runner, ctx


async def test_after_termination_explain_shows_no_active_step_and_every_tool_refused() -> None:
    async with conversation_on(tools=TOOLS) as conversation:
        runner, _ = await terminated(conversation)
        await conversation.user_turn("bye")
        why = runner.explain()
        assert why.terminated == "cancel"
        assert why.active == ()
        assert why.allowed_tools == ()
        assert set(why.blocked_tools) >= set(TOOLS)
        assert all("digression 'cancel' terminated it" in r for r in why.blocked_tools.values())
        assert "terminated by digression 'cancel'" in str(why)
        assert runner.admit("transfer").allowed is False


async def test_in_observe_mode_a_tool_called_after_the_end_is_recorded_as_a_violation() -> None:
    async with conversation_on(tools=TOOLS) as conversation:
        runner, _ = await terminated(conversation, enforcement="observe")
        admission = runner.admit("book_table")
        assert admission.allowed
        assert admission.violation
        (violation,) = runner.main.violations
        assert violation.tool == "book_table"
        assert "terminated" in violation.reason


async def test_in_explicit_handover_the_call_is_over_only_once_the_goodbye_was_confirmed() -> None:
    ended: list[str] = []

    def hang_up(sender: Any, flow: str) -> None:
        ended.append(flow)

    signals.flow_over.connect(hang_up)
    try:
        async with session_on() as session:
            conversation = Conversation(session, tools=TOOLS, handover="explicit")
            runner, goodbye = await terminated(conversation)
            assert runner.is_terminated  # already true on the goodbye turn ...
            assert not runner.is_over  # ... but the goodbye has not reached the model
            assert session.state.get(OVER_KEY) is False
            assert goodbye.postures == ("Say goodbye.",)
            goodbye.handed_over()
            assert runner.is_over
            assert session.state.get(OVER_KEY) is True
            assert ended == ["booking"]
    finally:
        signals.flow_over.disconnect(hang_up)


async def test_a_plain_flow_is_over_when_its_closing_words_are_handed_over() -> None:
    state = State()
    async with conversation_on(state, handover="explicit") as conversation:
        runner = conversation.run_flow(booking())
        state.update({"b:size": 2, "b:booked": True})
        assert runner.is_complete
        assert not runner.is_over
        closing = conversation.context_now()
        assert closing.postures == ("Thank them and say goodbye.",)
        closing.dropped()  # the caller talked over it: not over yet
        assert not runner.is_over
        conversation.context_now().handed_over()
        assert runner.is_over
        assert state.get("flow:booking:over") is True


async def test_a_stack_whose_main_flow_completes_is_over_after_its_closing_words() -> None:
    state = State()
    async with conversation_on(state, handover="explicit") as conversation:
        runner = conversation.run_flow(stack())
        state.update({"b:size": 2, "b:booked": True})
        closing = await conversation.user_turn("thanks")
        assert runner.is_complete
        assert not runner.is_over
        closing.handed_over()
        assert runner.is_over
        assert state.get(OVER_KEY) is True


async def test_with_the_default_handover_the_goodbye_turn_ends_the_call() -> None:
    # A simple loop: take a turn, speak its context, hang up once the call is over. It never
    # confirms a context, and after the goodbye no next context is built to count it.
    ended: list[str] = []

    def hang_up(sender: Any, flow: str) -> None:
        ended.append(flow)

    signals.flow_over.connect(hang_up)
    try:
        async with conversation_on(tools=TOOLS) as conversation:
            runner, goodbye = await terminated(conversation)
            assert goodbye.postures == ("Say goodbye.",)
            assert goodbye.status == "handed_over"
            assert runner.is_over
            assert conversation.state.get(OVER_KEY) is True
            assert ended == ["booking"]
    finally:
        signals.flow_over.disconnect(hang_up)


async def test_with_the_default_handover_a_completed_plain_flow_ends_on_its_closing_turn() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(booking())
        assert (await conversation.user_turn("two people")).status == "pending"
        state.update({"b:size": 2, "b:booked": True})
        closing = await conversation.user_turn("great, thanks")
        assert closing.postures == ("Thank them and say goodbye.",)
        assert runner.is_over
        assert state.get("flow:booking:over") is True


async def test_with_the_default_handover_a_dropped_goodbye_leaves_the_call_over() -> None:
    async with conversation_on(tools=TOOLS) as conversation:
        runner, goodbye = await terminated(conversation)
        goodbye.dropped()  # the loop drops every context an interruption cut off: no error
        assert goodbye.status == "handed_over"
        assert runner.is_over
