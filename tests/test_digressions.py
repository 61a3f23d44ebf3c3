"""FlowStack digressions, repair policies and voice timing, driven turn by turn through a
Session (``conversation.user_turn``), as a voice loop drives them."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

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
    called_ok,
    commit,
    done,
    is_set,
    is_true,
    once,
    reset,
    run,
)
from slateflow.errors import FlowDefinitionError, FlowFormatError
from slateflow.flow import DEFAULT_REPROMPT, Enforcement, StackRunner

pytestmark = pytest.mark.anyio


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
            Step("answer", done=is_true(f"{name}:answered"), posture="Answer the question."),
            Step("back", after=["answer"], terminal=True, posture="Offer to go back."),
        ],
    )


def one_step(name: str, posture: str) -> Flow:
    return Flow(name, [Step("only", terminal=True, posture=posture)])


def stack(*digressions: Digression, on_enter: Any = None) -> FlowStack:
    return FlowStack(main_flow(on_enter), digressions)


# -- digressions -------------------------------------------------------------------------------


async def test_a_digression_suspends_the_main_flow_and_resumes_it_where_it_was() -> None:
    state = State()
    async with Session(state, clock=ManualClock()) as session:
        conversation = Conversation(session)
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
async def test_restart_starts_the_main_flow_over_keeping_the_state(known: bool) -> None:
    state = State()
    calls: list[int] = []

    def count(state: State) -> int:
        calls.append(1)
        return len(calls)

    again = Digression("again", is_true("ask:again"), one_step("again", "Start over."), "restart")
    async with Session(state, clock=ManualClock()) as session:
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


async def test_terminate_ends_the_conversation_and_refuses_every_tool() -> None:
    state = State()
    cancel = Digression(
        "cancel", is_true("ask:cancel"), one_step("bye", "Say goodbye."), "terminate"
    )
    async with Session(state, clock=ManualClock()) as session:
        conversation = Conversation(session, tools=["pay", "transfer"])
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


async def test_default_reprompt_text() -> None:
    flow = Flow("d", [Step("q", done=is_set("x"), repair=RepairPolicy(reprompt_after=1))])
    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.run_flow(flow)
        ctx = await conversation.user_turn("...")
        assert ctx.reprompts == (DEFAULT_REPROMPT,)


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


def test_repair_definition_errors() -> None:
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
