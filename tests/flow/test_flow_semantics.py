"""Flow semantics a new user reaches for when building a chat intake flow.

Numeric thresholds as data guards (``gt`` / ``ge`` / ``lt`` / ``le`` / ``between``, on a key or
a path inside a result, saved and loaded as JSON); a hand-off step that ends the flow without
every other step carrying a "not handed off" condition; branch conditions latched once taken
unless declared live; and the waits of a flow with digressions.
"""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import pytest

from builders import session_on
from slateflow import Conversation, Flow, Session, State, Step, edge, is_set, is_true
from slateflow.errors import FlowDefinitionError, FlowFormatError, GuardFormatError
from slateflow.flow import (
    Digression,
    FlowRunner,
    FlowStack,
    Guard,
    Verdict,
    between,
    ge,
    gt,
    le,
    lt,
    require,
    reset,
)
from slateflow.stores import MemoryStore

# -- numeric comparisons ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("guard", "value", "holds"),
    [
        (gt("x", 0.8), 0.81, True),
        (gt("x", 0.8), 0.8, False),
        (gt("x", 1), 2, True),
        (ge("x", 0.8), 0.8, True),
        (ge("x", 0.8), 0.79, False),
        (lt("x", 10), 9.5, True),
        (lt("x", 10), 10, False),
        (le("x", 10), 10, True),
        (le("x", 10), 10.5, False),
        (between("x", 18, 65), 18, True),
        (between("x", 18, 65), 65, True),
        (between("x", 18, 65), 40.5, True),
        (between("x", 18, 65), 17.9, False),
        (between("x", 18, 65), 66, False),
        (gt("x", -1), 0, True),
        (gt("x", 2**70), 2**70 + 1, True),
    ],
)
def test_a_comparison_holds_by_number(guard: Guard, value: Any, holds: bool) -> None:
    state = State()
    state.set("x", value)
    assert guard.evaluate(state) is holds


@pytest.mark.parametrize("value", [None, True, False, "0.9", "high", [1], {"score": 1}])
def test_a_value_that_is_not_a_number_never_satisfies_a_comparison(value: Any) -> None:
    state = State()
    state.set("x", value)
    for guard in (gt("x", 0), ge("x", 0), lt("x", 100), le("x", 100), between("x", -5, 5)):
        assert not guard.evaluate(state)
        assert not guard.evaluate(State())  # missing


def test_a_comparison_reads_a_path_inside_a_result() -> None:
    state = State()
    high = gt("fraud:result.score", 0.8)
    assert high.keys_read() == frozenset({"fraud:result"})
    assert not high.evaluate(state)
    state.set("fraud:result", {"score": 0.93, "reasons": ["velocity"]})
    assert high.evaluate(state)
    assert lt("fraud:result.reasons.0", 1).evaluate(state) is False  # a string there


@pytest.mark.parametrize(
    "build",
    [
        lambda: gt("x", True),
        lambda: gt("x", "0.8"),
        lambda: gt("x", None),
        lambda: ge("x", math.nan),
        lambda: le("x", math.inf),
        lambda: between("x", 5, 1),
        lambda: between("x", 0, "9"),
        lambda: lt("", 1),
        lambda: gt("bad key!", 1),
    ],
)
def test_a_malformed_comparison_is_refused_when_built(build: Any) -> None:
    with pytest.raises(GuardFormatError):
        build()


@pytest.mark.parametrize(
    "guard",
    [
        gt("fraud:result.score", 0.8),
        ge("age", 18),
        lt("wait:minutes", 5),
        le("basket:total", 99.99),
        between("fraud:result.score", 0.2, 0.8),
        gt("x", 1) & ~between("y", 0, 1),
    ],
)
def test_a_comparison_round_trips_through_json(guard: Guard) -> None:
    data = guard.to_json()
    again = Guard.from_json(json.loads(json.dumps(data)))
    assert again == guard
    assert again.describe() == guard.describe()
    state = State()
    state.set("fraud:result", {"score": 0.5})
    state.set("age", 30)
    assert again.evaluate(state) == guard.evaluate(state)


@pytest.mark.parametrize(
    ("node", "where"),
    [
        ({"op": "gt", "key": "x", "value": "1"}, "guard"),
        ({"op": "gt", "key": "x"}, "value"),
        ({"op": "le", "key": 3, "value": 1}, "guard.key"),
        ({"op": "between", "key": "x", "low": 2, "high": 1}, "guard"),
        ({"op": "between", "key": "x", "low": 1}, "high"),
        ({"op": "ge", "key": "x", "value": 1, "extra": 1}, "extra"),
    ],
)
def test_a_bad_comparison_node_names_where_it_is(node: dict[str, Any], where: str) -> None:
    with pytest.raises(GuardFormatError, match=where):
        Guard.from_json({"format": "slateflow.guard/1", "guard": node})


def test_explain_shows_the_number_found_or_that_it_is_not_one() -> None:
    state = State()
    guard = gt("fraud:result.score", 0.8)
    assert "not set" in str(guard.explain(state))
    state.set("fraud:result", {"score": "high"})
    assert '"high" (not a number)' in str(guard.explain(state))
    state.set("fraud:result", {"score": 0.9})
    why = guard.explain(state)
    assert why.holds
    assert "0.9" in str(why)
    assert "greater than 0.8" in str(why)


def test_a_fraud_threshold_routes_the_flow_and_the_flow_saves_as_json() -> None:
    flow = Flow(
        "intake",
        [
            Step("check", done=is_set("fraud:result")),
            Step(
                "review",
                after=[edge("check", when=gt("fraud:result.score", 0.8))],
                done=is_true("reviewed"),
            ),
            Step(
                "approve",
                after=[edge("check", when=le("fraud:result.score", 0.8))],
                done=is_true("approved"),
            ),
        ],
    )
    loaded = Flow.from_json(flow.to_json())
    assert loaded.to_json() == flow.to_json()
    for f, score, active in ((flow, 0.93, "review"), (loaded, 0.41, "approve")):
        state = State()
        with FlowRunner(f, state) as runner:
            state.set("fraud:result", {"score": score})
            assert runner.active_steps == [active]


# -- latched branch conditions ------------------------------------------------------------------


def retry_flow(live: bool = False) -> Flow:
    return Flow(
        "pay",
        [
            Step("charge", done=is_set("charge:status")),
            Step(
                "retrying",
                after=[edge("charge", when=is_true("charge:declined"), live=live)],
                done=is_true("retry:finished"),
                posture="Tell the caller we are trying the card again.",
            ),
        ],
    )


def test_a_branch_taken_stays_taken_when_its_condition_turns_false() -> None:
    state = State()
    with FlowRunner(retry_flow(), state) as runner:
        state.update({"charge:status": "declined", "charge:declined": True})
        assert runner.active_steps == ["retrying"]
        state.set("charge:declined", False)  # the retry started: the decline flag clears
        assert runner.active_steps == ["retrying"]
        assert list(runner.brief().postures) == ["Tell the caller we are trying the card again."]
        state.set("retry:finished", True)
        assert runner.is_complete


def test_a_live_branch_is_active_only_while_its_condition_holds() -> None:
    state = State()
    with FlowRunner(retry_flow(live=True), state) as runner:
        state.update({"charge:status": "declined", "charge:declined": True})
        assert runner.active_steps == ["retrying"]
        state.set("charge:declined", False)
        assert runner.active_steps == []
        state.set("charge:declined", True)
        assert runner.active_steps == ["retrying"]


def test_a_branch_not_yet_taken_still_waits_for_its_condition() -> None:
    state = State()
    with FlowRunner(retry_flow(), state) as runner:
        state.set("charge:declined", True)
        state.set("charge:declined", False)  # flickered before "charge" was done
        state.set("charge:status", "ok")
        assert runner.active_steps == []
        assert runner.verdict("retrying") is Verdict.PENDING


def test_a_reset_reopens_a_latched_branch() -> None:
    flow = Flow(
        "pay",
        [
            Step("charge", done=is_set("charge:status")),
            Step("retrying", after=[edge("charge", when=is_true("declined"))], done=is_true("fin")),
        ],
        constraints=[reset("charge").when(is_true("new:card"))],
    )
    state = State()
    with FlowRunner(flow, state) as runner:
        state.update({"charge:status": "declined", "declined": True})
        state.set("declined", False)
        assert runner.active_steps == ["retrying"]
        state.set("new:card", True)  # re-opens charge and retrying; status is still known
        assert runner.active_steps == []  # the branch must be taken again, and it is not


def test_live_is_saved_and_loaded_and_needs_a_condition() -> None:
    flow = retry_flow(live=True)
    data = flow.to_json()
    assert Flow.from_json(data).steps[1].after[0].live is True
    assert "live" not in str(retry_flow().to_json())
    with pytest.raises(FlowDefinitionError, match="live"):
        edge("charge", live=True)
    bad = retry_flow().to_json()
    bad["flow"]["steps"][1]["after"][0]["live"] = "yes"
    with pytest.raises(FlowFormatError, match="live"):
        Flow.from_json(bad)


# -- a step that ends the flow ------------------------------------------------------------------


def intake(ends_terminal: bool = False) -> Flow:
    handoff = (
        Step(
            "handoff",
            gate=is_true("caller:wants_human"),
            ends=True,
            terminal=True,
            posture="Say a person will call back.",
        )
        if ends_terminal
        else Step(
            "handoff",
            gate=is_true("caller:wants_human"),
            ends=True,
            done=is_true("transfer:done"),
            posture="Transfer the caller to a person.",
            allow=["transfer_call"],
        )
    )
    return Flow(
        "intake",
        [
            Step("name", done=is_set("caller:name"), allow=["lookup"], posture="Ask the name."),
            Step("issue", after=["name"], done=is_set("caller:issue"), allow=["lookup"]),
            Step("book", after=["issue"], done=is_set("booking:id"), allow=["book"]),
            handoff,
        ],
        constraints=[require("book")],
    )


def test_a_hand_off_step_ends_the_flow_without_conditions_on_the_others() -> None:
    state = State()
    with FlowRunner(intake(), state) as runner:
        state.set("caller:name", "Ada")
        assert runner.active_steps == ["issue"]
        assert not runner.admit("transfer_call")
        state.set("caller:wants_human", True)
        assert runner.active_steps == ["handoff"]
        assert runner.admit("transfer_call")  # the tools it needs are admitted
        assert not runner.admit("book")
        assert list(runner.brief().postures) == ["Transfer the caller to a person."]
        assert not runner.is_complete
        state.set("caller:issue", "billing")  # would have moved the flow on
        assert runner.active_steps == ["handoff"]
        assert runner.verdict("book") is Verdict.SKIPPED
        state.set("transfer:done", True)
        assert runner.is_complete  # though "book", which require() names, never ran
        assert runner.done_steps == ["name", "handoff"]
        assert state.get("flow:intake:complete") is True


def test_a_terminal_hand_off_completes_at_once_and_keeps_its_closing_words() -> None:
    state = State()
    with FlowRunner(intake(ends_terminal=True), state) as runner:
        state.set("caller:wants_human", True)
        assert runner.is_complete
        assert runner.active_steps == []
        assert list(runner.brief().postures) == ["Say a person will call back."]


def test_a_step_made_eligible_by_the_same_change_as_the_hand_off_is_never_entered() -> None:
    entered: list[str] = []
    from slateflow.flow import signals

    def note(sender: Any, *, step: str, **_: Any) -> None:
        entered.append(step)

    state = State()
    with FlowRunner(intake(), state) as runner, signals.step_entered.connected_to(note):
        state.update({"caller:name": "Ada", "caller:wants_human": True})
        assert runner.active_steps == ["handoff"]
    assert entered == ["handoff"]


def test_an_ended_flow_resumes_ended_from_a_store() -> None:
    store = MemoryStore()
    state = State(store=store)
    with FlowRunner(intake(), state):
        state.set("caller:wants_human", True)
    again = State(store=store)
    with FlowRunner(intake(), again) as runner:
        assert runner.active_steps == ["handoff"]
        again.set("caller:name", "Ada")
        assert runner.active_steps == ["handoff"]


def test_ends_is_saved_and_loaded() -> None:
    flow = intake()
    loaded = Flow.from_json(flow.to_json())
    assert loaded.steps[3].ends is True
    assert loaded == flow


# -- waits on a flow with digressions -----------------------------------------------------------


def faq() -> Flow:
    return Flow(
        "faq",
        [
            Step("answer", done=is_true("faq:answered")),
            Step("back", after=["answer"], terminal=True),
        ],
    )


@pytest.mark.anyio
async def test_a_flow_stack_has_the_waits_of_a_flow() -> None:
    state = State()
    main = Flow("main", [Step("a", done=is_true("a")), Step("b", after=["a"], done=is_true("b"))])
    stack = FlowStack(main, [Digression("faq", is_true("ask:faq"), faq())])
    async with session_on(state) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(stack)
        assert await runner.wait_for_step("a") is Verdict.ACTIVE
        state.set("ask:faq", True)
        await conversation.user_turn("what are your hours?")
        assert await runner.wait_for_step("answer", timeout=1) is Verdict.ACTIVE
        assert await runner.wait_for_step("answer", flow="faq") is Verdict.ACTIVE
        state.set("faq:answered", True)
        state.set("ask:faq", False)
        await conversation.user_turn("thanks")
        await conversation.user_turn("back to it")
        state.set("a", True)
        assert await runner.wait_for_step("b", timeout=1) is Verdict.ACTIVE
        async with anyio.create_task_group() as tg:
            tg.start_soon(_set_later, session, state, "b")
            await runner.wait_complete(timeout=5)
        assert runner.is_complete


@pytest.mark.anyio
async def test_a_flow_stack_wait_times_out_with_an_explanation() -> None:
    from slateflow.errors import FlowError, WaitTimeoutError

    state = State()
    main = Flow("main", [Step("a", done=is_true("a"))])
    stack = FlowStack(main, [Digression("faq", is_true("ask:faq"), faq())])
    async with session_on(state) as session:
        runner = stack.start(session)
        with pytest.raises(WaitTimeoutError, match="main"):
            await runner.wait_complete(timeout=3)
        with pytest.raises(WaitTimeoutError, match="answer"):
            await runner.wait_for_step("answer", timeout=3)
        with pytest.raises(FlowError, match="no step 'nope'"):
            await runner.wait_for_step("nope")
        with pytest.raises(FlowError, match="no flow or digression named 'x'"):
            await runner.wait_for_step("a", flow="x")


async def _set_later(session: Session, state: State, key: str) -> None:
    await session.clock.sleep(1)
    state.set(key, True)
