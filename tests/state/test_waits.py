"""Async waits: ``state.wait_for`` and ``state.wait_until`` on asyncio and trio (anyio), woken from
tasks and threads, with timeouts and cancellation; plus a few runs under pytest-asyncio."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from slateflow import Change, Key, SlateError, State
from slateflow.errors import WaitTimeoutError

SAFETY = 10  # seconds: only a guard against a hung test, never what a test waits for


class Outcome:
    """The result of a waiting task, with an event set when it finishes (however it finishes)."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.cancelled = False

    async def run(self, wait: Callable[[], Awaitable[Any]]) -> None:
        try:
            self.value = await wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        except Exception as exc:
            self.error = exc
        finally:
            self.done.set()

    async def result(self) -> Any:
        with anyio.fail_after(SAFETY):
            await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


async def start_waiting(tg: anyio.abc.TaskGroup, wait: Callable[[], Awaitable[Any]]) -> Outcome:
    """Start ``wait()`` in ``tg`` and return once it is blocked waiting."""
    outcome = Outcome()
    tg.start_soon(outcome.run, wait)
    await anyio.wait_all_tasks_blocked()
    assert not outcome.done.is_set(), "the wait returned before anything was written"
    return outcome


@pytest.fixture
def state() -> State:
    return State()


# -- wait_for ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_wait_for_returns_an_existing_value_at_once(state: State) -> None:
    state.set("session:reply", {"text": "hi", "tags": ["a"]})
    value = await state.wait_for("session:reply")
    assert value == {"text": "hi", "tags": ["a"]}
    value["tags"].append("mutated")
    assert state.get("session:reply") == {"text": "hi", "tags": ["a"]}
    # Even a zero timeout is fine when the key is already set.
    assert await state.wait_for("session:reply", timeout=0) == {"text": "hi", "tags": ["a"]}
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_for_existing_falsy_values(state: State) -> None:
    state.update({"zero": 0, "none": None, "empty": ""})
    assert await state.wait_for("zero", timeout=0) == 0
    assert await state.wait_for("none", timeout=0) is None
    assert await state.wait_for("empty", timeout=0) == ""


@pytest.mark.anyio
async def test_wait_for_wakes_on_a_later_write(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "session:reply"))
        assert state.engine.delivery.subscriptions.count == 1
        state.set("session:other", 1)
        state.set("session:reply:draft", 1)
        await anyio.wait_all_tasks_blocked()
        assert not outcome.done.is_set()
        state.set("session:reply", "hello")
        assert await outcome.result() == "hello"
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_for_a_none_value_returns_none(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "k"))
        state.set("k", None)
        assert await outcome.result() is None
        assert outcome.error is None


@pytest.mark.anyio
async def test_wait_for_a_key_set_in_a_batch(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "b"))
        with state.transaction() as tx:
            tx.set("a", 1)
            tx.set("b", 2)
        assert await outcome.result() == 2


@pytest.mark.anyio
async def test_wait_for_a_removed_key_waits_for_it_to_come_back(state: State) -> None:
    state.set("k", 1)
    state.remove("k")
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "k"))
        state.set("k", 2)
        assert await outcome.result() == 2


@pytest.mark.anyio
async def test_wait_for_a_typed_key_returns_the_model(state: State) -> None:
    class Booking(BaseModel):
        date: str
        party: int

    booking = Key("booking", Booking)
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, booking))
        state.set("booking", {"date": "2024-05-01", "party": 4})
        assert await outcome.result() == Booking(date="2024-05-01", party=4)


@pytest.mark.anyio
async def test_wait_for_wakes_on_a_write_from_a_worker_thread(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "fetch:result", timeout=SAFETY))
        writer_thread: list[int] = []

        def write() -> None:
            writer_thread.append(threading.get_ident())
            state.set("fetch:result", [1, 2, 3], source="fetch")

        await anyio.to_thread.run_sync(write)
        assert writer_thread != [threading.get_ident()]
        assert await outcome.result() == [1, 2, 3]
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_for_wakes_on_a_write_from_a_plain_thread(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "k"))
        thread = threading.Thread(target=state.set, args=("k", "from thread"))
        thread.start()
        assert await outcome.result() == "from thread"
        thread.join()
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_several_waiters_on_one_key_all_wake(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcomes = [Outcome() for _ in range(5)]
        for outcome in outcomes:
            tg.start_soon(outcome.run, partial(state.wait_for, "k"))
        await anyio.wait_all_tasks_blocked()
        assert state.engine.delivery.subscriptions.count == 5
        await anyio.to_thread.run_sync(state.set, "k", 7)
        assert [await o.result() for o in outcomes] == [7] * 5
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_for_times_out_naming_the_key(state: State) -> None:
    with pytest.raises(WaitTimeoutError, match="'session:reply'") as info:
        await state.wait_for("session:reply", timeout=0.01)
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, SlateError)
    assert state.engine.delivery.subscriptions.count == 0
    state.set("session:reply", "late")
    assert await state.wait_for("session:reply", timeout=0.01) == "late"


@pytest.mark.anyio
async def test_wait_for_zero_timeout_on_a_missing_key(state: State) -> None:
    with pytest.raises(WaitTimeoutError):
        await state.wait_for("k", timeout=0)
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_for_with_a_timeout_returns_when_written_in_time(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "k", timeout=SAFETY))
        state.set("k", 1)
        assert await outcome.result() == 1


@pytest.mark.anyio
async def test_cancelled_wait_for_leaves_nothing_behind(state: State) -> None:
    got: list[Change] = []
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_for, "k"))
        assert state.engine.delivery.subscriptions.count == 1
        tg.cancel_scope.cancel()
    assert outcome.cancelled
    assert state.engine.delivery.subscriptions.count == 0
    state.subscribe(got.extend)
    await anyio.to_thread.run_sync(state.set, "k", 1)
    state.set("k", 2)
    assert [c.new for c in got] == [1, 2]
    assert await state.wait_for("k") == 2


@pytest.mark.anyio
async def test_outer_deadline_cancels_without_a_wait_timeout_error(state: State) -> None:
    with anyio.move_on_after(0.01) as scope:
        await state.wait_for("k")
    assert scope.cancelled_caught
    assert state.engine.delivery.subscriptions.count == 0
    with anyio.move_on_after(0.01) as scope:
        await state.wait_until(lambda s: s.get("k"))
    assert scope.cancelled_caught
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_thread_write_after_cancellation_is_harmless(state: State) -> None:
    async with anyio.create_task_group() as tg:
        await start_waiting(tg, partial(state.wait_for, "k"))
        await start_waiting(tg, partial(state.wait_until, lambda s: s.get("k") == 1))
        tg.cancel_scope.cancel()
    failures: list[Any] = []

    def on_failure(sender: Any, **kwargs: Any) -> None:
        failures.append(kwargs)

    state.receiver_failed.connect(on_failure)
    await anyio.to_thread.run_sync(state.set, "k", 1)
    assert failures == []
    assert state.get("k") == 1


# -- wait_until ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_wait_until_returns_the_predicates_result_at_once(state: State) -> None:
    state.set("booking", {"date": "2024-05-01"})
    result = await state.wait_until(lambda s: s.get("booking"), timeout=0)
    assert result == {"date": "2024-05-01"}
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_until_wakes_when_the_predicate_holds(state: State) -> None:
    def enough(s: State) -> Any:
        n = s.get("n", 0)
        return n >= 3 and f"n={n}"

    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_until, enough))
        for n in (1, 2):
            state.set("n", n)
            await anyio.wait_all_tasks_blocked()
            assert not outcome.done.is_set()
        state.set("n", 3)
        assert await outcome.result() == "n=3"
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_until_checks_only_batches_touching_its_keys(state: State) -> None:
    calls: list[Any] = []

    def ready(s: State) -> Any:
        calls.append(s.get("a"))
        return s.get("a") == "go"

    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_until, ready, keys=["a"]))
        checked = len(calls)
        state.set("b", "go")
        state.update({"c": 1, "d": 2})
        assert len(calls) == checked
        state.set("a", "not yet")
        assert len(calls) > checked
        state.set("a", "go")
        assert await outcome.result() is True


@pytest.mark.anyio
async def test_wait_until_with_a_pattern(state: State) -> None:
    calls: list[int] = []

    def all_done(s: State) -> bool:
        calls.append(1)
        return s.get("verify:status") == "done" and s.get("fetch:status") == "done"

    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_until, all_done, pattern="*:status"))
        checked = len(calls)
        state.set("verify:result", "done")
        assert len(calls) == checked
        state.set("verify:status", "done")
        await anyio.wait_all_tasks_blocked()
        assert not outcome.done.is_set()
        state.set("fetch:status", "done")
        assert await outcome.result() is True


@pytest.mark.anyio
async def test_wait_until_sees_a_condition_that_holds_only_briefly(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_until, lambda s: s.get("x") == 1))
        state.set("x", 1)
        state.set("x", 2)
        assert await outcome.result() is True
    assert state.get("x") == 2


@pytest.mark.anyio
async def test_wait_until_sees_a_brief_condition_set_from_a_thread(state: State) -> None:
    def flicker() -> None:
        state.set("x", 1)
        state.set("x", 2)

    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(
            tg, partial(state.wait_until, lambda s: s.get("x") == 1 and "seen", keys=["x"])
        )
        await anyio.to_thread.run_sync(flicker)
        assert await outcome.result() == "seen"
    assert state.get("x") == 2


@pytest.mark.anyio
async def test_wait_until_wakes_on_a_write_from_a_plain_thread(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(
            tg, partial(state.wait_until, lambda s: s.get("n", 0) > 10 and s.get("n"))
        )
        thread = threading.Thread(target=lambda: [state.set("n", i) for i in range(20)])
        thread.start()
        assert await outcome.result() == 11
        thread.join()
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_until_sees_writes_made_by_receivers(state: State) -> None:
    def double(changes: tuple[Change, ...]) -> None:
        state.set("doubled", changes[0].new * 2)

    state.subscribe(double, keys=["n"])
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(
            tg, partial(state.wait_until, lambda s: s.get("doubled"), keys=["doubled"])
        )
        state.set("n", 21)
        assert await outcome.result() == 42


@pytest.mark.anyio
async def test_wait_until_raises_the_predicates_error_at_once(state: State) -> None:
    def broken(s: State) -> bool:
        raise LookupError("no such thing")

    with pytest.raises(LookupError, match="no such thing"):
        await state.wait_until(broken)
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_wait_until_raises_the_predicates_later_error(state: State) -> None:
    def check(s: State) -> bool:
        if s.get("mode") == "bad":
            raise ValueError("bad mode")
        return s.get("mode") == "ready"

    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(tg, partial(state.wait_until, check))
        state.set("mode", "bad")
        with pytest.raises(ValueError, match="bad mode"):
            await outcome.result()
    assert state.engine.delivery.subscriptions.count == 0
    assert state.get("mode") == "bad"  # the write itself stands


@pytest.mark.anyio
async def test_wait_until_raises_a_predicates_timeout_error_unchanged(state: State) -> None:
    error = TimeoutError("the upstream lookup timed out")

    def slow_lookup(s: State) -> bool:
        raise error

    with pytest.raises(TimeoutError) as info:
        await state.wait_until(slow_lookup, timeout=SAFETY)
    assert info.value is error


@pytest.mark.anyio
async def test_wait_until_times_out_naming_the_predicate(state: State) -> None:
    def booking_confirmed(s: State) -> bool:
        return s.get("booking:status") == "confirmed"

    with pytest.raises(WaitTimeoutError, match="booking_confirmed"):
        await state.wait_until(booking_confirmed, timeout=0.01)
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.anyio
async def test_cancelled_wait_until_leaves_nothing_behind(state: State) -> None:
    async with anyio.create_task_group() as tg:
        outcome = await start_waiting(
            tg, partial(state.wait_until, lambda s: s.get("k"), pattern="k*")
        )
        assert state.engine.delivery.subscriptions.count == 1
        tg.cancel_scope.cancel()
    assert outcome.cancelled
    assert state.engine.delivery.subscriptions.count == 0
    state.set("k", 1)
    assert await state.wait_until(lambda s: s.get("k"), timeout=0) == 1


# -- under pytest-asyncio ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_asyncio_wait_for_wakes_from_another_task() -> None:
    state = State()
    task = asyncio.create_task(state.wait_for("k", timeout=SAFETY))
    await anyio.wait_all_tasks_blocked()
    assert not task.done()
    state.set("k", "v")
    assert await asyncio.wait_for(task, SAFETY) == "v"
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.asyncio
async def test_asyncio_wait_for_wakes_from_a_thread() -> None:
    state = State()
    task = asyncio.create_task(state.wait_for("k"))
    await anyio.wait_all_tasks_blocked()
    assert not task.done()
    await asyncio.to_thread(state.set, "k", [1])
    assert await asyncio.wait_for(task, SAFETY) == [1]
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.asyncio
async def test_asyncio_wait_until_wakes_from_a_thread() -> None:
    state = State()
    task = asyncio.create_task(state.wait_until(lambda s: s.get("n", 0) >= 5 and s.get("n")))
    await anyio.wait_all_tasks_blocked()
    await asyncio.to_thread(lambda: [state.set("n", i) for i in range(10)])
    assert await asyncio.wait_for(task, SAFETY) == 5


@pytest.mark.asyncio
async def test_asyncio_timeout_raises_wait_timeout_error() -> None:
    state = State()
    with pytest.raises(WaitTimeoutError, match="'k'"):
        await state.wait_for("k", timeout=0.01)
    with pytest.raises(TimeoutError):
        await state.wait_until(lambda s: s.get("k"), timeout=0.01)
    assert state.engine.delivery.subscriptions.count == 0


@pytest.mark.asyncio
async def test_asyncio_task_cancel_leaves_nothing_behind() -> None:
    state = State()
    waiters = [
        asyncio.create_task(state.wait_for("k")),
        asyncio.create_task(state.wait_until(lambda s: s.get("k"))),
    ]
    await anyio.wait_all_tasks_blocked()
    assert state.engine.delivery.subscriptions.count == 2
    for task in waiters:
        task.cancel()
    for task in waiters:
        with pytest.raises(asyncio.CancelledError):
            await task
    assert state.engine.delivery.subscriptions.count == 0
    await asyncio.to_thread(state.set, "k", 1)
    assert await state.wait_for("k") == 1
