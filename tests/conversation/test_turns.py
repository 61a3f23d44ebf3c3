"""The turn API of the Session, from the caller's side: ``user_turn`` (redaction, transcript,
turn keys), extractors attached to a session (triggers, windows, completion actions, failures),
the :class:`TurnContext` (postures, grounds, unmet requirements, tools, de-duplicated lines),
background results handed to the model exactly once, the interruption race, and voice timing.

Everything timed runs on a :class:`ManualClock`; nothing sleeps. ``await settle()`` (or
``await clock.advance(0)``) lets every ready task run; held fakes (``fake_fetch()`` with no
``returns``) finish only when the test calls ``fake.complete(...)``. The only real-time bound
is ``anyio.fail_after(SAFETY)`` around waits for another thread, a safety net a working session
never reaches.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from builders import ASK, BYE, READ_BACK, conversation_on, session_on
from builders import booking as shared_booking
from helpers import refusal
from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Scheduling,
    Session,
    State,
    Step,
    VoiceTiming,
    called_ok,
    captured,
    commit,
    is_set,
    is_true,
    never,
    require,
    resolved,
    run,
)
from slateflow.conversation import (
    Extract,
    Extractor,
    Recognition,
    Recognizer,
    Trigger,
    integer,
    integer_near,
    one_of,
    overwrite,
    regex,
    true_only,
    yes_no,
)
from slateflow.errors import SessionError
from slateflow.flow import Verdict
from slateflow.resolve import BackgroundResult
from slateflow.resolve.clock import settle
from slateflow.testing import fake_fetch

SAFETY = 10.0  # seconds of real time a thread test may take before it counts as hung

CONFIRM = READ_BACK
BOOK = "Book the table."
TOOLS_TRANSFER = "Tools you may call now: transfer."
UNMET_BOTH = "Before finishing, these still need to happen: confirm, book."


# -- builders ---------------------------------------------------------------------------------


def booking() -> Flow:
    """ask (a party size) -> confirm (a yes) -> book (the 'book' tool) -> bye.

    'book' is a commit tool refused until the yes; 'refund' is never allowed until 'manager'
    says so; the flow needs confirm and book done (in that order of naming)."""
    return shared_booking(
        grounds=True,
        book_done=called_ok("book"),
        book_tools=("book", "transfer"),
        book_posture=BOOK,
        ambient=("transfer",),  # a hand-off to a person, in every step
        constraints=[
            commit("book", until=is_true("b:ok")),
            never("refund").until(is_true("manager")),
            require("confirm", "book"),
        ],
    )


def step_is(step: str, flow: str = "booking") -> Callable[[Any, State], bool]:
    """An ``accept_when`` predicate: ``step`` of ``flow`` is active now (as demo_flow does)."""

    def active(value: Any, state: State) -> bool:
        return step in (state.get(f"flow:{flow}:active") or [])

    active.__name__ = f"step {step!r} is active"
    return active


def sizes(*, correctable: bool = False) -> Extractor:
    """'b:size' from "four people" (a later size overwrites it only if ``correctable``)."""
    rule = overwrite() if correctable else None
    return Extract("b").field("size", integer_near(["people", "us"]), rule).build()


def answers(*triggers: Trigger) -> Extractor:
    """'b:ok' from a yes, accepted only while the confirm step is active."""
    builder = Extract("ans").field_to(
        "ok", "b:ok", yes_no(), true_only().accept_when(step_is("confirm"))
    )
    return (builder.trigger(*triggers) if triggers else builder).build()


class Probe(Recognizer):
    """Hears nothing; calls ``see(text)`` with what the extractor was given."""

    def __init__(self, see: Callable[[str], Any]) -> None:
        self.see = see

    def recognize(self, text: str) -> Recognition | None:
        self.see(text)
        return None

    def describe(self) -> str:
        return "a probe"


class Boom(Recognizer):
    """A recognizer (a subclass) that always raises."""

    def recognize(self, text: str) -> Recognition | None:
        raise RuntimeError(f"cannot read {text!r}")

    def describe(self) -> str:
        return "a broken recognizer"


def probe(name: str, seen: list[Any], what: Callable[[str], Any] = lambda t: t) -> Extract:
    """An extractor builder whose only field records ``what(text)`` each time it runs."""
    return Extract(name).field("x", Probe(lambda text: seen.append(what(text))))


class Failures:
    """Records what ``state.receiver_failed`` reports (blinker holds receivers weakly, so this
    object keeps its receiver alive)."""

    def __init__(self, state: State) -> None:
        self.seen: list[tuple[Any, BaseException]] = []
        self.state = state
        state.receiver_failed.connect(self.receive)

    def receive(self, sender: Any, **kw: Any) -> None:
        self.seen.append((kw["receiver"], kw["error"]))

    def close(self) -> None:
        self.state.receiver_failed.disconnect(self.receive)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def state(clock: ManualClock) -> State:
    return State(clock=clock)


@pytest.fixture
def failures(state: State) -> Iterator[Failures]:
    recorder = Failures(state)
    yield recorder
    recorder.close()


HINTS = {
    "interrupt": " (tell the caller now)",
    "when_idle": " (tell the caller at a natural pause)",
}


def line(result_name: str, scheduling: str, response: dict[str, Any]) -> str:
    """The line a completed result is told in: its value in words."""
    if response["status"] == "error":
        words = f"it failed: {response['error']}"
    elif isinstance(response["result"], dict):
        words = "; ".join(
            f"{k}: {'yes' if v is True else v}" for k, v in response["result"].items()
        )
    else:
        words = str(response["result"])
    return f"Result of {result_name}{HINTS.get(scheduling, '')}: {words.rstrip('.')}."


def delivery_lines(lines: tuple[str, ...]) -> list[str]:
    return [x for x in lines if x.startswith("Result of")]


# -- 1. recording the turn ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_user_turn_redacts_records_and_clears_the_turn_keys(
    clock: ManualClock, state: State
) -> None:
    during: list[tuple[Any, Any, Any]] = []
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            probe(
                "peek",
                during,
                lambda text: (text, state.get("turn:user"), state.get("session:turn")),
            ).build()
        )
        state.set("temp:scratch", "x")
        state.set("turn:note", "y")
        await clock.advance(3)
        ctx = await conversation.user_turn(
            "my card is 4111 1111 1111 1111 and my account 12345678, for two"
        )

        heard = "my card is [card ending 1111] and my account [redacted number], for two"
        assert during == [(heard, heard, 1)]  # the extractor saw the redacted turn and its keys
        assert (ctx.turn.number, ctx.turn.text, ctx.turn.at) == (1, heard, clock.time())
        assert [(t.number, t.text) for t in conversation.transcript] == [(1, heard)]
        assert state.get("session:turn") == 1
        # turn: and temp: last one turn: gone once user_turn returned.
        assert state.keys("turn:") == []
        assert state.keys("temp:") == []
        # The card number never reached the State, not even its journal.
        journal = json.dumps([m.to_dict(redact=False) for m in state.journal.since(0)])
        assert "4111" not in journal
        assert "12345678" not in journal

        ctx = await conversation.user_turn("and a high chair")
        assert ctx.turn.number == 2
        assert during[-1] == ("and a high chair", "and a high chair", 2)
        assert [t.number for t in conversation.transcript] == [1, 2]
        assert state.get("session:turn") == 2
        assert "turn:user" not in state


@pytest.mark.anyio
async def test_a_flow_sees_turn_keys_during_the_turn_only(state: State) -> None:
    plan = Flow(
        "topic",
        [
            Step("listen", done=is_set("turn:parking"), posture="Listen."),
            Step("answer", after=["listen"], terminal=True, posture="Parking is free."),
        ],
    )
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("topic").field_to("parking", "turn:parking", one_of(["parking"])).build()
        )
        runner = conversation.run_flow(plan)
        first = await conversation.user_turn("hello")
        assert first.postures == ("Listen.",)
        second = await conversation.user_turn("is there parking?")
        assert second.postures == ("Parking is free.",)  # the guard saw turn:parking in the turn
        assert runner.is_complete
        assert "turn:parking" not in state


@pytest.mark.anyio
async def test_redact_none_keeps_the_words(state: State) -> None:
    seen: list[str] = []
    async with Session(state) as session:
        conversation = Conversation(session, redact=None)
        conversation.add_extractor(probe("peek", seen).build())
        ctx = await conversation.user_turn("card 4111 1111 1111 1111, ref 12345678")
    assert ctx.turn.text == "card 4111 1111 1111 1111, ref 12345678"
    assert seen == ["card 4111 1111 1111 1111, ref 12345678"]
    assert conversation.transcript[0].text == "card 4111 1111 1111 1111, ref 12345678"


@pytest.mark.anyio
async def test_a_custom_redact_is_what_everything_reads(state: State) -> None:
    calls: list[str] = []
    seen: list[Any] = []

    def mask_names(text: str) -> str:
        calls.append(text)
        return text.replace("Ada", "[name]")

    async with Session(state) as session:
        conversation = Conversation(session, redact=mask_names)
        conversation.add_extractor(
            probe("peek", seen, lambda text: (text, state.get("turn:user"))).build()
        )
        ctx = await conversation.user_turn("I'm Ada, card 4111 1111 1111 1111")
    # The custom callable replaces the default: it ran once and the digits stay as said.
    assert calls == ["I'm Ada, card 4111 1111 1111 1111"]
    assert ctx.turn.text == "I'm [name], card 4111 1111 1111 1111"
    assert seen == [(ctx.turn.text, ctx.turn.text)]
    assert [t.text for t in conversation.transcript] == [ctx.turn.text]


# -- 2. extractors in a session -------------------------------------------------------------------


@pytest.mark.anyio
async def test_extractors_run_each_turn_with_extraction_provenance(state: State) -> None:
    async with Session(state) as session:
        conversation = Conversation(session)
        extractor = sizes()
        conversation.add_extractor(extractor)
        await conversation.user_turn("hello")
        assert "b:size" not in state
        await conversation.user_turn("four people please")
        assert state.get("b:size") == 4
        prov = state.provenance("b:size")
        assert prov is not None
        assert (prov.source, prov.writer) == ("extraction", "b")
        await conversation.user_turn("no, six people")  # keep_known: the first size stays
        assert state.get("b:size") == 4
    assert [r.written for r in extractor.history] == [{}, {"b:size": 4}, {}]
    assert extractor.history[2].decisions[0].reason == "keep_known: 'b:size' is already known (4)"


@pytest.mark.anyio
async def test_extractors_run_in_the_order_added_each_reading_the_turn(state: State) -> None:
    order: list[str] = []
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(probe("first", order, lambda t: f"first:{t}").build())
        conversation.add_extractor(probe("second", order, lambda t: f"second:{t}").build())
        await conversation.user_turn("a")
        await conversation.user_turn("b")
    assert order == ["first:a", "second:a", "first:b", "second:b"]


@pytest.mark.anyio
async def test_window_reads_the_last_n_redacted_turns(state: State) -> None:
    two: list[str] = []
    three: list[str] = []
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(probe("two", two).window(2).build())
        conversation.add_extractor(probe("three", three).window(3).build())
        for text in ["one", "card 4111 1111 1111 1111", "three", "four"]:
            await conversation.user_turn(text)
    assert two == [
        "one",
        "one card [card ending 1111]",
        "card [card ending 1111] three",
        "three four",
    ]
    assert three == [
        "one",
        "one card [card ending 1111]",
        "one card [card ending 1111] three",
        "card [card ending 1111] three four",
    ]


@pytest.mark.anyio
async def test_a_window_joins_a_value_said_across_turns(state: State) -> None:
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("b").field("size", integer_near(["people"], distance=1)).window(2).build()
        )
        await conversation.user_turn("we are four")
        assert "b:size" not in state
        await conversation.user_turn("people")
        assert state.get("b:size") == 4


@pytest.mark.anyio
async def test_every_2_runs_on_turns_2_and_4_only(state: State) -> None:
    runs: list[Any] = []
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            probe("slow", runs, lambda text: (state.get("session:turn"), text))
            .window(2)
            .trigger(Trigger.every(2))
            .build()
        )
        for i in range(1, 6):
            await conversation.user_turn(f"t{i}")
    assert runs == [(2, "t1 t2"), (4, "t3 t4")]


@pytest.mark.anyio
async def test_after_tool_runs_on_tool_ok_and_not_on_turns(state: State) -> None:
    only_tool: list[str] = []
    both: list[str] = []
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(probe("tool", only_tool).trigger(Trigger.after_tool()).build())
        conversation.add_extractor(
            probe("both", both).trigger(Trigger.every_turn(), Trigger.after_tool()).build()
        )
        await conversation.tool_ok("lookup")  # no turn yet: nothing to read
        assert (only_tool, both) == ([], [])
        await conversation.user_turn("my reference is AB1234")
        await conversation.user_turn("did you find it")
        assert only_tool == []
        assert both == ["my reference is AB1234", "did you find it"]
        await conversation.tool_ok("lookup")
        assert only_tool == ["did you find it"]
        assert both == ["my reference is AB1234", "did you find it", "did you find it"]


@pytest.mark.anyio
async def test_after_tool_writes_what_the_turn_did_not(state: State) -> None:
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("ref").field("n", integer()).trigger(Trigger.after_tool()).build()
        )
        await conversation.user_turn("ticket 42")
        assert "ref:n" not in state
        await conversation.tool_ok("lookup")
        assert state.get("ref:n") == 42
        prov = state.provenance("ref:n")
        assert prov is not None
        assert (prov.source, prov.writer) == ("extraction", "ref")


@pytest.mark.anyio
async def test_a_yes_said_before_the_read_back_is_not_re_read_when_confirm_is_entered(
    clock: ManualClock, state: State
) -> None:
    yes = answers(Trigger.every_turn(), Trigger.on_step_change())
    async with conversation_on(state, clock) as conversation:
        conversation.add_extractor(yes)  # runs before the size is known ...
        conversation.add_extractor(sizes())  # ... which enters the confirm step
        runner = conversation.run_flow(booking())
        await settle()  # entering 'ask' at the start: nothing said yet, nothing read
        assert yes.history == []
        ctx = await conversation.user_turn("yes, four people")  # said in one breath
        assert runner.active_steps == ["confirm"]
        assert ctx.postures == (CONFIRM,)
        await settle()  # the step change does not re-read it: the question was never asked
        assert "b:ok" not in state
        assert len(yes.history) == 1
        assert runner.told_steps == []  # the read-back has not reached the model yet

        ctx.handed_over()  # the model reads the booking back ...
        assert runner.told_steps == ["confirm"]
        await conversation.user_turn("yes")  # ... and this yes answers it
        assert state.get("b:ok") is True
        assert runner.active_steps == ["book"]


@pytest.mark.anyio
async def test_without_on_step_change_the_early_yes_is_lost(
    clock: ManualClock, state: State
) -> None:
    async with conversation_on(state, clock) as conversation:
        conversation.add_extractor(answers())
        conversation.add_extractor(sizes())
        runner = conversation.run_flow(booking())
        await conversation.user_turn("yes, four people")
        await settle()
        assert "b:ok" not in state
        assert runner.active_steps == ["confirm"]


@pytest.mark.anyio
async def test_on_step_change_alone_does_not_run_on_turns(clock: ManualClock, state: State) -> None:
    yes = answers(Trigger.on_step_change())
    async with conversation_on(state, clock) as conversation:
        conversation.add_extractor(sizes())
        conversation.add_extractor(yes)
        runner = conversation.run_flow(booking())
        await settle()
        await conversation.user_turn("hello")
        await settle()
        assert yes.history == []  # no step entered, no run
        await conversation.user_turn("four people")
        await settle()
        assert yes.history == []  # confirm entered, but its question was never asked
        await conversation.user_turn("yes")
        await settle()
        assert yes.history == []  # a turn alone does not run it
        assert "b:ok" not in state
        assert runner.active_steps == ["confirm"]


@pytest.mark.anyio
async def test_a_turn_key_from_an_on_step_change_re_read_does_not_reach_the_next_turn(
    state: State,
) -> None:
    seen: list[Any] = []
    plan = Flow(
        "booking",
        [Step("ask", done=captured("b:size")), Step("next", after=["ask"], done=is_true("x"))],
    )
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(sizes())
        conversation.add_extractor(
            Extract("topic")
            .field_to("parking", "turn:parking", one_of(["parking"]))
            .trigger(Trigger.every_turn(), Trigger.on_step_change())
            .build()
        )
        conversation.add_extractor(probe("peek", seen, lambda t: state.get("turn:parking")).build())
        conversation.run_flow(plan)
        await settle()
        await conversation.user_turn("four people, and is there parking?")
        assert seen == ["parking"]
        await settle()  # 'next' was entered: the topic extractor re-reads that turn
        await conversation.user_turn("thanks")
        assert seen == ["parking", None]  # nothing about parking was said this turn


@pytest.mark.anyio
async def test_on_complete_call_runs_once_and_the_flow_sees_it_on_that_turn(
    state: State,
) -> None:
    check = fake_fetch(returns={"open": True})
    plan = Flow(
        "slots",
        [
            Step("collect", done=resolved("availability"), posture="Collect the details."),
            Step("offer", after=["collect"], terminal=True, posture="Offer the table."),
        ],
    )
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("slots")
            .field("size", integer_near(["people"]))
            .field("day", one_of(["friday", "saturday"]))
            .on_complete(Resolver.fetch("availability", check), "call")
            .build()
        )
        conversation.run_flow(plan)
        first = await conversation.user_turn("four people")
        assert check.call_count == 0  # one field still unknown
        assert first.postures == ("Collect the details.",)

        second = await conversation.user_turn("on saturday")
        assert check.call_count == 1
        assert state.get("availability:result") == {"open": True}
        assert second.postures == ("Offer the table.",)  # the same turn saw the result
        # The call saw both fields.
        assert check.calls[0].saw("slots:size")
        assert check.calls[0].saw("slots:day")

        await conversation.user_turn("saturday, four people")  # still complete: not again
        assert check.call_count == 1
        state.remove("slots:day")
        await conversation.user_turn("hmm")  # lost ...
        assert check.call_count == 1
        await conversation.user_turn("friday then")  # ... and found again
        assert check.call_count == 2
        assert state.get("slots:day") == "friday"


@pytest.mark.anyio
async def test_on_complete_dispatch_does_not_hold_the_turn(
    clock: ManualClock, state: State
) -> None:
    check = fake_fetch()  # held until completed
    plan = Flow(
        "slots",
        [
            Step("collect", done=resolved("availability"), posture="Collect."),
            Step("offer", after=["collect"], terminal=True, posture="Offer."),
        ],
    )
    async with conversation_on(state, clock) as conversation:
        conversation.add_extractor(
            Extract("slots")
            .field("size", integer_near(["people"]))
            .on_complete(Resolver.fetch("availability", check), "dispatch")
            .build()
        )
        runner = conversation.run_flow(plan)
        ctx = await conversation.user_turn("two people")
        assert state.get("availability:status") == "running"
        assert ctx.postures == ("Collect.",)  # the turn did not wait
        await settle()
        assert check.held == 1
        check.complete({"open": False})
        await settle()
        assert state.get("availability:result") == {"open": False}
        assert runner.is_complete
        ctx = await conversation.user_turn("ok")
        assert ctx.deliveries == ()  # dispatch mode delivers nothing to the model


@pytest.mark.anyio
async def test_on_complete_background_result_reaches_the_next_turn(
    clock: ManualClock, state: State
) -> None:
    check = fake_fetch()
    async with conversation_on(state, clock) as conversation:
        conversation.add_extractor(
            Extract("slots")
            .field("size", integer_near(["people"]))
            .on_complete(
                Resolver.fetch("availability", check), "background", scheduling="interrupt"
            )
            .build()
        )
        await conversation.user_turn("two people")
        await settle()
        check.complete({"open": True})
        await settle()
        ctx = await conversation.user_turn("well?")
        assert [(r.name, r.value, r.scheduling) for r in ctx.deliveries] == [
            ("availability", {"open": True}, Scheduling.INTERRUPT)
        ]


@pytest.mark.anyio
@pytest.mark.parametrize("broken", ["mapped", "subclass"])
async def test_a_broken_extractor_is_reported_and_the_turn_goes_on(
    broken: str, state: State, failures: Failures, caplog: pytest.LogCaptureFixture
) -> None:
    recognizer = integer().map(lambda v: v / 0) if broken == "mapped" else Boom()
    bad = Extract("bad").field("x", recognizer).build()
    good = sizes()
    plan = Flow("f", [Step("ask", done=captured("b:size"), posture="Ask.")])
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(bad)
        conversation.add_extractor(good)
        runner = conversation.run_flow(plan)
        with caplog.at_level(logging.ERROR, logger="slateflow.resolve"):
            ctx = await conversation.user_turn("2 people")
        assert ctx.turn.number == 1
        assert state.get("b:size") == 2  # the extractor after it still ran
        assert runner.is_complete  # and the flow advanced
        assert "bad:x" not in state
        assert state.keys("turn:") == []
        await conversation.user_turn("3 people")  # it is not dropped: it fails again
    error = ZeroDivisionError if broken == "mapped" else RuntimeError
    assert [(receiver, type(exc)) for receiver, exc in failures.seen] == [
        (bad, error),
        (bad, error),
    ]
    assert "slateflow conversation: extractor 'bad' failed" in caplog.messages
    assert bad.history == []


# -- 3. the turn context --------------------------------------------------------------------------


REFUSE_BOOK_ASK = (
    "'book' is not permitted yet: first, 'b:ok' must be true. Available now: transfer. " + ASK
)
REFUSE_REFUND_ASK = (
    "'refund' is not permitted yet: first, 'manager' must be true. Available now: transfer. " + ASK
)


@pytest.mark.anyio
async def test_the_context_of_a_first_turn(state: State) -> None:
    async with Session(state) as session:
        conversation = Conversation(session, tools=["transfer", "book", "refund"])
        conversation.run_flow(booking())
        ctx = await conversation.user_turn("hi")
    assert ctx.postures == (ASK,)
    assert ctx.grounds == ("Party size: not given.",)
    assert ctx.reprompts == ()
    assert ctx.unmet == ("confirm", "book")
    assert ctx.tools == ("transfer",)
    assert ctx.refused == {"book": REFUSE_BOOK_ASK, "refund": REFUSE_REFUND_ASK}
    assert ctx.deliveries == ()
    assert ctx.voice_timing is None
    assert ctx.all_lines == (
        ASK,
        "Party size: not given.",
        UNMET_BOTH,
        TOOLS_TRANSFER,
    )
    assert ctx.lines == ctx.all_lines
    assert ctx.prompt == "\n".join(ctx.all_lines)
    assert str(ctx) == ctx.prompt


@pytest.mark.anyio
async def test_refusals_match_what_the_session_and_flow_say(state: State) -> None:
    async with Session(state) as session:
        conversation = Conversation(session, tools=["transfer", "book", "refund"])
        runner = conversation.run_flow(booking())
        ctx = await conversation.user_turn("hi")
        for tool, reason in ctx.refused.items():
            assert refusal(conversation, tool) == reason
            assert (runner.admit(tool, record=False).reason or None) == reason
        assert refusal(conversation, "transfer") is None


@pytest.mark.anyio
async def test_postures_and_grounds_of_every_active_step_in_flow_order(state: State) -> None:
    plan = Flow(
        "parallel",
        [
            Step(
                "name",
                done=captured("c:name"),
                posture="Get the name.",
                ground="Name: {c:name?unknown}.",
            ),
            Step(
                "phone",
                done=captured("c:phone"),
                posture="Get the phone.",
                ground="Phone known: {c:phone?yes:no}.",
            ),
            Step("end", after=["name", "phone"], terminal=True, posture="Thank them."),
        ],
    )
    other = Flow("other", [Step("note", done=is_true("never"), posture="Be brief.")])
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan)
        conversation.run_flow(other)
        ctx = await conversation.user_turn("hi")
        assert ctx.postures == ("Get the name.", "Get the phone.", "Be brief.")
        assert ctx.grounds == ("Name: unknown.", "Phone known: no.")
        state.set("c:phone", "555")
        ctx = await conversation.user_turn("my number is 555")
        assert ctx.postures == ("Get the name.", "Be brief.")
        assert ctx.grounds == ("Name: unknown.",)
        state.set("c:name", "Ada")
        ctx = await conversation.user_turn("Ada")
        # Complete: the terminal step's closing words are said.
        assert ctx.postures == ("Thank them.", "Be brief.")
        assert ctx.grounds == ()


@pytest.mark.anyio
async def test_the_unmet_line_names_required_steps_not_done(state: State) -> None:
    plan = Flow(
        "r",
        [
            Step("a", done=is_true("a")),
            Step("b", done=is_true("b")),
            Step("c", done=is_true("c")),
        ],
        constraints=[require("b", "a")],
    )
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan)
        ctx = await conversation.user_turn("x")
        assert ctx.unmet == ("b", "a")
        assert "Before finishing, these still need to happen: b, a." in ctx.lines
        state.set("b", True)
        ctx = await conversation.user_turn("x")
        assert ctx.unmet == ("a",)
        assert ctx.lines == ("Before finishing, these still need to happen: a.",)
        state.set("a", True)
        ctx = await conversation.user_turn("x")
        assert ctx.unmet == ()
        assert not any(x.startswith("Before finishing") for x in ctx.all_lines)


@pytest.mark.anyio
async def test_lines_are_not_repeated_but_a_changed_ground_is(state: State) -> None:
    async with Session(state) as session:
        conversation = Conversation(session, tools=["transfer", "book", "refund"])
        conversation.add_extractor(sizes(correctable=True))
        runner = conversation.run_flow(booking())
        first = await conversation.user_turn("hi")
        again = await conversation.user_turn("hmm")
        assert again.lines == ()
        assert again.prompt == ""
        assert again.all_lines == first.all_lines  # everything still applies

        sized = await conversation.user_turn("four people")
        assert runner.active_steps == ["confirm"]
        assert sized.all_lines == (CONFIRM, "Party of 4.", UNMET_BOTH, TOOLS_TRANSFER)
        assert sized.lines == (CONFIRM, "Party of 4.")  # the unmet and tools lines were sent
        assert sized.prompt == f"{CONFIRM}\nParty of 4."

        corrected = await conversation.user_turn("sorry, five people")
        assert corrected.lines == ("Party of 5.",)  # only the changed ground is said again
        assert corrected.all_lines == (CONFIRM, "Party of 5.", UNMET_BOTH, TOOLS_TRANSFER)

        back = await conversation.user_turn("no, four people")
        assert back.lines == ("Party of 4.",)  # compared with the previous turn only


@pytest.mark.anyio
async def test_tools_follow_the_active_step(state: State) -> None:
    async with Session(state) as session:
        conversation = Conversation(session, tools=["transfer", "book", "refund"])
        conversation.add_extractor(sizes())
        runner = conversation.run_flow(booking())
        await conversation.user_turn("four people")
        state.set("b:ok", True)
        ctx = await conversation.user_turn("yes")
        assert runner.active_steps == ["book"]
        assert ctx.tools == ("transfer", "book")
        assert ctx.refused == {
            "refund": "'refund' is not permitted yet: first, 'manager' must be true. "
            "Available now: book, transfer. " + BOOK
        }
        assert ctx.lines == (
            BOOK,
            "Before finishing, these still need to happen: book.",
            "Tools you may call now: transfer, book.",
        )
        await conversation.tool_ok("book")
        ctx = await conversation.user_turn("thanks")
        assert runner.is_complete
        assert ctx.postures == (BYE,)
        assert ctx.unmet == ()
        assert ctx.refused["book"] == (
            "'book' has already run and may run only once in this conversation. "
            "Do not call it again."
        )
        assert "book" not in ctx.tools


@pytest.mark.anyio
async def test_context_now_between_turns_takes_deliveries_and_dedupes(
    clock: ManualClock, state: State
) -> None:
    lookup = fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, tools=["transfer", "book", "refund"])
        conversation.run_flow(booking())
        before = conversation.context_now()
        assert before.turn.number == 0
        assert before.lines == (ASK, "Party size: not given.", UNMET_BOTH, TOOLS_TRANSFER)
        await conversation.user_turn("hi")
        session.background(Resolver.fetch("lookup", lookup), conversation.deliver)
        await settle()
        lookup.complete({"open": True})
        await settle()
        now = conversation.context_now()
        assert now.turn.number == 1
        assert [r.name for r in now.deliveries] == ["lookup"]
        assert now.lines == (
            line(
                "lookup",
                "when_idle",
                {"resolver": "lookup", "result": {"open": True}, "status": "completed"},
            ),
        )
        assert conversation.transcript[-1].number == 1  # nothing recorded
        ctx = await conversation.user_turn("and?")
        assert ctx.deliveries == ()
        assert ctx.lines == ()


# -- 4. deliveries --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("scheduling", ["when_idle", "interrupt", "silent"])
async def test_a_background_result_lands_in_the_next_context_exactly_once(
    scheduling: str, clock: ManualClock, state: State
) -> None:
    lookup = fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        ack = session.background(
            Resolver.fetch("lookup", lookup), conversation.deliver, scheduling=scheduling
        )
        assert ack == {"status": "running", "resolver": "lookup"}
        first = await conversation.user_turn("is it free?")
        assert first.deliveries == ()  # still running
        await settle()
        lookup.complete({"open": True})
        await settle()
        assert state.get("lookup:result") == {"open": True}

        second = await conversation.user_turn("well?")
        [result] = second.deliveries
        assert isinstance(result, BackgroundResult)
        assert (result.name, result.status, result.value, result.scheduling) == (
            "lookup",
            "completed",
            {"open": True},
            Scheduling(scheduling),
        )
        response = {"resolver": "lookup", "result": {"open": True}, "status": "completed"}
        assert result.response == response
        expected = [] if scheduling == "silent" else [line("lookup", scheduling, response)]
        assert delivery_lines(second.all_lines) == expected
        assert delivery_lines(second.lines) == expected

        third = await conversation.user_turn("ok")
        assert third.deliveries == ()
        assert conversation.take_deliveries() == []
        assert conversation.context_now().deliveries == ()


@pytest.mark.anyio
async def test_results_are_handed_over_oldest_first_and_errors_too(
    clock: ManualClock, state: State
) -> None:
    a, b, c = fake_fetch(), fake_fetch(), fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("a", a), conversation.deliver)
        session.background(Resolver.fetch("b", b), conversation.deliver, scheduling="silent")
        session.background(Resolver.fetch("c", c), conversation.deliver, scheduling="interrupt")
        await settle()
        c.complete(3)
        await settle()
        a.fail("backend down")
        await settle()
        b.complete(2)
        await settle()
        ctx = await conversation.user_turn("?")
    assert [(r.name, r.status) for r in ctx.deliveries] == [
        ("c", "completed"),
        ("a", "error"),
        ("b", "completed"),
    ]
    failed = ctx.deliveries[1]
    assert failed.error == state.get("a:error")
    assert failed.response == {"status": "error", "resolver": "a", "error": failed.error}
    assert delivery_lines(ctx.lines) == [
        line("c", "interrupt", {"resolver": "c", "result": 3, "status": "completed"}),
        line("a", "when_idle", failed.response),
    ]


@pytest.mark.anyio
async def test_take_deliveries_hands_them_over_instead_of_the_turn(
    clock: ManualClock, state: State
) -> None:
    lookup = fake_fetch(returns=1)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("lookup", lookup), conversation.deliver)
        await settle()
        assert [r.value for r in conversation.take_deliveries()] == [1]
        assert conversation.take_deliveries() == []
        ctx = await conversation.user_turn("?")
        assert ctx.deliveries == ()


@pytest.mark.anyio
async def test_an_interrupt_result_is_pushed_at_once_and_not_in_the_next_turn(
    clock: ManualClock, state: State
) -> None:
    pushed: list[BackgroundResult] = []
    urgent, idle, quiet = fake_fetch(), fake_fetch(), fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=pushed.append)
        session.background(
            Resolver.fetch("urgent", urgent), conversation.deliver, scheduling="interrupt"
        )
        session.background(
            Resolver.fetch("idle", idle), conversation.deliver, scheduling="when_idle"
        )
        session.background(
            Resolver.fetch("quiet", quiet), conversation.deliver, scheduling="silent"
        )
        await settle()
        urgent.complete("now!")
        await settle()
        assert [(r.name, r.value, r.scheduling) for r in pushed] == [
            ("urgent", "now!", Scheduling.INTERRUPT)
        ]
        assert pushed[0].response == {"status": "completed", "resolver": "urgent", "result": "now!"}
        idle.complete("later")
        await settle()
        quiet.complete("shh")
        await settle()
        assert len(pushed) == 1  # only interrupt results are pushed
        ctx = await conversation.user_turn("ok")
        assert [r.name for r in ctx.deliveries] == ["idle", "quiet"]
        assert delivery_lines(ctx.lines) == [
            line(
                "idle", "when_idle", {"resolver": "idle", "result": "later", "status": "completed"}
            )
        ]
    assert [r.name for r in pushed] == ["urgent"]


@pytest.mark.anyio
async def test_an_async_on_delivery_is_awaited_and_its_failure_reported(
    clock: ManualClock, state: State, failures: Failures
) -> None:
    spoken: list[str] = []

    async def speak(result: BackgroundResult) -> None:
        await anyio.lowlevel.checkpoint()
        spoken.append(result.name)
        if result.name == "bad":
            raise ValueError("tts down")

    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=speak)
        session.background(
            Resolver.fetch("good", fake_fetch(returns=1)),
            conversation.deliver,
            scheduling="interrupt",
        )
        session.background(
            Resolver.fetch("bad", fake_fetch(returns=2)),
            conversation.deliver,
            scheduling="interrupt",
        )
        await settle()
        assert sorted(spoken) == ["bad", "good"]
        ctx = await conversation.user_turn("?")
        # The one whose push failed never reached the model: the next context carries it.
        assert [d.name for d in ctx.deliveries] == ["bad"]
    assert [(receiver, type(exc)) for receiver, exc in failures.seen] == [(speak, ValueError)]


@pytest.mark.anyio
async def test_a_deliver_callable_gets_the_result_instead_of_the_model(
    clock: ManualClock, state: State
) -> None:
    mine: list[BackgroundResult] = []
    pushed: list[BackgroundResult] = []
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=pushed.append)
        session.background(
            Resolver.fetch("lookup", fake_fetch(returns=1)), mine.append, "interrupt"
        )
        await settle()
        ctx = await conversation.user_turn("?")
    assert [(r.name, r.scheduling) for r in mine] == [("lookup", Scheduling.INTERRUPT)]
    assert pushed == []
    assert ctx.deliveries == ()


@pytest.mark.anyio
async def test_flow_background_actions_come_through_the_turn_context(
    clock: ManualClock, state: State
) -> None:
    check = fake_fetch()
    plan = Flow(
        "lookup",
        [
            Step("ask", done=is_true("go"), posture="Ask."),
            Step(
                "check",
                after=["ask"],
                done=resolved("availability"),
                on_enter=run(Resolver.fetch("availability", check), "background"),
                posture="Say you are checking.",
            ),
            Step("answer", after=["check"], terminal=True, posture="Give the answer."),
        ],
    )
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(plan)
        state.set("go", True)
        ctx = await conversation.user_turn("can you check?")
        assert ctx.postures == ("Say you are checking.",)
        assert ctx.deliveries == ()
        await settle()
        assert check.held == 1
        check.complete({"open": True})
        await settle()
        assert runner.is_complete
        ctx = await conversation.user_turn("and?")
        assert ctx.postures == ("Give the answer.",)
        assert [(r.name, r.value, r.scheduling) for r in ctx.deliveries] == [
            ("availability", {"open": True}, Scheduling.WHEN_IDLE)
        ]
        assert delivery_lines(ctx.lines) == [
            line(
                "availability",
                "when_idle",
                {"resolver": "availability", "result": {"open": True}, "status": "completed"},
            )
        ]
        assert conversation.take_deliveries() == []


@pytest.mark.anyio
async def test_a_flows_results_and_the_sessions_arrive_in_the_same_inbox(
    clock: ManualClock, state: State
) -> None:
    plan = Flow(
        "f",
        [
            Step(
                "check",
                done=resolved("mine"),
                on_enter=run(Resolver.fetch("mine", fake_fetch(returns="flow")), "background"),
            ),
        ],
    )
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        session.background(
            Resolver.fetch("theirs", fake_fetch(returns="session")), conversation.deliver
        )
        conversation.run_flow(plan)
        await settle()
        assert sorted(r.value for r in conversation.take_deliveries()) == ["flow", "session"]
        assert conversation.take_deliveries() == []
        ctx = await conversation.user_turn("?")
        assert ctx.deliveries == ()  # each handed out once


@pytest.mark.anyio
async def test_a_flow_interrupt_action_is_pushed_with_on_delivery(
    clock: ManualClock, state: State
) -> None:
    pushed: list[str] = []
    plan = Flow(
        "f",
        [
            Step(
                "check",
                done=resolved("fraud"),
                on_enter=run(
                    Resolver.fetch("fraud", fake_fetch(returns="flagged")),
                    "background",
                    scheduling="interrupt",
                ),
            ),
        ],
    )
    async with Session(state, clock=clock) as s:
        conversation = Conversation(s, on_delivery=lambda r: pushed.append(r.value))
        conversation.run_flow(plan)
        await settle()
        assert pushed == ["flagged"]
        assert conversation.take_deliveries() == []
        assert (await conversation.user_turn("?")).deliveries == ()


# -- 5. the interruption race ---------------------------------------------------------------------


def waiting_flow(*names: str) -> Flow:
    """One step per resolver name, all active at once, each done when its result is in."""
    return Flow("wait", [Step(f"s_{n}", done=resolved(n)) for n in names])


@pytest.mark.anyio
async def test_an_interrupt_result_during_an_interruption_waits_then_is_pushed_once(
    clock: ManualClock, state: State
) -> None:
    pushed: list[tuple[str, bool]] = []
    session: Session

    def speak(result: BackgroundResult) -> None:
        pushed.append((result.name, conversation.interrupting))

    urgent, idle = fake_fetch(), fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=speak)
        runner = conversation.run_flow(waiting_flow("urgent", "idle"))
        session.background(
            Resolver.fetch("urgent", urgent), conversation.deliver, scheduling="interrupt"
        )
        session.background(
            Resolver.fetch("idle", idle), conversation.deliver, scheduling="when_idle"
        )
        await settle()
        conversation.begin_interruption()
        assert conversation.interrupting
        urgent.complete("fraud alert")
        idle.complete("table free")
        await settle()
        # The State and the flow have both at once ...
        assert state.get("urgent:result") == "fraud alert"
        assert state.get("idle:result") == "table free"
        assert runner.verdict("s_urgent") is Verdict.DONE
        assert runner.is_complete
        # ... but nothing is said over the caller.
        assert pushed == []

        conversation.end_interruption()  # the caller's words come next, as a turn
        assert not conversation.interrupting
        await settle()
        assert pushed == []  # not spoken before the caller's own turn is answered

        ctx = await conversation.user_turn("sorry, go on")
        assert sorted(r.name for r in ctx.deliveries) == ["idle", "urgent"]  # in that reply
        conversation.begin_interruption()
        conversation.end_interruption()
        await settle()
        assert pushed == []
        assert conversation.take_deliveries() == []  # never twice


@pytest.mark.anyio
async def test_without_on_delivery_a_held_interrupt_result_waits_for_the_next_turn(
    clock: ManualClock, state: State
) -> None:
    urgent = fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        session.background(
            Resolver.fetch("urgent", urgent), conversation.deliver, scheduling="interrupt"
        )
        await settle()
        conversation.begin_interruption()
        urgent.complete(1)
        await settle()
        assert state.get("urgent:result") == 1
        conversation.end_interruption()
        await settle()
        ctx = await conversation.user_turn("go on")
        assert [(r.name, r.scheduling) for r in ctx.deliveries] == [
            ("urgent", Scheduling.INTERRUPT)
        ]
        assert (await conversation.user_turn("ok")).deliveries == ()


@pytest.mark.anyio
async def test_a_turn_during_the_interruption_takes_the_held_result_so_end_pushes_nothing(
    clock: ManualClock, state: State
) -> None:
    pushed: list[str] = []
    urgent = fake_fetch()
    async with Session(state, clock=clock) as s:
        conversation = Conversation(s, on_delivery=lambda r: pushed.append(r.name))
        s.background(Resolver.fetch("urgent", urgent), conversation.deliver, scheduling="interrupt")
        await settle()
        conversation.begin_interruption()
        urgent.complete(1)
        await settle()
        ctx = await conversation.user_turn(
            "what I was saying"
        )  # the caller's turn ends the barge-in
        assert [r.name for r in ctx.deliveries] == ["urgent"]
        conversation.end_interruption()
        await settle()
        assert pushed == []


@pytest.mark.anyio
async def test_a_held_result_waits_across_a_second_interruption_reported_from_a_thread(
    clock: ManualClock, state: State
) -> None:
    loop_thread = threading.get_ident()
    pushed: list[tuple[str, int]] = []
    heard = anyio.Event()

    def speak(result: BackgroundResult) -> None:
        pushed.append((result.name, threading.get_ident()))
        heard.set()

    urgent = fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=speak)
        session.background(
            Resolver.fetch("urgent", urgent), conversation.deliver, scheduling="interrupt"
        )
        await settle()
        await anyio.to_thread.run_sync(conversation.begin_interruption)
        urgent.complete(1)
        await settle()
        assert pushed == []

        def end_and_begin_again() -> None:
            conversation.end_interruption(turn_follows=False)
            conversation.begin_interruption()

        # The loop's thread blocks on the voice thread, so the flush the first call asks for
        # runs only after the second interruption began (with to_thread the loop could run it
        # in between, and then speaking the result would be right).
        voice = threading.Thread(target=end_and_begin_again)
        voice.start()
        voice.join()
        await settle()
        assert pushed == []  # still interrupting: held

        # A false alarm (nothing was said): the held result is spoken now.
        await anyio.to_thread.run_sync(lambda: conversation.end_interruption(turn_follows=False))
        with anyio.fail_after(SAFETY):
            await heard.wait()
        assert pushed == [("urgent", loop_thread)]  # pushed on the session's loop, once
        await settle()
        assert (await conversation.user_turn("go on")).deliveries == ()


@pytest.mark.anyio
async def test_held_results_are_not_pushed_if_the_caller_barges_in_again_at_once(
    clock: ManualClock, state: State
) -> None:
    pushed: list[tuple[str, bool]] = []
    session: Session

    def speak(result: BackgroundResult) -> None:
        pushed.append((result.name, conversation.interrupting))

    urgent = fake_fetch()
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=speak)
        session.background(
            Resolver.fetch("urgent", urgent), conversation.deliver, scheduling="interrupt"
        )
        await settle()
        conversation.begin_interruption()
        urgent.complete(1)
        await settle()
        conversation.end_interruption(turn_follows=False)
        conversation.begin_interruption()  # voice activity flickers: talking again
        await settle()
        assert pushed == []
        conversation.end_interruption(turn_follows=False)  # a cough, not words
        await settle()
        assert pushed == [("urgent", False)]


@pytest.mark.anyio
async def test_results_from_threads_land_exactly_once_while_turns_run(
    clock: ManualClock, state: State
) -> None:
    n = 12
    schedulings = [("when_idle", "interrupt", "silent")[i % 3] for i in range(n)]
    gates = [threading.Event() for _ in range(n)]
    pushed: list[str] = []

    def blocking(i: int) -> Callable[[State], Any]:
        def work(state: State) -> Any:
            if not gates[i].wait(SAFETY):
                raise TimeoutError(f"gate {i} never opened")
            return {"thread": i}

        return work

    # Flow side: a thread's write enters a step whose on_enter starts a background lookup.
    plan = Flow(
        "threads",
        [
            Step(
                f"s{i}",
                gate=is_true(f"go:{i}"),
                done=resolved(f"flow{i}"),
                on_enter=run(
                    Resolver.fetch(f"flow{i}", fake_fetch(returns=i)),
                    "background",
                    # (Interrupt results of flow actions: see the test of their own above.)
                    scheduling=("when_idle", "silent")[i % 2],
                ),
            )
            for i in range(n)
        ],
    )

    def voice_thread() -> None:
        for i in range(n):
            if i % 4 == 1:
                conversation.begin_interruption()
            state.set(f"go:{i}", True)
            gates[i].set()
            if i % 4 == 3:
                conversation.end_interruption()
        conversation.end_interruption()

    handed: list[str] = []
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=lambda r: pushed.append(r.name))
        runner = conversation.run_flow(plan)
        for i in range(n):
            session.background(
                Resolver.function(f"thr{i}", blocking(i), thread=True),
                conversation.deliver,
                scheduling=schedulings[i],
            )
        worker = threading.Thread(target=voice_thread)
        worker.start()
        expected = {f"thr{i}" for i in range(n)} | {f"flow{i}" for i in range(n)}
        with anyio.fail_after(SAFETY):
            while set(handed) | set(pushed) != expected:
                ctx = await conversation.user_turn("still there?")
                handed.extend(r.name for r in ctx.deliveries)
                await anyio.lowlevel.checkpoint()
            await anyio.to_thread.run_sync(worker.join)
            await session.wait_idle()
        await settle()
        handed.extend(r.name for r in conversation.take_deliveries())
        assert runner.is_complete
    assert Counter(handed) + Counter(pushed) == Counter(expected)  # each exactly once
    assert not set(pushed) & {f"thr{i}" for i in range(n) if schedulings[i] != "interrupt"}
    for i in range(n):
        assert state.get(f"thr{i}:result") == {"thread": i}
        assert state.get(f"flow{i}:result") == i


# The property: random interleavings of results landing (or failing, or cancelled), the caller
# interrupting, turns, take_deliveries and context_now, against a model of where each result
# must go. ``end`` lets the loop run before the next event (the back-to-back case has its own
# test above).

SCHEDULINGS = ["when_idle", "interrupt", "silent"]
RESOLVERS = st.lists(st.sampled_from(SCHEDULINGS), min_size=1, max_size=5)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["land", "fail", "cancel"]), st.integers(0, 4)),
        st.tuples(st.sampled_from(["begin", "end", "turn", "take", "now"]), st.just(0)),
    ),
    max_size=30,
)


async def interleaving(schedulings: list[str], events: list[tuple[str, int]], push: bool) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    names = [f"r{i}" for i in range(len(schedulings))]
    sched = dict(zip(names, schedulings, strict=True))
    fakes = {name: fake_fetch() for name in names}
    pushed: list[str] = []
    pushed_while_interrupting: list[str] = []
    handed: list[BackgroundResult] = []
    session: Session

    def speak(result: BackgroundResult) -> None:
        if conversation.interrupting:
            pushed_while_interrupting.append(result.name)
        pushed.append(result.name)

    # The model: where each result must be now.
    interrupting = False
    hold = False  # an interruption ended and the caller's turn is on its way
    queued: list[str] = []  # in the inbox, oldest first
    should_push: list[str] = []
    outcome: dict[str, str] = {}

    def take(got: tuple[BackgroundResult, ...] | list[BackgroundResult]) -> None:
        nonlocal queued
        assert [r.name for r in got] == queued  # every waiting result, oldest first
        for r in got:
            assert r.status == outcome[r.name]
            assert r.scheduling is Scheduling(sched[r.name])
        handed.extend(got)
        queued = []

    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=speak if push else None)
        runner = conversation.run_flow(waiting_flow(*names))
        for name in names:
            session.background(
                Resolver.fetch(name, fakes[name]), conversation.deliver, scheduling=sched[name]
            )
        await settle()
        for kind, i in [*events, *(("land", j) for j in range(len(names)))]:
            if kind in ("land", "fail", "cancel"):
                name = names[i % len(names)]
                if name in outcome:
                    continue
                if kind == "land":
                    fakes[name].complete({"from": name})
                    outcome[name] = "completed"
                elif kind == "fail":
                    fakes[name].fail("down")
                    outcome[name] = "error"
                else:
                    assert session.cancel(name) == 1
                    outcome[name] = "cancelled"
                await settle()
                # Written at once, whoever is talking; the flow advanced with it.
                assert state.get(f"{name}:status") == {"completed": "done"}.get(
                    outcome[name], outcome[name]
                )
                if kind == "land":
                    assert state.get(f"{name}:result") == {"from": name}
                    assert runner.verdict(f"s_{name}") is Verdict.DONE
                else:
                    assert runner.verdict(f"s_{name}") is Verdict.ACTIVE
                if sched[name] == "interrupt" and push and not interrupting and not hold:
                    should_push.append(name)
                else:
                    queued.append(name)
            elif kind == "begin":
                conversation.begin_interruption()
                interrupting = True
            elif kind == "end":
                # Even: the caller's words follow as a turn, which takes the held results;
                # odd: a false alarm, and they are spoken now.
                follows = i % 2 == 0
                conversation.end_interruption(turn_follows=follows)
                interrupting = False
                hold = follows
                await settle()
                if push and not follows:
                    should_push += [n for n in queued if sched[n] == "interrupt"]
                    queued = [n for n in queued if sched[n] != "interrupt"]
            elif kind == "turn":
                ctx = await conversation.user_turn("and?")
                spoken = [r for r in ctx.deliveries if r.scheduling is not Scheduling.SILENT]
                assert len(delivery_lines(ctx.all_lines)) == len(spoken)
                take(ctx.deliveries)
                hold = False
            elif kind == "take":
                take(conversation.take_deliveries())
            else:
                take(conversation.context_now().deliveries)
            assert conversation.interrupting is interrupting
            assert sorted(pushed) == sorted(should_push)
        conversation.end_interruption(turn_follows=False)
        await settle()
        if push:
            should_push += [n for n in queued if sched[n] == "interrupt"]
            queued = [n for n in queued if sched[n] != "interrupt"]
        take(conversation.take_deliveries())
        assert sorted(pushed) == sorted(should_push)

    assert pushed_while_interrupting == []
    every = Counter(r.name for r in handed) + Counter(pushed)
    assert every == Counter(names)  # each result handed out exactly once: none lost, none twice
    if not push:
        assert pushed == []
    assert all(sched[n] == "interrupt" for n in pushed)


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(schedulings=RESOLVERS, events=EVENTS, push=st.booleans())
@example(["interrupt"], [("begin", 0), ("land", 0), ("end", 0)], True)
@example(["interrupt"], [("begin", 0), ("land", 0), ("end", 1)], True)
@example(["interrupt"], [("begin", 0), ("end", 0), ("land", 0), ("turn", 0)], True)
@example(["interrupt", "when_idle"], [("begin", 0), ("land", 0), ("land", 1), ("turn", 0)], True)
@example(["interrupt"], [("begin", 0), ("cancel", 0), ("now", 0), ("end", 0)], True)
@example(["interrupt", "silent"], [("begin", 0), ("fail", 0), ("end", 0), ("take", 0)], False)
def test_every_result_is_handed_out_exactly_once_whatever_the_interleaving(
    schedulings: list[str], events: list[tuple[str, int]], push: bool
) -> None:
    for backend in ("asyncio", "trio"):
        anyio.run(interleaving, schedulings, events, push, backend=backend)


# -- 6. voice timing ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_timings_of_steps_active_in_two_flows_merge_most_cautious(
    clock: ManualClock, state: State
) -> None:
    first = Flow(
        "first",
        [
            Step(
                "read_back",
                done=is_true("a"),
                timing=VoiceTiming(
                    reprompt_after_ms=8000,
                    reprompt="Are you still there?",
                    filler_after_ms=1200,
                    end_of_speech_ms=400,
                ),
            ),
            Step("plain", after=["read_back"], done=is_true("never")),
        ],
    )
    second = Flow(
        "second",
        [
            Step(
                "disclosure",
                done=is_true("b"),
                timing=VoiceTiming(
                    reprompt_after_ms=5000, end_of_speech_ms=900, interruptible=False
                ),
            )
        ],
    )
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        conversation.run_flow(first)
        conversation.run_flow(second)
        ctx = await conversation.user_turn("hi")
        merged = {
            "reprompt_after_ms": 5000,
            "reprompt": "Are you still there?",
            "filler_after_ms": 1200,
            "interruptible": False,
            "end_of_speech_ms": 900,
        }
        assert ctx.voice_timing == merged
        assert state.get("session:voice_timing") == merged

        state.set("b", True)  # between turns: re-published by a task
        await settle()
        only_first = {
            "reprompt_after_ms": 8000,
            "reprompt": "Are you still there?",
            "filler_after_ms": 1200,
            "end_of_speech_ms": 400,
        }
        assert state.get("session:voice_timing") == only_first
        ctx = await conversation.user_turn("ok")
        assert ctx.voice_timing == only_first

        state.set("a", True)  # the step with no timing is all that is active
        await settle()
        assert "session:voice_timing" not in state
        ctx = await conversation.user_turn("ok")
        assert ctx.voice_timing is None
        assert "session:voice_timing" not in state


@pytest.mark.anyio
async def test_two_parallel_steps_of_one_flow_merge_and_the_key_goes_with_them(
    state: State,
) -> None:
    plan = Flow(
        "t",
        [
            Step(
                "a", done=is_true("a"), timing=VoiceTiming(interruptible=True, filler_after_ms=900)
            ),
            Step(
                "b",
                done=is_true("b"),
                timing=VoiceTiming(filler_after_ms=2500, end_of_speech_ms=700),
            ),
            Step("c", after=["a", "b"], done=is_true("c")),
        ],
    )
    async with session_on(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan)
        ctx = await conversation.user_turn("hi")
        both = {"interruptible": True, "filler_after_ms": 900, "end_of_speech_ms": 700}
        assert ctx.voice_timing == both
        assert state.get("session:voice_timing") == both
        state.set("a", True)
        ctx = await conversation.user_turn("a")
        assert ctx.voice_timing == {"filler_after_ms": 2500, "end_of_speech_ms": 700}
        assert state.get("session:voice_timing") == ctx.voice_timing
        state.set("b", True)
        ctx = await conversation.user_turn("b")
        assert ctx.voice_timing is None
        assert "session:voice_timing" not in state


@pytest.mark.anyio
async def test_the_timing_key_is_written_only_when_it_changes(state: State) -> None:
    plan = Flow("t", [Step("a", done=is_true("a"), timing=VoiceTiming(end_of_speech_ms=600))])
    async with session_on(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan)
        await conversation.user_turn("one")
        version = state.version("session:voice_timing")
        await conversation.user_turn("two")
        await conversation.user_turn("three")
        assert state.version("session:voice_timing") == version
        prov = state.provenance("session:voice_timing")
        assert prov is not None
        assert (prov.source, prov.writer) == ("session", "voice_timing")


# -- 7. pytest-asyncio ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_user_turn_under_pytest_asyncio_with_the_plugin_fixture(
    slate_conversation: Conversation, slate_state: State, slate_clock: ManualClock
) -> None:
    conversation = slate_conversation
    conversation.add_extractor(sizes())
    runner = conversation.run_flow(booking())
    lookup = fake_fetch(returns={"open": True}, delay=2, clock=slate_clock)
    conversation.session.background(Resolver.fetch("lookup", lookup), conversation.deliver)
    ctx = await conversation.user_turn("four people, card 4111 1111 1111 1111")
    assert ctx.turn.text == "four people, card [card ending 1111]"
    assert slate_state.get("b:size") == 4
    assert runner.active_steps == ["confirm"]
    assert ctx.postures == (CONFIRM,)
    assert ctx.deliveries == ()
    assert "turn:user" not in slate_state
    await slate_clock.advance(2)
    ctx = await conversation.user_turn("is it free?")
    assert [(r.name, r.value) for r in ctx.deliveries] == [("lookup", {"open": True})]


# -- user turns through a session: tool_ok, deliveries, interruptions ------------------------------

# Turns through the Session: ``user_turn`` (redaction, transcript, extractors, flows, context),
# ``tool_ok``, background results handed to the model exactly once, and the interruption race.
#
# Everything timed runs on a ManualClock; ``await clock.advance(0)`` lets ready tasks run.


def booking_plan() -> Flow:
    """The shared booking with grounds: 'book' is a commit tool refused until the yes, and the
    flow needs book and bye done."""
    return shared_booking(
        grounds=True,
        book_tools=("book",),
        book_done=called_ok("book"),
        constraints=[commit("book", until=is_true("b:ok")), require("book", "bye")],
        ambient=("transfer",),
    )


def active(step: str) -> Any:
    def check(value: Any, state: State) -> bool:
        return step in (state.get("flow:booking:active") or [])

    check.__name__ = f"{step} active"
    return check


class ProbeSession(Recognizer):
    """A recognizer that hears nothing and calls ``see(text)``: what an extractor was given."""

    def __init__(self, see: Any) -> None:
        self.see = see

    def recognize(self, text: str) -> Any:
        self.see(text)
        return None

    def describe(self) -> str:
        return "a probe"


def size_extractor(**options: Any) -> Any:
    builder = Extract("b").field("size", integer_near(["people", "us"]))
    if "window" in options:
        builder = builder.window(options["window"])
    if "triggers" in options:
        builder = builder.trigger(*options["triggers"])
    return builder.build()


# -- recording the turn ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_turn_is_redacted_recorded_and_its_keys_last_one_turn() -> None:
    seen: list[Any] = []
    state = State()
    clock = ManualClock()

    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("peek")
            .field(
                "x",
                ProbeSession(
                    lambda t: seen.append((state.get("turn:user"), state.get("session:turn")))
                ),
            )
            .build()
        )
        state.set("temp:scratch", 1)
        ctx = await conversation.user_turn("card 4111 1111 1111 1111, account 12345678 for 2")
        heard = "card [card ending 1111], account [redacted number] for 2"
        assert ctx.turn.text == heard
        assert ctx.turn.number == 1
        assert ctx.turn.at == clock.time()
        assert seen == [(heard, 1)]  # the extractor saw the turn keys during the turn
        assert [t.text for t in conversation.transcript] == [heard]
        assert state.get("session:turn") == 1
        assert state.keys("turn:") == []
        assert state.keys("temp:") == []
        await conversation.user_turn("again")
        assert [t.number for t in conversation.transcript] == [1, 2]
        assert state.get("session:turn") == 2


@pytest.mark.anyio
async def test_redaction_can_be_turned_off_or_replaced() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session, redact=None)
        ctx = await conversation.user_turn("4111 1111 1111 1111")
        assert ctx.turn.text == "4111 1111 1111 1111"
    async with Session(State()) as session:
        conversation = Conversation(session, redact=str.upper)
        ctx = await conversation.user_turn("hello")
        assert ctx.turn.text == "HELLO"
        assert conversation.transcript[0].text == "HELLO"


@pytest.mark.anyio
async def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="redact"):
        Session(State(), redact="yes")  # type: ignore[arg-type]
    async with Session(State()) as session:
        conversation = Conversation(session)
        with pytest.raises(TypeError, match="transcript text"):
            await conversation.user_turn(b"hi")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="add_extractor takes an extractor"):
            conversation.add_extractor(integer())  # type: ignore[arg-type]
        extractor = size_extractor()
        conversation.add_extractor(extractor)
        with pytest.raises(SessionError, match="'b' is already added"):
            conversation.add_extractor(extractor)
        assert conversation.transcript == []


# -- extractors in the session -----------------------------------------------------------------


@pytest.mark.anyio
async def test_extractors_run_each_turn_with_provenance() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        extractor = size_extractor()
        conversation.add_extractor(extractor)
        await conversation.user_turn("hello")
        await conversation.user_turn("four people")
        assert state.get("b:size") == 4
        prov = state.provenance("b:size")
        assert prov is not None
        assert (prov.source, prov.writer) == ("extraction", "b")
        assert len(extractor.history) == 2
        assert extractor.history[0].decisions == ()


@pytest.mark.anyio
async def test_window_reads_the_last_turns_of_the_session_transcript() -> None:
    state = State()
    heard: list[str] = []

    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("spy").field("x", ProbeSession(heard.append)).window(2).build()
        )
        for text in ["one", "two", "three"]:
            await conversation.user_turn(text)
    assert heard == ["one", "one two", "two three"]


@pytest.mark.anyio
async def test_every_n_turns() -> None:
    runs: list[int] = []
    state = State()

    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("c")
            .field("x", ProbeSession(lambda t: runs.append(state.get("session:turn"))))
            .trigger(Trigger.every(2))
            .build()
        )
        for i in range(5):
            await conversation.user_turn(f"turn {i}")
    assert runs == [2, 4]


@pytest.mark.anyio
async def test_after_tool_runs_on_tool_ok_only() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("ref")
            .field("code", regex(r"[A-Z]{2}\d{4}"))
            .trigger(Trigger.after_tool())
            .build()
        )
        await conversation.user_turn("my reference is AB1234")
        assert "ref:code" not in state  # not on turns
        await conversation.tool_ok("lookup")
        assert state.get("ref:code") == "AB1234"


@pytest.mark.parametrize("rereads", [True, False])
@pytest.mark.anyio
async def test_on_step_change_rereads_only_what_was_said_after_the_question(
    rereads: bool,
) -> None:
    # The read-back was told, then the step went inactive (its availability check refreshed)
    # just as the caller said yes; when it is active again, that yes is read again. A yes
    # said before the read-back ("yes, four people") is never taken.
    state = State()
    clock = ManualClock()
    triggers = [Trigger.every_turn(), Trigger.on_step_change()] if rereads else []
    answer = Extract("ans").field_to(
        "ok", "b:ok", yes_no(), true_only().accept_when(active("confirm"))
    )
    if triggers:
        answer = answer.trigger(*triggers)
    plan = Flow(
        "booking",
        [
            Step("ask", done=captured("b:size"), posture="Ask how many people."),
            Step(
                "confirm",
                after=["ask"],
                gate=is_set("tables:result"),
                done=is_true("b:ok"),
                posture="Read it back; ask for a yes.",
            ),
            Step("book", after=["confirm"], terminal=True),
        ],
    )
    async with conversation_on(state, clock) as conversation:
        conversation.add_extractor(answer.build())
        conversation.add_extractor(size_extractor())
        runner = conversation.run_flow(plan)
        state.set("tables:result", {"free": 3})
        ctx = await conversation.user_turn("yes, four people")  # said in one breath
        assert runner.active_steps == ["confirm"]
        await clock.advance(0)
        assert "b:ok" not in state  # before the question: never an answer
        ctx.handed_over()  # the read-back reaches the model
        state.remove("tables:result")  # refreshed just now: the step waits for it
        await conversation.user_turn("yes, that's right")
        assert "b:ok" not in state  # the step was not active
        state.set("tables:result", {"free": 2})
        await clock.advance(0)  # active again: the turns said after the read-back are re-read
        if rereads:
            assert state.get("b:ok") is True
            assert runner.active_steps == []
        else:
            assert "b:ok" not in state
            assert runner.active_steps == ["confirm"]


@pytest.mark.anyio
async def test_on_complete_in_call_mode_is_seen_by_the_flow_on_the_same_turn() -> None:
    state = State()
    calls: list[int] = []

    async def check(state: State) -> dict[str, bool]:
        calls.append(state["b:size"])
        return {"open": True}

    plan = Flow(
        "booking",
        [
            Step("ask", done=resolved("check"), posture="Ask."),
            Step("next", after=["ask"], terminal=True, posture="Next."),
        ],
    )
    async with conversation_on(state) as conversation:
        conversation.add_extractor(
            Extract("b")
            .field("size", integer_near(["people"]))
            .on_complete(Resolver.fetch("check", check), "call")
            .build()
        )
        conversation.run_flow(plan)
        ctx = await conversation.user_turn("three people")
        assert calls == [3]
        assert ctx.postures == ("Next.",)
        await conversation.user_turn("three people")  # still complete: not again
        assert calls == [3]
        state.remove("b:size")
        await conversation.user_turn("hm")  # lost ...
        await conversation.user_turn("five people")  # ... and found again: runs again
        assert calls == [3, 5]


@pytest.mark.anyio
async def test_on_complete_dispatch_returns_at_once() -> None:
    state = State()
    clock = ManualClock()

    async def slow(state: State) -> str:
        await clock.sleep(5)
        return "done"

    async with conversation_on(state, clock) as conversation:
        conversation.add_extractor(
            Extract("b")
            .field("size", integer())
            .on_complete(Resolver.fetch("slow", slow), "dispatch")
            .build()
        )
        await conversation.user_turn("2")
        assert state.get("slow:status") == "running"
        await clock.advance(5)
        assert state.get("slow:result") == "done"


@pytest.mark.anyio
async def test_a_broken_extractor_does_not_break_the_turn() -> None:
    state = State()
    failures: list[Any] = []

    def on_failure(sender: Any, **kw: Any) -> None:
        failures.append(kw["error"])

    state.receiver_failed.connect(on_failure)
    broken = integer().map(lambda v: 1 / 0)
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(Extract("broken").field("x", broken).build())
        conversation.add_extractor(size_extractor())
        ctx = await conversation.user_turn("2 people")
        assert ctx.turn.number == 1
        assert state.get("b:size") == 2  # the next extractor still ran
    assert [type(e) for e in failures] == [ZeroDivisionError]


# -- the context -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_context_tells_the_model_what_applies_and_drops_repeats() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session, tools=["book", "transfer"])
        conversation.add_extractor(size_extractor())
        runner = conversation.run_flow(booking_plan())
        first = await conversation.user_turn("hi")
        assert first.postures == ("Ask how many people.",)
        assert first.grounds == ("Party size: not given.",)
        assert first.unmet == ("book", "bye")
        assert first.tools == ("transfer",)
        assert set(first.refused) == {"book"}
        assert first.lines == (
            "Ask how many people.",
            "Party size: not given.",
            "Before finishing, these still need to happen: book, bye.",
            "Tools you may call now: transfer.",
        )
        assert first.prompt == "\n".join(first.lines)
        assert str(first) == first.prompt

        again = await conversation.user_turn("hmm")
        assert again.lines == ()  # nothing new
        assert again.all_lines == first.all_lines

        sized = await conversation.user_turn("four people")
        assert runner.active_steps == ["confirm"]
        assert sized.lines == (READ_BACK, "Party of 4.")

        state.set("b:size", 5)
        changed = conversation.context_now()
        assert changed.lines == ("Party of 5.",)  # a changed ground is said again
        assert changed.turn.number == 3  # between turns: the last turn


@pytest.mark.anyio
async def test_context_now_before_any_turn() -> None:
    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.run_flow(booking_plan())
        ctx = conversation.context_now()
        assert ctx.turn.number == 0
        assert ctx.postures == ("Ask how many people.",)


# -- deliveries ------------------------------------------------------------------------------


def lookup(clock: ManualClock, name: str = "lookup", after: float = 1.0) -> Resolver:
    async def fetch(state: State) -> dict[str, str]:
        await clock.sleep(after)
        return {"from": name}

    return Resolver.fetch(name, fetch)


@pytest.mark.parametrize("scheduling", ["when_idle", "interrupt", "silent"])
@pytest.mark.anyio
async def test_a_background_result_reaches_the_next_turn_once(scheduling: str) -> None:
    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session)
        session.background(lookup(clock), conversation.deliver, scheduling=scheduling)
        ctx = await conversation.user_turn("first")
        assert ctx.deliveries == ()
        await clock.advance(1)
        ctx = await conversation.user_turn("second")
        assert [(r.name, r.value, r.scheduling.value) for r in ctx.deliveries] == [
            ("lookup", {"from": "lookup"}, scheduling)
        ]
        lines = [line for line in ctx.lines if line.startswith("Result of")]
        if scheduling == "silent":
            assert lines == []
        else:
            # In words, with what to do with it: not raw JSON the model must parse.
            assert lines == [f"Result of lookup{HINTS[scheduling]}: from: lookup."]
        third = await conversation.user_turn("third")
        assert third.deliveries == ()
        assert conversation.take_deliveries() == []


@pytest.mark.anyio
async def test_an_interrupt_result_is_spoken_at_once_with_on_delivery() -> None:
    clock = ManualClock()
    spoken: list[BackgroundResult] = []
    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session, on_delivery=spoken.append)
        session.background(lookup(clock, "urgent"), conversation.deliver, scheduling="interrupt")
        session.background(lookup(clock, "later"), conversation.deliver, scheduling="when_idle")
        await clock.advance(1)
        assert [r.name for r in spoken] == ["urgent"]
        ctx = await conversation.user_turn("ok")
        assert [r.name for r in ctx.deliveries] == ["later"]


@pytest.mark.anyio
async def test_flow_background_actions_are_delivered_through_the_turn() -> None:
    clock = ManualClock()
    plan = Flow(
        "f",
        [
            Step("wait", done=resolved("lookup"), on_enter=run(lookup(clock), "background")),
            Step("end", after=["wait"], terminal=True),
        ],
    )
    async with conversation_on(clock=clock) as conversation:
        conversation.run_flow(plan)
        await clock.advance(1)
        ctx = await conversation.user_turn("hello")
        assert [r.value for r in ctx.deliveries] == [{"from": "lookup"}]
        assert conversation.take_deliveries() == []


# -- the interruption race ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_results_landing_during_an_interruption_advance_the_flow_and_wait() -> None:
    clock = ManualClock()
    state = State()
    spoken: list[BackgroundResult] = []
    plan = Flow(
        "f",
        [
            Step("check", done=resolved("urgent"), posture="Checking."),
            Step("tell", after=["check"], terminal=True, posture="Tell them."),
        ],
    )
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=spoken.append)
        runner = conversation.run_flow(plan)
        session.background(lookup(clock, "urgent"), conversation.deliver, scheduling="interrupt")
        session.background(lookup(clock, "idle"), conversation.deliver, scheduling="when_idle")
        conversation.begin_interruption()
        assert conversation.interrupting
        await clock.advance(1)
        # Landed while the caller talks: the State and the flow have them ...
        assert state.get("urgent:result") == {"from": "urgent"}
        assert runner.is_complete
        # ... but nothing was spoken over the caller.
        assert spoken == []
        conversation.end_interruption()  # the caller's words follow as a turn
        assert not conversation.interrupting
        await clock.advance(0)
        assert spoken == []  # not spoken just before the caller's own question
        ctx = await conversation.user_turn("sorry, go on")
        # That turn's context carries both: the model answers once.
        assert sorted(r.name for r in ctx.deliveries) == ["idle", "urgent"]
        conversation.begin_interruption()
        conversation.end_interruption()
        await clock.advance(0)
        assert spoken == []
        assert conversation.take_deliveries() == []  # never twice


@pytest.mark.anyio
async def test_without_on_delivery_held_results_wait_for_the_next_turn() -> None:
    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session)
        session.background(lookup(clock, "urgent"), conversation.deliver, scheduling="interrupt")
        conversation.begin_interruption()
        await clock.advance(1)
        conversation.end_interruption()
        await clock.advance(0)
        ctx = await conversation.user_turn("go on")
        assert [r.name for r in ctx.deliveries] == ["urgent"]


@pytest.mark.anyio
async def test_a_result_from_another_thread_during_a_turn_is_delivered_once() -> None:
    state = State()
    release = threading.Event()
    started = threading.Event()

    def work(state: State) -> str:
        started.set()
        release.wait(5)
        return "from a thread"

    slow_plan = Flow("f", [Step("wait", done=is_set("w:result"), posture="Wait.")])

    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("x").field("y", ProbeSession(lambda t: release.set())).build()
        )
        conversation.run_flow(slow_plan)
        session.background(Resolver.function("w", work, thread=True), conversation.deliver)
        with anyio.fail_after(5):
            while not started.is_set():
                await anyio.lowlevel.checkpoint()
            first = await conversation.user_turn("now")
            await session.wait_idle()
        second = await conversation.user_turn("then")
        delivered = [r.value for r in first.deliveries + second.deliveries]
        assert delivered == ["from a thread"]
        assert state.get("w:result") == "from a thread"


EVENTS_SESSION = st.lists(
    st.sampled_from(["advance", "begin", "end", "turn", "take", "now"]), min_size=1, max_size=25
)
SCHEDULES = st.lists(
    st.tuples(st.sampled_from(["when_idle", "interrupt", "silent"]), st.integers(1, 6)),
    min_size=1,
    max_size=6,
)


@settings(deadline=None, max_examples=60)
@given(events=EVENTS_SESSION, schedules=SCHEDULES, push=st.booleans())
def test_every_result_is_handed_out_exactly_once(
    events: list[str], schedules: list[tuple[str, int]], push: bool
) -> None:
    async def main() -> None:
        clock = ManualClock()
        state = State()
        handed: list[str] = []
        spoken_while_interrupting: list[str] = []
        session: Session

        def speak(result: BackgroundResult) -> None:
            if conversation.interrupting:
                spoken_while_interrupting.append(result.name)
            handed.append(result.name)

        async with Session(state, clock=clock) as session:
            conversation = Conversation(session, on_delivery=speak if push else None)
            for i, (scheduling, after) in enumerate(schedules):
                session.background(
                    lookup(clock, f"r{i}", after), conversation.deliver, scheduling=scheduling
                )
            for event in events:
                if event == "advance":
                    await clock.advance(1)
                elif event == "begin":
                    conversation.begin_interruption()
                elif event == "end":
                    conversation.end_interruption()
                    await clock.advance(0)
                elif event == "turn":
                    ctx = await conversation.user_turn("x")
                    handed.extend(r.name for r in ctx.deliveries)
                elif event == "take":
                    handed.extend(r.name for r in conversation.take_deliveries())
                else:
                    handed.extend(r.name for r in conversation.context_now().deliveries)
            await clock.advance(10)  # everything lands
            conversation.end_interruption()
            await clock.advance(0)
            handed.extend(r.name for r in conversation.take_deliveries())
        names = [f"r{i}" for i in range(len(schedules))]
        assert sorted(handed) == sorted(names)  # each exactly once: none lost, none twice
        assert spoken_while_interrupting == []
        for name in names:
            assert state.get(f"{name}:result") == {"from": name}

    for backend in ("asyncio", "trio"):
        anyio.run(main, backend=backend)


# -- voice timing ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_voice_timing_of_active_steps_is_merged_and_published() -> None:
    state = State()
    plan = Flow(
        "t",
        [
            Step(
                "a",
                done=is_true("a"),
                timing=VoiceTiming(reprompt_after_ms=8000, end_of_speech_ms=400),
            ),
            Step(
                "b",
                done=is_true("b"),
                timing=VoiceTiming(
                    reprompt_after_ms=5000, end_of_speech_ms=900, interruptible=False
                ),
            ),
            Step("c", after=["a", "b"], done=is_true("c")),
        ],
    )
    async with session_on(state) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan)
        ctx = await conversation.user_turn("hi")
        merged = {"reprompt_after_ms": 5000, "end_of_speech_ms": 900, "interruptible": False}
        assert state.get("session:voice_timing") == merged
        assert ctx.voice_timing == merged
        state.set("b", True)
        ctx = await conversation.user_turn("b done")
        assert ctx.voice_timing == {"reprompt_after_ms": 8000, "end_of_speech_ms": 400}
        state.set("a", True)
        ctx = await conversation.user_turn("a done")  # "c" has no timing
        assert ctx.voice_timing is None
        assert "session:voice_timing" not in state


@pytest.mark.anyio
async def test_timing_follows_a_step_change_between_turns() -> None:
    state = State()
    clock = ManualClock()
    plan = Flow(
        "t",
        [
            Step("a", done=is_true("a")),
            Step("b", after=["a"], done=is_true("b"), timing=VoiceTiming(filler_after_ms=1500)),
        ],
    )
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan)
        await conversation.user_turn("hi")
        assert "session:voice_timing" not in state
        state.set("a", True)  # a background result, say
        await clock.advance(0)
        assert state.get("session:voice_timing") == {"filler_after_ms": 1500}


@pytest.mark.anyio
async def test_one_of_topics_in_turn_keys_are_gone_after_the_turn() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("topic").field_to("t", "turn:topic", one_of(["parking", "menu"])).build()
        )
        seen: list[Any] = []
        plan = Flow("f", [Step("s", done=is_set("turn:topic"), posture="Topic!")])
        runner = conversation.run_flow(plan)
        await conversation.user_turn("is there parking")
        seen.append(runner.done_steps)
        assert seen == [["s"]]
        assert "turn:topic" not in state


@pytest.mark.anyio
async def test_a_timer_that_fires_during_an_interruption_is_delivered_once() -> None:
    # A lookup that times out on the session clock while the caller talks: its error is a
    # result like any other, held, then handed over once.
    clock = ManualClock()
    spoken: list[BackgroundResult] = []
    state = State()

    async def never(state: State) -> None:
        await clock.sleep(100)

    slow = Resolver.fetch("slow", never, timeout=2)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, on_delivery=spoken.append)
        session.background(slow, conversation.deliver, scheduling="interrupt")
        conversation.begin_interruption()
        await clock.advance(2)
        assert state.get("slow:status") == "error"
        assert spoken == []
        conversation.end_interruption(turn_follows=False)  # a false alarm: spoken now
        await clock.advance(0)
        assert [(r.name, r.status) for r in spoken] == [("slow", "error")]
        ctx = await conversation.user_turn("and?")
        assert ctx.deliveries == ()


@pytest.mark.anyio
async def test_a_conversation_script_drives_turns_and_digressions() -> None:
    from slateflow import Digression, FlowStack
    from slateflow.testing import ConversationScript

    faq = Flow("faq", [Step("answer", terminal=True, posture="Parking is free.")])
    async with conversation_on(tools=["book", "transfer"]) as conversation:
        conversation.add_extractor(size_extractor())
        conversation.add_extractor(
            Extract("topic").field_to("p", "turn:parking", one_of(["parking"])).build()
        )
        script = ConversationScript(conversation)
        await script.start(
            FlowStack(booking_plan(), [Digression("parking", is_set("turn:parking"), faq)])
        )
        ctx = await script.user("hi")
        assert ctx is script.context
        script.expect_told("Ask how many people.")
        await script.user("is there parking?")
        assert script.stack.overlay == "parking"
        script.expect_told("Parking is free.")
        script.expect_refused("book")
        await script.user("two people")
        script.expect_step("confirm")
        script.expect_told("Party of 2.")
        with pytest.raises(AssertionError, match="expected the model to be told 'Thank them"):
            script.expect_told("Thank them")
        assert script.transcript == ["hi", "is there parking?", "two people"]
        assert len(script.contexts) == 3


@pytest.mark.anyio
async def test_the_context_as_json() -> None:
    import json

    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session, tools=["book", "transfer"])
        conversation.run_flow(booking_plan())
        session.background(lookup(clock), conversation.deliver, scheduling="when_idle")
        await clock.advance(1)
        data = (await conversation.user_turn("hi")).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["turn"] == {"number": 1, "text": "hi", "at": clock.time(), "speaker": "user"}
    assert data["status"] == "pending"  # built; handed to the model once the loop says so
    assert data["full_prompt"] == "\n".join(data["all_lines"])
    assert data["deliveries"] == [
        {
            "name": "lookup",
            "scheduling": "when_idle",
            "response": {"status": "completed", "resolver": "lookup", "result": {"from": "lookup"}},
        }
    ]
    assert data["tools"] == ["transfer"]
    assert list(data["refused"]) == ["book"]
    assert data["prompt"] == "\n".join(data["lines"])
    assert data["postures"] == ["Ask how many people."]


@pytest.mark.anyio
async def test_interruptions_reported_from_another_thread() -> None:
    clock = ManualClock()
    spoken: list[BackgroundResult] = []
    heard = anyio.Event()

    def speak(result: BackgroundResult) -> None:
        spoken.append(result)
        heard.set()

    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session, on_delivery=speak)
        session.background(lookup(clock, "urgent"), conversation.deliver, scheduling="interrupt")
        await anyio.to_thread.run_sync(conversation.begin_interruption)
        await clock.advance(1)
        assert spoken == []
        await anyio.to_thread.run_sync(lambda: conversation.end_interruption(turn_follows=False))
        with anyio.fail_after(5):
            await heard.wait()
        assert [r.name for r in spoken] == ["urgent"]
        assert (await conversation.user_turn("go on")).deliveries == ()
