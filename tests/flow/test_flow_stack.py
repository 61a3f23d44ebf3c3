"""FlowStack digressions, repair policies and voice timing, driven the way a voice loop drives
them: ``conversation.run_flow(stack)`` then ``await conversation.user_turn(...)`` turn after
turn (a few
tests run a ``StackRunner`` or ``FlowRunner`` by hand with ``await runner.on_turn()``).

Everything runs on a :class:`ManualClock`; tests wait on the session (``wait_idle``) or on
``settle()``, never on the wall clock. Facts an extractor would write are written to the State
just before the turn that "said" them.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from builders import conversation_on, session_on
from helpers import refusal
from slateflow import (
    Conversation,
    Digression,
    Flow,
    FlowStack,
    ManualClock,
    RepairPolicy,
    Resolver,
    Session,
    State,
    Step,
    VoiceTiming,
    all_,
    called_ok,
    commit,
    custom,
    done,
    is_set,
    is_true,
    never,
    once,
    require,
    reset,
    run,
)
from slateflow.conversation import VOICE_TIMING_KEY, Extract, regex
from slateflow.errors import FlowDefinitionError, FlowError, FlowFormatError
from slateflow.flow import (
    DEFAULT_REPROMPT,
    OVERLAY_KEY,
    TERMINATED_KEY,
    Admission,
    Enforcement,
    FlowRunner,
    StackRunner,
    Verdict,
    escalate_key,
    reprompt_key,
)
from slateflow.resolve.clock import settle
from slateflow.stores import MemoryStore
from slateflow.testing import fake_fetch

TOOLS = ["check_tables", "book_table", "lookup_hours", "transfer"]

ASK_NAME = "Ask for the caller's name."
ASK_SIZE = "Ask how many people are coming."
BOOK = "Book the table."
BYE = "Thank the caller and say goodbye."


# -- helpers --------------------------------------------------------------------------------------


class Count:
    """A resolver that counts how often it ran (an ``on_enter`` action's witness)."""

    def __init__(self, name: str) -> None:
        self.calls = 0
        self.resolver = Resolver.function(name, self._run)

    def _run(self, state: State) -> int:
        self.calls += 1
        return self.calls


def booking(
    *,
    name_enter: Any = None,
    size_enter: Any = None,
    size_repair: RepairPolicy | None = None,
    size_timing: VoiceTiming | None = None,
) -> Flow:
    """name -> size -> book -> bye, ``require("book")``, ``once("book_table")``."""
    return Flow(
        "booking",
        [
            Step("name", done=is_set("name"), posture=ASK_NAME, on_enter=name_enter),
            Step(
                "size",
                after=["name"],
                done=is_set("size"),
                posture=ASK_SIZE,
                ground="The caller is {name}.",
                allow=["check_tables"],
                on_enter=size_enter,
                repair=size_repair,
                timing=size_timing,
            ),
            Step(
                "book",
                after=["size"],
                done=called_ok("book_table"),
                posture=BOOK,
                allow=["book_table"],
            ),
            Step("bye", after=["book"], terminal=True, posture=BYE),
        ],
        constraints=[once("book_table"), require("book")],
    )


def side(name: str, *, on_enter: Any = None, done_key: str | None = None) -> Flow:
    """A two-step side conversation: ``q`` (done when ``done_key``, default
    ``{name}:answered``, is true) then the terminal ``close``."""
    return Flow(
        name,
        [
            Step(
                "q",
                done=is_true(done_key or f"{name}:answered"),
                posture=f"Answer the {name} question.",
                allow=["lookup_hours"],
                on_enter=on_enter,
            ),
            Step("close", after=["q"], terminal=True, posture=f"Close the {name} detour."),
        ],
    )


def instant(name: str, posture: str) -> Flow:
    """A side conversation complete the moment it starts: one terminal step."""
    return Flow(name, [Step("only", terminal=True, posture=posture)])


def ended(name: str) -> str:
    return f"The conversation has ended: digression '{name}' terminated it."


# -- digressions: pausing the main flow and then="previous" ---------------------------------------


@pytest.mark.anyio
async def test_a_digression_takes_the_floor_and_the_main_flow_stays_frozen_until_resumed() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("intent:faq"), side("faq"))])
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(stack)
        assert isinstance(runner, StackRunner)
        assert (state.get(OVERLAY_KEY), state.get(TERMINATED_KEY)) == (None, False)
        ctx = await conversation.user_turn("hi")
        assert ctx.postures == (ASK_NAME,)
        assert runner.current is runner.main
        assert runner.main.turns == 1

        state.set("intent:faq", True)
        ctx = await conversation.user_turn("when do you open?")
        assert runner.overlay == "faq"
        assert state.get(OVERLAY_KEY) == "faq"
        assert runner.current is not runner.main
        assert runner.current.name == "faq"
        assert runner.main.paused
        assert ctx.postures == ("Answer the faq question.",)
        assert runner.active_steps == ["q"]
        assert state.get("flow:faq:active") == ["q"]
        assert runner.history == [(2, "faq", "entered")]

        # The keys the main flow reads change under it; it does not move.
        state.update({"name": "Ann", "size": 4})
        assert runner.main.active_steps == ["name"]
        assert runner.main.done_steps == []
        assert state.get("flow:booking:active") == ["name"]
        assert state.get("flow:booking:done") == []
        ctx = await conversation.user_turn("and on sundays?")
        assert runner.main.done_steps == []
        assert runner.main.turns == 1  # its on_turn did not run while the digression spoke
        assert ctx.postures == ("Answer the faq question.",)

        state.update({"faq:answered": True, "intent:faq": False})
        ctx = await conversation.user_turn("thanks")
        # The completing turn: the digression still speaks, with its closing posture.
        assert runner.overlay == "faq"
        assert state.get(OVERLAY_KEY) == "faq"
        assert ctx.postures == ("Close the faq detour.",)
        assert runner.main.paused
        assert runner.main.done_steps == []

        ctx = await conversation.user_turn("ok, the booking")
        assert runner.overlay is None
        assert state.get(OVERLAY_KEY) is None
        assert not runner.main.paused
        assert runner.current is runner.main
        # Caught up on everything written while it was suspended.
        assert runner.main.done_steps == ["name", "size"]
        assert runner.main.active_steps == ["book"]
        assert state.get("flow:booking:done") == ["name", "size"]
        assert ctx.postures == (BOOK,)
        assert runner.main.turns == 2
        assert runner.history == [(2, "faq", "entered"), (5, "faq", "resumed")]


@pytest.mark.anyio
async def test_resume_previous_continues_the_main_flow_mid_way_with_its_grounds() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("turn:faq"), side("faq"))])
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(stack)
        state.set("name", "Ann")
        ctx = await conversation.user_turn("I'm Ann")
        assert ctx.postures == (ASK_SIZE,)
        assert ctx.grounds == ("The caller is Ann.",)
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("are you open late?")
        assert ctx.grounds == ()  # the digression has no grounds; main's are not said
        state.set("faq:answered", True)
        await conversation.user_turn("good")
        ctx = await conversation.user_turn("so, four of us")
        assert runner.main.active_steps == ["size"]  # where it was: the size was not given
        assert ctx.postures == (ASK_SIZE,)
        assert ctx.grounds == ("The caller is Ann.",)
        assert ctx.lines[:2] == (ASK_SIZE, "The caller is Ann.")  # said again after the detour


@pytest.mark.anyio
async def test_the_speaking_layer_decides_tools_and_main_constraints_still_bind() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("turn:faq"), side("faq"))])
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(stack)
        state.set("name", "Ann")
        ctx = await conversation.user_turn("Ann")
        assert ctx.tools == ("check_tables",)
        await conversation.tool_ok("book_table")  # ran once (before it was its turn): once() binds
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("hours?")
        # The digression's allow list applies, not the main step's; once() still binds.
        assert ctx.tools == ("lookup_hours",)
        assert set(ctx.refused) == {"check_tables", "book_table", "transfer"}
        assert ctx.refused["check_tables"].startswith(
            "'check_tables' is not part of the current step ('q')."
        )
        assert ctx.refused["check_tables"].endswith(
            "Available now: lookup_hours. Answer the faq question."
        )
        assert runner.admit("lookup_hours") == Admission("lookup_hours", True)
        assert not runner.admit("book_table").allowed
        state.set("faq:answered", True)
        ctx = await conversation.user_turn("thanks")  # closing turn: nothing active in the detour
        # The digression is done and hands the floor back: the main step decides the tools
        # again, and its once() binds.
        assert ctx.tools == ("check_tables",)
        assert ctx.refused["book_table"] == (
            "'book_table' has already run and may run only once in this conversation. Do not "
            "call it again."
        )
        assert ctx.refused["lookup_hours"].startswith("'lookup_hours' is not part of the current")
        assert runner.admit("book_table") == Admission(
            "book_table", False, ctx.refused["book_table"]
        )


@pytest.mark.anyio
async def test_a_trigger_still_holding_when_the_digression_ends_starts_it_again_at_once() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("intent:faq"), side("faq"))])
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(stack)
        state.set("intent:faq", True)
        await conversation.user_turn("q")
        state.set("faq:answered", True)
        await conversation.user_turn("thanks")
        state.set("faq:answered", False)
        ctx = await conversation.user_turn("hm")  # left, then "intent:faq" still holds: in again
        assert runner.overlay == "faq"
        assert ctx.postures == ("Answer the faq question.",)
        assert runner.history == [
            (1, "faq", "entered"),
            (3, "faq", "resumed"),
            (3, "faq", "entered"),
        ]


# -- then="restart" -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_restart_re_enters_steps_re_fires_on_enter_and_clears_repair_and_tools() -> None:
    state = State()
    name_count, size_count = Count("name_entered"), Count("size_entered")
    main = booking(
        name_enter=run(name_count.resolver),
        size_enter=run(size_count.resolver),
        size_repair=RepairPolicy(reprompt_after=2, escalate_after=9),
    )
    over = Digression("over", is_true("turn:over"), instant("over", "Start over."), "restart")
    async with session_on(state) as session:
        conversation = Conversation(session, tools=TOOLS)
        runner = conversation.run_flow(FlowStack(main, [over]))
        await session.wait_idle()
        assert (name_count.calls, size_count.calls) == (1, 0)
        state.set("name", "Ann")
        await conversation.user_turn("Ann")
        ctx = await conversation.user_turn("...")
        await session.wait_idle()
        assert (name_count.calls, size_count.calls) == (1, 1)
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        assert state.get(reprompt_key("size")) is True
        await conversation.tool_ok("check_tables")
        assert runner.main.marking.tools_ok == {"check_tables": 1}

        state.set("turn:over", True)
        ctx = await conversation.user_turn("let's start over")
        assert ctx.postures == ("Start over.",)
        assert ctx.reprompts == ()  # the detour speaks
        assert runner.main.done_steps == ["name"]  # untouched until the next turn

        ctx = await conversation.user_turn("ok")
        await session.wait_idle()
        assert runner.history == [(3, "over", "entered"), (4, "over", "restarted")]
        # "name" is known: re-opened and done again at once, so not entered (no on_enter);
        # "size" was entered again: its on_enter fired again.
        assert runner.main.done_steps == ["name"]
        assert runner.main.active_steps == ["size"]
        assert (name_count.calls, size_count.calls) == (1, 2)
        assert runner.main.marking.tools_ok == {}
        # The repair count started over (two turns stuck before would reprompt at once).
        assert state.get(reprompt_key("size")) is False
        assert ctx.reprompts == ()
        assert ctx.postures == (ASK_SIZE,)


@pytest.mark.anyio
async def test_restart_with_nothing_known_enters_the_first_step_again() -> None:
    state = State()
    name_count = Count("name_entered")
    over = Digression("over", is_true("turn:over"), instant("over", "Start over."), "restart")
    async with session_on(state) as session:
        conversation = Conversation(session, tools=TOOLS)
        runner = conversation.run_flow(
            FlowStack(booking(name_enter=run(name_count.resolver)), [over])
        )
        await session.wait_idle()
        state.set("turn:over", True)
        await conversation.user_turn("again")
        await session.wait_idle()
        assert name_count.calls == 1
        ctx = await conversation.user_turn("ok")
        await session.wait_idle()
        assert name_count.calls == 2
        assert runner.main.active_steps == ["name"]
        assert ctx.postures == (ASK_NAME,)


@pytest.mark.anyio
async def test_restart_lets_known_facts_complete_their_steps_but_forgets_tool_calls() -> None:
    state = State()
    over = Digression("over", is_true("turn:over"), instant("over", "Start over."), "restart")
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [over]))
        state.update({"name": "Ann", "size": 2})
        await conversation.user_turn("Ann, two")
        await conversation.tool_ok("book_table")
        assert runner.main.is_complete
        assert refusal(conversation, "book_table") is not None  # once()
        state.set("turn:over", True)
        await conversation.user_turn("actually, start over")
        ctx = await conversation.user_turn("go")
        assert runner.main.done_steps == ["name", "size"]
        assert runner.main.active_steps == ["book"]
        assert not runner.main.is_complete
        assert refusal(conversation, "book_table") is None
        assert ctx.tools == ("book_table",)


# -- then="terminate" -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_terminate_ends_the_call_on_the_closing_turn_and_governs_nothing_after() -> None:
    state = State()
    cancel = Digression(
        "cancel", is_true("turn:cancel"), instant("bye", "Confirm the cancellation."), "terminate"
    )
    faq = Digression("faq", is_true("turn:faq"), side("faq"))
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [cancel, faq]))
        state.set("name", "Ann")
        await conversation.user_turn("Ann")
        state.set("turn:cancel", True)
        ctx = await conversation.user_turn("cancel everything")
        reason = ended("cancel")
        assert ctx.postures == ("Confirm the cancellation.",)
        assert state.get(TERMINATED_KEY) is True
        assert state.get(OVERLAY_KEY) == "cancel"
        assert runner.is_terminated
        assert runner.terminated == "cancel"
        assert runner.is_complete
        assert ctx.tools == ()
        assert ctx.refused == dict.fromkeys(TOOLS, reason)
        assert ctx.reprompts == ()
        assert ctx.unmet == ()
        for tool in TOOLS:
            assert refusal(conversation, tool) == reason
            assert runner.admit(tool) == Admission(tool, False, reason)
            assert (runner.admit(tool, record=False).reason or None) == reason
        assert runner.history == [(2, "cancel", "entered"), (2, "cancel", "terminated")]

        await conversation.tool_ok("book_table")  # ignored: nothing is governed any more
        assert runner.main.marking.tools_ok == {}
        assert runner.current.marking.tools_ok == {}

        state.update({"size": 3, "turn:faq": True})
        ctx = await conversation.user_turn("wait, a question")
        assert ctx.postures == ()
        assert ctx.grounds == ()
        assert ctx.unmet == ()
        assert ctx.reprompts == ()
        assert ctx.tools == ()
        assert ctx.refused == dict.fromkeys(TOOLS, reason)
        assert ctx.voice_timing is None
        assert runner.active_steps == []
        assert list(runner.brief().unmet) == []
        assert list(runner.main.brief().unmet) == ["book"]  # what the call never finished
        assert runner.main.active_steps == ["size"]  # frozen where it was
        assert runner.overlay is None
        assert state.get(OVERLAY_KEY) is None
        assert state.get(TERMINATED_KEY) is True
        assert runner.history == [(2, "cancel", "entered"), (2, "cancel", "terminated")]
        assert repr(runner) == "<StackRunner 'booking' terminated by 'cancel'>"
        runner.on_tool_ok("transfer")
        assert runner.main.marking.tools_ok == {}


@pytest.mark.anyio
async def test_terminate_in_observe_mode_admits_every_tool_with_a_violation() -> None:
    state = State()
    cancel = Digression("cancel", is_true("turn:stop"), instant("bye", "Bye."), "terminate")
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [cancel]), enforcement="observe")
        assert runner.enforcement is Enforcement.OBSERVE
        state.set("turn:stop", True)
        ctx = await conversation.user_turn("stop")
        assert ctx.refused == {}
        assert ctx.tools == tuple(TOOLS)
        for tool in TOOLS:
            assert refusal(conversation, tool) is None
            assert runner.admit(tool) == Admission(tool, True, ended("cancel"), violation=True)
            assert runner.admit(tool, record=False).reason == ended("cancel")


# -- one level deep, order, same-turn triggers ----------------------------------------------------


@pytest.mark.anyio
async def test_digressions_are_one_level_deep() -> None:
    state = State()
    faq = Digression("faq", is_true("turn:faq"), side("faq"))
    cancel = Digression("cancel", is_true("cancel"), instant("cancel", "Bye."), "terminate")
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [faq, cancel]))
        state.set("turn:faq", True)
        await conversation.user_turn("question")
        state.set("cancel", True)  # would start "cancel", but "faq" has the floor
        ctx = await conversation.user_turn("actually cancel")
        assert runner.overlay == "faq"
        assert not runner.is_terminated
        assert ctx.postures == ("Answer the faq question.",)
        state.set("turn:faq", True)  # its own trigger again: nothing restarts
        await conversation.user_turn("faq again")
        assert runner.history == [(1, "faq", "entered")]
        state.set("faq:answered", True)
        await conversation.user_turn("thanks")
        ctx = await conversation.user_turn("so")  # faq left; "cancel" still holds: it starts now
        assert runner.is_terminated
        assert ctx.postures == ("Bye.",)
        assert runner.history == [
            (1, "faq", "entered"),
            (5, "faq", "resumed"),
            (5, "cancel", "entered"),
            (5, "cancel", "terminated"),
        ]


@pytest.mark.anyio
@pytest.mark.parametrize("order", [("alpha", "beta"), ("beta", "alpha")])
async def test_the_first_matching_digression_in_order_wins(order: tuple[str, str]) -> None:
    state = State()
    digressions = [Digression(n, is_true("turn:both"), side(n)) for n in order]
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), digressions))
        state.set("turn:both", True)
        ctx = await conversation.user_turn("x")
        assert runner.overlay == order[0]
        assert ctx.postures == (f"Answer the {order[0]} question.",)
        assert runner.history == [(1, order[0], "entered")]
        assert state.get(f"flow:{order[1]}:active") is None  # never started


@pytest.mark.anyio
async def test_a_digression_starting_on_the_turn_main_would_escalate_holds_main_back() -> None:
    state = State()
    main = Flow(
        "main",
        [
            Step(
                "ask",
                done=is_set("size"),
                posture="Ask the size.",
                repair=RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="human"),
            ),
            Step("next", after=["ask"], terminal=True, posture="Next."),
            Step("human", terminal=True, posture="Hand over to a person."),
        ],
    )
    hours = Digression("hours", is_true("turn:hours"), instant("hours", "We open at nine."))
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(FlowStack(main, [hours]))
        ctx = await conversation.user_turn("uh")
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        state.set("turn:hours", True)
        ctx = await conversation.user_turn("when do you open?")  # main's second stuck turn ...
        assert runner.overlay == "hours"
        assert ctx.postures == ("We open at nine.",)
        assert ctx.reprompts == ()
        assert runner.main.active_steps == ["ask"]  # ... is not counted: no escalation
        assert escalate_key("ask") not in state
        ctx = await conversation.user_turn("uh")  # back in main: this turn counts, it escalates
        assert runner.main.done_steps == ["ask", "human"]
        assert state.get(escalate_key("ask")) is True
        assert ctx.postures == ("Hand over to a person.",)


@pytest.mark.anyio
async def test_a_write_that_advances_main_before_the_trigger_is_kept() -> None:
    # The main flow reacts to writes the moment they land; a digression suspends it only at
    # the turn, so what was written before that turn has already moved it.
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("turn:faq"), side("faq"))])
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(stack)
        state.update({"name": "Ann", "turn:faq": True})
        ctx = await conversation.user_turn("Ann here, quick question")
        assert runner.overlay == "faq"
        assert runner.main.done_steps == ["name"]
        assert runner.main.active_steps == ["size"]
        assert ctx.postures == ("Answer the faq question.",)


@pytest.mark.anyio
async def test_a_digression_complete_on_its_entry_turn_is_spoken_for_that_turn() -> None:
    state = State()
    hours = Digression("hours", is_true("turn:hours"), instant("hours", "We open at nine."))
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [hours]))
        state.set("turn:hours", True)
        ctx = await conversation.user_turn("when do you open?")
        assert runner.overlay == "hours"
        assert runner.current.is_complete
        assert ctx.postures == ("We open at nine.",)
        assert ctx.lines[0] == "We open at nine."
        assert not runner.is_complete  # the main flow is not
        ctx = await conversation.user_turn("thanks")
        assert runner.overlay is None
        assert ctx.postures == (ASK_NAME,)
        assert runner.history == [(1, "hours", "entered"), (2, "hours", "resumed")]


@pytest.mark.anyio
@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
async def test_the_same_digression_entered_twice_gets_a_fresh_runner(durable: bool) -> None:
    # On a durable state the first run's recorded marking must not complete the second one.
    state = State(store=MemoryStore()) if durable else State()
    asked = Count("faq_opened")
    faq = side("faq", on_enter=run(asked.resolver), done_key="turn:answered")
    async with session_on(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(
            FlowStack(booking(), [Digression("faq", is_true("turn:q"), faq)])
        )
        state.set("turn:q", True)
        await conversation.user_turn("question")
        await session.wait_idle()
        first = runner.current
        assert asked.calls == 1
        state.set("turn:answered", True)
        await conversation.user_turn("got it")
        assert state.get("flow:faq:done") == ["q", "close"]
        await conversation.user_turn("back")
        assert first.closed
        state.set("turn:q", True)
        ctx = await conversation.user_turn("another question")
        await session.wait_idle()
        second = runner.current
        assert second is not first
        assert not second.closed
        assert asked.calls == 2
        assert second.active_steps == ["q"]
        assert state.get("flow:faq:done") == []
        assert ctx.postures == ("Answer the faq question.",)
        assert [h[2] for h in runner.history] == ["entered", "resumed", "entered"]


@pytest.mark.anyio
async def test_a_stack_runner_driven_by_hand_without_a_session() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("intent:faq"), side("faq"))])
    with StackRunner(stack, state) as runner:
        assert runner.name == "booking"
        assert repr(runner) == "<StackRunner 'booking' main>"
        state.set("intent:faq", True)
        await runner.on_turn()
        assert repr(runner) == "<StackRunner 'booking' in 'faq'>"
        assert list(runner.brief().postures) == ["Answer the faq question."]
        assert runner.verdict("q") is Verdict.ACTIVE
        assert runner.explain().flow == "faq"
        state.update({"faq:answered": True, "intent:faq": False})
        await runner.on_turn()
        assert list(runner.brief().postures) == ["Close the faq detour."]
        await runner.on_turn()
        assert runner.overlay is None
        assert list(runner.brief().postures) == [ASK_NAME]
        assert runner.turns == 3
    assert runner.closed
    assert runner.main.closed
    with pytest.raises(FlowError, match="flow stack 'booking' is closed"):
        await runner.on_turn()


@pytest.mark.anyio
async def test_a_stack_without_session_refuses_on_enter_digressions_up_front() -> None:
    state = State()
    faq = side("faq", on_enter=run(Count("x").resolver))
    stack = FlowStack(booking(), [Digression("faq", is_true("intent:faq"), faq)])
    with pytest.raises(FlowError, match="on_enter"):
        StackRunner(stack, state)


@pytest.mark.anyio
async def test_a_trigger_that_raises_is_skipped_and_triggers_read_the_main_marking(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(state: State, marking: Any) -> bool:
        raise RuntimeError("trigger bug")

    state = State()
    digressions = [
        Digression("broken", custom(broken, ["turn:faq"]), instant("broken", "Never said.")),
        # Starts only once the main flow has the caller's name.
        Digression("faq", all_(done("name"), is_true("turn:faq")), side("faq")),
    ]
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), digressions))
        state.set("turn:faq", True)
        with caplog.at_level("ERROR", logger="slateflow.flow"):
            ctx = await conversation.user_turn("question first")
        assert runner.overlay is None
        assert ctx.postures == (ASK_NAME,)
        assert [r.getMessage() for r in caplog.records] == [
            "flow stack 'booking': the trigger of 'broken' raised"
        ]
        state.update({"name": "Ann", "turn:faq": True})
        ctx = await conversation.user_turn("Ann; a question")
        assert runner.overlay == "faq"
        assert ctx.postures == ("Answer the faq question.",)
        assert runner.history == [(2, "faq", "entered")]


@pytest.mark.anyio
async def test_a_tool_run_during_a_digression_advances_main_when_it_resumes() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("turn:faq"), side("faq"))])
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(stack)
        state.update({"name": "Ann", "size": 2})
        await conversation.user_turn("Ann, two")
        assert runner.main.active_steps == ["book"]
        state.set("turn:faq", True)
        await conversation.user_turn("hours?")
        await conversation.tool_ok("book_table")
        assert runner.main.marking.tools_ok == {"book_table": 1}  # counted ...
        assert runner.main.active_steps == ["book"]  # ... but not acted on while suspended
        assert runner.current.marking.tools_ok == {"book_table": 1}
        state.set("faq:answered", True)
        await conversation.user_turn("thanks")
        assert not runner.is_complete  # the digression still speaks
        ctx = await conversation.user_turn("bye")
        assert runner.main.done_steps == ["name", "size", "book", "bye"]
        assert runner.is_complete
        assert ctx.postures == (BYE,)
        assert ctx.unmet == ()


@pytest.mark.anyio
async def test_observe_mode_reports_a_main_constraint_breach_during_a_digression() -> None:
    state = State()
    hours = Digression("hours", is_true("turn:hours"), instant("hours", "We open at nine."))
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [hours]), enforcement="observe")
        await conversation.tool_ok("book_table")
        state.set("turn:hours", True)
        await conversation.user_turn("when do you open?")
        reason = runner.admit("book_table", record=False).reason or None
        assert reason == (
            "'book_table' has already run and may run only once in this conversation. "
            "Do not call it again."
        )
        assert runner.admit("book_table") == Admission("book_table", True, reason, violation=True)


# -- definitions ----------------------------------------------------------------------------------


def _dup_in_builder() -> Any:
    return (
        FlowStack(booking())
        .digression("faq", when=is_true("a"), flow=side("faq"))
        .digression("faq", when=is_true("b"), flow=side("other"))
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(_dup_in_builder, "digression 'faq' is defined twice", id="dup-builder"),
        pytest.param(
            lambda: FlowStack(
                booking(),
                [
                    Digression("faq", is_true("a"), side("faq")),
                    Digression("faq", is_true("b"), side("other")),
                ],
            ),
            "digression 'faq' is defined twice",
            id="dup-list",
        ),
        pytest.param(
            lambda: FlowStack(booking(), [Digression("d", is_true("a"), side("booking"))]),
            "digression 'd': its flow is named 'booking' like another flow of the stack",
            id="flow-named-like-main",
        ),
        pytest.param(
            lambda: FlowStack(
                booking(),
                [
                    Digression("d1", is_true("a"), side("faq")),
                    Digression("d2", is_true("b"), side("faq")),
                ],
            ),
            "digression 'd2': its flow is named 'faq' like another flow of the stack",
            id="flow-named-like-another-digression",
        ),
        pytest.param(
            lambda: Digression("d", is_true("a"), side("faq"), "later"),  # type: ignore[arg-type]
            "digression 'd': then must be one of ['previous', 'restart', 'terminate'], got 'later'",
            id="bad-resume",
        ),
        pytest.param(
            lambda: Digression("d", "intent:faq", side("faq")),  # type: ignore[arg-type]
            "digression 'd': when takes a guard, got 'intent:faq'",
            id="string-trigger",
        ),
        pytest.param(
            lambda: Digression("d", lambda s, m: True, side("faq")),  # type: ignore[arg-type]
            "digression 'd': when takes a guard",
            id="callable-trigger",
        ),
        pytest.param(
            lambda: Digression("d", is_true("a"), "faq"),  # type: ignore[arg-type]
            "digression 'd': flow takes a Flow, got 'faq'",
            id="flow-not-a-flow",
        ),
        pytest.param(
            lambda: Digression("", is_true("a"), side("faq")),
            "a digression name is a non-empty string, got ''",
            id="empty-name",
        ),
        pytest.param(
            lambda: FlowStack(booking(), ["faq"]),  # type: ignore[list-item]
            "FlowStack takes Digression objects, got 'faq'",
            id="not-a-digression",
        ),
        pytest.param(
            lambda: FlowStack(side("x")).digression(
                "d",
                when=is_true("a"),
                flow=side("y"),
                then="sideways",  # type: ignore[arg-type]
            ),
            "then must be one of",
            id="bad-then-builder",
        ),
    ],
)
def test_stack_definition_errors_name_the_problem(make: Any, message: str) -> None:
    with pytest.raises(FlowDefinitionError) as raised:
        make()
    assert message in str(raised.value)


@pytest.mark.anyio
async def test_a_digression_flow_with_problems_is_reported_when_the_stack_starts() -> None:
    bad = Flow("bad", [Step("a", after=["nowhere"], done=is_true("a"))])
    stack = FlowStack(booking(), [Digression("bad", is_true("x"), bad)])
    assert repr(stack) == "<FlowStack 'booking' + [bad]>"
    async with session_on() as session:
        with pytest.raises(FlowDefinitionError) as raised:
            stack.start(session)
    assert "flow 'bad' has 1 problem(s)" in str(raised.value)
    assert "step 'a' comes after unknown step 'nowhere'" in str(raised.value)


# -- repair ---------------------------------------------------------------------------------------


def asking(policy: RepairPolicy, *, timing: VoiceTiming | None = None) -> Flow:
    """ask (repair ``policy``) -> confirm -> finish; with ``escalate_to="human"``, a step
    ``human`` (no ``after``) reached only by escalation."""
    steps = [
        Step("ask", done=is_set("size"), posture="Ask the size.", repair=policy, timing=timing),
        Step("confirm", after=["ask"], done=is_true("confirmed"), posture="Confirm."),
        Step("finish", after=["confirm"], terminal=True, posture="Finish."),
    ]
    if policy.escalate_to == "human":
        steps.append(Step("human", done=is_true("handed"), posture="Hand over to a person."))
    return Flow("intake", steps, constraints=[require("ask")])


@pytest.mark.anyio
@pytest.mark.parametrize("after", [1, 2, 3])
async def test_reprompt_after_n_turns_stuck(after: int) -> None:
    state = State()
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(asking(RepairPolicy(reprompt_after=after, escalate_after=9)))
        seen = []
        for _ in range(4):
            ctx = await conversation.user_turn("um")
            seen.append((state.get(reprompt_key("ask")), ctx.reprompts))
        # The key is written when it first rises (absent before).
        want = [(True, (DEFAULT_REPROMPT,)) if n >= after else (None, ()) for n in range(1, 5)]
        assert seen == want
        assert escalate_key("ask") not in state
        assert runner.active_steps == ["ask"]


@pytest.mark.anyio
async def test_the_reprompt_line_is_the_steps_own_timing_text() -> None:
    state = State()
    timing = VoiceTiming(reprompt="Ask again: how many people?")
    async with conversation_on(state) as conversation:
        conversation.run_flow(asking(RepairPolicy(reprompt_after=1), timing=timing))
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == ("Ask again: how many people?",)
        assert ctx.lines == (
            "Ask the size.",
            "Ask again: how many people?",
            "Before finishing, these still need to happen: ask.",
            "Tools you may call now: none.",
        )


@pytest.mark.anyio
async def test_a_timing_without_reprompt_text_reprompts_with_the_default() -> None:
    state = State()
    timing = VoiceTiming(end_of_speech_ms=500, interruptible=False)
    async with conversation_on(state) as conversation:
        conversation.run_flow(asking(RepairPolicy(reprompt_after=1), timing=timing))
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        assert ctx.voice_timing == {"interruptible": False, "end_of_speech_ms": 500}


@pytest.mark.anyio
async def test_escalation_routes_to_the_target_and_never_to_the_normal_successor() -> None:
    state = State()
    policy = RepairPolicy(reprompt_after=1, escalate_after=3, escalate_to="human", flag="help")
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(asking(policy))
        assert runner.active_steps == ["ask"]  # the target has no after: not started with it
        assert runner.verdict("human") is Verdict.PENDING
        for _ in range(2):
            await conversation.user_turn("um")
            assert runner.active_steps == ["ask"]
            assert state.get(reprompt_key("ask")) is True
            assert escalate_key("ask") not in state
            assert "help" not in state
        ctx = await conversation.user_turn("um")
        assert runner.done_steps == ["ask"]
        assert runner.active_steps == ["human"]
        assert state.get(escalate_key("ask")) is True
        assert state.get("help") is True
        assert state.get(reprompt_key("ask")) is False
        assert ctx.postures == ("Hand over to a person.",)
        assert ctx.reprompts == ()
        assert runner.verdict("confirm") is Verdict.PENDING
        # The fact arriving late does not send the flow down the normal path.
        state.set("size", 4)
        await conversation.user_turn("oh, four")
        assert runner.active_steps == ["human"]
        assert runner.done_steps == ["ask"]
        assert state.get("flow:intake:active") == ["human"]


@pytest.mark.anyio
async def test_escalation_without_a_target_raises_the_keys_and_stays_on_the_step() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        policy = RepairPolicy(reprompt_after=1, escalate_after=2, flag="help")
        runner = conversation.run_flow(asking(policy))
        await conversation.user_turn("um")
        ctx = await conversation.user_turn("um")
        assert runner.active_steps == ["ask"]
        assert state.get(escalate_key("ask")) is True
        assert state.get("help") is True
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        state.set("size", 2)
        ctx = await conversation.user_turn("two")
        assert runner.active_steps == ["confirm"]
        assert state.get(reprompt_key("ask")) is False
        assert ctx.reprompts == ()
        # The escalation stays on record once the step completes (only leaving without
        # completing, a reset or a restart clears it).
        assert state.get(escalate_key("ask")) is True
        assert state.get("help") is True


@pytest.mark.anyio
async def test_tool_calls_writes_and_advances_are_not_turns() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        policy = RepairPolicy(reprompt_after=2, escalate_after=2, escalate_to="human")
        runner = conversation.run_flow(asking(policy))
        await conversation.user_turn("um")
        for i in range(4):
            await conversation.tool_ok("lookup")
            state.set("noise", i)
            runner.advance()
        assert reprompt_key("ask") not in state
        assert runner.active_steps == ["ask"]
        await conversation.user_turn("um")
        assert state.get(escalate_key("ask")) is True
        assert runner.active_steps == ["human"]


@pytest.mark.anyio
async def test_the_reprompt_key_goes_false_when_the_step_completes() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(asking(RepairPolicy(reprompt_after=1, escalate_after=5)))
        await conversation.user_turn("um")
        assert state.get(reprompt_key("ask")) is True
        state.set("size", 3)  # completes at once, between turns
        assert runner.active_steps == ["confirm"]
        assert state.get(reprompt_key("ask")) is False
        ctx = await conversation.user_turn("three")
        assert ctx.reprompts == ()
        assert escalate_key("ask") not in state


@pytest.mark.anyio
async def test_repair_keys_go_false_when_the_step_leaves_without_completing() -> None:
    state = State()
    flow = Flow(
        "gated",
        [
            Step(
                "ask",
                gate=is_true("open"),
                done=is_set("size"),
                repair=RepairPolicy(reprompt_after=1, escalate_after=2, flag="help"),
            )
        ],
    )
    state.set("open", True)
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(flow)
        await conversation.user_turn("um")
        await conversation.user_turn("um")
        assert (state.get(reprompt_key("ask")), state.get(escalate_key("ask"))) == (True, True)
        assert state.get("help") is True
        state.set("open", False)
        assert runner.active_steps == []
        assert state.get(reprompt_key("ask")) is False
        await conversation.user_turn("hello?")
        assert state.get(escalate_key("ask")) is False
        assert state.get("help") is False
        state.set("open", True)  # back: counted from zero
        await conversation.user_turn("um")
        assert state.get(reprompt_key("ask")) is True
        assert state.get(escalate_key("ask")) is False


@pytest.mark.anyio
async def test_a_reset_clears_the_repair_state_so_the_step_asks_again() -> None:
    state = State()
    flow = Flow(
        "intake",
        [
            Step(
                "ask",
                done=is_set("size"),
                repair=RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="human"),
            ),
            Step("confirm", after=["ask"], done=is_true("confirmed")),
            Step("human", done=is_true("handed")),
        ],
        constraints=[reset("ask").when(is_true("retry"))],
    )
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(flow)
        await conversation.user_turn("um")
        await conversation.user_turn("um")
        assert runner.done_steps == ["ask"]
        assert runner.active_steps == ["human"]
        assert state.get(escalate_key("ask")) is True
        state.set("retry", True)
        # Re-opened (and the target with it); the escalation does not complete it again.
        assert runner.active_steps == ["ask"]
        assert runner.done_steps == []
        assert state.get(escalate_key("ask")) is False
        assert state.get(reprompt_key("ask")) is False
        await conversation.user_turn("um")
        assert state.get(reprompt_key("ask")) is True
        assert state.get(escalate_key("ask")) is False
        state.set("size", 2)  # now the normal successor is open
        assert runner.active_steps == ["confirm"]


@pytest.mark.anyio
async def test_a_reset_of_a_stuck_step_before_escalation_clears_its_reprompt() -> None:
    state = State()
    flow = Flow(
        "intake",
        [Step("ask", done=is_set("size"), repair=RepairPolicy(reprompt_after=2, escalate_after=3))],
        constraints=[reset("ask").when(is_true("retry"))],
    )
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(flow)
        await conversation.user_turn("um")
        await conversation.user_turn("um")
        assert state.get(reprompt_key("ask")) is True
        state.set("retry", True)
        assert runner.active_steps == ["ask"]
        assert state.get(reprompt_key("ask")) is False
        await conversation.user_turn("um")  # one turn since the reset
        assert state.get(reprompt_key("ask")) is False
        await conversation.user_turn("um")
        assert state.get(reprompt_key("ask")) is True
        await conversation.user_turn("um")  # three turns since the reset (five in all)
        assert state.get(escalate_key("ask")) is True


@pytest.mark.anyio
async def test_two_stuck_steps_each_get_their_reprompt_in_flow_order() -> None:
    state = State()
    flow = Flow(
        "parallel",
        [
            Step(
                "a",
                done=is_set("a"),
                repair=RepairPolicy(reprompt_after=1),
                timing=VoiceTiming(reprompt="Ask A again."),
            ),
            Step("b", done=is_set("b"), repair=RepairPolicy(reprompt_after=2)),
        ],
    )
    async with conversation_on(state) as conversation:
        conversation.run_flow(flow)
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == ("Ask A again.",)
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == ("Ask A again.", DEFAULT_REPROMPT)


@pytest.mark.anyio
async def test_escalations_chain_and_a_target_does_not_count_its_entry_turn() -> None:
    state = State()
    flow = Flow(
        "chain",
        [
            Step(
                "ask",
                done=is_set("size"),
                repair=RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="human"),
            ),
            Step("confirm", after=["ask"], done=is_true("confirmed")),
            Step(
                "human",
                done=is_true("handed"),
                posture="Hand over.",
                repair=RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="voicemail"),
            ),
            Step("voicemail", terminal=True, posture="Offer voicemail."),
        ],
    )
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(flow)
        assert runner.active_steps == ["ask"]
        await conversation.user_turn("um")
        ctx = await conversation.user_turn("um")
        assert runner.active_steps == ["human"]
        assert reprompt_key("human") not in state  # entered by escalation this turn
        assert ctx.reprompts == ()
        ctx = await conversation.user_turn("hello?")
        assert state.get(reprompt_key("human")) is True
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        ctx = await conversation.user_turn("hello??")
        assert runner.done_steps == ["ask", "human", "voicemail"]
        assert runner.is_complete
        assert ctx.postures == ("Offer voicemail.",)
        assert state.get(escalate_key("ask")) is True
        assert state.get(escalate_key("human")) is True
        assert state.get(reprompt_key("human")) is False


@pytest.mark.anyio
@pytest.mark.parametrize("answered", [True, False])
async def test_escalating_to_the_normal_successor_reaches_it_either_way(answered: bool) -> None:
    state = State()
    policy = RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="confirm")
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(asking(policy))
        await conversation.user_turn("um")
        if answered:
            state.set("size", 2)
        await conversation.user_turn("two" if answered else "um")
        assert runner.done_steps == ["ask"]
        assert runner.active_steps == ["confirm"]
        assert state.get(escalate_key("ask"), False) is not answered


@pytest.mark.anyio
async def test_the_turn_a_step_is_entered_on_is_not_a_stuck_turn() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(
            booking(size_repair=RepairPolicy(reprompt_after=1, escalate_after=2))
        )
        # The extractor hears the name during the turn: that turn enters the size step.
        conversation.add_extractor(
            Extract("who").field_to("name", "name", regex(r"I'm (\w+)", group=1)).build()
        )
        ctx = await conversation.user_turn("I'm Ann")
        assert runner.active_steps == ["size"]
        assert ctx.postures == (ASK_SIZE,)
        assert ctx.reprompts == ()
        assert reprompt_key("size") not in state
        ctx = await conversation.user_turn("um")  # asked once, not answered
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        assert escalate_key("size") not in state


def test_a_flow_runner_counts_repair_only_on_turns() -> None:
    state = State()

    async def body() -> None:
        policy = RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="human")
        with FlowRunner(asking(policy), state) as runner:
            runner.on_tool_ok("x")
            runner.advance()
            assert list(runner.brief().reprompts) == []
            await runner.on_turn()
            assert list(runner.brief().reprompts) == [DEFAULT_REPROMPT]
            assert state.get(reprompt_key("ask")) is True
            await runner.on_turn()
            assert runner.active_steps == ["human"]
            assert list(runner.brief().reprompts) == []

    anyio.run(body)


def test_repair_definition_errors() -> None:
    with pytest.raises(FlowDefinitionError) as raised:
        Flow(
            "f", [Step("a", done=is_true("a"), repair=RepairPolicy(escalate_to="nowhere"))]
        ).build()
    assert "step 'a' escalates to unknown step 'nowhere'" in str(raised.value)
    with pytest.raises(FlowDefinitionError) as raised:
        Step("a", done=is_true("a"), repair=RepairPolicy(escalate_to="a"))
    assert str(raised.value) == "step 'a': repair cannot escalate to the step itself"
    with pytest.raises(ValidationError) as invalid:
        RepairPolicy(reprompt_after=3, escalate_after=2)
    assert "escalate_after (2) must be >= reprompt_after (3)" in str(invalid.value)
    with pytest.raises(ValidationError):
        RepairPolicy(reprompt_after=0)
    with pytest.raises(ValidationError):
        RepairPolicy(unknown=1)  # type: ignore[call-arg]
    assert RepairPolicy(reprompt_after=2, escalate_after=2).escalate_after == 2


@pytest.mark.anyio
async def test_an_unknown_escalation_target_is_reported_when_the_flow_starts() -> None:
    flow = Flow("f", [Step("a", done=is_true("a"), repair=RepairPolicy(escalate_to="ghost"))])
    async with session_on() as session:
        with pytest.raises(FlowDefinitionError, match="escalates to unknown step 'ghost'"):
            flow.start(session)


# -- voice timing ---------------------------------------------------------------------------------


VT = VoiceTiming


@pytest.mark.parametrize(
    ("a", "b", "merged"),
    [
        (VT(), VT(), VT()),
        (VT(reprompt_after_ms=8000), VT(reprompt_after_ms=5000), VT(reprompt_after_ms=5000)),
        (VT(reprompt_after_ms=5000), VT(reprompt_after_ms=8000), VT(reprompt_after_ms=5000)),
        (VT(reprompt_after_ms=0), VT(reprompt_after_ms=10), VT(reprompt_after_ms=0)),
        (VT(), VT(reprompt_after_ms=7000), VT(reprompt_after_ms=7000)),
        (VT(filler_after_ms=900), VT(filler_after_ms=300), VT(filler_after_ms=300)),
        (VT(filler_after_ms=900), VT(), VT(filler_after_ms=900)),
        (VT(end_of_speech_ms=400), VT(end_of_speech_ms=900), VT(end_of_speech_ms=900)),
        (VT(end_of_speech_ms=900), VT(end_of_speech_ms=400), VT(end_of_speech_ms=900)),
        (VT(), VT(end_of_speech_ms=400), VT(end_of_speech_ms=400)),
        (VT(interruptible=True), VT(interruptible=False), VT(interruptible=False)),
        (VT(interruptible=False), VT(interruptible=True), VT(interruptible=False)),
        (VT(interruptible=False), VT(), VT(interruptible=False)),
        (VT(), VT(interruptible=False), VT(interruptible=False)),
        (VT(interruptible=True), VT(), VT(interruptible=True)),
        (VT(), VT(interruptible=True), VT(interruptible=True)),
        (VT(interruptible=True), VT(interruptible=True), VT(interruptible=True)),
        (VT(reprompt="mine"), VT(reprompt="theirs"), VT(reprompt="mine")),
        (VT(), VT(reprompt="theirs"), VT(reprompt="theirs")),
        (VT(reprompt=""), VT(reprompt="theirs"), VT(reprompt="")),
        (
            VT(
                reprompt_after_ms=6000,
                filler_after_ms=200,
                interruptible=True,
                end_of_speech_ms=500,
            ),
            VT(reprompt_after_ms=4000, filler_after_ms=800, interruptible=False, reprompt="x"),
            VT(
                reprompt_after_ms=4000,
                reprompt="x",
                filler_after_ms=200,
                interruptible=False,
                end_of_speech_ms=500,
            ),
        ),
    ],
)
def test_voice_timing_merge_takes_the_most_cautious_of_each_field(
    a: VoiceTiming, b: VoiceTiming, merged: VoiceTiming
) -> None:
    assert a.merge(b) == merged
    assert a.merge(b).holds_floor is (merged.interruptible is False)


timings = st.builds(
    VoiceTiming,
    reprompt_after_ms=st.none() | st.integers(0, 20_000),
    reprompt=st.none() | st.text(max_size=5),
    filler_after_ms=st.none() | st.integers(0, 20_000),
    interruptible=st.none() | st.booleans(),
    end_of_speech_ms=st.none() | st.integers(0, 20_000),
)


@settings(deadline=None, max_examples=150)
@given(timings, timings, timings)
def test_voice_timing_merge_is_associative_and_commutative_apart_from_the_text(
    a: VoiceTiming, b: VoiceTiming, c: VoiceTiming
) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(b).model_copy(update={"reprompt": None}) == b.merge(a).model_copy(
        update={"reprompt": None}
    )
    assert a.merge(VoiceTiming()) == a
    assert VoiceTiming().merge(a) == a
    assert a.merge(a) == a
    assert VoiceTiming.model_validate(a.model_dump(mode="json")) == a
    assert VoiceTiming.model_validate_json(a.model_dump_json()) == a


def test_voice_timing_json_round_trip_and_validation() -> None:
    timing = VT(reprompt_after_ms=6000, reprompt="Again?", interruptible=False)
    data = timing.model_dump(mode="json", exclude_none=True)
    assert data == {"reprompt_after_ms": 6000, "reprompt": "Again?", "interruptible": False}
    assert VoiceTiming.model_validate(data) == timing
    assert VoiceTiming.model_validate_json(timing.model_dump_json()) == timing
    assert timing.model_dump() == {
        "reprompt_after_ms": 6000,
        "reprompt": "Again?",
        "filler_after_ms": None,
        "interruptible": False,
        "end_of_speech_ms": None,
    }
    assert timing.reprompt_text == "Again?"
    assert VT().reprompt_text == DEFAULT_REPROMPT
    assert VT().is_empty
    assert not timing.is_empty
    assert timing.holds_floor
    assert not VT(interruptible=None).holds_floor
    for bad in (
        {"reprompt_after_ms": -1},
        {"filler_after_ms": -5},
        {"end_of_speech_ms": -1},
        {"pause_ms": 3},
    ):
        with pytest.raises(ValidationError):
            VoiceTiming.model_validate(bad)
    with pytest.raises(ValidationError):
        timing.reprompt = "changed"  # type: ignore[misc]


def timed_main() -> Flow:
    return Flow(
        "main",
        [
            Step(
                "greet",
                done=is_true("greeted"),
                timing=VT(end_of_speech_ms=700, reprompt_after_ms=8000),
            ),
            Step(
                "consent",
                done=is_true("consented"),
                timing=VT(interruptible=False, end_of_speech_ms=400, reprompt_after_ms=5000),
            ),
            Step("plain", after=["greet", "consent"], done=is_true("plain")),
            Step("slow", after=["plain"], done=is_true("slow"), timing=VT(filler_after_ms=1500)),
        ],
    )


@pytest.mark.anyio
async def test_the_session_publishes_the_speaking_layers_merged_timing() -> None:
    state = State()
    faq = Flow(
        "faq",
        [
            Step("q", done=is_true("faq:done"), timing=VT(reprompt_after_ms=3000)),
            Step("end", after=["q"], terminal=True),
        ],
    )
    bye = Flow("bye", [Step("x", terminal=True, posture="Bye.")])
    stack = FlowStack(
        timed_main(),
        [
            Digression("faq", is_true("turn:faq"), faq),
            Digression("bye", is_true("turn:bye"), bye, "terminate"),
        ],
    )
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(stack)
        ctx = await conversation.user_turn("hello")
        both = {"reprompt_after_ms": 5000, "interruptible": False, "end_of_speech_ms": 700}
        assert state.get(VOICE_TIMING_KEY) == both
        assert ctx.voice_timing == both
        assert runner.brief().timing == VT(
            reprompt_after_ms=5000, interruptible=False, end_of_speech_ms=700
        )
        state.set("consented", True)
        ctx = await conversation.user_turn("yes")
        assert ctx.voice_timing == {"reprompt_after_ms": 8000, "end_of_speech_ms": 700}
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("question")
        assert ctx.voice_timing == {"reprompt_after_ms": 3000}
        assert state.get(VOICE_TIMING_KEY) == {"reprompt_after_ms": 3000}
        state.set("faq:done", True)
        ctx = await conversation.user_turn("thanks")  # closing turn: nothing active in faq
        assert ctx.voice_timing is None
        assert VOICE_TIMING_KEY not in state
        ctx = await conversation.user_turn("back")
        assert ctx.voice_timing == {"reprompt_after_ms": 8000, "end_of_speech_ms": 700}
        state.set("greeted", True)
        ctx = await conversation.user_turn("hi")
        assert runner.active_steps == ["plain"]  # no timing on it: the key goes
        assert ctx.voice_timing is None
        assert VOICE_TIMING_KEY not in state
        state.set("plain", True)
        ctx = await conversation.user_turn("ok")
        assert ctx.voice_timing == {"filler_after_ms": 1500}
        state.set("turn:bye", True)
        ctx = await conversation.user_turn("bye")
        assert ctx.voice_timing is None
        assert runner.brief().timing is None
        assert VOICE_TIMING_KEY not in state
        await conversation.user_turn("still there?")
        assert VOICE_TIMING_KEY not in state
        assert conversation.context_now().voice_timing is None


@pytest.mark.anyio
async def test_timing_follows_a_step_change_between_turns() -> None:
    state = State()
    async with session_on(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(timed_main())
        await conversation.user_turn("hello")
        assert state.get(VOICE_TIMING_KEY)["interruptible"] is False
        state.set("consented", True)  # no turn: the session re-publishes in a task
        await settle()
        assert state.get(VOICE_TIMING_KEY) == {"reprompt_after_ms": 8000, "end_of_speech_ms": 700}


@pytest.mark.anyio
async def test_a_terminal_steps_timing_applies_while_its_closing_words_are_said() -> None:
    state = State()
    flow = Flow(
        "call",
        [
            Step("ask", done=is_true("asked")),
            Step(
                "disclose",
                after=["ask"],
                terminal=True,
                posture="Read the disclosure.",
                timing=VT(interruptible=False),
            ),
        ],
    )
    async with conversation_on(state) as conversation:
        conversation.run_flow(flow)
        state.set("asked", True)
        ctx = await conversation.user_turn("ok")
        assert ctx.postures == ("Read the disclosure.",)
        assert ctx.voice_timing == {"interruptible": False}


# -- a property: a stuck step ends exactly one way ------------------------------------------------


def stuck_model(
    events: list[str], reprompt_after: int, escalate_after: int
) -> list[tuple[bool, bool, str | None]]:
    """After each turn: (ask active, reprompt key, outcome), per the repair semantics: a turn
    counts for the step when it is still active at the end of the turn, except a turn a
    digression has the floor (the main flow is suspended); tool calls are not turns."""
    active, stuck, outcome = True, 0, None
    seen: list[tuple[bool, bool, str | None]] = []
    for event in events:
        if event == "tool":
            continue
        if event == "answer" and active:
            active, outcome = False, "normal"
        if active and event != "detour":
            stuck += 1
            if stuck >= escalate_after:
                active, outcome = False, "escalated"
        seen.append((active, active and stuck >= reprompt_after, outcome))
    return seen


@settings(deadline=None, max_examples=60)
@given(
    events=st.lists(
        st.sampled_from(["stuck", "answer", "tool", "detour"]), min_size=1, max_size=12
    ),
    reprompt_after=st.integers(1, 4),
    extra=st.integers(0, 3),
)
@example(events=["stuck", "stuck", "answer"], reprompt_after=1, extra=1)  # escalated first
@example(events=["stuck", "answer", "stuck"], reprompt_after=1, extra=1)  # answered in time
@example(events=["tool"] * 6 + ["stuck"], reprompt_after=1, extra=0)  # tools are not turns
@example(events=["stuck", "detour", "detour", "stuck"], reprompt_after=1, extra=1)
def test_a_step_with_escalate_to_completes_normally_or_escalates_never_both(
    events: list[str], reprompt_after: int, extra: int
) -> None:
    escalate_after = reprompt_after + extra
    want = stuck_model(events, reprompt_after, escalate_after)

    async def body() -> None:
        state = State()
        policy = RepairPolicy(
            reprompt_after=reprompt_after, escalate_after=escalate_after, escalate_to="human"
        )
        detour = Digression("detour", is_true("turn:detour"), instant("detour", "Detour."))
        async with conversation_on(state) as conversation:
            runner = conversation.run_flow(FlowStack(asking(policy), [detour]))
            main = runner.main
            got: list[tuple[bool, bool, str | None]] = []
            for event in events:
                if event == "tool":
                    await conversation.tool_ok("lookup")
                    continue
                if event == "answer":
                    state.set("size", 2)
                elif event == "detour":
                    state.set("turn:detour", True)
                ctx = await conversation.user_turn(event)
                assert (runner.overlay == "detour") is (event == "detour")
                normal = "confirm" in main.active_steps or "confirm" in main.done_steps
                escalated = "human" in main.active_steps
                assert not (normal and escalated)
                assert escalated is bool(state.get(escalate_key("ask"), False))
                outcome = "normal" if normal else "escalated" if escalated else None
                active = main.active_steps == ["ask"]
                key = bool(state.get(reprompt_key("ask"), False))
                # The digression speaks on its turn; otherwise the line follows the key.
                assert ctx.reprompts == ((DEFAULT_REPROMPT,) if key and event != "detour" else ())
                got.append((active, key, outcome))
            assert got == want

    for backend in ("asyncio", "trio"):
        anyio.run(body, backend=backend)


# -- main constraints and catch-up while a digression has the floor -------------------------------


def paying() -> Flow:
    """name -> pay (``commit("pay", until=is_true("confirmed"))``) -> bye, with
    ``never("transfer").until(is_set("name"))``."""
    return Flow(
        "billing",
        [
            Step("name", done=is_set("name"), posture=ASK_NAME),
            Step("pay", after=["name"], done=called_ok("pay"), posture="Take the payment."),
            Step("bye", after=["pay"], terminal=True, posture=BYE),
        ],
        constraints=[commit("pay", is_true("confirmed")), never("transfer").until(is_set("name"))],
    )


def chat(name: str) -> Flow:
    """A side conversation whose steps restrict no tool: ``q`` (done when ``{name}:answered``)
    then the terminal ``close``."""
    return Flow(
        name,
        [
            Step(
                "q",
                done=is_true(f"{name}:answered"),
                posture=f"Answer the {name} question.",
                allow="*",  # the detour admits any tool: the main flow's constraints decide
            ),
            Step("close", after=["q"], terminal=True, posture=f"Close the {name} detour."),
        ],
    )


PAY_TOOLS = ["pay", "lookup_hours", "transfer"]
PAID_ONCE = (
    "'pay' has already run and may run only once in this conversation. Do not call it again."
)


@pytest.mark.anyio
async def test_main_commit_and_never_bind_during_a_digression_and_its_tools_count() -> None:
    state = State()
    stack = FlowStack(paying(), [Digression("faq", is_true("turn:faq"), chat("faq"))])
    async with conversation_on(state, tools=PAY_TOOLS) as conversation:
        runner = conversation.run_flow(stack)
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("a question first")
        assert runner.overlay == "faq"
        # The digression restricts nothing; main's commit and never still bind.
        assert ctx.tools == ("lookup_hours",)
        assert sorted(ctx.refused) == ["pay", "transfer"]
        assert ctx.refused["pay"].startswith("'pay' is not permitted yet: first, 'confirmed'")
        assert ctx.refused["transfer"].startswith(
            "'transfer' is not permitted yet: first, 'name' must be known."
        )
        assert not runner.admit("pay").allowed
        assert runner.admit("pay").reason == ctx.refused["pay"]
        assert refusal(conversation, "transfer") == ctx.refused["transfer"]

        state.update({"confirmed": True, "name": "Ann"})
        ctx = await conversation.user_turn("yes, confirmed; I'm Ann")
        # The guards of main's constraints read the State live, even while main is suspended.
        assert runner.main.active_steps == ["name"]
        assert runner.admit("pay") == Admission("pay", True)
        assert refusal(conversation, "transfer") is None
        assert ctx.tools == tuple(PAY_TOOLS)
        await conversation.tool_ok("pay")  # it ran during the digression: main counts it
        assert runner.main.marking.tools_ok == {"pay": 1}
        assert refusal(conversation, "pay") == PAID_ONCE
        assert runner.admit("pay") == Admission("pay", False, PAID_ONCE)

        state.set("faq:answered", True)
        await conversation.user_turn("thanks")
        ctx = await conversation.user_turn("back to it")
        assert runner.overlay is None
        # Main caught up: the name and the payment made during the detour complete its steps.
        assert runner.main.done_steps == ["name", "pay", "bye"]
        assert runner.is_complete
        assert ctx.postures == (BYE,)
        # commit = at most once: still refused after resuming; the rest because the plan is
        # complete (only ambient tools run after it).
        assert ctx.refused["pay"] == PAID_ONCE
        assert refusal(conversation, "pay") == PAID_ONCE
        assert ctx.tools == ()
        assert "the conversation's plan is complete" in ctx.refused["transfer"]


@pytest.mark.anyio
async def test_observe_mode_records_a_main_constraint_breach_during_a_digression() -> None:
    state = State()
    stack = FlowStack(paying(), [Digression("faq", is_true("turn:faq"), chat("faq"))])
    async with conversation_on(state, tools=PAY_TOOLS) as conversation:
        runner = conversation.run_flow(stack, enforcement="observe")
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("question")
        assert ctx.refused == {}
        assert refusal(conversation, "pay") is None
        assert runner.main.violations == []
        admission = runner.admit("pay")
        assert admission.allowed
        assert admission.violation
        assert admission.reason is not None
        assert admission.reason.startswith("'pay' is not permitted yet")
        assert [(v.tool, v.reason, v.active) for v in runner.main.violations] == [
            ("pay", admission.reason, ("q",))
        ]


@pytest.mark.anyio
async def test_a_main_constraint_refusal_during_a_digression_fits_the_speaking_layer() -> None:
    state = State()
    stack = FlowStack(paying(), [Digression("faq", is_true("turn:faq"), chat("faq"))])
    async with conversation_on(state, tools=PAY_TOOLS) as conversation:
        conversation.run_flow(stack)
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("a question first")
        assert ctx.tools == ("lookup_hours",)
        reason = ctx.refused["pay"]
        assert "No tool is available right now" not in reason
        assert ASK_NAME not in reason


@pytest.mark.anyio
async def test_main_on_enter_actions_wait_for_the_catch_up_after_a_digression() -> None:
    state = State()
    size_info = fake_fetch(returns={"max": 8})
    main = booking(size_enter=run(Resolver.fetch("size_info", size_info)))
    stack = FlowStack(main, [Digression("faq", is_true("turn:faq"), chat("faq"))])
    async with session_on(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(stack)
        state.set("turn:faq", True)
        await conversation.user_turn("question")
        state.set("name", "Ann")  # would enter "size", but main is suspended
        await session.wait_idle()
        assert size_info.call_count == 0
        assert runner.main.active_steps == ["name"]
        state.set("faq:answered", True)
        await conversation.user_turn("thanks")
        await session.wait_idle()
        assert size_info.call_count == 0
        ctx = await conversation.user_turn("back")
        await session.wait_idle()
        assert runner.main.active_steps == ["size"]
        assert size_info.call_count == 1
        assert state.get("size_info:result") == {"max": 8}
        assert ctx.postures == (ASK_SIZE,)


@pytest.mark.anyio
async def test_a_digression_after_main_completes_reopens_the_call_until_it_ends() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("turn:faq"), chat("faq"))])
    async with conversation_on(state, tools=TOOLS) as conversation:
        runner = conversation.run_flow(stack)
        state.update({"name": "Ann", "size": 2})
        await conversation.user_turn("Ann, two")
        await conversation.tool_ok("book_table")
        assert runner.is_complete
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("one more thing")
        assert not runner.is_complete
        assert ctx.postures == ("Answer the faq question.",)
        assert ctx.unmet == ()
        state.set("faq:answered", True)
        await conversation.user_turn("thanks")
        assert not runner.is_complete
        ctx = await conversation.user_turn("bye")
        assert runner.is_complete
        assert ctx.postures == (BYE,)  # main's closing words again
        assert runner.history == [(2, "faq", "entered"), (4, "faq", "resumed")]


@pytest.mark.anyio
async def test_restart_after_an_escalation_clears_its_keys_flag_and_target() -> None:
    state = State()
    policy = RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="human", flag="help")
    over = Digression("over", is_true("turn:over"), instant("over", "Start over."), "restart")
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(FlowStack(asking(policy), [over]))
        await conversation.user_turn("um")
        await conversation.user_turn("um")
        assert runner.main.active_steps == ["human"]
        assert (state.get(escalate_key("ask")), state.get("help")) == (True, True)
        state.set("turn:over", True)
        ctx = await conversation.user_turn("start over")
        assert ctx.postures == ("Start over.",)
        assert runner.main.active_steps == ["human"]  # untouched until the next turn
        ctx = await conversation.user_turn("ok")
        assert runner.main.active_steps == ["ask"]
        assert runner.main.done_steps == []
        assert runner.main.verdict("human") is Verdict.PENDING
        assert state.get(escalate_key("ask")) is False
        assert state.get("help") is False
        assert state.get(reprompt_key("ask")) is False
        assert ctx.postures == ("Ask the size.",)
        assert ctx.reprompts == ()  # the restart turn entered the step: not a stuck turn
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        await conversation.user_turn("um")
        assert runner.main.active_steps == ["human"]
        assert state.get("help") is True


# -- repair inside a digression; timing of a terminating digression ------------------------------


@pytest.mark.anyio
async def test_a_digressions_repair_does_not_count_the_turn_that_started_it() -> None:
    state = State()
    faq = Flow(
        "faq",
        [
            Step(
                "q",
                done=is_true("faq:answered"),
                posture="Answer the faq question.",
                repair=RepairPolicy(reprompt_after=1, escalate_after=2),
            ),
            Step("close", after=["q"], terminal=True, posture="Close the faq detour."),
        ],
    )
    async with conversation_on(state) as conversation:
        conversation.run_flow(FlowStack(booking(), [Digression("faq", is_true("turn:faq"), faq)]))
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("when do you open?")
        assert ctx.postures == ("Answer the faq question.",)
        assert ctx.reprompts == ()
        assert reprompt_key("q") not in state
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        assert escalate_key("q") not in state


@pytest.mark.anyio
async def test_a_digressions_repair_reprompts_in_its_own_layer() -> None:
    # The digression's own repair runs in its layer: its reprompt line is said, main's is not,
    # and main's count waits while it is suspended.
    state = State()
    faq = Flow(
        "faq",
        [
            Step(
                "q",
                done=is_true("faq:answered"),
                posture="Answer the faq question.",
                repair=RepairPolicy(reprompt_after=1, escalate_after=2, flag="faq:stuck"),
                timing=VT(reprompt="Ask what they want to know."),
            ),
            Step("close", after=["q"], terminal=True, posture="Close the faq detour."),
        ],
    )
    main = booking(size_repair=RepairPolicy(reprompt_after=1, escalate_after=9))
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(
            FlowStack(main, [Digression("faq", is_true("turn:faq"), faq)])
        )
        state.set("name", "Ann")
        await conversation.user_turn("Ann")
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        state.set("turn:faq", True)
        ctx = await conversation.user_turn("question")
        assert ctx.reprompts == ()  # main's line is not said; the detour has just begun
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == ("Ask what they want to know.",)
        assert state.get(reprompt_key("q")) is True
        assert state.get(reprompt_key("size")) is True  # main's, frozen while it is suspended
        assert "faq:stuck" not in state
        ctx = await conversation.user_turn("um")
        assert state.get(escalate_key("q")) is True
        assert state.get("faq:stuck") is True
        assert runner.current.active_steps == ["q"]  # no target: it stays on the step
        assert escalate_key("size") not in state  # main was not counted meanwhile
        state.set("faq:answered", True)
        ctx = await conversation.user_turn("ok")
        assert ctx.reprompts == ()
        assert state.get(reprompt_key("q")) is False
        ctx = await conversation.user_turn("back")
        assert runner.overlay is None
        assert ctx.reprompts == (DEFAULT_REPROMPT,)  # main's step is still stuck
        assert escalate_key("size") not in state


@pytest.mark.anyio
async def test_a_terminating_digressions_closing_words_keep_their_timing() -> None:
    state = State()
    bye = Flow(
        "bye",
        [Step("x", terminal=True, posture="Read the terms.", timing=VT(interruptible=False))],
    )
    stack = FlowStack(booking(), [Digression("bye", is_true("turn:bye"), bye, "terminate")])
    async with conversation_on(state) as conversation:
        conversation.run_flow(stack)
        state.set("turn:bye", True)
        ctx = await conversation.user_turn("cancel")
        assert ctx.postures == ("Read the terms.",)
        assert ctx.voice_timing == {"interruptible": False}


@pytest.mark.anyio
@pytest.mark.parametrize("resume", ["previous", "restart"])
async def test_a_digressions_closing_step_timing_is_published_on_its_closing_turn(
    resume: Any,
) -> None:
    state = State()
    bye = Flow(
        "note",
        [Step("x", terminal=True, posture="Read the note.", timing=VT(interruptible=False))],
    )
    stack = FlowStack(booking(), [Digression("note", is_true("turn:note"), bye, resume)])
    async with conversation_on(state) as conversation:
        conversation.run_flow(stack)
        state.set("turn:note", True)
        ctx = await conversation.user_turn("read me the note")
        assert ctx.postures == ("Read the note.",)
        assert ctx.voice_timing == {"interruptible": False}
        assert state.get(VOICE_TIMING_KEY) == {"interruptible": False}
        ctx = await conversation.user_turn("ok")
        assert ctx.postures == (ASK_NAME,)
        assert ctx.voice_timing is None
        assert VOICE_TIMING_KEY not in state


# -- repair and timing survive JSON ---------------------------------------------------------------


def test_flow_json_round_trip_keeps_repair_and_timing() -> None:
    policy = RepairPolicy(reprompt_after=1, escalate_after=3, escalate_to="human", flag="help")
    timing = VT(reprompt="Again?", interruptible=False, end_of_speech_ms=800)
    flow = asking(policy, timing=timing)
    data = flow.to_json()
    ask = data["flow"]["steps"][0]
    assert ask["repair"] == {
        "reprompt_after": 1,
        "escalate_after": 3,
        "escalate_to": "human",
        "flag": "help",
    }
    assert ask["timing"] == {"reprompt": "Again?", "interruptible": False, "end_of_speech_ms": 800}
    assert "repair" not in data["flow"]["steps"][1]
    assert "timing" not in data["flow"]["steps"][1]
    back = Flow.from_json(json.loads(json.dumps(data)))
    assert back == flow
    assert back.steps[0].repair == policy
    assert back.steps[0].timing == timing
    assert back.to_json() == data
    # Defaults are written too, so a reader never guesses them.
    plain = Flow("p", [Step("a", done=is_true("a"), repair=RepairPolicy())]).to_json()
    assert plain["flow"]["steps"][0]["repair"] == {"reprompt_after": 2, "escalate_after": 4}


@pytest.mark.anyio
async def test_a_flow_read_from_json_repairs_and_times_like_the_original() -> None:
    policy = RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="human", flag="help")
    flow = asking(policy, timing=VT(reprompt="Again?", interruptible=False))
    back = Flow.from_json(json.loads(json.dumps(flow.to_json())))
    state = State()
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(back)
        ctx = await conversation.user_turn("um")
        assert ctx.reprompts == ("Again?",)
        assert ctx.voice_timing == {"reprompt": "Again?", "interruptible": False}
        ctx = await conversation.user_turn("um")
        assert runner.active_steps == ["human"]
        assert state.get("help") is True
        assert ctx.postures == ("Hand over to a person.",)
        assert ctx.voice_timing is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "repair",
            {"reprompt_after": 5, "escalate_after": 3},
            "flow.steps[0].repair: value: Value error, escalate_after (3) must be >= "
            "reprompt_after (5)",
        ),
        ("repair", {"escalate_after": 0}, "flow.steps[0].repair: escalate_after:"),
        ("repair", {"escalate_to": "ask"}, "repair cannot escalate to the step itself"),
        ("repair", {"tries": 2}, "flow.steps[0].repair: tries:"),
        ("timing", {"filler_after_ms": -1}, "flow.steps[0].timing: filler_after_ms:"),
        ("timing", {"interruptible": "maybe"}, "flow.steps[0].timing: interruptible:"),
    ],
)
def test_bad_repair_or_timing_json_names_its_path(field: str, value: Any, message: str) -> None:
    data = asking(RepairPolicy()).to_json()
    data["flow"]["steps"][0][field] = value
    with pytest.raises(FlowFormatError) as raised:
        Flow.from_json(data)
    assert message in str(raised.value)


def test_an_unknown_escalation_target_fails_compile_for_a_flow_and_a_stack() -> None:
    ghost = Flow("f", [Step("a", done=is_true("a"), repair=RepairPolicy(escalate_to="ghost"))])
    data = ghost.to_json()  # JSON keeps it; checking the graph is compile's job
    assert Flow.from_json(data) == ghost
    with pytest.raises(FlowDefinitionError) as raised:
        ghost.compile()
    assert raised.value.problems == ["step 'a' escalates to unknown step 'ghost'"]
    stack = FlowStack(booking(), [Digression("d", is_true("x"), ghost)])
    with pytest.raises(FlowDefinitionError, match="escalates to unknown step 'ghost'"):
        stack.compile()
    with pytest.raises(FlowDefinitionError, match="escalates to unknown step 'ghost'"):
        StackRunner(stack, State())
    with pytest.raises(FlowDefinitionError, match="repair takes a RepairPolicy"):
        Step("a", done=is_true("a"), repair={"reprompt_after": 1})  # type: ignore[arg-type]
    with pytest.raises(FlowDefinitionError, match="timing takes a VoiceTiming"):
        Step("a", done=is_true("a"), timing={"interruptible": False})  # type: ignore[arg-type]


# -- a property: resets, answers and stuck turns --------------------------------------------------


def retry_flow(reprompt_after: int, escalate_after: int) -> Flow:
    """``ask`` (escalates to ``human``, flag ``help``) -> ``confirm``; ``reset("ask")`` when
    ``turn:retry`` rises."""
    return Flow(
        "retry",
        [
            Step(
                "ask",
                done=is_set("size"),
                posture="Ask the size.",
                repair=RepairPolicy(
                    reprompt_after=reprompt_after,
                    escalate_after=escalate_after,
                    escalate_to="human",
                    flag="help",
                ),
            ),
            Step("confirm", after=["ask"], done=is_true("confirmed"), posture="Confirm."),
            Step("human", done=is_true("handed"), posture="Hand over to a person."),
        ],
        constraints=[reset("ask").when(is_true("turn:retry"))],
    )


@settings(deadline=None, max_examples=60)
@given(
    events=st.lists(st.sampled_from(["stuck", "answer", "retry"]), min_size=1, max_size=14),
    reprompt_after=st.integers(1, 3),
    extra=st.integers(0, 3),
)
@example(events=["stuck", "stuck", "retry", "stuck", "stuck"], reprompt_after=1, extra=1)
@example(events=["answer", "retry", "stuck"], reprompt_after=1, extra=0)
@example(events=["stuck", "stuck", "answer", "retry", "answer"], reprompt_after=2, extra=0)
def test_a_reset_puts_a_stuck_or_escalated_step_back_to_its_first_turn(
    events: list[str], reprompt_after: int, extra: int
) -> None:
    """Each turn: "stuck" says nothing useful, "answer" gives the size, "retry" forgets the
    size and resets ``ask`` (both written before the turn, as an extractor's facts). Model:
    the step is on ``ask``, ``normal`` (answered) or ``escalated``; a reset puts it back on
    ``ask`` with its count at zero; every turn ending on ``ask`` counts."""
    escalate_after = reprompt_after + extra

    async def body() -> None:
        state = State()
        async with conversation_on(state) as conversation:
            runner = conversation.run_flow(retry_flow(reprompt_after, escalate_after))
            phase, stuck = "ask", 0
            for event in events:
                if event == "answer":
                    state.set("size", 2)
                    if phase == "ask":
                        phase = "normal"
                elif event == "retry":
                    state.remove("size", None)
                    state.set("turn:retry", True)
                    phase, stuck = "ask", 0
                    assert runner.active_steps == ["ask"]
                    assert state.get(reprompt_key("ask"), False) is False
                    assert state.get(escalate_key("ask"), False) is False
                ctx = await conversation.user_turn(event)
                if phase == "ask":
                    stuck += 1
                    if stuck >= escalate_after:
                        phase = "escalated"
                want = {"ask": ["ask"], "normal": ["confirm"], "escalated": ["human"]}[phase]
                assert runner.active_steps == want
                assert runner.done_steps == ([] if phase == "ask" else ["ask"])
                reprompting = phase == "ask" and stuck >= reprompt_after
                assert state.get(reprompt_key("ask"), False) is reprompting
                assert ctx.reprompts == ((DEFAULT_REPROMPT,) if reprompting else ())
                assert state.get(escalate_key("ask"), False) is (phase == "escalated")
                assert state.get("help", False) is (phase == "escalated")

    for backend in ("asyncio", "trio"):
        anyio.run(body, backend=backend)


# -- a terminate completed by a tool; a digression that cannot start -----------------------------


CANCEL_TOOLS = ["cancel_booking", "book_table", "transfer", "check_tables"]


def cancelling() -> Flow:
    """``confirm`` (done when cancel_booking succeeded; allows only it) then the terminal
    ``bye``."""
    return Flow(
        "cancel",
        [
            Step(
                "confirm",
                done=called_ok("cancel_booking"),
                posture="Cancel the booking.",
                allow=["cancel_booking"],
            ),
            Step("bye", after=["confirm"], terminal=True, posture="Say goodbye."),
        ],
    )


@pytest.mark.anyio
async def test_a_terminate_digression_completed_by_a_tool_closes_the_call_right_then() -> None:
    state = State()
    cancel = Digression("cancel", is_true("turn:cancel"), cancelling(), "terminate")
    async with conversation_on(state, tools=CANCEL_TOOLS) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [cancel]))
        state.set("turn:cancel", True)
        ctx = await conversation.user_turn("cancel my booking")
        assert ctx.tools == ("cancel_booking",)
        assert ctx.postures == ("Cancel the booking.",)
        await conversation.tool_ok("cancel_booking")
        assert runner.current.is_complete
        assert runner.history == [(1, "cancel", "entered"), (1, "cancel", "terminated")]
        # The model's reply after the tool carries the closing words, and no tool.
        now = conversation.context_now()
        assert now.postures == ("Say goodbye.",)
        assert now.tools == ()
        assert now.refused == dict.fromkeys([*CANCEL_TOOLS, "check_tables"], ended("cancel"))
        assert state.get(OVERLAY_KEY) == "cancel"
        ctx = await conversation.user_turn("thanks")
        assert runner.is_terminated
        assert runner.overlay is None
        assert state.get(OVERLAY_KEY) is None
        assert (ctx.postures, ctx.grounds, ctx.tools) == ((), (), ())
        assert runner.history == [(1, "cancel", "entered"), (1, "cancel", "terminated")]


@pytest.mark.anyio
async def test_a_terminate_digression_completed_by_a_tool_refuses_tools_at_once() -> None:
    state = State()
    cancel = Digression("cancel", is_true("turn:cancel"), cancelling(), "terminate")
    async with conversation_on(state, tools=CANCEL_TOOLS) as conversation:
        runner = conversation.run_flow(FlowStack(booking(), [cancel]))
        state.set("turn:cancel", True)
        await conversation.user_turn("cancel my booking")
        await conversation.tool_ok("cancel_booking")
        reason = ended("cancel")
        assert runner.is_terminated
        assert state.get(TERMINATED_KEY) is True
        assert runner.admit("book_table") == Admission("book_table", False, reason)
        assert refusal(conversation, "transfer") == reason
        assert conversation.context_now().tools == ()


@pytest.mark.anyio
async def test_a_digression_that_cannot_start_leaves_the_main_flow_running() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        conversation.run_flow(side("faq"))  # a flow named "faq" outside the stack
        stack = FlowStack(booking(), [Digression("faq", is_true("turn:faq"), side("faq"))])
        runner = conversation.run_flow(stack)
        state.set("turn:faq", True)
        with pytest.raises(FlowError, match="a flow named 'faq' is already running"):
            await conversation.user_turn("a question")
        assert runner.overlay is None
        assert not runner.main.paused
        state.set("name", "Ann")
        assert runner.main.active_steps == ["size"]


# -- a property: a stuck main flow through detours, restarts and a terminate ----------------------


DETOURS = {"prev": "previous", "again": "restart", "stop": "terminate"}


@settings(deadline=None, max_examples=80)
@given(
    events=st.lists(
        st.sampled_from(["stuck", "answer", "tool", "prev", "again", "stop"]),
        min_size=1,
        max_size=14,
    ),
    reprompt_after=st.integers(1, 3),
    extra=st.integers(0, 2),
)
@example(events=["stuck", "again", "stuck", "stuck"], reprompt_after=1, extra=1)
@example(events=["stuck", "stuck", "answer", "again", "stuck"], reprompt_after=1, extra=1)
@example(events=["prev", "prev", "stuck", "stop", "stuck", "answer"], reprompt_after=1, extra=0)
def test_detours_suspend_restart_or_end_a_stuck_main_flow_as_a_model_says(
    events: list[str], reprompt_after: int, extra: int
) -> None:
    """Three one-turn detours (complete on their entry turn): "prev" resumes the main flow
    where it was, "again" restarts it, "stop" ends the call. Model of the main flow: its phase
    (``ask``, ``normal`` once the size is known, ``escalated``) and the turns stuck on ``ask``;
    a detour turn does not count, nor does the turn a restart re-enters ``ask``; after "stop"
    nothing changes and nothing is said."""
    escalate_after = reprompt_after + extra

    async def body() -> None:
        state = State()
        policy = RepairPolicy(
            reprompt_after=reprompt_after,
            escalate_after=escalate_after,
            escalate_to="human",
            flag="help",
        )
        detours = [
            Digression(name, is_true(f"turn:{name}"), instant(name, f"Detour {name}."), resume)
            for name, resume in DETOURS.items()
        ]
        async with conversation_on(state) as conversation:
            runner = conversation.run_flow(FlowStack(asking(policy), detours))
            main = runner.main
            phase, stuck, known, pending, over = "ask", 0, False, None, False
            for event in events:
                if event == "tool":
                    await conversation.tool_ok("lookup")
                    continue
                if event == "answer":
                    state.set("size", 2)
                    known = True
                elif event in DETOURS:
                    state.set(f"turn:{event}", True)
                frozen = (main.active_steps, main.done_steps)
                ctx = await conversation.user_turn(event)
                if over:
                    assert (main.active_steps, main.done_steps) == frozen
                    assert (ctx.postures, ctx.reprompts, ctx.unmet) == ((), (), ())
                    assert runner.overlay is None
                    assert state.get(TERMINATED_KEY) is True
                    continue
                entered = False
                if pending == "again":  # restarted at this turn, against what is known
                    phase, stuck, entered = ("normal" if known else "ask"), 0, not known
                pending = None
                if phase == "ask" and known:
                    phase = "normal"
                if event in DETOURS:
                    pending, over = event, event == "stop"
                    assert runner.overlay == event
                    assert state.get(OVERLAY_KEY) == event
                    assert ctx.postures == (f"Detour {event}.",)
                    assert ctx.reprompts == ()
                    assert runner.is_terminated is over
                    assert state.get(TERMINATED_KEY) is over
                    continue
                assert runner.overlay is None
                assert state.get(OVERLAY_KEY) is None
                if phase == "ask" and not entered:
                    stuck += 1
                    if stuck >= escalate_after:
                        phase = "escalated"
                want = {"ask": ["ask"], "normal": ["confirm"], "escalated": ["human"]}[phase]
                assert main.active_steps == want
                posture = {"ask": "Ask the size.", "normal": "Confirm."}
                assert ctx.postures == (posture.get(phase, "Hand over to a person."),)
                reprompting = phase == "ask" and stuck >= reprompt_after
                assert state.get(reprompt_key("ask"), False) is reprompting
                assert ctx.reprompts == ((DEFAULT_REPROMPT,) if reprompting else ())
                assert state.get(escalate_key("ask"), False) is (phase == "escalated")
                assert state.get("help", False) is (phase == "escalated")

    for backend in ("asyncio", "trio"):
        anyio.run(body, backend=backend)


# -- triggers heard in the turn, and a detour's background answer ---------------------------------


@pytest.mark.anyio
async def test_a_trigger_is_checked_at_turns_only() -> None:
    state = State()
    stack = FlowStack(booking(), [Digression("faq", is_true("intent:faq"), side("faq"))])
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(stack)
        state.set("intent:faq", True)
        assert runner.overlay is None  # between turns: main still drives
        assert state.get(OVERLAY_KEY) is None
        state.set("intent:faq", False)  # gone again before the turn: never starts
        ctx = await conversation.user_turn("hm")
        assert runner.overlay is None
        assert ctx.postures == (ASK_NAME,)
        assert runner.history == []


@pytest.mark.anyio
async def test_an_extractor_starts_a_detour_whose_background_answer_arrives_after_it() -> None:
    state = State()
    clock = ManualClock()
    hours = fake_fetch(returns={"opens": "9am"}, delay=5, clock=clock)
    faq = Flow(
        "faq",
        [
            Step(
                "q",
                done=is_set("faq:topic"),
                posture="Answer the faq question.",
                on_enter=run(Resolver.fetch("hours", hours), "background"),
            ),
            Step("close", after=["q"], terminal=True, posture="Close the faq detour."),
        ],
    )
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("intent").field_to("faq", "turn:faq", regex(r"\bopen\b")).window(1).build()
        )
        stack = FlowStack(booking(), [Digression("faq", is_set("turn:faq"), faq)])
        runner = conversation.run_flow(stack)
        ctx = await conversation.user_turn("when do you open?")
        assert runner.overlay == "faq"  # heard in this very turn
        assert ctx.postures == ("Answer the faq question.",)
        assert "turn:faq" not in state  # turn-scoped: cleared at the end of the turn
        await settle()  # the lookup starts (and waits on the clock)
        assert hours.call_count == 1
        assert hours.held == 0
        state.set("faq:topic", "hours")
        ctx = await conversation.user_turn("the hours")
        assert ctx.postures == ("Close the faq detour.",)
        assert ctx.deliveries == ()
        ctx = await conversation.user_turn("ok")  # "open" not said again: no new detour
        assert runner.overlay is None
        assert runner.current.name == "booking"
        assert ctx.postures == (ASK_NAME,)
        assert runner.history == [(1, "faq", "entered"), (3, "faq", "resumed")]
        await clock.advance(6)
        await session.wait_idle()
        ctx = await conversation.user_turn("so?")
        # The detour is over, but its lookup's answer still reaches the model.
        assert [(d.name, d.value) for d in ctx.deliveries] == [("hours", {"opens": "9am"})]
        assert ctx.lines == ("Result of hours (tell the caller at a natural pause): opens: 9am.",)


@pytest.mark.anyio
async def test_a_terminate_digression_completed_by_a_write_refuses_tools_at_once() -> None:
    state = State()
    stop = Flow(
        "stop",
        [
            Step("wait", done=is_true("cancel:done"), posture="Cancel the booking."),
            Step("bye", after=["wait"], terminal=True, posture="Say goodbye."),
        ],
    )
    cancel = Digression("cancel", is_true("turn:cancel"), stop, "terminate")
    async with session_on(state) as session:
        conversation = Conversation(session, tools=CANCEL_TOOLS)
        runner = conversation.run_flow(FlowStack(booking(), [cancel]))
        state.set("turn:cancel", True)
        await conversation.user_turn("cancel my booking")
        state.set("cancel:done", True)  # the cancellation service answered
        await session.wait_idle()
        assert runner.current.is_complete
        now = conversation.context_now()
        assert now.postures == ("Say goodbye.",)
        assert now.tools == ()
        assert state.get(TERMINATED_KEY) is True


@pytest.mark.anyio
async def test_a_turn_that_fails_to_start_a_digression_does_not_wedge_the_call() -> None:
    state = State()
    async with session_on(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(side("faq"))  # a flow named "faq" outside the stack
        stack = FlowStack(booking(), [Digression("faq", is_true("turn:faq"), side("faq"))])
        runner = conversation.run_flow(stack)
        state.set("turn:faq", True)
        with pytest.raises(FlowError, match="a flow named 'faq' is already running"):
            await conversation.user_turn("a question")
        assert state.keys("turn:") == []
        assert conversation.cancelled_turns[0].text == "a question"  # the failed turn: not taken
        ctx = await conversation.user_turn("ok, my name is Ann")
        assert runner.overlay is None
        # The main flow speaks (beside the other flow named "faq" the session runs).
        assert ctx.postures == ("Answer the faq question.", ASK_NAME)
        assert [t.text for t in conversation.transcript] == ["ok, my name is Ann"]


@pytest.mark.anyio
async def test_a_digression_step_sharing_an_id_does_not_clobber_main_repair_keys() -> None:
    state = State()
    faq = Flow(
        "faq",
        [
            Step(
                "ask",
                done=is_true("faq:answered"),
                posture="Answer the faq question.",
                repair=RepairPolicy(reprompt_after=1, escalate_after=5),
            ),
            Step("close", after=["ask"], terminal=True, posture="Close the faq detour."),
        ],
    )
    main = Flow(
        "main",
        [
            Step(
                "ask",
                done=is_set("size"),
                posture="Ask the size.",
                repair=RepairPolicy(reprompt_after=1, escalate_after=9),
            )
        ],
    )
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(
            FlowStack(main, [Digression("faq", is_true("turn:faq"), faq)])
        )
        await conversation.user_turn("um")
        assert state.get(reprompt_key("ask")) is True
        state.set("turn:faq", True)
        await conversation.user_turn("a question")
        await conversation.user_turn("um")
        state.set("faq:answered", True)
        await conversation.user_turn("ok")
        ctx = await conversation.user_turn("back")
        assert runner.main.active_steps == ["ask"]
        assert ctx.reprompts == (DEFAULT_REPROMPT,)
        assert state.get(reprompt_key("ask")) is True


# -- digressions, repair and timing driven turn by turn --------------------------------------------

# FlowStack digressions, repair policies and voice timing, driven turn by turn through a
# Session (``conversation.user_turn``), as a voice loop drives them.


def main_flow(on_enter: Any = None) -> Flow:
    return Flow(
        "main",
        [
            Step("a", done=is_true("a"), posture="Do A.", on_enter=on_enter),
            Step("b", after=["a"], done=is_true("b"), posture="Do B.", allow=["pay"]),
            Step("end", after=["b"], terminal=True, posture="Goodbye."),
        ],
        constraints=[commit("pay", until=is_true("b")), once("pay")],
    )


def faq_flow(name: str = "faq") -> Flow:
    return Flow(
        name,
        [
            Step(
                "answer",
                done=is_true(f"{name}:answered"),
                posture="Answer the question.",
                allow="*",  # any tool: what binds is the main flow's constraints
            ),
            Step("back", after=["answer"], terminal=True, posture="Offer to go back."),
        ],
    )


def one_step(name: str, posture: str) -> Flow:
    return Flow(name, [Step("only", terminal=True, posture=posture)])


def stack(*digressions: Digression, on_enter: Any = None) -> FlowStack:
    return FlowStack(main_flow(on_enter), digressions)


# -- digressions -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_digression_suspends_the_main_flow_and_resumes_it_where_it_was() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        runner = conversation.run_flow(stack(Digression("faq", is_true("ask:faq"), faq_flow())))
        assert isinstance(runner, StackRunner)
        assert state.get("flow:overlay") is None
        assert state.get("flow:terminated") is False
        state.set("ask:faq", True)
        ctx = await conversation.user_turn("what are your hours?")
        assert runner.overlay == "faq"
        assert state.get("flow:overlay") == "faq"
        assert ctx.postures == ("Answer the question.",)
        # The main flow is suspended untouched: what it reads may change meanwhile.
        state.set("a", True)
        assert runner.main.active_steps == ["a"]
        assert runner.main.done_steps == []
        state.update({"faq:answered": True, "ask:faq": False})
        ctx = await conversation.user_turn("thanks")
        assert runner.overlay == "faq"  # its closing turn: its last words are said
        assert ctx.postures == ("Offer to go back.",)
        ctx = await conversation.user_turn("ok")
        assert runner.overlay is None
        assert state.get("flow:overlay") is None
        assert runner.main.done_steps == ["a"]  # caught up on "a" when it resumed
        assert ctx.postures == ("Do B.",)
        assert runner.history == [(1, "faq", "entered"), (3, "faq", "resumed")]


@pytest.mark.parametrize("known", [False, True])
@pytest.mark.anyio
async def test_restart_starts_the_main_flow_over_keeping_the_state(known: bool) -> None:
    state = State()
    calls: list[int] = []

    def count(state: State) -> int:
        calls.append(1)
        return len(calls)

    again = Digression("again", is_true("ask:again"), one_step("again", "Start over."), "restart")
    async with session_on(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(
            stack(again, on_enter=run(Resolver.function("count", count), "dispatch"))
        )
        await session.wait_idle()
        assert calls == [1]
        if known:
            state.set("a", True)
            await conversation.user_turn("a done")
            assert runner.main.active_steps == ["b"]
        state.set("ask:again", True)
        await conversation.user_turn("start over")
        state.set("ask:again", False)
        ctx = await conversation.user_turn("ok")
        assert runner.history[-1] == (3 if known else 2, "again", "restarted")
        await session.wait_idle()
        if known:
            # "a" was re-opened and completed at once: the State still knows it (a step whose
            # done already holds is passed through, so its on_enter does not run again).
            assert calls == [1]
            assert runner.main.done_steps == ["a"]
            assert ctx.postures == ("Do B.",)
        else:
            assert calls == [1, 1]  # "a" was entered again: its on_enter fired again
            assert runner.main.active_steps == ["a"]
            assert ctx.postures == ("Do A.",)


@pytest.mark.anyio
async def test_terminate_ends_the_conversation_and_refuses_every_tool() -> None:
    state = State()
    cancel = Digression(
        "cancel", is_true("ask:cancel"), one_step("bye", "Say goodbye."), "terminate"
    )
    async with conversation_on(state, tools=["pay", "transfer"]) as conversation:
        runner = conversation.run_flow(stack(cancel))
        state.set("ask:cancel", True)
        ctx = await conversation.user_turn("cancel it")
        reason = "The conversation has ended: digression 'cancel' terminated it."
        assert ctx.postures == ("Say goodbye.",)  # the closing words are still said
        assert state.get("flow:terminated") is True
        assert runner.is_terminated
        assert runner.is_complete
        assert ctx.tools == ()
        assert ctx.refused == {"pay": reason, "transfer": reason}
        assert refusal(conversation, "transfer") == reason
        admission = runner.admit("transfer")
        assert not admission.allowed
        assert admission.reason == reason
        ctx = await conversation.user_turn("bye")
        assert ctx.postures == ()
        assert ctx.unmet == ()
        assert runner.active_steps == []
        runner.on_tool_ok("pay")  # ignored: nothing is governed
        assert runner.main.marking.tools_ok == {}
        assert runner.history == [(1, "cancel", "entered"), (1, "cancel", "terminated")]


@pytest.mark.anyio
async def test_terminate_in_observe_mode_admits_with_a_violation() -> None:
    state = State()
    cancel = Digression("cancel", is_true("stop"), one_step("bye", "Bye."), "terminate")
    async with Session(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(stack(cancel), enforcement=Enforcement.OBSERVE)
        state.set("stop", True)
        await conversation.user_turn("stop")
        admission = runner.admit("pay")
        assert admission.allowed
        assert admission.violation
        assert "terminated" in admission.reason


@pytest.mark.anyio
async def test_the_main_flow_s_constraints_bind_during_a_digression() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session, tools=["pay"])
        runner = conversation.run_flow(stack(Digression("faq", is_true("ask:faq"), faq_flow())))
        state.set("ask:faq", True)
        ctx = await conversation.user_turn("question")
        assert runner.overlay == "faq"
        assert "pay" in ctx.refused  # commit("pay", until=b) holds in the digression too
        assert "'b' must be true" in ctx.refused["pay"]
        state.set("b", True)
        assert refusal(conversation, "pay") is None
        await conversation.tool_ok("pay")  # during the digression ...
        assert runner.main.marking.tools_ok == {"pay": 1}  # ... counted for the main flow
        assert "may run only once" in (refusal(conversation, "pay") or "")


@pytest.mark.anyio
async def test_one_level_deep_and_the_first_trigger_wins() -> None:
    state = State()
    first = Digression("first", is_true("x"), faq_flow("first"))
    second = Digression("second", is_true("x"), faq_flow("second"))
    async with Session(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(stack(first, second))
        state.set("x", True)
        await conversation.user_turn("x")
        assert runner.overlay == "first"
        await conversation.user_turn("again")  # "second" also holds, but one level deep
        assert runner.overlay == "first"
        assert [h[1] for h in runner.history] == ["first"]


@pytest.mark.anyio
async def test_a_digression_complete_on_entry_is_spoken_then_left() -> None:
    state = State()
    quick = Digression("hours", is_set("turn:hours"), one_step("hours", "We open at 9."))
    async with Session(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(stack(quick))
        state.set("turn:hours", True)
        ctx = await conversation.user_turn("when do you open?")
        assert ctx.postures == ("We open at 9.",)
        assert "turn:hours" not in state  # a turn key: gone after the turn
        ctx = await conversation.user_turn("ok")
        assert runner.overlay is None
        assert ctx.postures == ("Do A.",)
        # Entered again later in the same call: a fresh runner for it.
        state.set("turn:hours", True)
        ctx = await conversation.user_turn("sorry, when?")
        assert ctx.postures == ("We open at 9.",)
        assert [h[2] for h in runner.history] == ["entered", "resumed", "entered"]


def test_definition_errors_name_the_problem() -> None:
    cases: list[tuple[Any, str]] = [
        (
            lambda: (
                FlowStack(main_flow())
                .digression("d", when=is_true("x"), flow=faq_flow())
                .digression("d", when=is_true("y"), flow=faq_flow("other"))
            ),
            "defined twice",
        ),
        (
            lambda: FlowStack(main_flow(), [Digression("d", is_true("x"), main_flow())]),
            "named 'main' like another flow",
        ),
        (lambda: Digression("d", is_true("x"), faq_flow(), "later"), "then must be one of"),
        (lambda: Digression("d", "x", faq_flow()), "when takes a guard"),
        (lambda: Digression("", is_true("x"), faq_flow()), "non-empty string"),
        (lambda: FlowStack("main"), "needs a main Flow"),
    ]
    for make, message in cases:
        with pytest.raises(FlowDefinitionError) as raised:
            make()
        assert message in str(raised.value)


# -- repair ------------------------------------------------------------------------------------


def stuck_flow(**policy: Any) -> Flow:
    return Flow(
        "s",
        [
            Step(
                "ask",
                done=is_set("size"),
                posture="Ask the size.",
                repair=RepairPolicy(**policy),
                timing=VoiceTiming(reprompt="Ask again, shorter."),
            ),
            Step("next", after=["ask"], terminal=True, posture="Next."),
            Step("handoff", terminal=True, posture="Hand off."),
        ],
    )


@pytest.mark.anyio
async def test_reprompt_then_escalate_to_a_step() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(
            stuck_flow(reprompt_after=2, escalate_after=3, escalate_to="handoff", flag="human")
        )
        assert runner.active_steps == ["ask"]  # the target is not active before escalation
        ctx = await conversation.user_turn("uh")
        assert ctx.reprompts == ()
        assert not state.get("repair:ask:reprompt", False)
        ctx = await conversation.user_turn("what")
        assert ctx.reprompts == ("Ask again, shorter.",)
        assert state.get("repair:ask:reprompt") is True
        assert state.get("repair:ask:escalate", False) is False
        ctx = await conversation.user_turn("dunno")
        assert state.get("repair:ask:escalate") is True
        assert state.get("human") is True
        assert runner.done_steps == ["ask", "handoff"]  # "next" was not entered
        assert ctx.postures == ("Hand off.",)
        assert state.get("repair:ask:reprompt") is False  # the step left the active set


@pytest.mark.anyio
async def test_answering_in_time_clears_the_reprompt_and_never_escalates() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(
            stuck_flow(reprompt_after=1, escalate_after=3, escalate_to="handoff")
        )
        ctx = await conversation.user_turn("uh")
        assert ctx.reprompts == ("Ask again, shorter.",)
        state.set("size", 4)
        ctx = await conversation.user_turn("four")
        assert runner.done_steps == ["ask", "next"]
        assert state.get("repair:ask:reprompt") is False
        assert state.get("repair:ask:escalate", False) is False
        for _ in range(5):
            await conversation.user_turn("more")
        assert runner.done_steps == ["ask", "next"]


@pytest.mark.anyio
async def test_tool_calls_do_not_count_as_turns() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(stuck_flow(reprompt_after=2, escalate_after=2))
        await conversation.user_turn("uh")
        for _ in range(5):
            await conversation.tool_ok("lookup")
        assert not state.get("repair:ask:reprompt", False)
        await conversation.user_turn("hm")
        assert state.get("repair:ask:reprompt") is True
        assert state.get("repair:ask:escalate") is True


@pytest.mark.anyio
async def test_default_reprompt_text() -> None:
    flow = Flow("d", [Step("q", done=is_set("x"), repair=RepairPolicy(reprompt_after=1))])
    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.run_flow(flow)
        ctx = await conversation.user_turn("...")
        assert ctx.reprompts == (DEFAULT_REPROMPT,)


@pytest.mark.anyio
async def test_a_reset_clears_the_repair_state() -> None:
    state = State()
    flow = Flow(
        "r",
        [
            Step(
                "ask",
                done=is_set("size"),
                repair=RepairPolicy(reprompt_after=1, escalate_after=2, escalate_to="human"),
            ),
            Step("next", after=["ask"], terminal=True),
            Step("human", terminal=True),
        ],
        constraints=[reset("ask").when(is_true("again"))],
    )
    async with Session(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(flow)
        await conversation.user_turn("uh")
        await conversation.user_turn("uh")
        assert runner.done_steps == ["ask", "human"]
        state.set("again", True)  # start the question over
        assert runner.active_steps == ["ask"]  # re-opened, not re-completed by the escalation
        await conversation.user_turn("hm")
        assert state.get("repair:ask:escalate") is False
        assert state.get("repair:ask:reprompt") is True  # counting from one again


def test_repair_definition_errors_turns() -> None:
    with pytest.raises(FlowDefinitionError, match="escalate to the step itself"):
        Step("a", done=is_true("a"), repair=RepairPolicy(escalate_to="a"))
    with pytest.raises(FlowDefinitionError, match="escalates to unknown step 'nowhere'"):
        Flow(
            "f", [Step("a", done=is_true("a"), repair=RepairPolicy(escalate_to="nowhere"))]
        ).build()
    with pytest.raises(ValidationError, match="escalate_after"):
        RepairPolicy(reprompt_after=3, escalate_after=2)
    with pytest.raises(FlowDefinitionError, match="repair takes a RepairPolicy"):
        Step("a", done=is_true("a"), repair={"reprompt_after": 2})  # type: ignore[arg-type]


def test_repair_and_timing_survive_json() -> None:
    flow = stuck_flow(reprompt_after=2, escalate_after=3, escalate_to="handoff", flag="human")
    data = flow.to_json()
    assert data["flow"]["steps"][0]["repair"] == {
        "reprompt_after": 2,
        "escalate_after": 3,
        "escalate_to": "handoff",
        "flag": "human",
    }
    assert data["flow"]["steps"][0]["timing"] == {"reprompt": "Ask again, shorter."}
    assert Flow.from_json(data).steps == flow.steps
    data["flow"]["steps"][0]["timing"] = {"reprompt_after_ms": -1}
    with pytest.raises(FlowFormatError, match=r"steps\[0\]\.timing: reprompt_after_ms"):
        Flow.from_json(data)


@settings(deadline=None, max_examples=60)
@given(
    turns=st.lists(st.sampled_from(["stuck", "answer"]), min_size=1, max_size=12),
    reprompt=st.integers(1, 4),
    extra=st.integers(0, 3),
)
def test_a_stuck_step_ends_one_way_and_reprompts_when_due(
    turns: list[str], reprompt: int, extra: int
) -> None:
    escalate = reprompt + extra

    async def main() -> None:
        state = State()
        async with Session(state) as session:
            conversation = Conversation(session)
            runner = conversation.run_flow(
                stuck_flow(reprompt_after=reprompt, escalate_after=escalate, escalate_to="handoff")
            )
            stuck = 0
            for turn in turns:
                if turn == "answer" and runner.active_steps == ["ask"]:
                    state.set("size", 1)
                was_active = runner.active_steps == ["ask"]
                await conversation.user_turn(turn)
                if was_active and runner.active_steps == ["ask"]:
                    stuck += 1
                active = runner.active_steps == ["ask"]
                reprompting = bool(state.get("repair:ask:reprompt", False))
                assert reprompting == (active and stuck >= reprompt)
            finished = {"next", "handoff"} & set(runner.done_steps)
            assert len(finished) <= 1  # never both
            if "ask" in runner.done_steps:
                assert len(finished) == 1

    for backend in ("asyncio", "trio"):
        anyio.run(main, backend=backend)


# -- voice timing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "merged"),
    [
        (
            VoiceTiming(reprompt_after_ms=8000),
            VoiceTiming(reprompt_after_ms=5000),
            VoiceTiming(reprompt_after_ms=5000),
        ),
        (VoiceTiming(filler_after_ms=1000), VoiceTiming(), VoiceTiming(filler_after_ms=1000)),
        (
            VoiceTiming(end_of_speech_ms=400),
            VoiceTiming(end_of_speech_ms=900),
            VoiceTiming(end_of_speech_ms=900),
        ),
        (
            VoiceTiming(interruptible=True),
            VoiceTiming(interruptible=False),
            VoiceTiming(interruptible=False),
        ),
        (VoiceTiming(interruptible=True), VoiceTiming(), VoiceTiming(interruptible=True)),
        (VoiceTiming(reprompt="A"), VoiceTiming(reprompt="B"), VoiceTiming(reprompt="A")),
        (VoiceTiming(), VoiceTiming(reprompt="B"), VoiceTiming(reprompt="B")),
    ],
)
def test_voice_timing_merges_to_the_most_cautious(
    a: VoiceTiming, b: VoiceTiming, merged: VoiceTiming
) -> None:
    assert a.merge(b) == merged
    assert VoiceTiming.model_validate(merged.model_dump()) == merged
    assert merged.holds_floor is (merged.interruptible is False)


@pytest.mark.anyio
async def test_timing_switches_with_the_speaking_layer() -> None:
    state = State()
    main = Flow("main", [Step("a", done=is_true("a"), timing=VoiceTiming(end_of_speech_ms=700))])
    faq = Flow("faq", [Step("q", done=is_true("q"), timing=VoiceTiming(interruptible=False))])
    bye = Flow("bye", [Step("x", terminal=True)])
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(
            FlowStack(
                main,
                [
                    Digression("faq", is_true("ask"), faq),
                    Digression("bye", is_true("stop"), bye, "terminate"),
                ],
            )
        )
        await conversation.user_turn("hi")
        assert state.get("session:voice_timing") == {"end_of_speech_ms": 700}
        state.set("ask", True)
        await conversation.user_turn("question")
        assert state.get("session:voice_timing") == {"interruptible": False}
        state.update({"q": True, "ask": False})
        await conversation.user_turn("thanks")  # the closing turn: nothing active in faq
        assert "session:voice_timing" not in state
        await conversation.user_turn("back")
        assert state.get("session:voice_timing") == {"end_of_speech_ms": 700}
        state.set("stop", True)
        await conversation.user_turn("stop")
        assert "session:voice_timing" not in state


@pytest.mark.anyio
async def test_done_guards_see_digression_free_markings() -> None:
    # A main-flow guard over the marking (done("a")) still works after a digression.
    state = State()
    main = Flow(
        "main",
        [
            Step("a", done=is_true("a")),
            Step("b", gate=done("a"), done=called_ok("t"), allow=["t"]),
        ],
    )
    async with Session(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(FlowStack(main, [Digression("d", is_true("d"), faq_flow())]))
        state.set("d", True)
        await conversation.user_turn("x")
        state.update({"a": True, "d": False, "faq:answered": True})
        await conversation.user_turn("y")
        await conversation.user_turn("z")
        assert runner.active_steps == ["b"]
