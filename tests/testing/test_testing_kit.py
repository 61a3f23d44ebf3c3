"""The testing kit (``slateflow.testing``): fake agents and fetches, the scripted LLM, the
assertion helpers and the conversation script, used the way a user's own tests use them.

Every timed thing runs on a :class:`ManualClock`; ``await clock.advance(0)`` (or ``settle()``)
lets the ready tasks run until they block again. Nothing here waits on the wall clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskGroup
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import voice_booking
from helpers import tagged
from slateflow import (
    Conversation,
    Flow,
    Resolver,
    Session,
    State,
    Step,
    captured,
    eq,
    is_true,
)
from slateflow import ManualClock as RootManualClock
from slateflow.errors import FakeScriptError, ResolverError, SlateError
from slateflow.flow import FlowRunner, Verdict
from slateflow.resolve import (
    LLM,
    BackgroundResult,
    LLMRequest,
    LLMResponse,
    ManualClock,
    Usage,
    settle,
)
from slateflow.testing import (
    ConversationScript,
    Fake,
    FakeCall,
    ScriptedLLM,
    assert_provenance,
    assert_resolved,
    assert_step,
    fake_agent,
    fake_fetch,
    recent_journal,
    why,
)

Mode = Literal["call", "dispatch", "background"]
MODES: list[Mode] = ["call", "dispatch", "background"]


# -- helpers --------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def session_on(clock: ManualClock, **state_options: Any) -> AsyncIterator[Session]:
    """A Session on a fresh State, both on ``clock``."""
    async with Session(State(clock=clock, **state_options), clock=clock) as session:
        yield session


async def call_quietly(session: Session, resolver: Resolver) -> None:
    """Call mode, keeping the outcome in the State only (a failure is read from ``:error``)."""
    with contextlib.suppress(ResolverError):
        await session.call(resolver)


def start_in(
    mode: str,
    session: Session,
    resolver: Resolver,
    tg: TaskGroup,
    delivered: list[BackgroundResult],
) -> None:
    """Start one run of ``resolver`` in ``mode`` without waiting for it."""
    if mode == "call":
        tg.start_soon(call_quietly, session, resolver)
    elif mode == "dispatch":
        session.dispatch(resolver)
    else:
        session.background(resolver, delivered.append)


async def run_once(mode: str, session: Session, resolver: Resolver) -> list[BackgroundResult]:
    """Run ``resolver`` once in ``mode`` to its end; returns what background mode delivered."""
    delivered: list[BackgroundResult] = []
    if mode == "call":
        await call_quietly(session, resolver)
    elif mode == "dispatch":
        await session.dispatch(resolver).wait(raise_error=False)
    else:
        session.background(resolver, delivered.append)
        await settle()
        assert len(delivered) == 1, delivered
    return delivered


def outcome(state: State, name: str) -> tuple[str | None, Any, str | None]:
    """A resolver's keys: (status, result, error)."""
    return state.get(f"{name}:status"), state.get(f"{name}:result"), state.get(f"{name}:error")


@contextlib.asynccontextmanager
async def booking_script(
    mode: Mode = "dispatch", *, lookup: Fake | None = None
) -> AsyncIterator[tuple[ConversationScript, Fake]]:
    """A started booking conversation whose availability lookup is a held fake (unless given)."""
    clock = ManualClock()
    fake = lookup if lookup is not None else fake_fetch()
    resolver = Resolver.fetch("availability", fake, reads=["booking:date", "booking:time"])
    async with session_on(clock) as session:
        script = ConversationScript(Conversation(session), fakes={"availability": fake})
        await script.start(voice_booking(resolver, mode=mode))
        yield script, fake


async def at_check(script: ConversationScript) -> None:
    """The caller gives the slot; the flow is checking availability (the lookup is held)."""
    await script.user("Saturday at seven, please")
    await script.say(booking__date="Saturday", booking__time="19:00")


def failure(action: Callable[[], Any]) -> str:
    """The message of the AssertionError ``action()`` raises."""
    with pytest.raises(AssertionError) as info:
        action()
    return str(info.value)


def explained(message: str, runner: FlowRunner) -> None:
    """The failure message carries the flow's explanation and the recent journal."""
    assert str(runner.explain()) in message, message
    assert "recent changes:" in message, message
    assert recent_journal(runner.state) in message, message


# -- the kit's surface ----------------------------------------------------------------------------


def test_the_kit_exports_the_documented_names() -> None:
    import slateflow.testing as kit

    for name in (
        "fake_agent",
        "fake_fetch",
        "Fake",
        "FakeCall",
        "ScriptedLLM",
        "ConversationScript",
        "assert_step",
        "assert_resolved",
        "assert_provenance",
        "recent_journal",
        "why",
    ):
        assert name in kit.__all__
        assert getattr(kit, name) is not None
    assert ManualClock is RootManualClock  # time lives in slateflow.resolve (and the top level)
    assert "ManualClock" not in kit.__all__
    assert issubclass(FakeScriptError, SlateError)
    assert isinstance(ScriptedLLM(), LLM)
    assert isinstance(fake_agent(returns="x"), Fake)


# -- fakes: returns / raises in every mode --------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("kind", "value"),
    [("fetch", {"open": True}), ("fetch", None), ("fetch", [1, "two"]), ("agent", "all good")],
)
async def test_a_fake_that_returns_lands_as_the_result_in_every_mode(
    mode: str, kind: str, value: Any
) -> None:
    if kind == "fetch":
        fake = fake_fetch(returns=value)
        resolver = Resolver.fetch("lookup", fake)
    else:
        fake = fake_agent(returns=value)
        resolver = Resolver.agent("lookup", fake)
    async with session_on(ManualClock()) as session:
        delivered = await run_once(mode, session, resolver)
        state = session.state
        assert outcome(state, "lookup") == ("done", value, None)
        assert "lookup:result" in state
        assert_resolved(state, "lookup", value)
        assert_provenance(state, "lookup:result", source=kind, writer="lookup", mode=mode)
        assert fake.call_count == 1
        assert fake.held == 0
        if mode == "background":
            assert delivered[0].status == "completed"
            assert delivered[0].value == value


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("raises", "message"),
    [(ValueError("backend down"), "backend down"), (TimeoutError, "TimeoutError")],
    ids=["instance", "class"],
)
@pytest.mark.parametrize("kind", ["fetch", "agent"])
async def test_a_fake_that_raises_lands_as_the_error_in_every_mode(
    mode: str, raises: BaseException | type[BaseException], message: str, kind: str
) -> None:
    if kind == "fetch":
        resolver = Resolver.fetch("lookup", fake_fetch(raises=raises))
    else:
        resolver = Resolver.agent("lookup", fake_agent(raises=raises))
    async with session_on(ManualClock()) as session:
        delivered = await run_once(mode, session, resolver)
        assert outcome(session.state, "lookup") == ("error", None, message)
        assert_provenance(session.state, "lookup:error", source=kind, writer="lookup", mode=mode)
        if mode == "background":
            assert delivered[0].status == "error"
            assert delivered[0].error == message


@pytest.mark.anyio
async def test_a_fake_raising_in_call_mode_raises_a_resolver_error_to_the_caller() -> None:
    async with session_on(ManualClock()) as session:
        with pytest.raises(ResolverError, match="backend down") as info:
            await session.call(Resolver.fetch("lookup", fake_fetch(raises=OSError("backend down"))))
        assert info.value.name == "lookup"


# -- fakes: scripts -------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_script_plays_values_exceptions_and_callables_in_order(mode: str) -> None:
    async def async_entry(state: State) -> Any:
        await anyio.lowlevel.checkpoint()
        return {"seen": state.get("n")}

    fake = fake_fetch(
        script=[
            1,
            ValueError("second fails"),
            lambda state: state.get("n") * 10,
            async_entry,
            KeyError,
            [1, 2],
        ]
    )
    resolver = Resolver.fetch("x", fake)
    async with session_on(ManualClock()) as session:
        state = session.state
        state.set("n", 4)
        seen = []
        for _ in range(6):
            await run_once(mode, session, resolver)
            seen.append(outcome(state, "x"))
        assert seen == [
            ("done", 1, None),
            ("error", None, "second fails"),
            ("done", 40, None),
            ("done", {"seen": 4}, None),
            ("error", None, "KeyError"),
            ("done", [1, 2], None),
        ]
        # One call more than the script has: a FakeScriptError, recorded as the run's error.
        await run_once(mode, session, resolver)
        status, result, error = outcome(state, "x")
        assert (status, result) == ("error", None)
        assert error == (
            "fake_fetch was called 7 times but its script has 6 entries; add entries for every "
            "call the test makes"
        )
        assert_provenance(state, "x:error", exception="FakeScriptError")
        assert fake.call_count == 7


@pytest.mark.anyio
async def test_script_exhaustion_says_entry_for_one_and_entries_for_none() -> None:
    one = fake_agent(script=["only"])
    none = fake_fetch(script=[])
    async with session_on(ManualClock()) as session:
        state = session.state
        assert await session.call(Resolver.agent("one", one)) == "only"
        with pytest.raises(ResolverError):
            await session.call(Resolver.agent("one", one))
        assert state.get("one:error") == (
            "fake_agent was called 2 times but its script has 1 entry; add entries for every "
            "call the test makes"
        )
        with pytest.raises(ResolverError, match="called 1 times but its script has 0 entries"):
            await session.call(Resolver.fetch("none", none))
    # Used directly, the fake raises the error itself.
    with pytest.raises(FakeScriptError, match="called 3 times but its script has 1 entry"):
        await one(State())


@pytest.mark.anyio
async def test_an_agent_script_is_checked_like_a_real_agent() -> None:
    async def later(state: State) -> str:
        return f"hello {state.get('name')}"

    agent = fake_agent(script=["first", later, lambda state: 42])
    resolver = Resolver.agent("greet", agent)
    async with session_on(ManualClock()) as session:
        session.state.set("name", "Ada")
        assert await session.call(resolver) == "first"
        assert await session.call(resolver) == "hello Ada"
        with pytest.raises(ResolverError, match="returned int, not str"):
            await session.call(resolver)
        assert session.state.get("greet:error") == (
            "agent of resolver 'greet' returned int, not str; use Resolver.fetch for other values"
        )
        assert agent.call_count == 3


@pytest.mark.anyio
async def test_a_script_is_copied_when_the_fake_is_made() -> None:
    entries = ["a", "b"]
    fake = fake_agent(script=entries)
    entries.append("c")  # too late: the fake has its own copy
    entries.clear()
    state = State()
    assert [await fake(state), await fake.run(state)] == ["a", "b"]
    with pytest.raises(FakeScriptError, match="has 2 entries"):
        await fake(state)


# -- fakes: delay on a manual clock ---------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_delay_lands_nothing_until_the_clock_is_advanced(mode: str) -> None:
    clock = ManualClock()
    fake = fake_fetch(returns={"open": True}, delay=2.0, clock=clock)
    resolver = Resolver.fetch("slow", fake)
    delivered: list[BackgroundResult] = []
    async with session_on(clock) as session, anyio.create_task_group() as tg:
        state = session.state
        start_in(mode, session, resolver, tg, delivered)
        await clock.advance(0)
        assert fake.call_count == 1  # called at once, answering later
        assert clock.pending == 1
        assert outcome(state, "slow") == ("running", None, None)
        await clock.advance(1.5)
        assert outcome(state, "slow") == ("running", None, None)
        assert delivered == []
        await clock.advance(0.5)
        assert outcome(state, "slow") == ("done", {"open": True}, None)
        assert_provenance(state, "slow:result", duration=2.0, mode=mode)
        assert clock.pending == 0
        if mode == "background":
            assert [r.value for r in delivered] == [{"open": True}]


@pytest.mark.anyio
async def test_a_delay_longer_than_the_timeout_times_the_resolver_out() -> None:
    clock = ManualClock()
    fake = fake_agent(returns="late", delay=5, clock=clock)
    resolver = Resolver.agent("slow", fake, timeout=2)
    async with session_on(clock) as session:
        session.dispatch(resolver)
        await clock.advance(1.9)
        assert session.state.get("slow:status") == "running"
        await clock.advance(0.1)
        status, result, error = outcome(session.state, "slow")
        assert (status, result) == ("error", None)
        assert error is not None
        assert "timed out after 2s" in error


@pytest.mark.anyio
async def test_a_delayed_script_answers_each_call_after_its_own_delay() -> None:
    clock = ManualClock()
    fake = fake_fetch(script=["a", "b"], delay=1, clock=clock)
    resolver = Resolver.fetch("x", fake, on_conflict="queue")
    async with session_on(clock) as session:
        state = session.state
        session.dispatch(resolver)
        session.dispatch(resolver)
        await clock.advance(1)
        assert state.get("x:result") == "a"
        assert fake.call_count == 2  # the queued run started after the first ended
        await clock.advance(0.5)
        assert state.get("x:result") == "a"
        await clock.advance(0.5)
        assert state.get("x:result") == "b"


# -- fakes: held calls ----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_held_call_waits_for_complete(mode: str) -> None:
    clock = ManualClock()
    fake = fake_fetch()
    resolver = Resolver.fetch("lookup", fake)
    delivered: list[BackgroundResult] = []
    async with session_on(clock) as session, anyio.create_task_group() as tg:
        state = session.state
        start_in(mode, session, resolver, tg, delivered)
        await settle()
        assert fake.held == 1
        assert repr(fake) == "<fake_fetch: 1 call(s), 1 held>"
        await clock.advance(3600)  # time alone never answers a held call
        assert outcome(state, "lookup") == ("running", None, None)
        fake.complete({"open": False})
        assert fake.held == 0
        await settle()
        assert outcome(state, "lookup") == ("done", {"open": False}, None)
        assert_provenance(state, "lookup:result", source="fetch", mode=mode)
        if mode == "background":
            assert [r.status for r in delivered] == ["completed"]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("backend down", "backend down"),
        (ConnectionError("refused"), "refused"),
        (KeyError, "KeyError"),
    ],
    ids=["text", "instance", "class"],
)
async def test_a_held_call_fails_with_fail(
    mode: str, error: BaseException | str, message: str
) -> None:
    fake = fake_agent()
    resolver = Resolver.agent("verify", fake)
    delivered: list[BackgroundResult] = []
    async with session_on(ManualClock()) as session, anyio.create_task_group() as tg:
        start_in(mode, session, resolver, tg, delivered)
        await settle()
        fake.fail(error)
        await settle()
        assert outcome(session.state, "verify") == ("error", None, message)
        if mode == "background":
            assert [r.error for r in delivered] == [message]


@pytest.mark.anyio
async def test_held_calls_are_answered_oldest_first() -> None:
    fake = fake_fetch()
    async with session_on(ManualClock()) as session:
        state = session.state
        for name in "abc":  # one at a time: trio does not start tasks in spawn order
            session.dispatch(Resolver.fetch(name, fake))
            await settle()
        assert fake.held == 3
        fake.complete("first")
        await settle()
        assert outcome(state, "a") == ("done", "first", None)
        assert outcome(state, "b") == ("running", None, None)
        fake.fail("second")
        fake.complete(None)
        await settle()
        assert outcome(state, "b") == ("error", None, "second")
        assert outcome(state, "c") == ("done", None, None)
        assert fake.held == 0
        with pytest.raises(FakeScriptError) as info:
            fake.complete("nobody")
        assert str(info.value) == (
            "fake_fetch: no call is waiting to be answered (3 call(s) so far); start the "
            "resolver first, or give the fake returns=/script="
        )
        with pytest.raises(FakeScriptError, match="no call is waiting"):
            fake.fail("nobody")


def test_complete_or_fail_before_any_call_raises() -> None:
    fake = fake_agent()
    with pytest.raises(FakeScriptError, match=r"no call is waiting to be answered \(0 call"):
        fake.complete("x")
    with pytest.raises(FakeScriptError, match="fake_agent: no call is waiting"):
        fake.fail(RuntimeError("x"))
    # A fake with returns= never holds anything, so there is nothing to complete either.
    with pytest.raises(FakeScriptError):
        fake_fetch(returns=1).complete(2)


@pytest.mark.anyio
async def test_complete_answers_the_live_call_after_a_held_one_was_superseded() -> None:
    fake = fake_fetch()
    resolver = Resolver.fetch("lookup", fake)  # on_conflict="latest"
    async with session_on(ManualClock()) as session:
        session.dispatch(resolver)
        await settle()
        session.dispatch(resolver)  # cancels the first run, whose call was held
        await settle()
        assert fake.call_count == 2
        assert fake.held == 1
        fake.complete("answer")
        await settle()
        assert outcome(session.state, "lookup") == ("done", "answer", None)


# -- fakes: call records --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_calls_record_number_cursor_and_the_versions_the_fake_saw() -> None:
    fake = fake_fetch(
        script=[lambda state: state.journal.cursor, lambda state: state.version("booking:date")]
    )
    resolver = Resolver.fetch("lookup", fake)
    async with session_on(ManualClock()) as session:
        state = session.state
        state.set("booking:date", "Saturday")
        cursor_then = await session.call(resolver)
        state.set("booking:date", "Sunday")
        state.set("booking:time", "19:00")
        date_version_then = await session.call(resolver)
    first, second = fake.calls
    assert all(isinstance(c, FakeCall) for c in fake.calls)
    assert (first.number, second.number) == (1, 2)
    assert first.cursor == cursor_then
    assert second.cursor > first.cursor
    assert first.saw("booking:date")
    assert not first.saw("booking:time")
    assert first.versions["booking:date"] == 1
    assert second.saw("booking:time")
    assert second.versions["booking:date"] == date_version_then == 2
    assert first.saw("lookup:status")  # "running" is written before the source is called
    assert not first.saw("lookup:result")
    assert second.versions["lookup:result"] == 1
    # A record is a snapshot: later writes do not change it.
    assert first.versions == {"booking:date": 1, "lookup:status": 1}


@pytest.mark.anyio
async def test_a_call_is_recorded_even_when_it_fails_or_is_held() -> None:
    failing = fake_fetch(raises=ValueError("no"))
    held = fake_agent()
    async with session_on(ManualClock()) as session:
        await call_quietly(session, Resolver.fetch("a", failing))
        session.dispatch(Resolver.agent("b", held))
        await settle()
        assert [c.number for c in failing.calls] == [1]
        assert [c.number for c in held.calls] == [1]
        assert held.calls[0].saw("b:status")
        held.complete("done")


# -- fakes: argument validation -------------------------------------------------------------------


@pytest.mark.parametrize("make", [fake_fetch, fake_agent])
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"returns": "x", "raises": ValueError}, "['returns', 'raises']"),
        ({"returns": "x", "script": ["y"]}, "['returns', 'script']"),
        ({"raises": ValueError("x"), "script": []}, "['raises', 'script']"),
        (
            {"returns": "x", "raises": ValueError, "script": ["y"]},
            "['returns', 'raises', 'script']",
        ),
    ],
)
def test_two_of_returns_raises_and_script_are_refused(
    make: Callable[..., Fake], options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match="give one of returns=, raises= or script=") as info:
        make(**options)
    assert named in str(info.value)


@pytest.mark.parametrize("make", [fake_fetch, fake_agent])
@pytest.mark.parametrize("delay", [-1, -0.001, float("nan"), float("inf"), True, "1", None])
def test_a_bad_delay_is_refused(make: Callable[..., Fake], delay: Any) -> None:
    with pytest.raises(ValueError, match="delay must be a finite number of seconds >= 0"):
        make(returns="x", delay=delay)


@pytest.mark.parametrize("delay", [0, 0.0, 1, 2.5])
def test_a_good_delay_is_kept_in_seconds(delay: float) -> None:
    fake = fake_fetch(returns=1, delay=delay)
    assert fake.delay == float(delay)
    assert isinstance(fake.delay, float)


@pytest.mark.parametrize("other", [{"raises": ValueError}, {"script": [1]}])
def test_returns_none_with_raises_or_script_is_refused(other: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="give one of"):
        fake_fetch(returns=None, **other)


# -- ScriptedLLM ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_scripted_llm_answers_text_and_records_the_rendered_requests() -> None:
    llm = ScriptedLLM(["Hello Ada!", "Hi again."])
    resolver = Resolver.llm(
        "greet", llm, "Greet {user:name} warmly.", system="Be brief.", temperature=0.2
    )
    async with session_on(ManualClock()) as session:
        state = session.state
        state.set("user:name", "Ada")
        assert await session.call(resolver) == "Hello Ada!"
        assert llm.remaining == 1
        assert llm.last_request.prompt == "Greet Ada warmly."
        assert llm.last_request.system == "Be brief."
        assert llm.last_request.temperature == 0.2
        assert_provenance(
            state,
            "greet:result",
            source="llm",
            writer="greet",
            model="scripted",
            usage=None,  # a text reply reports no usage: unknown, never zero
            usage_estimate={"input_tokens": 7, "output_tokens": 3},  # ~4 characters a token
        )
        state.set("user:name", "Grace")
        session.dispatch(resolver)
        await settle()
        assert state.get("greet:result") == "Hi again."
        assert [r.prompt for r in llm.requests] == ["Greet Ada warmly.", "Greet Grace warmly."]
        assert llm.last_request is llm.requests[-1]
        assert llm.remaining == 0


@pytest.mark.anyio
async def test_scripted_llm_text_takes_the_requested_model_or_its_own() -> None:
    llm = ScriptedLLM(["a", "b"], model="house-model")
    async with session_on(ManualClock()) as session:
        await session.call(Resolver.llm("one", llm, "x", model="gpt-test"))
        await session.call(Resolver.llm("two", llm, "x"))
        assert_provenance(session.state, "one:result", model="gpt-test")
        assert_provenance(session.state, "two:result", model="house-model")


@pytest.mark.anyio
async def test_scripted_llm_response_replies_put_model_and_usage_in_provenance() -> None:
    reply = LLMResponse(
        text="Table for two.",
        model="m-large",
        usage=Usage(input_tokens=12, output_tokens=5),
        finish_reason="stop",
    )
    llm = ScriptedLLM([reply])
    async with session_on(ManualClock()) as session:
        assert await session.call(Resolver.llm("summary", llm, "Summarise.")) == "Table for two."
        assert_provenance(
            session.state,
            "summary:result",
            source="llm",
            model="m-large",
            usage={"input_tokens": 12, "output_tokens": 5},
        )


@pytest.mark.anyio
async def test_scripted_llm_callable_replies_see_the_request_sync_and_async() -> None:
    async def shout(request: LLMRequest) -> LLMResponse:
        await anyio.lowlevel.checkpoint()
        return LLMResponse(text=request.prompt.upper(), model="async-model")

    llm = ScriptedLLM([lambda request: f"echo: {request.prompt} / {request.system}"])
    llm.add(shout)
    resolver = Resolver.llm("echo", llm, "Say {word}", system="sys")
    async with session_on(ManualClock()) as session:
        state = session.state
        state.set("word", "hi")
        assert await session.call(resolver) == "echo: Say hi / sys"
        state.set("word", "there")
        assert await session.call(resolver) == "SAY THERE"
        assert_provenance(state, "echo:result", model="async-model")


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_scripted_llm_exceptions_land_as_the_error(mode: str) -> None:
    llm = ScriptedLLM([ConnectionError("model unavailable")])
    async with session_on(ManualClock()) as session:
        await run_once(mode, session, Resolver.llm("greet", llm, "Hello"))
        assert outcome(session.state, "greet") == ("error", None, "model unavailable")
        assert len(llm.requests) == 1


@pytest.mark.anyio
async def test_scripted_llm_exhaustion_names_the_counts_and_the_prompt() -> None:
    llm = ScriptedLLM(["only reply"])
    resolver = Resolver.llm("ask", llm, "Is {day} free?")
    async with session_on(ManualClock()) as session:
        state = session.state
        state.set("day", "Tuesday")
        await session.call(resolver)
        with pytest.raises(ResolverError):
            await session.call(resolver)
        assert state.get("ask:error") == (
            "ScriptedLLM was called 2 times but its script has 1 reply; the unanswered prompt "
            "was 'Is Tuesday free?'"
        )
        assert_provenance(state, "ask:error", exception="FakeScriptError")
        llm.add("two", "three")
        assert llm.remaining == 2
        await session.call(resolver)
        await session.call(resolver)
        with pytest.raises(ResolverError):
            await session.call(resolver)
        assert state.get("ask:error") == (
            "ScriptedLLM was called 5 times but its script has 3 replies; the unanswered prompt "
            "was 'Is Tuesday free?'"
        )
        assert len(llm.requests) == 5


@pytest.mark.anyio
async def test_scripted_llm_used_directly() -> None:
    llm = ScriptedLLM()
    with pytest.raises(FakeScriptError, match="has not been called yet"):
        _ = llm.last_request
    assert llm.remaining == 0
    assert llm.add("x") is llm
    assert llm.remaining == 1
    response = await llm.generate(LLMRequest(prompt="p"))
    assert response == LLMResponse(text="x", model="scripted")
    assert llm.last_request == LLMRequest(prompt="p")
    with pytest.raises(FakeScriptError, match="called 2 times but its script has 1 reply"):
        await llm.generate(LLMRequest(prompt="q"))
    assert llm.last_request.prompt == "q"  # an unanswered request is recorded too
    assert repr(llm) == "<ScriptedLLM: 2 request(s), 0 repl(ies) left>"


@pytest.mark.anyio
async def test_scripted_llm_a_callable_returning_something_else_is_a_clear_error() -> None:
    llm = ScriptedLLM([lambda request: 42])
    with pytest.raises(FakeScriptError, match="reply 1 is a int; a reply is text"):
        await llm.generate(LLMRequest(prompt="p"))


@pytest.mark.anyio
async def test_scripted_llm_raises_an_exception_class_from_its_script() -> None:
    llm = ScriptedLLM([TimeoutError])
    with pytest.raises(TimeoutError):
        await llm.generate(LLMRequest(prompt="p"))


# -- assertion helpers ----------------------------------------------------------------------------


def small_flow() -> Flow:
    return Flow(
        "greeting",
        [
            Step("ask", done=captured("user:name"), posture="Ask the caller's name."),
            Step("greet", after=["ask"], done=is_true("greeted")),
            Step("end", after=["greet"], terminal=True),
        ],
    )


def test_assert_step_passes_for_the_verdict_it_is_given() -> None:
    state = State()
    runner = FlowRunner(small_flow(), state)
    try:
        assert_step(runner, "ask")
        assert_step(runner, "greet", "pending")
        state.set("user:name", "Ada")
        assert_step(runner, "ask", Verdict.DONE)
        assert_step(runner, "greet")
        assert_step(runner, "greet", Verdict.ACTIVE)
    finally:
        runner.close()


def test_assert_step_failure_explains_the_flow_and_shows_the_journal() -> None:
    state = State()
    runner = FlowRunner(small_flow(), state)
    try:
        state.set("note", "hello", source="extraction", writer="slots")
        message = failure(lambda: assert_step(runner, "greet"))
        assert message.startswith(
            "expected step 'greet' to be active, but it is pending (active: ask)\n"
        )
        explained(message, runner)
        assert "step 'ask' waits for:" in message
        assert '[seq 2] note = "hello"  (extraction/slots)' in message
        message = failure(lambda: assert_step(runner, "ask", "done"))
        assert "expected step 'ask' to be done, but it is active" in message
        explained(message, runner)
    finally:
        runner.close()


def test_assert_step_failure_when_nothing_is_active() -> None:
    state = State()
    runner = FlowRunner(small_flow(), state)
    try:
        state.update({"user:name": "Ada", "greeted": True})
        assert runner.is_complete
        message = failure(lambda: assert_step(runner, "greet"))
        assert "but it is done (active: none)" in message
        explained(message, runner)
    finally:
        runner.close()


@pytest.mark.anyio
async def test_assert_resolved_passes_and_fails_with_the_status_and_error() -> None:
    async with session_on(ManualClock()) as session:
        state = session.state
        await session.call(Resolver.fetch("good", fake_fetch(returns={"open": True})))
        await call_quietly(session, Resolver.fetch("bad", fake_fetch(raises=OSError("down"))))
        assert_resolved(state, "good")
        assert_resolved(state, "good", {"open": True})

        message = failure(lambda: assert_resolved(state, "bad"))
        assert message.startswith(
            "expected 'bad' to be resolved, but 'bad:result' is not set "
            "(status 'error', error 'down')\n"
        )
        assert "recent changes:" in message
        assert '  [seq 4] bad:error = "down"  (fetch/bad)' in message

        message = failure(lambda: assert_resolved(state, "never"))
        assert "'never:result' is not set (status None)" in message

        message = failure(lambda: assert_resolved(state, "good", {"open": False}))
        assert message.startswith(
            "expected 'good:result' to be {'open': False}, got {'open': True}\n"
        )
        assert recent_journal(state) in message


@pytest.mark.parametrize(
    ("stored", "expected"), [(1, 1.0), (1, True), (0, False), ("1", 1), (None, 0)]
)
def test_assert_resolved_compares_values_with_their_types(stored: Any, expected: Any) -> None:
    state = State()
    state.set("x:result", stored)
    assert_resolved(state, "x", stored)
    with pytest.raises(AssertionError, match="expected 'x:result' to be"):
        assert_resolved(state, "x", expected)


@pytest.mark.anyio
async def test_assert_resolved_of_none_is_a_value() -> None:
    async with session_on(ManualClock()) as session:
        await session.call(Resolver.fetch("x", fake_fetch(returns=None)))
        assert_resolved(session.state, "x", None)
        with pytest.raises(AssertionError, match="to be 0, got None"):
            assert_resolved(session.state, "x", 0)


@pytest.mark.anyio
async def test_assert_provenance_passes_and_lists_every_mismatch() -> None:
    async with session_on(ManualClock()) as session:
        state = session.state
        session.dispatch(Resolver.agent("verify", fake_agent(returns="ok")))
        await settle()
        state.set("booking:date", "Sat", source="extraction", writer="slots", confidence=0.8)
        assert_provenance(state, "verify:result", source="agent", writer="verify")
        assert_provenance(state, "verify:result", mode="dispatch", attempt=1)
        assert_provenance(state, "booking:date", source="extraction", confidence=0.8)
        assert_provenance(state, "booking:date")  # no fields: only that it is set

        message = failure(
            lambda: assert_provenance(
                state, "verify:result", source="fetch", writer="verify", mode="call", nope=1
            )
        )
        assert message.splitlines()[0] == (
            "provenance of 'verify:result' does not match: source: expected 'fetch', got "
            "'agent'; mode: expected 'call', got 'dispatch'; nope: expected 1, got missing"
        )
        message = failure(lambda: assert_provenance(state, "booking:date", confidence=0.9))
        assert "confidence: expected 0.9, got 0.8" in message
        message = failure(lambda: assert_provenance(state, "missing:key", source="user"))
        assert message.startswith("expected 'missing:key' to be set")


def test_assert_provenance_failure_shows_the_recent_journal() -> None:
    state = State()
    state.set("booking:date", "Sat", source="extraction", writer="slots")
    message = failure(lambda: assert_provenance(state, "booking:date", source="user"))
    assert "recent changes:" in message


def test_recent_journal_lines_and_secret_masking() -> None:
    state = State()
    assert recent_journal(state) == "  (no changes yet)"
    state.policy("user:card", secret=True)
    state.set("user:card", "4111 1111 1111 1111", source="extraction", writer="slots")
    state.update({"a": 1, "b": {"x": [True, None]}})
    state.remove("a")
    state.set("user:card", "5500 0000 0000 0004")
    text = recent_journal(state)
    assert text.splitlines() == [
        '  [seq 1] user:card = "***"  (extraction/slots)',
        "  [seq 2] a = 1  (user)",
        '  [seq 2] b = {"x": [true, null]}  (user)',
        "  [seq 3] a removed  (user)",
        '  [seq 4] user:card = "***"  (user)',
    ]
    assert "4111" not in text
    assert "5500" not in text
    assert recent_journal(state, 2).splitlines() == [
        "  [seq 3] a removed  (user)",
        '  [seq 4] user:card = "***"  (user)',
    ]


def test_recent_journal_keeps_the_last_count_changes_of_a_big_batch() -> None:
    state = State()
    state.update({f"k{i}": i for i in range(20)})
    lines = recent_journal(state, 5).splitlines()
    assert lines == [f"  [seq 1] k{i} = {i}  (user)" for i in range(15, 20)]
    assert len(recent_journal(state).splitlines()) == 15


def test_recent_journal_without_a_journal_says_so() -> None:
    state = State(journal_size=0)
    state.set("k", 1)
    assert recent_journal(state) == "(the journal no longer holds the recent changes)"


def test_recent_journal_shows_what_a_small_journal_still_holds() -> None:
    state = State(journal_size=4)
    for i in range(10):
        state.set("k", i)
    assert "k = 9" in recent_journal(state)


def test_why_is_the_explanation_then_the_journal_and_masks_secrets() -> None:
    state = State()
    state.policy("user:*", secret=True)
    flow = Flow(
        "verify",
        [
            Step("pin", done=eq("user:pin", "1234")),
            Step("end", after=["pin"], terminal=True),
        ],
    )
    runner = FlowRunner(flow, state)
    try:
        assert why(None, state) == "recent changes:\n" + recent_journal(state)
        assert why(runner, state) == (
            str(runner.explain()) + "\nrecent changes:\n" + recent_journal(state)
        )
        state.set("user:pin", "271828", source="extraction", writer="digits")
        message = failure(lambda: assert_step(runner, "end"))
        explained(message, runner)
        assert "'user:pin' is ***" in message  # the explanation masks it
        assert '[seq 2] user:pin = "***"  (extraction/digits)' in message  # so does the journal
        assert "271828" not in message
    finally:
        runner.close()


@pytest.mark.anyio
@pytest.mark.parametrize("which", ["assert_resolved", "expect_key"])
async def test_a_value_mismatch_on_a_secret_key_does_not_print_it(which: str) -> None:
    async with session_on(ManualClock()) as session:
        state = session.state
        state.policy("verify:*", secret=True)
        await session.call(Resolver.fetch("verify", fake_fetch(returns="4111 1111")))
        if which == "assert_resolved":
            message = failure(lambda: assert_resolved(state, "verify", "0000"))
        else:
            script = ConversationScript(Conversation(session))
            message = failure(lambda: script.expect_key("verify:result", "0000"))
        assert "expected 'verify:result' to be '0000'" in message
        assert "4111" not in message


@pytest.mark.anyio
async def test_expect_key_reads_a_path_and_says_what_is_there() -> None:
    async with session_on(ManualClock()) as session:
        state = session.state
        state.set("pick:slot", {"date": "2025-06-17", "time": "15:15"})
        script = ConversationScript(Conversation(session))
        script.expect_key("pick:slot.time", "15:15")
        message = failure(lambda: script.expect_key("pick:slot.time", "09:00"))
        assert message.startswith(
            "expected 'pick:slot.time' (a path into 'pick:slot') to be '09:00', got '15:15'"
        )
        message = failure(lambda: script.expect_key("pick:slot.doctor"))
        assert "to be set, and it is not" in message


# -- ConversationScript ---------------------------------------------------------------------------


async def booking_conversation(mode: Mode) -> None:
    """The booking, driven as a conversation: the happy path, every expectation on the way."""
    async with booking_script(mode) as (script, lookup):
        state = script.state
        script.expect_step("slot")
        script.expect_key("flow:booking:active", ["slot"])

        await script.user("A table on Saturday at seven, please")
        assert script.transcript == ["A table on Saturday at seven, please"]
        written = [m for m in state.journal.since(0) if m.key == "turn:transcript"]
        assert [(m.removed, m.new, m.provenance.source, m.provenance.writer) for m in written] == [
            (False, "A table on Saturday at seven, please", "user", "caller"),
            (True, None, "system", None),
        ]
        assert "turn:transcript" not in state  # the turn ended
        script.expect_step("slot")  # words alone do not fill slots

        await script.say(booking__date="Saturday", booking__time="19:00")
        assert_provenance(state, "booking:time", source="extraction", writer="script")
        script.expect_done("slot")
        script.expect_step("check")
        script.expect_key("availability:status", "running")
        assert lookup.held == 1
        assert lookup.calls[0].versions.keys() >= {"booking:date", "booking:time"}
        reason = script.expect_refused("book_table", reason="'booking:confirmed' must be true")
        assert "Tell the caller you are checking the book." in reason
        script.expect_admitted("transfer_to_human")

        await script.resolve("availability", {"open": True})
        script.expect_resolved("availability", {"open": True})
        assert_provenance(state, "availability:result", source="fetch", mode=mode)
        script.expect_done("check")
        script.expect_step("confirm")

        await script.user("Yes, that's right")
        await script.say(booking__confirmed=True)
        script.expect_step("book")
        script.expect_admitted("book_table")
        await script.tool_ok("book_table")
        script.expect_done("book")
        script.expect_done("goodbye")
        script.expect_complete()
        script.expect_key("flow:booking:complete", True)
        script.expect_refused("book_table", reason="Do not call it again")
        assert script.transcript == ["A table on Saturday at seven, please", "Yes, that's right"]
        assert lookup.call_count == 1
        # The background result was handed to the model with the next turn, and only then.
        delivered = [[r.value for r in ctx.deliveries] for ctx in script.contexts]
        assert delivered == ([[], [{"open": True}]] if mode == "background" else [[], []])
        assert script.conversation.take_deliveries() == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["dispatch", "background"])
async def test_conversation_books_a_free_table(mode: Mode) -> None:
    await booking_conversation(mode)


@pytest.mark.anyio
async def test_conversation_expect_resolved_without_a_value() -> None:
    async with booking_script() as (script, _):
        await at_check(script)
        await script.resolve("availability", {"open": True})
        script.expect_resolved("availability")


@pytest.mark.anyio
async def test_conversation_takes_the_alternative_when_the_time_is_taken() -> None:
    async with booking_script() as (script, _):
        await at_check(script)
        await script.resolve("availability", {"open": False, "alternative": "19:30"})
        script.expect_step("offer")
        script.expect_key("availability:result", {"open": False, "alternative": "19:30"})
        await script.say(booking__time="19:30", booking__alternative_accepted=True)
        script.expect_done("offer")
        script.expect_step("confirm")
        assert script.runner.verdict("goodbye") is Verdict.PENDING


@pytest.mark.anyio
async def test_conversation_fail_makes_the_lookup_fail() -> None:
    async with booking_script() as (script, lookup):
        await at_check(script)
        await script.fail("availability", "booking system down")
        script.expect_key("availability:error", "booking system down")
        script.expect_key("availability:status", "error")
        script.expect_done("check")
        script.expect_step("sorry")
        assert lookup.held == 0
        message = failure(script.expect_complete)
        assert "unmet requirements: book" in message
        explained(message, script.runner)
        message = failure(lambda: script.expect_resolved("availability"))
        assert "(status 'error', error 'booking system down')" in message


@pytest.mark.anyio
async def test_conversation_fail_with_an_exception() -> None:
    async with booking_script() as (script, _):
        await at_check(script)
        await script.fail("availability", TimeoutError("no answer in 5s"))
        script.expect_key("availability:error", "no answer in 5s")
        script.expect_step("sorry")


@pytest.mark.anyio
async def test_conversation_advance_moves_the_session_clock() -> None:
    clock = ManualClock()
    lookup = fake_fetch(returns={"open": True}, delay=0.4, clock=clock)
    resolver = Resolver.fetch("availability", lookup)
    async with Session(State(clock=clock), clock=clock) as session:
        script = ConversationScript(Conversation(session))
        assert script.use("availability", lookup) is lookup
        await script.start(voice_booking(resolver, mode="dispatch"))
        await at_check(script)
        await script.advance(0.3)
        script.expect_step("check")
        assert clock.monotonic() == pytest.approx(0.3)
        await script.advance(0.1)
        script.expect_step("confirm")
        script.expect_resolved("availability", {"open": True})


@pytest.mark.anyio
async def test_conversation_tool_ok_of_a_refused_tool_fails_with_the_reason() -> None:
    async with booking_script() as (script, _):
        await at_check(script)
        done_before = script.runner.done_steps
        reason = script.runner.admit("book_table", record=False).reason or None
        assert reason is not None
        with pytest.raises(AssertionError) as info:
            await script.tool_ok("book_table")
        message = str(info.value)
        assert message.startswith(f"the flow refused 'book_table': {reason}\n")
        explained(message, script.runner)
        # The refused tool did not run: the flow did not hear of it.
        assert script.runner.done_steps == done_before
        await script.resolve("availability", {"open": True})
        await script.say(booking__confirmed=True)
        script.expect_step("book")  # book_table never counted as called


@pytest.mark.anyio
async def test_conversation_tool_ok_in_observe_mode_records_a_violation() -> None:
    lookup = fake_fetch()
    async with session_on(ManualClock()) as session:
        script = ConversationScript(Conversation(session), fakes={"availability": lookup})
        flow = voice_booking(Resolver.fetch("availability", lookup), mode="dispatch")
        await script.start(flow, enforcement="observe")
        reason = script.expect_refused("book_table")
        assert script.runner.violations == []  # expect_refused records nothing
        await script.tool_ok("book_table")
        assert [v.tool for v in script.runner.violations] == ["book_table"]
        assert script.runner.violations[0].reason == reason


@pytest.mark.anyio
async def test_conversation_expectations_fail_with_the_explanation_and_journal() -> None:
    async with booking_script() as (script, _):
        await at_check(script)
        runner = script.runner
        cases: list[tuple[Callable[[], Any], str]] = [
            (
                lambda: script.expect_step("confirm"),
                "expected step 'confirm' to be active, but it is pending (active: check)",
            ),
            (
                lambda: script.expect_done("check"),
                "expected step 'check' to be done, but it is active",
            ),
            (
                lambda: script.expect_key("booking:confirmed"),
                "expected 'booking:confirmed' to be set",
            ),
            (
                lambda: script.expect_key("booking:time", "19:30"),
                "expected 'booking:time' to be '19:30', got '19:00'",
            ),
            (
                lambda: script.expect_refused("transfer_to_human"),
                "expected the flow to refuse 'transfer_to_human', but it admits it",
            ),
            (
                lambda: script.expect_admitted("book_table"),
                "expected 'book_table' to be admitted, but: 'book_table' is not permitted yet",
            ),
            (script.expect_complete, "expected the flow to be complete"),
        ]
        for action, headline in cases:
            message = failure(action)
            assert message.startswith(headline), message
            explained(message, runner)
            assert "step 'check' waits for:" in message
            assert "(extraction/script)" in message  # the journal shows who wrote the slots


@pytest.mark.anyio
async def test_conversation_expect_key_compares_types_and_accepts_none() -> None:
    async with booking_script() as (script, _):
        await script.say(party=2, note=None)
        script.expect_key("party", 2)
        script.expect_key("note")
        script.expect_key("note", None)
        assert "expected 'party' to be 2.0, got 2" in failure(
            lambda: script.expect_key("party", 2.0)
        )
        assert "expected 'party' to be True" in failure(lambda: script.expect_key("party", True))


@pytest.mark.anyio
async def test_conversation_expect_refused_for_another_reason_fails() -> None:
    async with booking_script() as (script, _):
        await at_check(script)
        reason = script.runner.admit("book_table", record=False).reason or None
        message = failure(lambda: script.expect_refused("book_table", reason="already run"))
        assert message.startswith(f"'book_table' is refused, but not for 'already run': {reason}")


@pytest.mark.anyio
@pytest.mark.parametrize("which", ["expect_refused", "expect_resolved"])
async def test_every_conversation_expectation_failure_carries_the_explanation(which: str) -> None:
    async with booking_script() as (script, _):
        await at_check(script)
        if which == "expect_refused":
            message = failure(lambda: script.expect_refused("book_table", reason="already run"))
        else:
            message = failure(lambda: script.expect_resolved("availability"))
        explained(message, script.runner)


@pytest.mark.anyio
async def test_conversation_resolve_of_an_unregistered_name_says_what_is_registered() -> None:
    async with booking_script() as (script, lookup):
        await at_check(script)
        with pytest.raises(AssertionError) as info:
            await script.resolve("weather", {"sunny": True})
        assert str(info.value) == (
            "no fake is registered for resolver 'weather' (registered: availability); pass "
            "fakes={name: fake} to the script or call script.use(name, fake)"
        )
        with pytest.raises(AssertionError, match="no fake is registered for resolver 'x'"):
            await script.fail("x", "boom")
        assert lookup.held == 1  # nothing was answered
    async with session_on(ManualClock()) as session:
        with pytest.raises(AssertionError, match=r"\(registered: none\)"):
            await ConversationScript(Conversation(session)).resolve("weather", 1)


@pytest.mark.anyio
async def test_conversation_resolve_with_nothing_held_fails_with_the_explanation() -> None:
    async with booking_script() as (script, _):
        script.expect_step("slot")  # the lookup has not been dispatched yet
        with pytest.raises(AssertionError, match="no call is waiting") as info:
            await script.resolve("availability", {"open": True})
        assert str(script.runner.explain()) in str(info.value)


@pytest.mark.anyio
async def test_conversation_needs_a_started_flow_and_a_manual_clock_to_advance() -> None:
    async with Session(State()) as session:  # the real clock
        script = ConversationScript(Conversation(session))
        message = failure(lambda: script.runner)
        assert message == "the script has no flow yet: await script.start(flow) first"
        with pytest.raises(AssertionError, match=r"await script\.start"):
            script.expect_step("slot")
        with pytest.raises(AssertionError, match="needs a Session with a ManualClock"):
            await script.advance(1)
        # The rest works on the real clock: settling needs no time to pass.
        await script.user("hello")  # no flow yet: the transcript is still written and cleared
        assert "turn:transcript" not in script.state
        lookup = script.use("availability", fake_fetch())
        await script.start(voice_booking(Resolver.fetch("availability", lookup), mode="dispatch"))
        await at_check(script)
        script.expect_step("check")
        await script.resolve("availability", {"open": True})
        script.expect_step("confirm")


@pytest.mark.anyio
async def test_conversation_custom_transcript_key() -> None:
    async with session_on(ManualClock()) as session:
        script = ConversationScript(Conversation(session), transcript_key="turn:heard")
        await script.user("hi")
        heard = [m for m in session.state.journal.since(0) if m.key == "turn:heard"]
        assert [(m.removed, m.new) for m in heard] == [(False, "hi"), (True, None)]


@pytest.mark.anyio
async def test_conversation_resolve_after_the_lookup_was_re_run() -> None:
    lookup = fake_fetch()
    resolver = Resolver.fetch(
        "availability", lookup, reads=["booking:date", "booking:time"], reactive=True
    )
    async with session_on(ManualClock()) as session:
        script = ConversationScript(Conversation(session), fakes={"availability": lookup})
        await script.start(voice_booking(resolver, mode="dispatch"))
        await at_check(script)
        await script.say(booking__time="19:30")  # the caller changes their mind
        await script.advance(1)  # past the debounce: the lookup runs again
        assert lookup.call_count == 2
        await script.resolve("availability", {"open": True})
        script.expect_step("confirm")


# -- pytest-asyncio -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_asyncio_conversation_books_a_free_table() -> None:
    await booking_conversation("dispatch")


@pytest.mark.asyncio
async def test_asyncio_held_fake_and_delay_on_a_manual_clock() -> None:
    clock = ManualClock()
    held = fake_agent()
    slow = fake_fetch(returns=3, delay=1, clock=clock)
    async with session_on(clock) as session:
        state = session.state
        session.dispatch(Resolver.agent("verify", held))
        session.dispatch(Resolver.fetch("slow", slow))
        await settle()
        assert held.held == 1
        held.complete("verified")
        await clock.advance(0.5)
        assert outcome(state, "verify") == ("done", "verified", None)
        assert outcome(state, "slow") == ("running", None, None)
        await clock.advance(0.5)
        assert outcome(state, "slow") == ("done", 3, None)


@pytest.mark.asyncio
async def test_asyncio_scripted_llm_and_assert_helpers() -> None:
    llm = ScriptedLLM(["Hi Ada"])
    async with session_on(ManualClock()) as session:
        session.state.set("name", "Ada")
        session.dispatch(Resolver.llm("greet", llm, "Greet {name}"))
        await settle()
        assert_resolved(session.state, "greet", "Hi Ada")
        assert_provenance(session.state, "greet:result", source="llm", model="scripted")
        assert llm.last_request.prompt == "Greet Ada"


# -- property -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=40, deadline=None)
@given(st.lists(json_values, max_size=8))
def test_a_scripted_fetch_returns_its_script_in_order(values: list[Any]) -> None:
    async def body() -> None:
        fake = fake_fetch(script=values)
        resolver = Resolver.fetch("x", fake)
        async with session_on(ManualClock()) as session:
            got = [await session.call(resolver) for _ in values]
            assert tagged(got) == tagged(values)
            if values:
                assert tagged(session.state.get("x:result")) == tagged(values[-1])
            assert [c.number for c in fake.calls] == list(range(1, len(values) + 1))
            cursors = [c.cursor for c in fake.calls]
            assert cursors == sorted(set(cursors))
            with pytest.raises(ResolverError):
                await session.call(resolver)
            assert session.state.get("x:error").startswith(
                f"fake_fetch was called {len(values) + 1} times but its script has {len(values)} "
            )

    for backend in ("asyncio", "trio"):
        anyio.run(body, backend=backend)
