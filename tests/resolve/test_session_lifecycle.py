"""A Session usable from framework callbacks (started in one task, closed in another), waits that
never hang under a manual clock, freshness that moves a flow the moment a result goes stale,
background results delivered exactly once across a restart, and what the testing kit does for
work that needs no time."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import anyio
import pytest

from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    captured,
    fresh,
    is_true,
    not_,
)
from slateflow.errors import ResolverDefinitionError, SessionError, WaitTimeoutError
from slateflow.resolve import fresh_for
from slateflow.stores import MemoryStore
from slateflow.testing import ConversationScript, fake_fetch

pytestmark = pytest.mark.anyio


# -- start / aclose -------------------------------------------------------------------------------


async def test_a_session_started_in_one_task_is_closed_from_another() -> None:
    state = State()
    clock = ManualClock()
    session = Session(state, clock=clock)
    conversation = Conversation(session)
    lookup = Resolver.fetch("lookup", fake_fetch())  # held until answered

    async with anyio.create_task_group() as tg:
        started = anyio.Event()
        stop = anyio.Event()

        async def on_start() -> None:  # a framework's StartFrame handler
            await session.start()
            session.dispatch(lookup)
            started.set()

        async def on_end() -> None:  # ... and its EndFrame handler, another task
            await stop.wait()
            await session.aclose()

        tg.start_soon(on_start)
        tg.start_soon(on_end)
        await started.wait()
        await clock.advance(0)
        assert state.get("lookup:status") == "running"
        ctx = await conversation.user_turn("hello")  # usable from any task of the loop
        assert ctx.turn.number == 1
        stop.set()
    assert state.get("lookup:status") == "cancelled"  # exactly one terminal status
    assert session.active_count == 0
    with pytest.raises(SessionError, match="not open"):
        session.dispatch(lookup)


async def test_start_and_aclose_keep_the_exit_rules() -> None:
    state = State()
    clock = ManualClock()
    session = await Session(state, clock=clock, on_exit="wait").start()
    session.dispatch(Resolver.fetch("slow", _sleeper(clock, 5)))
    await session.aclose()  # waits for it: the manual clock jumps while it is the only wait
    assert state.get("slow:result") == "slept"
    await session.aclose()  # twice is fine


async def test_a_session_starts_once_and_aclose_needs_start() -> None:
    session = await Session(State()).start()
    with pytest.raises(SessionError, match="started once"):
        await session.start()
    await session.aclose()
    async with Session(State()) as other:
        with pytest.raises(SessionError, match="async with"):
            await other.aclose()


async def test_a_watcher_that_fails_is_reported_and_aclose_still_closes_cleanly() -> None:
    failures: list[BaseException] = []
    session = await Session(State()).start()
    session.state.receiver_failed.connect(
        lambda sender, error, **kw: failures.append(error), weak=False
    )
    session.watch("x", lambda old, new: True, _boom, blocking=True)
    session.state.set("x", 1)
    await session.wait_idle()  # the watcher's action ran (and failed)
    await session.aclose()
    assert [str(e) for e in failures] == ["watcher bug"]


async def _boom(change: Any) -> None:
    raise ValueError("watcher bug")


def _sleeper(clock: ManualClock, seconds: float) -> Any:
    async def sleep(state: State) -> str:
        await clock.sleep(seconds)
        return "slept"

    return sleep


# -- waits that never hang ------------------------------------------------------------------------


def two_steps() -> Flow:
    return Flow("f", [Step("a", done=is_true("x")), Step("b", after=["a"], done=is_true("y"))])


async def test_a_wait_with_a_timeout_times_out_on_the_manual_clock_nobody_advances() -> None:
    clock = ManualClock()
    async with Session(State(clock=clock), clock=clock) as session:
        runner = two_steps().start(session)
        with pytest.raises(WaitTimeoutError, match="waited 1s for step 'b' to be reached"):
            await runner.wait_for_step("b", timeout=1)
        assert clock.monotonic() == 1


async def test_a_wait_nothing_can_end_fails_naming_what_it_waited_for() -> None:
    clock = ManualClock()
    async with Session(State(clock=clock), clock=clock) as session:
        runner = two_steps().start(session)
        with pytest.raises(WaitTimeoutError, match="waiting for the flow to complete, but"):
            await runner.wait_complete()


async def test_a_wait_jumps_over_a_lookup_that_takes_time() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        runner = (
            Flow(
                "f",
                [Step("a", done=captured("lookup:result")), Step("b", after=["a"], terminal=True)],
            )
        ).start(session)
        session.dispatch(Resolver.fetch("lookup", _sleeper(clock, 30)))
        assert await runner.wait_for_step("b", timeout=60) is not None
        assert clock.monotonic() == 30


async def test_wait_idle_fails_instead_of_hanging_on_a_fake_nobody_answers() -> None:
    async with Session(State(), clock=ManualClock()) as session:
        session.dispatch(Resolver.fetch("lookup", fake_fetch()))
        with pytest.raises(WaitTimeoutError, match="lookup can never end"):
            await session.wait_idle()
        session.cancel("lookup")


async def test_without_autojump_a_wait_waits_for_the_test_to_move_time() -> None:
    clock = ManualClock(autojump=False)
    async with Session(State(clock=clock), clock=clock) as session:
        runner = two_steps().start(session)
        result: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                try:
                    await runner.wait_for_step("b", timeout=5)
                except WaitTimeoutError as exc:
                    result.append(exc)

            tg.start_soon(wait)
            await clock.advance(4.9)
            assert result == []
            await clock.advance(0.2)
        assert len(result) == 1


# -- freshness on the session clock ---------------------------------------------------------------


async def test_a_step_waiting_on_freshness_moves_the_moment_the_value_goes_stale() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    plan = Flow(
        "quote",
        [
            Step("quoted", done=captured("price:result")),
            Step("still_valid", after=["quoted"], gate=fresh("price"), done=is_true("accepted")),
            Step("expired", after=["quoted"], gate=not_(fresh("price")), terminal=True),
        ],
    )
    async with Session(state, clock=clock) as session:
        runner = plan.start(session)
        await session.call(Resolver.fetch("price", _answer(120), ttl=30))
        assert runner.active_steps == ["still_valid"]
        await clock.advance(29.9)
        assert runner.active_steps == ["still_valid"]
        await clock.advance(0.1)  # no turn, no write: the timer moves it
        assert runner.active_steps == []
        assert runner.done_steps == ["quoted", "expired"]


async def test_a_new_result_restarts_the_freshness_clock() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    plan = Flow("q", [Step("valid", gate=fresh("price"), done=is_true("never"))])
    async with Session(state, clock=clock) as session:
        runner = plan.start(session)
        price = Resolver.fetch("price", _answer(1), ttl=10)
        await session.call(price)
        await clock.advance(8)
        await session.call(price)  # refreshed: good for 10 s from now
        await clock.advance(8)
        assert runner.active_steps == ["valid"]
        await clock.advance(2)
        assert runner.active_steps == []
        assert fresh_for(state, "price") == 0.0


def _answer(value: Any) -> Any:
    async def source(state: State) -> Any:
        return value

    return source


def test_fresh_for_says_how_long_a_result_stays_fresh() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    assert fresh_for(state, "price") is None
    anyio.run(Resolver.fetch("price", _answer(1), ttl=10).resolve, state)
    assert fresh_for(state, "price") == 10
    anyio.run(Resolver.fetch("forever", _answer(1)).resolve, state)
    assert fresh_for(state, "forever") is None


# -- background results across a restart ----------------------------------------------------------


async def test_a_result_committed_but_never_handed_over_is_delivered_once_after_a_restart() -> None:
    store = MemoryStore()
    clock = ManualClock()
    async with Session(State(store=store), clock=clock) as first:
        conversation = Conversation(first)
        first.background(
            Resolver.fetch("tables", _answer({"free": 2})),
            conversation.deliver,
            scheduling="when_idle",
        )
        await clock.advance(0)
        assert len(conversation.inbox) == 1  # committed; the process dies before any context
        crashed = store.copy()

    async with Session(State(store=crashed), clock=ManualClock()) as second:
        conversation = Conversation(second)
        ctx = await conversation.user_turn("hello?")
        assert [(d.name, d.value, d.scheduling.value) for d in ctx.deliveries] == [
            ("tables", {"free": 2}, "when_idle")
        ]
        assert ctx.deliveries[0].response["result"] == {"free": 2}
        ctx.handed_over()
        again = crashed.copy()

    async with Session(State(store=again), clock=ManualClock()) as third:
        conversation = Conversation(third)
        assert (await conversation.user_turn("and?")).deliveries == ()  # exactly once


async def test_a_result_handed_over_before_the_crash_is_not_delivered_again() -> None:
    store = MemoryStore()
    clock = ManualClock()
    async with Session(State(store=store), clock=clock) as first:
        conversation = Conversation(first)
        first.background(Resolver.fetch("tables", _answer(1)), conversation.deliver)
        await clock.advance(0)
        conversation.context_now().handed_over()
        crashed = store.copy()
    async with Session(State(store=crashed), clock=ManualClock()) as second:
        conversation = Conversation(second)
        assert conversation.context_now().deliveries == ()


async def test_a_result_redelivered_before_a_crash_is_delivered_after_it() -> None:
    store = MemoryStore()
    clock = ManualClock()
    async with Session(State(store=store), clock=clock) as first:
        conversation = Conversation(first)
        first.background(Resolver.fetch("tables", _answer(1)), conversation.deliver)
        await clock.advance(0)
        ctx = conversation.context_now()
        ctx.handed_over()
        conversation.redeliver(*ctx.deliveries)  # the bot was cut off: not heard after all
        crashed = store.copy()
    async with Session(State(store=crashed), clock=ManualClock()) as second:
        conversation = Conversation(second)
        assert [d.name for d in conversation.context_now().deliveries] == ["tables"]


# -- the testing kit ------------------------------------------------------------------------------


async def test_background_work_that_needs_no_time_lands_within_the_turn() -> None:
    async with Session(State(), clock=ManualClock()) as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("tables", _answer({"free": 2})), conversation.deliver)
        ctx = await conversation.user_turn("any tables?")  # no settle() or advance(0) needed
        assert [d.name for d in ctx.deliveries] == ["tables"]


async def test_say_reads_dunder_as_colon_in_a_mapping_and_in_keywords() -> None:
    async with Session(State(), clock=ManualClock()) as session:
        script = ConversationScript(Conversation(session))
        await script.say({"booking__date": "Tuesday", "booking:size": 4}, booking__time="19:00")
        assert session.state.pick("booking:date", "booking:size", "booking:time") == {
            "booking:date": "Tuesday",
            "booking:size": 4,
            "booking:time": "19:00",
        }
        assert "booking__date" not in session.state


def test_a_sync_function_given_to_fetch_is_refused_when_the_resolver_is_built() -> None:
    def lookup(state: State) -> dict[str, int]:
        return {"free": 2}

    with pytest.raises(ResolverDefinitionError, match=r"'tables'.*async def lookup\(state\)"):
        Resolver.fetch("tables", lookup)  # type: ignore[arg-type]
    with pytest.raises(ResolverDefinitionError, match=r"Resolver\.function"):
        Resolver.fetch("tables", print)  # type: ignore[arg-type]
    Resolver.function("tables", lookup)  # the way for sync code
    Resolver.fetch("tables", _answer(1))
    Resolver.fetch("tables", lambda state: _answer(1)(state))  # returns an awaitable: fine


async def test_a_resumed_call_keeps_counting_its_turns() -> None:
    store = MemoryStore()
    async with Session(State(store=store), clock=ManualClock()) as first:
        conversation = Conversation(first)
        await conversation.user_turn("hello")
        await conversation.user_turn("four people")
        crashed = store.copy()
    state = State(store=crashed)
    async with Session(state, clock=ManualClock()) as second:
        conversation = Conversation(second)
        ctx = await conversation.user_turn("are you still there?")
        assert ctx.turn.number == 3
        assert state.get("session:turn") == 3


# -- on_close: what closes with the session ----------------------------------------------------


@pytest.mark.anyio
async def test_on_close_callbacks_run_as_the_session_closes_before_its_runs_are_cancelled() -> None:
    clock = ManualClock()
    seen: list[Any] = []
    failures: list[Any] = []
    state = State()
    state.receiver_failed.connect(lambda sender, **kw: failures.append(kw["error"]), weak=False)
    lookup = fake_fetch(returns=1, delay=10, clock=clock)

    def boom() -> None:
        raise RuntimeError("closer failed")

    async with Session(state, clock=clock) as session:
        session.dispatch(Resolver.fetch("lookup", lookup))
        session.on_close(lambda: seen.append(state.get("lookup:status")))
        session.on_close(boom)
        session.on_close(lambda: seen.append("after the failing one"))
        forget = session.on_close(lambda: seen.append("taken back"))
        forget()
        forget()  # twice is harmless
        assert seen == []
    assert seen == ["running", "after the failing one"]
    assert [str(e) for e in failures] == ["closer failed"]
    assert state.get("lookup:status") == "cancelled"


@pytest.mark.anyio
async def test_a_runner_closed_early_is_not_held_by_its_session() -> None:
    async with Session(State(), clock=ManualClock()) as session:
        runner = Flow("f", [Step("a", done=is_true("x"))]).start(session)
        ref = weakref.ref(runner)
        runner.close()
        del runner
        gc.collect()
        assert ref() is None
