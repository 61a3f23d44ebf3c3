"""The Session: dispatch and background modes, conflicts, cancellation, exit, watchers, reactions.

Everything timed runs on a :class:`ManualClock` (``Session(state, clock=clock)``); tests wait with
anyio Events, ``run.wait()``, ``session.wait_idle()`` and ``clock.advance(...)``, never on the wall
clock. ``clock.advance(0)`` lets every ready task run until it blocks again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from helpers import fingerprint
from slateflow import Change, ManualClock, Resolver, Retry, Scheduling, Session, State
from slateflow.errors import (
    DispatchRejectedError,
    ResolverCancelledError,
    ResolverDefinitionError,
    ResolverError,
    ResolverTimeoutError,
    SessionError,
)
from slateflow.resolve import BackgroundResult, Run, Watcher, is_fresh
from slateflow.state import when

START = 1_767_225_600.0  # ManualClock's default start: 2026-01-01T00:00:00Z


def epoch(started_at: Any) -> float:
    """``started_at`` from provenance as Unix seconds (it may be a number or an ISO string)."""
    if isinstance(started_at, str):
        return datetime.fromisoformat(started_at).timestamp()
    assert isinstance(started_at, int | float)
    assert not isinstance(started_at, bool)
    return float(started_at)


# -- helpers --------------------------------------------------------------------------------------


class Probe:
    """An async source that counts its calls and, when ``gated``, waits for each call's release.

    Call ``n`` (1-based) returns ``value(n, state)``; ``started``/``ended`` record call numbers,
    ``finally_ran`` the calls whose ``finally`` block ran, ``max_active`` the most calls in
    flight at once.
    """

    def __init__(
        self,
        value: Callable[[int, State], Any] = lambda n, state: n,
        *,
        gated: bool = False,
        fail: Callable[[int], BaseException | None] = lambda n: None,
    ) -> None:
        self.value = value
        self.gated = gated
        self.fail = fail
        self.calls = 0
        self.active = 0
        self.max_active = 0
        self.started: list[int] = []
        self.ended: list[int] = []
        self.finally_ran: list[int] = []
        self._gates: dict[int, anyio.Event] = {}

    def gate(self, n: int) -> anyio.Event:
        if n not in self._gates:
            self._gates[n] = anyio.Event()
        return self._gates[n]

    def release(self, n: int) -> None:
        self.gate(n).set()

    async def __call__(self, state: State) -> Any:
        self.calls += 1
        n = self.calls
        self.started.append(n)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.gated:
                await self.gate(n).wait()
            exc = self.fail(n)
            if exc is not None:
                raise exc
            value = self.value(n, state)
            self.ended.append(n)
            return value
        finally:
            self.active -= 1
            self.finally_ran.append(n)


def results_in_journal(state: State, key: str) -> list[Any]:
    """The values written to ``key``, oldest first (removals left out)."""
    return [m.new for m in state.journal.since(0) if m.key == key and not m.removed]


def statuses_in_journal(state: State, name: str) -> list[Any]:
    return results_in_journal(state, f"{name}:status")


class Failures:
    """A ``state.receiver_failed`` receiver that keeps what it is sent."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.event = anyio.Event()

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append({"sender": sender, **kwargs})
        self.event.set()

    @property
    def errors(self) -> list[BaseException]:
        return [c["error"] for c in self.calls]


# Tests never wait on the wall clock; this only turns a hang (a broken wake-up) into a failure.
HANG_GUARD = 30.0


def make() -> tuple[State, ManualClock]:
    clock = ManualClock()
    return State(clock=clock), clock


# -- dispatch and the handle ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_dispatch_returns_a_running_handle_and_wait_returns_the_value() -> None:
    state, clock = make()
    state.set("lookup:error", "left over from an earlier run")
    probe = Probe(lambda n, s: {"open": True, "n": n}, gated=True)
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("lookup", probe))
        # Written before dispatch returns, before the source has even been called.
        assert isinstance(run, Run)
        assert isinstance(run, Run)
        assert run.name == "lookup"
        assert run.status == "running"
        assert not run.done
        assert state.get("lookup:status") == "running"
        assert probe.calls == 0
        await clock.advance(0)
        assert probe.calls == 1
        assert run.status == "running"
        assert state.get("lookup:result") is None
        probe.release(1)
        assert await run.wait() == {"open": True, "n": 1}
        assert run.status == "done"
        assert run.done
        assert run.value == {"open": True, "n": 1}
        assert run.error is None
        assert run.attempts == 1
        assert state.get("lookup:result") == {"open": True, "n": 1}
        assert state.get("lookup:status") == "done"
        assert "lookup:error" not in state
        # A finished run answers again at once, with the same value.
        assert await run.wait() == {"open": True, "n": 1}
        assert await run.wait(raise_error=False) == {"open": True, "n": 1}
    assert statuses_in_journal(state, "lookup") == ["running", "done"]


@pytest.mark.anyio
async def test_wait_raises_resolver_error_when_the_source_fails() -> None:
    state, clock = make()
    state.set("lookup:result", "stale")
    probe = Probe(fail=lambda n: ValueError("no such booking"))
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("lookup", probe))
        with pytest.raises(ResolverError) as info:
            await run.wait()
        err = info.value
        assert err.name == "lookup"
        assert err.error == "no such booking"
        assert err.attempts == 1
        assert "no such booking" in str(err)
        assert run.status == "error"
        assert run.error == "no such booking"
        assert isinstance(run.exception, ValueError)
        assert run.value is None
        assert await run.wait(raise_error=False) is None
        assert state.get("lookup:status") == "error"
        assert state.get("lookup:error") == "no such booking"
        assert "lookup:result" not in state
        prov = state.provenance("lookup:error")
        assert prov is not None
        assert prov.meta["exception"] == "ValueError"
        assert prov.meta["attempts"] == 1


@pytest.mark.anyio
async def test_wait_chains_the_source_exception_as_cause() -> None:
    state, clock = make()
    boom = ValueError("no such booking")
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("lookup", Probe(fail=lambda n: boom)))
        with pytest.raises(ResolverError) as info:
            await run.wait()
    assert info.value.__cause__ is boom


@pytest.mark.anyio
async def test_wait_raises_cancelled_error_for_a_cancelled_run() -> None:
    state, clock = make()
    state.set("lookup:result", "kept")
    probe = Probe(gated=True)
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("lookup", probe))
        await clock.advance(0)
        assert run.cancel() is True
        with pytest.raises(ResolverCancelledError):
            await run.wait()
        assert await run.wait(raise_error=False) is None
        assert run.status == "cancelled"
        assert run.cancel() is False  # already ended
        assert state.get("lookup:status") == "cancelled"
        # Cancellation leaves the earlier result alone.
        assert state.get("lookup:result") == "kept"
        assert probe.finally_ran == [1]
        assert probe.ended == []


# -- on_conflict ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_latest_supersedes_the_old_run() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: f"v{n}", gated=True)
    resolver = Resolver.fetch("lookup", probe)  # on_conflict="latest" is the default
    async with Session(state, clock=clock) as session:
        old = session.dispatch(resolver)
        await clock.advance(0)
        new = session.dispatch(resolver)
        await clock.advance(0)
        assert old.superseded is True
        assert old.status == "cancelled"
        assert new.superseded is False
        assert new.status == "running"
        assert probe.finally_ran == [1]  # the old source was really cancelled
        with pytest.raises(ResolverCancelledError):
            await old.wait()
        assert state.get("lookup:status") == "running"
        probe.release(2)
        assert await new.wait() == "v2"
    assert state.get("lookup:result") == "v2"
    assert state.get("lookup:status") == "done"
    assert results_in_journal(state, "lookup:result") == ["v2"]
    # The superseded run never wrote "cancelled" over the new run's keys.
    assert "cancelled" not in statuses_in_journal(state, "lookup")


@pytest.mark.anyio
@pytest.mark.parametrize("old_ends_first", [True, False])
async def test_latest_old_value_never_lands_even_if_its_source_finishes(
    old_ends_first: bool,
) -> None:
    """A source that shields itself from cancellation still returns a value; it is discarded."""
    state, clock = make()
    gates: dict[str, anyio.Event] = {"old": anyio.Event(), "new": anyio.Event()}
    calls: list[str] = []

    async def source(state: State) -> str:
        tag = "old" if not calls else "new"
        calls.append(tag)
        with anyio.CancelScope(shield=True):
            await gates[tag].wait()
        return tag

    resolver = Resolver.fetch("lookup", source)
    async with Session(state, clock=clock) as session:
        old = session.dispatch(resolver)
        await clock.advance(0)
        new = session.dispatch(resolver)
        await clock.advance(0)
        order = ["old", "new"] if old_ends_first else ["new", "old"]
        for tag in order:
            gates[tag].set()
            await clock.advance(0)
        assert await new.wait() == "new"
        assert await old.wait(raise_error=False) is None
        assert old.status == "cancelled"
        assert old.superseded
    assert state.get("lookup:result") == "new"
    assert state.get("lookup:status") == "done"
    assert results_in_journal(state, "lookup:result") == ["new"]
    assert statuses_in_journal(state, "lookup")[-1] == "done"


@pytest.mark.anyio
async def test_a_superseded_run_ignoring_cancellation_is_reported_after_the_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, clock = make()
    gate = anyio.Event()
    calls: list[int] = []

    async def source(state: State) -> str:
        calls.append(len(calls) + 1)
        if len(calls) == 1:
            with anyio.CancelScope(shield=True):
                await gate.wait()
            return "old"
        return "new"

    resolver = Resolver.fetch("lookup", source)
    with caplog.at_level(logging.WARNING, logger="slateflow"):
        async with Session(state, clock=clock, cancel_grace=2.0) as session:
            old = session.dispatch(resolver)
            await clock.advance(0)
            new = session.dispatch(resolver)
            assert await new.wait() == "new"
            await clock.advance(1.9)
            assert not old.ignored_cancel
            await clock.advance(0.1)
            assert old.ignored_cancel
            assert any("lookup" in r.getMessage() for r in caplog.records)
            gate.set()
            assert await old.wait(raise_error=False) is None
    assert old.status == "cancelled"
    assert state.get("lookup:result") == "new"
    assert state.get("lookup:status") == "done"


@pytest.mark.anyio
async def test_queue_runs_one_after_another_in_dispatch_order() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: f"r{n}", gated=True)
    resolver = Resolver.fetch("lookup", probe, on_conflict="queue")
    async with Session(state, clock=clock) as session:
        first = session.dispatch(resolver)
        second = session.dispatch(resolver)
        third = session.dispatch(resolver)
        assert first.status == "running"
        assert second.status == "queued"
        assert third.status == "queued"
        assert not second.done
        await clock.advance(0)
        assert probe.started == [1]
        assert session.active_count == 3
        probe.release(1)
        assert await first.wait() == "r1"
        await clock.advance(0)
        assert second.status == "running"
        assert third.status == "queued"
        assert probe.started == [1, 2]
        assert probe.max_active == 1
        # Releasing the third first changes nothing: it has not started.
        probe.release(3)
        await clock.advance(0)
        assert probe.started == [1, 2]
        probe.release(2)
        assert await second.wait() == "r2"
        assert await third.wait() == "r3"
    assert probe.max_active == 1
    assert probe.started == [1, 2, 3]
    assert results_in_journal(state, "lookup:result") == ["r1", "r2", "r3"]
    assert state.get("lookup:status") == "done"


@pytest.mark.anyio
async def test_reject_refuses_a_second_dispatch_and_leaves_the_state_untouched() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    resolver = Resolver.fetch("lookup", probe, on_conflict="reject")
    async with Session(state, clock=clock) as session:
        run = session.dispatch(resolver)
        await clock.advance(0)
        before = fingerprint(state)
        with pytest.raises(DispatchRejectedError):
            session.dispatch(resolver)
        assert fingerprint(state) == before
        await clock.advance(0)
        assert probe.calls == 1
        assert session.runs("lookup") == [run]
        probe.release(1)
        assert await run.wait() == 1
        # Once the run has ended, the name can be dispatched again.
        again = session.dispatch(resolver)
        probe.release(2)
        assert await again.wait() == 2


@pytest.mark.anyio
async def test_parallel_runs_concurrently_and_status_stays_running_until_the_last_ends() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: f"p{n}", gated=True)
    resolver = Resolver.fetch("lookup", probe, on_conflict="parallel")
    async with Session(state, clock=clock) as session:
        runs = [session.dispatch(resolver), session.dispatch(resolver)]
        await clock.advance(0)
        assert probe.active == 2
        assert [r.status for r in runs] == ["running", "running"]
        assert not any(r.superseded for r in runs)
        assert session.active_count == 2
        # (Which run got which call is up to the scheduler: trio shuffles task starts.)
        probe.release(2)
        await clock.advance(0)
        (first,) = [r for r in runs if r.done]
        (last,) = [r for r in runs if not r.done]
        assert first.value == "p2"
        assert last.status == "running"
        assert state.get("lookup:status") == "running"
        probe.release(1)
        assert await last.wait() == "p1"
    assert probe.max_active == 2
    assert state.get("lookup:status") == "done"
    assert state.get("lookup:result") == "p1"
    # "done" was written once, at the very end.
    assert [v for v in statuses_in_journal(state, "lookup") if v != "running"] == ["done"]
    assert results_in_journal(state, "lookup:result") == ["p2", "p1"]


@pytest.mark.anyio
async def test_parallel_final_status_is_that_of_the_last_run_to_end() -> None:
    state, clock = make()
    # Call 1 fails, call 2 succeeds; call 1 ends last.
    probe = Probe(
        lambda n, s: f"p{n}",
        gated=True,
        fail=lambda n: RuntimeError("upstream down") if n == 1 else None,
    )
    resolver = Resolver.fetch("lookup", probe, on_conflict="parallel")
    async with Session(state, clock=clock) as session:
        runs = [session.dispatch(resolver), session.dispatch(resolver)]
        await clock.advance(0)
        probe.release(2)
        await clock.advance(0)
        (ok,) = [r for r in runs if r.done]
        (failing,) = [r for r in runs if not r.done]
        assert ok.value == "p2"
        assert state.get("lookup:status") == "running"
        probe.release(1)
        with pytest.raises(ResolverError):
            await failing.wait()
    assert state.get("lookup:status") == "error"
    assert state.get("lookup:error") == "upstream down"
    assert "lookup:result" not in state


@pytest.mark.anyio
async def test_on_conflict_can_be_overridden_per_dispatch() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    latest = Resolver.fetch("lookup", probe)  # "latest" by default
    async with Session(state, clock=clock) as session:
        a = session.dispatch(latest)
        b = session.dispatch(latest, on_conflict="parallel")
        await clock.advance(0)
        assert not a.superseded
        assert a.status == "running"
        assert probe.active == 2
        before = fingerprint(state)
        with pytest.raises(DispatchRejectedError):
            session.dispatch(latest, on_conflict="reject")
        assert fingerprint(state) == before
        c = session.dispatch(latest, on_conflict="queue")
        assert c.status == "queued"
        # And the resolver's own policy applies again without an override: all superseded.
        d = session.dispatch(latest)
        await clock.advance(0)
        assert a.superseded
        assert b.superseded
        assert c.superseded
        assert a.status == b.status == c.status == "cancelled"
        assert d.status == "running"
        probe.release(probe.calls)
        assert await d.wait() == probe.calls
    assert probe.calls == 3  # the queued run never started


@pytest.mark.anyio
async def test_a_per_dispatch_override_to_reject_applies_even_if_the_resolver_queues() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    resolver = Resolver.fetch("lookup", probe, on_conflict="queue")
    async with Session(state, clock=clock) as session:
        run = session.dispatch(resolver)
        with pytest.raises(DispatchRejectedError):
            session.dispatch(resolver, on_conflict="reject")
        assert session.runs("lookup") == [run]
        probe.release(1)
        await run.wait()


@pytest.mark.anyio
async def test_queue_moves_on_when_the_running_run_is_cancelled() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: f"r{n}", gated=True)
    resolver = Resolver.fetch("lookup", probe, on_conflict="queue")
    async with Session(state, clock=clock) as session:
        first = session.dispatch(resolver)
        second = session.dispatch(resolver)
        await clock.advance(0)
        assert first.cancel() is True
        await clock.advance(0)
        assert first.status == "cancelled"
        assert second.status == "running"
        assert probe.started == [1, 2]
        probe.release(2)
        assert await second.wait() == "r2"
    assert state.get("lookup:status") == "done"
    assert state.get("lookup:result") == "r2"


@pytest.mark.anyio
async def test_dispatch_refuses_bad_arguments_and_leaves_the_state_untouched() -> None:
    state, clock = make()
    probe = Probe()
    async with Session(state, clock=clock) as session:
        before = fingerprint(state)
        with pytest.raises(ResolverDefinitionError):
            # type: ignore[arg-type]
            session.dispatch(Resolver.fetch("lookup", probe), on_conflict="newest")
        with pytest.raises(TypeError):
            session.dispatch(probe)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            # type: ignore[arg-type]
            session.background(Resolver.fetch("lookup", probe), "not callable")
        await clock.advance(0)
        assert fingerprint(state) == before
        assert session.active_count == 0
    assert probe.calls == 0
    with pytest.raises(ValueError, match="max_concurrency"):
        Session(state, max_concurrency=0)
    with pytest.raises(ValueError, match="on_exit"):
        Session(state, on_exit="later")  # type: ignore[arg-type]


# -- cancel, cancel_all, bookkeeping --------------------------------------------------------------


@pytest.mark.anyio
async def test_session_cancel_cancels_every_run_of_a_name_and_returns_the_count() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    other = Probe(gated=True)
    parallel = Resolver.fetch("lookup", probe, on_conflict="parallel")
    async with Session(state, clock=clock) as session:
        a = session.dispatch(parallel)
        b = session.dispatch(parallel)
        keep = session.dispatch(Resolver.fetch("other", other))
        await clock.advance(0)
        assert session.is_running("lookup")
        assert session.cancel("lookup") == 2
        await clock.advance(0)
        assert a.status == b.status == "cancelled"
        assert not session.is_running("lookup")
        assert state.get("lookup:status") == "cancelled"
        prov = state.provenance("lookup:status")
        assert prov is not None
        assert "reason" in prov.meta
        assert sorted(probe.finally_ran) == [1, 2]
        assert probe.ended == []
        # Other names are left alone.
        assert keep.status == "running"
        assert session.is_running("other")
        # Nothing left to cancel.
        assert session.cancel("lookup") == 0
        assert session.cancel("never-dispatched") == 0
        other.release(1)
        assert await keep.wait() == 1


@pytest.mark.anyio
async def test_cancel_all_cancels_runs_of_every_name() -> None:
    state, clock = make()
    probes = {name: Probe(gated=True) for name in ("a", "b", "c")}
    async with Session(state, clock=clock) as session:
        runs = [session.dispatch(Resolver.fetch(n, p)) for n, p in probes.items()]
        queued = session.dispatch(Resolver.fetch("a", probes["a"], on_conflict="queue"))
        await clock.advance(0)
        assert session.active_count == 4
        assert session.cancel_all() == 4
        await session.wait_idle()
        assert session.active_count == 0
        assert [r.status for r in runs] == ["cancelled"] * 3
        assert queued.status == "cancelled"
        assert all(state.get(f"{n}:status") == "cancelled" for n in probes)
        assert probes["a"].calls == 1
        assert session.runs() == []


@pytest.mark.anyio
async def test_is_running_active_count_and_runs_track_the_runs_in_flight() -> None:
    state, clock = make()
    p1, p2 = Probe(gated=True), Probe(gated=True)
    r1 = Resolver.fetch("one", p1, on_conflict="queue")
    r2 = Resolver.fetch("two", p2)
    async with Session(state, clock=clock) as session:
        assert session.active_count == 0
        assert session.runs() == []
        assert not session.is_running("one")
        a = session.dispatch(r1)
        b = session.dispatch(r1)  # queued
        c = session.dispatch(r2)
        assert session.active_count == 3
        assert session.is_running("one")
        assert session.is_running("two")
        assert session.runs("one") == [a, b]
        assert session.runs("two") == [c]
        assert set(map(id, session.runs())) == {id(a), id(b), id(c)}
        p2.release(1)
        await c.wait()
        assert not session.is_running("two")
        assert session.runs("two") == []
        assert session.active_count == 2
        p1.release(1)
        await a.wait()
        assert session.runs("one") == [b]
        assert session.is_running("one")
        p1.release(2)
        await b.wait()
        assert not session.is_running("one")
        assert session.active_count == 0
        await session.wait_idle()  # returns at once when idle


@pytest.mark.anyio
async def test_cancelling_a_queued_run_through_the_session_means_it_never_starts() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    resolver = Resolver.fetch("lookup", probe, on_conflict="queue")
    async with Session(state, clock=clock) as session:
        first = session.dispatch(resolver)
        queued = session.dispatch(resolver)
        await clock.advance(0)
        assert session.cancel("lookup") == 2
        with pytest.raises(ResolverCancelledError):
            await queued.wait()
        assert queued.status == "cancelled"
        await first.wait(raise_error=False)
        await session.wait_idle()
    assert probe.calls == 1
    assert state.get("lookup:status") == "cancelled"


@pytest.mark.anyio
async def test_cancelling_a_queued_run_through_its_handle_ends_it_at_once() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    resolver = Resolver.fetch("lookup", probe, on_conflict="queue")
    async with Session(state, clock=clock) as session:
        first = session.dispatch(resolver)
        queued = session.dispatch(resolver)
        await clock.advance(0)
        assert queued.cancel() is True
        await clock.advance(0)
        cancelled_at_once = queued.status == "cancelled"
        count_after_cancel = session.active_count
        probe.release(1)
        await first.wait()
        await session.wait_idle()
    assert probe.calls == 1
    # The cancelled queued run never touched the keys: the first run's outcome stands.
    assert state.get("lookup:status") == "done"
    assert statuses_in_journal(state, "lookup") == ["running", "done"]
    assert cancelled_at_once
    assert count_after_cancel == 1


# -- leaving the session --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_exit_cancels_running_runs_and_leaves_no_task() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    tasks_before = len(anyio.get_running_tasks())
    with anyio.fail_after(HANG_GUARD):
        async with Session(state, clock=clock) as session:
            run = session.dispatch(Resolver.fetch("lookup", probe))
            queued = session.dispatch(Resolver.fetch("lookup", probe, on_conflict="queue"))
            await clock.advance(0)
    assert run.status == "cancelled"
    assert queued.status == "cancelled"
    assert probe.finally_ran == [1]  # the source's finally ran before the block ended
    assert probe.calls == 1  # the queued run never started
    assert state.get("lookup:status") == "cancelled"
    assert len(anyio.get_running_tasks()) == tasks_before
    with pytest.raises(ResolverCancelledError):
        await run.wait()


@pytest.mark.anyio
async def test_on_exit_wait_waits_for_running_runs() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: f"r{n}", gated=True)
    exiting = anyio.Event()

    async def release_after_exit_started() -> None:
        await exiting.wait()
        await clock.advance(0)
        probe.release(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(release_after_exit_started)
        async with Session(state, clock=clock, on_exit="wait") as session:
            run = session.dispatch(Resolver.fetch("lookup", probe))
            await clock.advance(0)
            exiting.set()
            status_at_exit = run.status
    assert status_at_exit == "running"
    assert run.status == "done"
    assert run.value == "r1"
    assert state.get("lookup:result") == "r1"
    assert state.get("lookup:status") == "done"


@pytest.mark.anyio
@pytest.mark.parametrize("on_exit", ["cancel", "wait"])
async def test_a_resolver_exception_never_escapes_the_session(on_exit: Any) -> None:
    state, clock = make()
    boom = Probe(fail=lambda n: RuntimeError("resolver blew up"))
    async with Session(state, clock=clock, on_exit=on_exit) as session:
        run = session.dispatch(Resolver.fetch("lookup", boom))
        if on_exit == "cancel":
            await clock.advance(0)
    assert run.status == "error"
    assert state.get("lookup:error") == "resolver blew up"
    assert state.get("lookup:status") == "error"


@pytest.mark.anyio
@pytest.mark.parametrize("on_exit", ["cancel", "wait"])
async def test_an_exception_in_the_session_body_propagates_unchanged_and_cancels_runs(
    on_exit: Any,
) -> None:
    state, clock = make()
    probe = Probe(gated=True)  # never released: waiting for it would hang
    boom = KeyError("from the body")
    runs: list[Run] = []

    async def body() -> None:
        async with Session(state, clock=clock, on_exit=on_exit) as session:
            runs.append(session.dispatch(Resolver.fetch("lookup", probe)))
            await clock.advance(0)
            raise boom

    with pytest.raises(KeyError) as info, anyio.fail_after(HANG_GUARD):
        await body()
    assert info.value is boom
    (run,) = runs
    assert run.status == "cancelled"
    assert probe.finally_ran == [1]
    assert state.get("lookup:status") == "cancelled"


@pytest.mark.anyio
async def test_using_the_session_after_exit_raises_session_error() -> None:
    state, clock = make()
    resolver = Resolver.fetch("lookup", Probe())
    session = Session(state, clock=clock)
    with pytest.raises(SessionError):
        session.dispatch(resolver)  # not entered yet
    async with session:
        await session.dispatch(resolver).wait()
    before = fingerprint(state)
    with pytest.raises(SessionError):
        session.dispatch(resolver)
    with pytest.raises(SessionError):
        session.background(resolver, lambda result: None)
    with pytest.raises(SessionError):
        session.watch("k", when.changed(), lambda change: None)
    with pytest.raises(SessionError):
        await session.call(resolver)
    with pytest.raises(SessionError):
        async with session:
            pass
    assert fingerprint(state) == before


@pytest.mark.anyio
async def test_dispatch_from_another_thread_raises_session_error() -> None:
    state, clock = make()
    probe = Probe()
    resolver = Resolver.fetch("lookup", probe)
    async with Session(state, clock=clock) as session:
        before = fingerprint(state)
        with pytest.raises(SessionError):
            await anyio.to_thread.run_sync(session.dispatch, resolver)
        with pytest.raises(SessionError):
            await anyio.to_thread.run_sync(session.background, resolver, lambda result: None)
        assert fingerprint(state) == before
        assert session.active_count == 0
        # From the loop thread it works.
        assert await session.dispatch(resolver).wait() == 1
    assert probe.calls == 1


@pytest.mark.anyio
async def test_cancel_from_another_thread_raises_session_error() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("lookup", probe))
        await clock.advance(0)
        with pytest.raises(SessionError):
            await anyio.to_thread.run_sync(session.cancel, "lookup")
        with pytest.raises(SessionError):
            await anyio.to_thread.run_sync(session.cancel_all)
        await clock.advance(0)
        assert run.status == "running"  # untouched
        probe.release(1)
        assert await run.wait() == 1


# -- max_concurrency ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_max_concurrency_caps_sources_running_at_once() -> None:
    state, clock = make()
    live = {"now": 0, "max": 0}
    finished: list[int] = []

    def source(i: int) -> Callable[[State], Any]:
        async def fn(state: State) -> int:
            live["now"] += 1
            live["max"] = max(live["max"], live["now"])
            try:
                await clock.sleep(1.0)
            finally:
                live["now"] -= 1
            finished.append(i)
            return i

        return fn

    async with Session(state, clock=clock, max_concurrency=2) as session:
        runs = [session.dispatch(Resolver.fetch(f"job{i}", source(i))) for i in range(5)]
        # Every dispatch is accepted and reported running, even those waiting for a slot.
        assert all(r.status == "running" for r in runs)
        assert all(state.get(f"job{i}:status") == "running" for i in range(5))
        await clock.advance(0)
        assert live["now"] == 2
        steps = 0
        while session.active_count:
            await clock.advance(1.0)
            assert live["now"] <= 2
            steps += 1
            assert steps <= 5
        assert [await r.wait() for r in runs] == [0, 1, 2, 3, 4]
    assert live["max"] == 2
    assert sorted(finished) == [0, 1, 2, 3, 4]
    assert steps == 3  # 2 + 2 + 1
    # Durations are measured from when a run got a slot, not from dispatch.
    assert all(r.duration == pytest.approx(1.0) for r in runs)


# -- background mode ------------------------------------------------------------------------------


class Deliveries:
    def __init__(self) -> None:
        self.results: list[BackgroundResult] = []
        self.event = anyio.Event()

    def __call__(self, result: BackgroundResult) -> None:
        self.results.append(result)
        self.event.set()


@pytest.mark.anyio
async def test_background_acks_at_once_and_delivers_the_result_once() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: {"slots": ["9:00"]}, gated=True)
    deliver = Deliveries()
    async with Session(state, clock=clock) as session:
        ack = session.background(Resolver.fetch("availability", probe), deliver)
        assert ack == {"status": "running", "resolver": "availability"}
        assert state.get("availability:status") == "running"
        await clock.advance(0)
        assert deliver.results == []
        probe.release(1)
        await deliver.event.wait()
        await session.wait_idle()
        await clock.advance(0)
    (result,) = deliver.results
    assert isinstance(result, BackgroundResult)
    assert result.name == "availability"
    assert result.status == "completed"
    assert result.value == {"slots": ["9:00"]}
    assert result.error is None
    assert result.scheduling is Scheduling.WHEN_IDLE
    assert result.attempts == 1
    assert result.superseded is False
    assert result.response == {
        "status": "completed",
        "resolver": "availability",
        "result": {"slots": ["9:00"]},
    }
    assert state.get("availability:result") == {"slots": ["9:00"]}
    assert state.get("availability:status") == "done"
    assert state.get("availability:status") == "done"


@pytest.mark.anyio
async def test_background_delivers_an_error() -> None:
    state, clock = make()
    deliver = Deliveries()
    probe = Probe(fail=lambda n: ConnectionError("calendar unreachable"))
    async with Session(state, clock=clock) as session:
        session.background(Resolver.fetch("availability", probe), deliver)
        await deliver.event.wait()
    (result,) = deliver.results
    assert result.status == "error"
    assert result.error == "calendar unreachable"
    assert result.value is None
    assert result.response == {
        "status": "error",
        "resolver": "availability",
        "error": "calendar unreachable",
    }
    assert state.get("availability:error") == "calendar unreachable"


@pytest.mark.anyio
async def test_background_delivers_a_cancellation() -> None:
    state, clock = make()
    deliver = Deliveries()
    probe = Probe(gated=True)
    async with Session(state, clock=clock) as session:
        session.background(Resolver.fetch("availability", probe), deliver)
        await clock.advance(0)
        assert session.cancel("availability") == 1
        await deliver.event.wait()
        await clock.advance(0)
    (result,) = deliver.results
    assert result.status == "cancelled"
    assert result.value is None
    assert result.error is None
    assert result.superseded is False
    assert result.response == {"status": "cancelled", "resolver": "availability"}


@pytest.mark.anyio
async def test_background_run_cut_short_by_session_exit_is_still_delivered() -> None:
    state, clock = make()
    deliver = Deliveries()
    async with Session(state, clock=clock) as session:
        session.background(Resolver.fetch("availability", Probe(gated=True)), deliver)
        await clock.advance(0)
    assert [r.status for r in deliver.results] == ["cancelled"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (Scheduling.INTERRUPT, Scheduling.INTERRUPT),
        ("silent", Scheduling.SILENT),
        ("when_idle", Scheduling.WHEN_IDLE),
    ],
)
async def test_background_passes_the_scheduling_hint_through(
    given: Any, expected: Scheduling
) -> None:
    state, clock = make()
    deliver = Deliveries()
    async with Session(state, clock=clock) as session:
        session.background(Resolver.fetch("availability", Probe()), deliver, given)
        await deliver.event.wait()
    (result,) = deliver.results
    assert result.scheduling is expected


@pytest.mark.anyio
async def test_background_refuses_an_unknown_scheduling_and_starts_nothing() -> None:
    state, clock = make()
    probe = Probe()
    deliver = Deliveries()
    async with Session(state, clock=clock) as session:
        before = fingerprint(state)
        with pytest.raises(ValueError, match="scheduling"):
            session.background(Resolver.fetch("availability", probe), deliver, "urgent")
        await clock.advance(0)
        assert fingerprint(state) == before
        assert session.active_count == 0
    assert probe.calls == 0
    assert deliver.results == []


@pytest.mark.anyio
async def test_background_awaits_an_async_deliver() -> None:
    state, clock = make()
    got: list[BackgroundResult] = []

    async def deliver(result: BackgroundResult) -> None:
        await clock.sleep(0.5)  # a slow consumer: the session must await it to completion
        got.append(result)

    async with Session(state, clock=clock) as session:
        session.background(Resolver.fetch("availability", Probe()), deliver)
        await clock.advance(0.499)
        assert got == []
        await clock.advance(0.001)
        assert [r.value for r in got] == [1]
    assert [r.value for r in got] == [1]


@pytest.mark.anyio
@pytest.mark.parametrize("is_async", [False, True])
async def test_a_failing_deliver_is_reported_and_does_not_break_the_session(
    caplog: pytest.LogCaptureFixture, is_async: bool
) -> None:
    state, clock = make()
    failures = Failures()
    state.receiver_failed.connect(failures)
    boom = RuntimeError("the model connection is gone")

    def sync_deliver(result: BackgroundResult) -> None:
        raise boom

    async def async_deliver(result: BackgroundResult) -> None:
        await anyio.lowlevel.checkpoint()
        raise boom

    deliver: Callable[[BackgroundResult], Any] = async_deliver if is_async else sync_deliver

    with caplog.at_level(logging.CRITICAL + 1, logger="slateflow.resolve"):
        async with Session(state, clock=clock) as session:
            session.background(Resolver.fetch("availability", Probe()), deliver)
            with anyio.fail_after(HANG_GUARD):
                await failures.event.wait()
            assert failures.errors == [boom]
            assert failures.calls[0]["receiver"] is deliver
            assert failures.calls[0]["sender"] is state
            # The session carries on.
            assert await session.dispatch(Resolver.fetch("next", Probe())).wait() == 1
    assert state.get("availability:result") == 1
    assert state.get("availability:status") == "done"


@pytest.mark.anyio
async def test_custom_ack_and_result_formatters() -> None:
    state, clock = make()
    deliver = Deliveries()

    def ack(name: str) -> dict[str, Any]:
        return {"ack": name.upper()}

    def fmt(result: BackgroundResult) -> dict[str, Any]:
        return {"say": f"{result.name} -> {result.status}: {result.value}"}

    async with Session(state, clock=clock, ack_formatter=ack, result_formatter=fmt) as session:
        assert session.background(Resolver.fetch("avail", Probe()), deliver) == {"ack": "AVAIL"}
        await deliver.event.wait()
    (result,) = deliver.results
    assert result.response == {"say": "avail -> completed: 1"}
    assert result.value == 1


@pytest.mark.anyio
async def test_a_superseded_background_run_is_delivered_silently() -> None:
    state, clock = make()
    deliver = Deliveries()
    probe = Probe(lambda n, s: f"v{n}", gated=True)
    resolver = Resolver.fetch("avail", probe)
    async with Session(state, clock=clock) as session:
        session.background(resolver, deliver, Scheduling.INTERRUPT)
        await clock.advance(0)
        session.background(resolver, deliver, Scheduling.INTERRUPT)
        await clock.advance(0)
        probe.release(2)
        await session.wait_idle()
        await clock.advance(0)
    assert len(deliver.results) == 2
    old, new = deliver.results
    assert old.status == "cancelled"
    assert old.superseded is True
    assert old.scheduling is Scheduling.SILENT
    assert new.status == "completed"
    assert new.value == "v2"
    assert new.superseded is False
    assert new.scheduling is Scheduling.INTERRUPT
    assert state.get("avail:result") == "v2"


# -- watchers -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_non_blocking_watch_actions_run_concurrently() -> None:
    state, clock = make()
    release = anyio.Event()
    live = {"now": 0, "max": 0}
    seen: list[Any] = []

    async def action(change: Change) -> None:
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        await release.wait()
        seen.append(change.new)
        live["now"] -= 1

    async with Session(state, clock=clock) as session:
        watcher = session.watch("k", when.changed(), action)
        assert isinstance(watcher, Watcher)
        assert watcher.active
        for v in (1, 2, 3):
            state.set("k", v)
        await clock.advance(0)
        assert live["now"] == 3  # all three started, none finished
        release.set()
        await clock.advance(0)
    assert live["max"] == 3
    assert sorted(seen) == [1, 2, 3]


@pytest.mark.anyio
async def test_blocking_watch_actions_run_one_after_another_in_commit_order() -> None:
    state, clock = make()
    gates = [anyio.Event() for _ in range(3)]
    started: list[Any] = []
    finished: list[Any] = []
    live = {"now": 0, "max": 0}

    async def action(change: Change) -> None:
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        started.append(change.new)
        await gates[len(started) - 1].wait()
        finished.append(change.new)
        live["now"] -= 1

    async with Session(state, clock=clock) as session:
        session.watch("k", when.changed(), action, blocking=True)
        for v in ("a", "b", "c"):
            state.set("k", v)
        await clock.advance(0)
        assert started == ["a"]
        gates[0].set()
        await clock.advance(0)
        assert started == ["a", "b"]
        assert finished == ["a"]
        gates[1].set()
        gates[2].set()
        await clock.advance(0)
    assert started == finished == ["a", "b", "c"]
    assert live["max"] == 1


@pytest.mark.anyio
async def test_blocking_watchers_share_one_queue_in_commit_order() -> None:
    state, clock = make()
    order: list[tuple[str, Any]] = []
    live = {"now": 0, "max": 0}
    # The earliest change takes longest: run concurrently, they would finish in reverse.
    takes = {("x", 1): 4.0, ("y", 1): 3.0, ("y", 2): 2.0, ("x", 2): 1.0}

    def recorder(tag: str) -> Callable[[Change], Any]:
        async def action(change: Change) -> None:
            live["now"] += 1
            live["max"] = max(live["max"], live["now"])
            await clock.sleep(takes[(tag, change.new)])
            order.append((tag, change.new))
            live["now"] -= 1

        return action

    async with Session(state, clock=clock) as session:
        session.watch("x", when.changed(), recorder("x"), blocking=True)
        session.watch("y", when.changed(), recorder("y"), blocking=True)
        for key, value in (("x", 1), ("y", 1), ("y", 2), ("x", 2)):
            state.set(key, value)
        await clock.advance(4.0)
        assert order == [("x", 1)]
        await clock.advance(6.0)
    assert order == [("x", 1), ("y", 1), ("y", 2), ("x", 2)]
    assert live["max"] == 1


@pytest.mark.anyio
async def test_watch_when_predicate_filters_changes() -> None:
    state, clock = make()
    seen: list[tuple[Any, Any]] = []
    async with Session(state, clock=clock) as session:
        session.watch(
            "lookup:status", when.changed_to("done"), lambda c: seen.append((c.old, c.new))
        )
        probe = Probe()
        await session.dispatch(Resolver.fetch("lookup", probe)).wait()
        await session.dispatch(Resolver.fetch("lookup", Probe(fail=lambda n: ValueError()))).wait(
            raise_error=False
        )
        state.set("lookup:status", "done")
        await clock.advance(0)
    assert seen == [("running", "done"), ("error", "done")]


@pytest.mark.anyio
async def test_watcher_close_stops_it() -> None:
    state, clock = make()
    seen: list[Any] = []
    async with Session(state, clock=clock) as session:
        watcher = session.watch("k", when.changed(), lambda c: seen.append(c.new))
        state.set("k", 1)
        await clock.advance(0)
        watcher.close()
        assert not watcher.active
        state.set("k", 2)
        await clock.advance(0)
        watcher.close()  # idempotent
    assert seen == [1]


@pytest.mark.anyio
async def test_watch_action_exception_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    state, clock = make()
    failures = Failures()
    state.receiver_failed.connect(failures)
    boom = ValueError("action failed")
    seen: list[Any] = []

    async def action(change: Change) -> None:
        seen.append(change.new)
        if change.new == 1:
            raise boom

    with caplog.at_level(logging.CRITICAL + 1, logger="slateflow.resolve"):
        async with Session(state, clock=clock) as session:
            session.watch("k", when.changed(), action, blocking=True)
            state.set("k", 1)
            with anyio.fail_after(HANG_GUARD):
                await failures.event.wait()
            # The watcher (and its queue) keep working.
            state.set("k", 2)
            await clock.advance(0)
    assert failures.errors == [boom]
    assert failures.calls[0]["receiver"] is action
    assert seen == [1, 2]


@pytest.mark.anyio
async def test_sync_watch_action_works() -> None:
    state, clock = make()
    seen: list[Change] = []
    async with Session(state, clock=clock) as session:
        session.watch("k", when.changed_to(2), seen.append)
        session.watch("k", when.changed_to(3), seen.append, blocking=True)
        for v in (1, 2, 3):
            state.set("k", v)
        await clock.advance(0)
    assert [(c.old, c.new) for c in seen] == [(1, 2), (2, 3)]


@pytest.mark.anyio
@pytest.mark.parametrize("blocking", [False, True])
async def test_writes_from_another_thread_wake_watchers(blocking: bool) -> None:
    state, clock = make()
    seen: list[tuple[Any, int]] = []
    woke = anyio.Event()
    loop_thread = threading.get_ident()

    async def action(change: Change) -> None:
        seen.append((change.new, threading.get_ident()))
        woke.set()

    async with Session(state, clock=clock) as session:
        session.watch("k", when.changed_to("from-thread"), action, blocking=blocking)
        await anyio.to_thread.run_sync(state.set, "k", "from-thread")
        await woke.wait()
    assert seen == [("from-thread", loop_thread)]  # the action ran on the session's loop


@pytest.mark.anyio
async def test_watch_action_triggered_from_inside_a_source_is_not_fenced() -> None:
    state, clock = make()
    failures = Failures()
    state.receiver_failed.connect(failures)
    done = anyio.Event()

    async def source(state: State) -> str:
        state.set("lookup:progress", 50)  # a resolver may write its own keys
        await anyio.lowlevel.checkpoint()
        return "ok"

    def action(change: Change) -> None:
        try:
            state.set("ui:progress", change.new)  # the app's own write
        finally:
            done.set()

    async with Session(state, clock=clock) as session:
        session.watch("lookup:progress", when.changed(), action)
        await session.dispatch(Resolver.fetch("lookup", source)).wait()
        await done.wait()
    assert failures.errors == []
    assert state.get("ui:progress") == 50
    prov = state.provenance("ui:progress")
    assert prov is not None
    assert prov.source == "user"


# -- reactive resolvers ---------------------------------------------------------------------------


def reactive(probe: Probe, **options: Any) -> Resolver:
    options.setdefault("debounce", 1.0)
    return Resolver.fetch("quote", probe, reads=["slot"], reactive=True, **options)


def slot_reader(n: int, state: State) -> Any:
    return state.get("slot")


@pytest.mark.anyio
async def test_reactive_reruns_once_after_the_debounce_with_the_latest_value() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    async with Session(state, clock=clock) as session:
        first = session.dispatch(reactive(probe))
        assert await first.wait() == 0
        assert probe.calls == 1
        for v in (1, 2, 3):
            state.set("slot", v)
        await clock.advance(0.999)
        assert probe.calls == 1  # not before the debounce has elapsed
        await clock.advance(0.001)
        assert probe.calls == 2
        await session.wait_idle()
        assert state.get("quote:result") == 3
        await clock.advance(10.0)
        assert probe.calls == 2  # exactly once
    assert results_in_journal(state, "quote:result") == [0, 3]
    prov = state.provenance("quote:result")
    assert prov is not None
    assert prov.meta["inputs"] == {"slot": state.version("slot")}


@pytest.mark.anyio
async def test_reactive_debounce_waits_for_a_quiet_period() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    async with Session(state, clock=clock) as session:
        await session.dispatch(reactive(probe)).wait()
        state.set("slot", 1)
        await clock.advance(0.6)
        state.set("slot", 2)  # pushes the deadline to 1.6
        await clock.advance(0.6)
        assert probe.calls == 1
        await clock.advance(0.3)
        assert probe.calls == 1
        await clock.advance(0.1)
        assert probe.calls == 2
        await session.wait_idle()
    assert state.get("quote:result") == 2


@pytest.mark.anyio
async def test_reactive_rerun_cancels_a_stale_in_flight_run() -> None:
    state, clock = make()
    state.set("slot", "a")
    probe = Probe(slot_reader, gated=True)
    async with Session(state, clock=clock) as session:
        stale = session.dispatch(reactive(probe))
        await clock.advance(0)
        assert stale.inputs == {"slot": 1}
        state.set("slot", "b")
        await clock.advance(1.0)
        assert probe.calls == 2
        assert stale.status == "cancelled"
        assert stale.superseded
        (fresh,) = session.runs("quote")
        assert fresh is not stale
        assert fresh.inputs == {"slot": 2}
        probe.release(1)  # too late: the stale source is gone
        probe.release(2)
        assert await fresh.wait() == "b"
        await clock.advance(5.0)
        assert probe.calls == 2
    assert results_in_journal(state, "quote:result") == ["b"]


@pytest.mark.anyio
async def test_reactive_skips_the_rerun_when_the_latest_run_saw_current_versions() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    resolver = reactive(probe)
    async with Session(state, clock=clock) as session:
        await session.dispatch(resolver).wait()
        state.set("slot", 1)
        # Dispatched by hand within the debounce: this run already reads slot=1.
        assert await session.dispatch(resolver).wait() == 1
        assert probe.calls == 2
        await clock.advance(5.0)
        assert probe.calls == 2


@pytest.mark.anyio
async def test_reactive_skips_the_rerun_when_a_run_waiting_for_a_slot_read_the_change() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    blocker = Probe(gated=True)
    async with Session(state, clock=clock, max_concurrency=1) as session:
        hold = session.dispatch(Resolver.fetch("hold", blocker))
        await clock.advance(0)
        run = session.dispatch(reactive(probe))
        await clock.advance(0)
        assert probe.calls == 0  # waiting for the slot
        state.set("slot", 1)
        blocker.release(1)
        await hold.wait()
        assert await run.wait() == 1
        await clock.advance(5.0)
        assert probe.calls == 1


@pytest.mark.anyio
async def test_reactive_rerun_triggered_by_a_write_from_another_thread() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    async with Session(state, clock=clock) as session:
        await session.dispatch(reactive(probe)).wait()
        await anyio.to_thread.run_sync(state.set, "slot", 7)
        await clock.advance(0.5)
        assert probe.calls == 1
        await clock.advance(0.5)
        assert probe.calls == 2
        await session.wait_idle()
    assert state.get("quote:result") == 7


@pytest.mark.anyio
async def test_session_cancel_stops_reacting() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    async with Session(state, clock=clock) as session:
        await session.dispatch(reactive(probe)).wait()
        state.set("slot", 1)
        await clock.advance(0.5)
        assert session.cancel("quote") == 0  # nothing in flight, but reacting stops
        await clock.advance(5.0)
        state.set("slot", 2)
        await clock.advance(5.0)
        assert probe.calls == 1
        assert session.active_count == 0


@pytest.mark.anyio
async def test_reactive_resolver_does_not_rerun_after_the_session_ends() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    async with Session(state, clock=clock) as session:
        await session.dispatch(reactive(probe)).wait()
        state.set("slot", 1)
    await clock.advance(5.0)
    state.set("slot", 2)
    await clock.advance(5.0)
    assert probe.calls == 1


# -- timeouts and retries -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_timeout_in_dispatch_mode_follows_the_session_clock() -> None:
    state, clock = make()
    probe = Probe(gated=True)  # never released: it hangs
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("slow", probe, timeout=2.0))
        await clock.advance(1.999)
        assert run.status == "running"
        await clock.advance(0.001)
        assert run.status == "error"
        with pytest.raises(ResolverError) as info:
            await run.wait()
    assert isinstance(run.exception, ResolverTimeoutError)
    assert isinstance(run.exception, TimeoutError)
    assert info.value.attempts == 1
    assert "timed out" in state.get("slow:error")
    assert state.get("slow:status") == "error"
    prov = state.provenance("slow:error")
    assert prov is not None
    assert prov.meta["exception"] == "ResolverTimeoutError"
    assert prov.meta["duration"] == pytest.approx(2.0)
    assert probe.finally_ran == [1]


@pytest.mark.anyio
async def test_a_source_ignoring_its_timeout_is_reported_and_its_value_discarded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, clock = make()
    gate = anyio.Event()

    async def stubborn(state: State) -> str:
        with anyio.CancelScope(shield=True):
            await gate.wait()
        return "late"

    with caplog.at_level(logging.WARNING, logger="slateflow"):
        async with Session(state, clock=clock) as session:
            run = session.dispatch(Resolver.fetch("slow", stubborn, timeout=1.0))
            await clock.advance(1.0)
            assert run.status == "running"  # it cannot be stopped
            await clock.advance(2.0)
            gate.set()
            with pytest.raises(ResolverError):
                await run.wait()
    assert run.ignored_cancel
    assert isinstance(run.exception, ResolverTimeoutError)
    assert "slow:result" not in state
    assert state.get("slow:status") == "error"
    assert any(r.levelno >= logging.WARNING and "slow" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_retries_wait_the_backoff_on_the_session_clock() -> None:
    state, clock = make()
    probe = Probe(
        lambda n, s: f"ok after {n}",
        fail=lambda n: ConnectionError(f"attempt {n} failed") if n < 4 else None,
    )
    retry = Retry(attempts=4, backoff=1.0, multiplier=2.0)
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("flaky", probe, retry=retry))
        await clock.advance(0)
        assert probe.calls == 1
        # Waits of 1, 2 and 4 seconds between the attempts.
        for wait, calls in ((1.0, 2), (2.0, 3), (4.0, 4)):
            await clock.advance(wait - 0.001)
            assert probe.calls == calls - 1
            assert run.status == "running"
            await clock.advance(0.001)
            assert probe.calls == calls
            assert run.attempts == calls
        assert await run.wait() == "ok after 4"
    assert run.attempts == 4
    assert state.get("flaky:status") == "done"
    prov = state.provenance("flaky:result")
    assert prov is not None
    assert prov.meta["attempt"] == 4
    assert prov.meta["duration"] == pytest.approx(7.0)


@pytest.mark.anyio
async def test_retries_exhausted_record_attempts_and_the_last_error() -> None:
    state, clock = make()
    probe = Probe(fail=lambda n: ConnectionError(f"attempt {n} failed"))
    retry = Retry(attempts=3, backoff=0.5, multiplier=3.0)
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("flaky", probe, retry=retry))
        await clock.advance(0.5)
        assert probe.calls == 2
        await clock.advance(1.499)
        assert probe.calls == 2
        await clock.advance(0.001)
        assert probe.calls == 3
        with pytest.raises(ResolverError) as info:
            await run.wait()
        await clock.advance(100.0)
    assert probe.calls == 3
    assert info.value.attempts == 3
    assert state.get("flaky:error") == "attempt 3 failed"
    prov = state.provenance("flaky:error")
    assert prov is not None
    assert prov.meta["attempts"] == 3
    assert prov.meta["exception"] == "ConnectionError"


@pytest.mark.anyio
async def test_each_attempt_gets_its_own_timeout_and_timeouts_are_retried() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: "late but fine", gated=True)
    retry = Retry(attempts=2, backoff=1.0)
    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("slow", probe, timeout=3.0, retry=retry))
        await clock.advance(3.0)  # attempt 1 times out
        assert probe.finally_ran == [1]
        assert run.status == "running"
        await clock.advance(1.0)  # backoff, attempt 2 starts
        assert probe.calls == 2
        await clock.advance(2.9)
        probe.release(2)
        assert await run.wait() == "late but fine"
    assert run.attempts == 2


@pytest.mark.anyio
async def test_cancelling_during_the_backoff_ends_the_run() -> None:
    state, clock = make()
    probe = Probe(fail=lambda n: ConnectionError("down"))
    async with Session(state, clock=clock) as session:
        run = session.dispatch(
            Resolver.fetch("flaky", probe, retry=Retry(attempts=5, backoff=10.0))
        )
        await clock.advance(1.0)
        assert probe.calls == 1
        run.cancel()
        with pytest.raises(ResolverCancelledError):
            await run.wait()
        await clock.advance(100.0)
    assert probe.calls == 1
    assert state.get("flaky:status") == "cancelled"


# -- provenance -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_provenance_of_a_dispatched_result() -> None:
    state, clock = make()
    state.set("party", 4)

    async def source(state: State) -> dict[str, Any]:
        await clock.sleep(2.5)
        return {"table": state.get("party")}

    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("table", source, reads=["party"], ttl=60.0))
        await clock.advance(2.5)
        await run.wait()
    prov = state.provenance("table:result")
    assert prov is not None
    assert prov.source == "fetch"
    assert prov.writer == "table"
    assert prov.meta["mode"] == "dispatch"
    assert epoch(prov.meta["started_at"]) == START
    assert prov.meta["duration"] == pytest.approx(2.5)
    assert prov.meta["attempt"] == 1
    assert prov.meta["inputs"] == {"party": 1}
    assert prov.meta["ttl"] == 60.0
    assert run.inputs == {"party": 1}
    assert run.duration == pytest.approx(2.5)
    status_prov = state.provenance("table:status")
    assert status_prov is not None
    assert status_prov.writer == "table"
    assert is_fresh(state, "table")
    await clock.advance(60.0)
    assert not is_fresh(state, "table")


@pytest.mark.anyio
async def test_provenance_of_a_background_result() -> None:
    state, clock = make()
    deliver = Deliveries()

    async def agent(state: State) -> str:
        await clock.sleep(1.0)
        return "booked"

    async with Session(state, clock=clock) as session:
        await clock.advance(3.0)  # the run starts 3 s after the clock's start
        session.background(Resolver.agent("booker", agent), deliver)
        await clock.advance(1.0)
        await deliver.event.wait()
    prov = state.provenance("booker:result")
    assert prov is not None
    assert prov.source == "agent"
    assert prov.writer == "booker"
    assert prov.meta["mode"] == "background"
    assert epoch(prov.meta["started_at"]) == START + 3.0
    assert prov.meta["duration"] == pytest.approx(1.0)
    assert "inputs" not in prov.meta  # it declared no reads


@pytest.mark.anyio
async def test_session_call_runs_in_call_mode_on_the_session_clock() -> None:
    state, clock = make()

    async def source(state: State) -> int:
        await clock.sleep(1.0)
        return 42

    async with Session(state, clock=clock) as session:
        async with anyio.create_task_group() as tg:
            got: list[Any] = []

            async def caller() -> None:
                got.append(await session.call(Resolver.fetch("answer", source, timeout=5.0)))

            tg.start_soon(caller)
            await clock.advance(1.0)
        assert got == [42]
    prov = state.provenance("answer:result")
    assert prov is not None
    assert prov.meta["mode"] == "call"


# -- pytest-asyncio (strict mode), outside anyio's plugin -----------------------------------------


@pytest.mark.asyncio
async def test_pytest_asyncio_dispatch_wait_and_manual_clock() -> None:
    state, clock = make()
    probe = Probe(lambda n, s: "ready")

    async def source(state: State) -> str:
        await clock.sleep(2.0)
        return await probe(state)

    async with Session(state, clock=clock) as session:
        run = session.dispatch(Resolver.fetch("job", source))
        await clock.advance(1.0)
        assert run.status == "running"
        await clock.advance(1.0)
        assert await run.wait() == "ready"
    assert state.get("job:status") == "done"
    prov = state.provenance("job:result")
    assert prov is not None
    assert prov.meta["duration"] == pytest.approx(2.0)


@pytest.mark.asyncio
async def test_pytest_asyncio_timeout_and_latest() -> None:
    state, clock = make()
    probe = Probe(gated=True)
    resolver = Resolver.fetch("job", probe, timeout=1.0)
    async with Session(state, clock=clock) as session:
        old = session.dispatch(resolver)
        await clock.advance(0.5)
        new = session.dispatch(resolver)
        await clock.advance(0)
        assert old.superseded
        assert old.status == "cancelled"
        await clock.advance(1.0)
        with pytest.raises(ResolverError):
            await new.wait()
    assert state.get("job:status") == "error"
    assert "timed out" in state.get("job:error")


@pytest.mark.asyncio
async def test_pytest_asyncio_background_and_reaction() -> None:
    state, clock = make()
    state.set("slot", 0)
    probe = Probe(slot_reader)
    deliver = Deliveries()
    async with Session(state, clock=clock) as session:
        session.background(reactive(probe), deliver, "interrupt")
        await deliver.event.wait()
        deliver.event = anyio.Event()
        state.set("slot", 9)
        await clock.advance(1.0)
        await deliver.event.wait()
    assert [(r.status, r.value, r.scheduling) for r in deliver.results] == [
        ("completed", 0, Scheduling.INTERRUPT),
        ("completed", 9, Scheduling.INTERRUPT),
    ]


@pytest.mark.anyio
async def test_cancelling_an_on_exit_wait_still_cancels_every_run() -> None:
    """A session waiting for its runs at exit (on_exit="wait") that is itself cancelled
    cancels them: each writes "cancelled" and no source outlives the block."""
    state = State()
    finished: list[str] = []

    async def forever(s: State) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            finished.append("source ended")

    with anyio.CancelScope() as outer:
        async with Session(state, on_exit="wait") as session:
            run = session.dispatch(Resolver.fetch("forever", forever))
            await anyio.lowlevel.checkpoint()
            outer.cancel()  # the exit's wait is what gets cancelled
    assert finished == ["source ended"]
    assert run.status == "cancelled"
    assert state.get("forever:status") == "cancelled"
