"""Turns through the Session: ``user_turn`` (redaction, transcript, extractors, flows, context),
``tool_ok``, background results handed to the model exactly once, and the interruption race.

Everything timed runs on a ManualClock; ``await clock.advance(0)`` lets ready tasks run.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    VoiceTiming,
    called_ok,
    captured,
    commit,
    is_set,
    is_true,
    require,
    resolved,
    run,
)
from slateflow.conversation import (
    Extract,
    Recognizer,
    Trigger,
    integer,
    integer_near,
    one_of,
    regex,
    true_only,
    yes_no,
)
from slateflow.errors import SessionError
from slateflow.resolve import BackgroundResult

pytestmark = pytest.mark.anyio


def booking_plan() -> Flow:
    return Flow(
        "booking",
        [
            Step(
                "ask",
                done=captured("b:size"),
                posture="Ask how many people.",
                ground="Size: {b:size?known:unknown}.",
            ),
            Step(
                "confirm",
                after=["ask"],
                done=is_true("b:ok"),
                posture="Ask for a yes.",
                ground="Booking for {b:size}.",
            ),
            Step("book", after=["confirm"], done=called_ok("book"), allow=["book"]),
            Step("bye", after=["book"], terminal=True, posture="Say goodbye."),
        ],
        constraints=[commit("book", until=is_true("b:ok")), require("book", "bye")],
    )


def active(step: str) -> Any:
    def check(value: Any, state: State) -> bool:
        return step in (state.get("flow:booking:active") or [])

    check.__name__ = f"{step} active"
    return check


class Probe(Recognizer):
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
                Probe(lambda t: seen.append((state.get("turn:user"), state.get("session:turn")))),
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


async def test_extractors_run_each_turn_with_provenance() -> None:
    state = State()
    async with Session(state, clock=ManualClock()) as session:
        conversation = Conversation(session)
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


async def test_window_reads_the_last_turns_of_the_session_transcript() -> None:
    state = State()
    heard: list[str] = []

    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(Extract("spy").field("x", Probe(heard.append)).window(2).build())
        for text in ["one", "two", "three"]:
            await conversation.user_turn(text)
    assert heard == ["one", "one two", "two three"]


async def test_every_n_turns() -> None:
    runs: list[int] = []
    state = State()

    async with Session(state) as session:
        conversation = Conversation(session)
        conversation.add_extractor(
            Extract("c")
            .field("x", Probe(lambda t: runs.append(state.get("session:turn"))))
            .trigger(Trigger.every(2))
            .build()
        )
        for i in range(5):
            await conversation.user_turn(f"turn {i}")
    assert runs == [2, 4]


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
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
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
    async with Session(state, clock=ManualClock()) as session:
        conversation = Conversation(session)
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


async def test_on_complete_dispatch_returns_at_once() -> None:
    state = State()
    clock = ManualClock()

    async def slow(state: State) -> str:
        await clock.sleep(5)
        return "done"

    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
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


async def test_the_context_tells_the_model_what_applies_and_drops_repeats() -> None:
    state = State()
    async with Session(state) as session:
        conversation = Conversation(session, tools=["book", "transfer"])
        conversation.add_extractor(size_extractor())
        runner = conversation.run_flow(booking_plan())
        first = await conversation.user_turn("hi")
        assert first.postures == ("Ask how many people.",)
        assert first.grounds == ("Size: unknown.",)
        assert first.unmet == ("book", "bye")
        assert first.tools == ("transfer",)
        assert set(first.refused) == {"book"}
        assert first.lines == (
            "Ask how many people.",
            "Size: unknown.",
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
        assert sized.lines == ("Ask for a yes.", "Booking for 4.")

        state.set("b:size", 5)
        changed = conversation.context_now()
        assert changed.lines == ("Booking for 5.",)  # a changed ground is said again
        assert changed.turn.number == 3  # between turns: the last turn


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
        lines = [line for line in ctx.lines if line.startswith("Background result")]
        if scheduling == "silent":
            assert lines == []
        else:
            assert lines == [
                f"Background result ({scheduling}) from lookup: "
                '{"resolver": "lookup", "result": {"from": "lookup"}, "status": "completed"}'
            ]
        third = await conversation.user_turn("third")
        assert third.deliveries == ()
        assert conversation.take_deliveries() == []


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


async def test_flow_background_actions_are_delivered_through_the_turn() -> None:
    clock = ManualClock()
    plan = Flow(
        "f",
        [
            Step("wait", done=resolved("lookup"), on_enter=run(lookup(clock), "background")),
            Step("end", after=["wait"], terminal=True),
        ],
    )
    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan)
        await clock.advance(1)
        ctx = await conversation.user_turn("hello")
        assert [r.value for r in ctx.deliveries] == [{"from": "lookup"}]
        assert conversation.take_deliveries() == []


# -- the interruption race ---------------------------------------------------------------------


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
        conversation.add_extractor(Extract("x").field("y", Probe(lambda t: release.set())).build())
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


EVENTS = st.lists(
    st.sampled_from(["advance", "begin", "end", "turn", "take", "now"]), min_size=1, max_size=25
)
SCHEDULES = st.lists(
    st.tuples(st.sampled_from(["when_idle", "interrupt", "silent"]), st.integers(1, 6)),
    min_size=1,
    max_size=6,
)


@settings(deadline=None, max_examples=60)
@given(events=EVENTS, schedules=SCHEDULES, push=st.booleans())
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
    async with Session(state, clock=ManualClock()) as session:
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


async def test_a_conversation_script_drives_turns_and_digressions() -> None:
    from slateflow import Digression, FlowStack
    from slateflow.testing import ConversationScript

    faq = Flow("faq", [Step("answer", terminal=True, posture="Parking is free.")])
    async with Session(State(), clock=ManualClock()) as session:
        conversation = Conversation(session, tools=["book"])
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
        script.expect_told("Booking for 2.")
        with pytest.raises(AssertionError, match="expected the model to be told 'Say goodbye"):
            script.expect_told("Say goodbye")
        assert script.transcript == ["hi", "is there parking?", "two people"]
        assert len(script.contexts) == 3


async def test_the_context_as_json() -> None:
    import json

    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        conversation = Conversation(session, tools=["book"])
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
    assert data["tools"] == []
    assert list(data["refused"]) == ["book"]
    assert data["prompt"] == "\n".join(data["lines"])
    assert data["postures"] == ["Ask how many people."]


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
