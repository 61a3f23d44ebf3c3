"""A bad resolver never ends a session: a source that raises a cancellation it was never sent (an
HTTP library leaking its own timeout's CancelledError) or another BaseException is that run's
error, and every other run goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from slateflow import ManualClock, Resolver, Session, State
from slateflow.errors import ResolverError
from slateflow.testing import fake_fetch

pytestmark = pytest.mark.anyio


class Weird(BaseException):
    """What some libraries raise: not an Exception."""


async def raises_base(state: State) -> Any:
    raise Weird("the library's own signal")


async def leaks_cancellation(state: State) -> Any:
    # What an asyncio HTTP client does when its own timeout cancels an inner task and the
    # CancelledError escapes: this task was never cancelled.
    raise asyncio.CancelledError()


async def test_a_base_exception_from_a_source_is_that_runs_error() -> None:
    state = State()
    other = fake_fetch()
    async with Session(state, clock=ManualClock()) as session:
        slow = session.dispatch(Resolver.fetch("other", other))
        bad = session.dispatch(Resolver.fetch("bad", raises_base))
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert bad.status == "error"
        assert state.get("bad:status") == "error"
        assert "Weird" in state.get("bad:error")
        assert "not cancelled" in state.get("bad:error")
        assert slow.status == "running"  # unrelated runs go on
        other.complete({"ok": True})
        await session.wait_idle()
    assert state.get("other:result") == {"ok": True}


async def test_a_base_exception_in_call_mode_raises_a_resolver_error() -> None:
    state = State()
    async with Session(state, clock=ManualClock()) as session:
        with pytest.raises(ResolverError, match="bad"):
            await session.call(Resolver.fetch("bad", raises_base))
        assert state.get("bad:status") == "error"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_leaked_cancelled_error_is_that_runs_error_and_the_session_lives_on() -> None:
    # asyncio only: trio's Cancelled cannot be raised by a library on its own.
    state = State()
    other = fake_fetch()
    async with Session(state, clock=ManualClock()) as session:
        session.dispatch(Resolver.fetch("other", other))
        leaky = session.dispatch(Resolver.fetch("leaky", leaks_cancellation))
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert leaky.status == "error"
        assert state.get("leaky:status") == "error"
        assert "CancelledError" in state.get("leaky:error")
        other.complete(1)
        await session.wait_idle()  # no exception reaches the host
        with pytest.raises(ResolverError):
            await session.call(Resolver.fetch("leaky2", leaks_cancellation))
    assert state.get("other:status") == "done"


async def test_a_real_cancellation_still_cancels_the_run() -> None:
    state = State()
    async with Session(state, clock=ManualClock()) as session:
        run = session.dispatch(Resolver.fetch("held", fake_fetch()))
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert session.cancel("held") == 1
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert run.status == "cancelled"
        assert state.get("held:status") == "cancelled"

        with anyio.move_on_after(0):  # the caller of a call-mode run is cancelled
            await session.call(Resolver.fetch("sleepy", fake_fetch()))
        assert state.get("sleepy:status") == "cancelled"


async def test_a_watcher_that_writes_the_key_it_watches_is_stopped_and_reported() -> None:
    state = State()
    failures: list[BaseException] = []
    state.receiver_failed.connect(
        lambda sender, receiver, error, changes: failures.append(error), weak=False
    )

    async def bump(change: Any) -> None:
        state.set("n", change.new + 1)

    async with Session(state, clock=ManualClock()) as session:
        session.watch("n", lambda old, new: True, bump, blocking=True)
        session.watch("m", lambda old, new: True, _bump_m(state))
        state.set("n", 0)
        state.set("m", 0)
        await session.wait_idle()
    assert [type(e).__name__ for e in failures] == ["DeliveryChainError"] * 2
    assert state.get("n") == state.get("m") == 1000


def _bump_m(state: State) -> Any:
    async def bump(change: Any) -> None:
        state.set("m", change.new + 1)

    return bump


async def test_a_resolver_run_starts_a_chain_of_its_own() -> None:
    # A flow of many steps, each started by the last one's resolver: long, but no loop.
    from slateflow import Flow, Step, resolved, run

    steps = []
    for i in range(MAX_STEPS):
        lookup = Resolver.fetch(f"r{i}", _value(i))
        steps.append(
            Step(
                f"s{i}",
                after=[f"s{i - 1}"] if i else [],
                done=resolved(f"r{i}"),
                on_enter=run(lookup, "dispatch"),
            )
        )
    state = State()
    async with Session(state, clock=ManualClock()) as session:
        runner = Flow("long", steps).start(session)
        await runner.wait_complete(timeout=10)
    assert state.get(f"r{MAX_STEPS - 1}:result") == MAX_STEPS - 1


MAX_STEPS = 1200  # deeper than a delivery chain may go


def _value(i: int) -> Any:
    async def source(state: State) -> int:
        return i

    return source
