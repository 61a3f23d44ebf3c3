"""Clocks: ManualClock moves only when advanced, fires timers in order and lets tasks settle."""

from __future__ import annotations

import math
import time

import anyio
import pytest

from slateflow import ManualClock, State
from slateflow.resolve import Clock, SystemClock


def test_manual_clock_starts_where_told_and_is_a_state_clock() -> None:
    clock = ManualClock(start=1_000.0)
    assert clock.time() == clock() == 1_000.0
    assert clock.monotonic() == 0.0
    assert isinstance(clock, Clock)
    assert isinstance(SystemClock(), Clock)
    state = State(clock=clock)
    state.set("k", 1)
    assert state.provenance("k").at.timestamp() == 1_000.0  # type: ignore[union-attr]


@pytest.mark.parametrize("start", [math.nan, math.inf])
def test_manual_clock_refuses_a_non_finite_start(start: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        ManualClock(start=start)


@pytest.mark.anyio
@pytest.mark.parametrize("seconds", [-1.0, math.inf, math.nan])
async def test_advance_refuses_bad_amounts(seconds: float) -> None:
    with pytest.raises(ValueError, match="advance"):
        await ManualClock().advance(seconds)


@pytest.mark.anyio
async def test_sleepers_wake_in_due_order_at_their_due_time() -> None:
    clock = ManualClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    async with anyio.create_task_group() as tg:
        for name, seconds in [("c", 3.0), ("a", 1.0), ("b", 2.0)]:
            tg.start_soon(sleeper, name, seconds)
        await clock.advance(0)
        assert clock.pending == 3
        assert clock.next_due() == 1.0
        await clock.advance(1.5)
        assert woke == [("a", 1.0)]
        assert clock.monotonic() == 1.5
        await clock.advance(10)
    assert woke == [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert clock.pending == 0
    assert clock.next_due() is None


@pytest.mark.anyio
async def test_timers_registered_while_advancing_fire_in_the_same_advance() -> None:
    clock = ManualClock()
    ticks: list[float] = []

    async def ticker() -> None:
        for _ in range(5):
            await clock.sleep(1.0)
            ticks.append(clock.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await clock.advance(3.0)
        assert ticks == [1.0, 2.0, 3.0]
        await clock.advance(2.0)
    assert ticks == [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.anyio
async def test_deadline_cancels_only_once_its_time_has_passed() -> None:
    clock = ManualClock()
    outcome: list[object] = []

    async def guarded() -> None:
        with clock.deadline(2.0) as scope:
            await anyio.sleep_forever()
        outcome.append((scope.cancelled_caught, clock.monotonic()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(guarded)
        await clock.advance(1.9)
        assert outcome == []
        await clock.advance(0.1)
        assert outcome == [(True, 2.0)]
    assert clock.pending == 0


@pytest.mark.anyio
async def test_zero_deadline_and_zero_sleep_register_no_timer() -> None:
    clock = ManualClock()
    with clock.deadline(0) as scope:
        await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    await clock.sleep(0)
    assert clock.pending == 0


@pytest.mark.anyio
async def test_a_cancelled_sleeper_leaves_no_live_timer() -> None:
    clock = ManualClock()
    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.sleep, 5.0)
        await clock.advance(0)
        assert clock.pending == 1
        tg.cancel_scope.cancel()
    assert clock.pending == 0


@pytest.mark.anyio
async def test_advance_lets_a_chain_of_woken_tasks_run_before_it_returns() -> None:
    clock = ManualClock()
    first, second = anyio.Event(), anyio.Event()
    order: list[str] = []

    async def a() -> None:
        await clock.sleep(1.0)
        order.append("a")
        first.set()

    async def b() -> None:
        await first.wait()
        order.append("b")
        second.set()

    async def c() -> None:
        await second.wait()
        order.append("c")

    async with anyio.create_task_group() as tg:
        for fn in (a, b, c):
            tg.start_soon(fn)
        await clock.advance(1.0)
        assert order == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_manual_clock_under_pytest_asyncio() -> None:
    clock = ManualClock()
    done: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(0.5)
        done.append(clock.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper)
        await clock.advance(0.5)
    assert done == [0.5]


@pytest.mark.anyio
async def test_system_clock_reads_real_time_and_its_deadlines_cancel() -> None:
    clock = SystemClock()
    assert abs(clock() - time.time()) < 60
    assert clock.monotonic() <= clock.monotonic()
    with clock.deadline(0) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    await clock.sleep(0)


@pytest.mark.anyio
async def test_manual_clock_refuses_a_nan_sleep_or_deadline() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="nan"):
        await clock.sleep(float("nan"))
    with pytest.raises(ValueError, match="nan"):
        clock.deadline(float("nan"))
    await clock.advance(1)  # nothing was left behind to wedge it
    assert clock.pending == 0


# -- the State's own waits follow the session's clock --------------------------------------------


@pytest.mark.anyio
async def test_state_wait_for_under_a_manual_clock_fails_instead_of_hanging() -> None:
    from slateflow import Session
    from slateflow.errors import WaitTimeoutError

    async with Session(State(), clock=ManualClock()) as session:
        with anyio.fail_after(10), pytest.raises(WaitTimeoutError, match="'never:set'"):
            await session.state.wait_for("never:set")  # nothing could ever set it


@pytest.mark.anyio
async def test_state_wait_until_times_out_on_the_manual_clock_not_the_wall() -> None:
    from slateflow import Session
    from slateflow.errors import WaitTimeoutError

    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        began, wall = clock.monotonic(), time.monotonic()
        with pytest.raises(WaitTimeoutError, match="after 30"):
            await session.state.wait_until(lambda s: s.get("x") == 1, timeout=30)
        assert clock.monotonic() - began == pytest.approx(30)  # 30 s of the session's clock
        assert time.monotonic() - wall < 5  # not 30 s of wall time


@pytest.mark.anyio
async def test_state_wait_for_sees_a_value_set_by_a_timer_on_the_manual_clock() -> None:
    from slateflow import Session

    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        began = clock.monotonic()

        async def later() -> None:
            await clock.sleep(5)
            session.state.set("x", 1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            assert await session.state.wait_for("x", timeout=60) == 1
        assert clock.monotonic() - began == pytest.approx(5)  # woken when the timer fired


@pytest.mark.anyio
async def test_after_the_session_closes_the_states_waits_use_the_loops_clock_again() -> None:
    from slateflow import Session
    from slateflow.errors import WaitTimeoutError

    state = State()
    async with Session(state, clock=ManualClock()):
        pass
    with pytest.raises(WaitTimeoutError, match=r"after 0\.01"):
        await state.wait_for("x", timeout=0.01)


@pytest.mark.anyio
async def test_settle_runs_a_chain_of_tasks_to_its_end_among_many_idle_ones() -> None:
    from slateflow.resolve import settle

    idle = anyio.Event()
    reached: list[int] = []
    links = [anyio.Event() for _ in range(50)]

    async def link(i: int) -> None:
        await links[i].wait()
        reached.append(i)
        if i + 1 < len(links):
            links[i + 1].set()

    async with anyio.create_task_group() as tg:
        for _ in range(1000):
            tg.start_soon(idle.wait)  # tasks that stay blocked: settle must not wait for them
        for i in range(len(links)):
            tg.start_soon(link, i)
        await settle()
        assert reached == []  # nothing could run: every task waits
        links[0].set()
        await settle()
        assert reached == list(range(50))  # each woke the next, all before settle returned
        idle.set()


@pytest.mark.anyio
async def test_waiting_for_a_dispatched_run_follows_the_manual_clock() -> None:
    from slateflow import Resolver, Session

    clock = ManualClock()
    async with Session(State(), clock=clock) as session:
        began = clock.monotonic()

        async def slow(state: State) -> int:
            await clock.sleep(5)
            return 1

        run = session.dispatch(Resolver.fetch("slow", slow))
        with anyio.fail_after(10):  # a safety net: it hung before
            assert await run.wait() == 1
        assert clock.monotonic() - began == pytest.approx(5)


@pytest.mark.anyio
async def test_waiting_for_a_run_nothing_could_end_fails_instead_of_hanging() -> None:
    from slateflow import Resolver, Session
    from slateflow.errors import WaitTimeoutError

    never = anyio.Event()

    async def stuck(state: State) -> None:
        await never.wait()

    async with Session(State(), clock=ManualClock()) as session:
        run = session.dispatch(Resolver.fetch("stuck", stuck))
        with anyio.fail_after(10), pytest.raises(WaitTimeoutError, match="'stuck'"):
            await run.wait()
        never.set()
