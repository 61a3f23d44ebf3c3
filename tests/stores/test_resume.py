"""Resuming after a crash: a durable State recovered in a new process picks its flows and
resolvers up where they were.

A crash is simulated in-process: :class:`Crashing` is a MemoryStore that takes a copy of itself
(``MemoryStore.copy()``: exactly what a restart would find) right after its ``n``-th commit; the
first run goes on regardless, and the copy is recovered into a fresh State, Session and flow,
as a restarted process would. Sweeping ``n`` over every commit of a run crashes it at every
point there is. The same resume runs on a real SQLite file, and a subprocess with SIGKILL
(``test_crash.py``) proves it against a real process death.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from slateflow import Flow, ManualClock, Resolver, Session, State, Step, is_true, resolved, run
from slateflow.errors import RecoveryError
from slateflow.stores import CommitRow, MemoryStore

# -- harness --------------------------------------------------------------------------------------


class Crashing(MemoryStore):
    """A MemoryStore that keeps a copy of itself as of commit ``at`` (what a process killed
    right after that commit leaves behind)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.copy_at: MemoryStore | None = None

    def append(self, commit: CommitRow) -> None:
        super().append(commit)
        if commit[0] == self.at:
            self.copy_at = self.copy()


class Effects:
    """Side effects counted per resolver name (what 'ran exactly once' is checked against)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def source(self, name: str, value: Any, clock: ManualClock, delay: float) -> Any:
        async def fetch(state: State) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            await clock.sleep(delay)
            return value

        return fetch


def booking_flow(effects: Effects, clock: ManualClock) -> tuple[Flow, list[Resolver]]:
    """greet (user says hi) -> lookup (dispatch, 2 s) -> quote (background, 3 s) -> confirm
    (hold, 1 s; user confirms) -> book (dispatch, 1 s) -> bye."""
    lookup = Resolver.fetch("lookup", effects.source("lookup", {"slots": 3}, clock, 2))
    quote = Resolver.fetch("quote", effects.source("quote", 120, clock, 3))
    hold = Resolver.fetch("hold", effects.source("hold", "held", clock, 1))
    book = Resolver.fetch("book", effects.source("book", "B-17", clock, 1))
    flow = Flow(
        "booking",
        [
            Step("greet", done=is_true("hi")),
            Step("lookup", after=["greet"], done=resolved("lookup"), on_enter=run(lookup)),
            Step(
                "quote",
                after=["lookup"],
                done=resolved("quote"),
                on_enter=run(quote, "background", deliver=lambda result: None),
            ),
            # Its resolver finishes long before the user confirms: a restart in between must
            # not place the hold twice.
            Step("confirm", after=["quote"], done=is_true("confirmed"), on_enter=run(hold)),
            Step("book", after=["confirm"], done=resolved("book"), on_enter=run(book)),
            Step("bye", after=["book"], done=is_true("said_bye")),
        ],
    )
    return flow, [lookup, quote, hold, book]


USER = {"greet": ("hi", True), "confirm": ("confirmed", True), "bye": ("said_bye", True)}


async def drive(state: State, clock: ManualClock, effects: Effects) -> dict[str, Any]:
    """Run (or resume) the booking flow to completion: the user answers whatever step is
    active, the clock moves on while resolvers work. Returns the final values."""
    flow, _ = booking_flow(effects, clock)
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        for _ in range(50):
            await clock.advance(0)
            if runner.is_complete:
                break
            await clock.advance(1)
            for step in runner.active_steps:
                if step in USER:
                    key, value = USER[step]
                    state.set(key, value)
            await clock.advance(1)
        assert runner.is_complete, runner.active_steps
    return values(state)


def values(state: State) -> dict[str, Any]:
    """The values a user would read back (timestamps and durations vary between runs)."""
    return {
        key: state.get(key)
        for key in state.keys(prefix="")
        if not key.endswith((":started_at", ":finished_at", ":elapsed", ":marking"))
    }


def commits_of_a_run() -> tuple[int, dict[str, Any]]:
    store = MemoryStore()
    result = anyio.run(drive, State(store=store, clock=ManualClock()), ManualClock(), Effects())
    return store.read().head, result


# -- crash at every commit ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_crash_at_any_commit_resumes_to_the_same_end_and_completed_work_runs_once() -> None:
    clean = MemoryStore()
    expected = await drive(State(store=clean), ManualClock(), Effects())
    head = clean.read().head
    assert head > 10
    for at in range(1, head + 1):
        store, effects = Crashing(at), Effects()
        await drive(State(store=store), ManualClock(), effects)
        assert store.copy_at is not None
        crashed = store.copy_at
        # What the crash left: resolvers whose result was committed must not run again.
        before = State(store=crashed.copy())
        finished = {
            name
            for name in ("lookup", "quote", "hold", "book")
            if before.get(f"{name}:status") == "done"
        }
        before.close()
        again = Effects()
        resumed = await drive(State(store=crashed), ManualClock(), again)
        assert resumed == expected, f"crash after commit {at}"
        for name in finished:
            assert again.counts.get(name, 0) == 0, f"{name} ran again after commit {at}"
        for name in ("lookup", "quote", "hold", "book"):
            # Every resolver ran at least once across both processes (at-least-once).
            assert effects.counts.get(name, 0) + again.counts.get(name, 0) >= 1


@pytest.mark.anyio
async def test_a_step_entered_before_the_crash_does_not_fire_its_on_enter_again() -> None:
    clock, effects = ManualClock(), Effects()
    store = MemoryStore()
    state = State(store=store, clock=clock)
    flow, _ = booking_flow(effects, clock)
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        state.set("hi", True)
        await clock.advance(2)
        await clock.advance(0)
        assert state.get("lookup:result") == {"slots": 3}
        assert runner.active_steps == ["quote"]
        await clock.advance(3)
        await clock.advance(0)
        assert runner.active_steps == ["confirm"]
        await clock.advance(1)
        await clock.advance(0)
        assert state.get("hold:result") == "held"
        crashed = store.copy()
    again = Effects()
    state2 = State(store=crashed, clock=clock)
    flow2, _ = booking_flow(again, clock)
    async with Session(state2, clock=clock) as session:
        runner = flow2.start(session)
        assert runner.active_steps == ["confirm"]
        assert runner.done_steps == ["greet", "lookup", "quote"]
        await clock.advance(5)
        assert again.counts == {}
        state2.set("confirmed", True)
        await clock.advance(1)
        await clock.advance(0)
        assert runner.active_steps == ["bye"]
    assert again.counts == {"book": 1}


@pytest.mark.anyio
async def test_an_on_enter_resolver_in_flight_at_the_crash_is_dispatched_again() -> None:
    clock, effects = ManualClock(), Effects()
    store = MemoryStore()
    state = State(store=store, clock=clock)
    flow, _ = booking_flow(effects, clock)
    async with Session(state, clock=clock) as session:
        flow.start(session)
        state.set("hi", True)
        await clock.advance(1)  # lookup takes 2 s: still running
        assert state.get("lookup:status") == "running"
        crashed = store.copy()
    assert effects.counts == {"lookup": 1}
    again = Effects()
    state2 = State(store=crashed, clock=clock)
    flow2, _ = booking_flow(again, clock)
    async with Session(state2, clock=clock) as session:
        runner = flow2.start(session)
        assert session.in_flight() == []  # the flow took it over
        await clock.advance(0)
        assert again.counts == {"lookup": 1}
        await clock.advance(2)
        await clock.advance(0)
        assert state2.get("lookup:result") == {"slots": 3}
        assert runner.active_steps == ["quote"]


@pytest.mark.anyio
async def test_a_run_cancelled_by_the_session_closing_is_dispatched_again() -> None:
    clock, effects = ManualClock(), Effects()
    state = State(store=MemoryStore(), clock=clock)
    flow, _ = booking_flow(effects, clock)
    async with Session(state, clock=clock) as session:
        flow.start(session)
        state.set("hi", True)
        await clock.advance(1)
    assert state.get("lookup:status") == "cancelled"  # an orderly shutdown mid-run
    assert state.store is not None
    again = Effects()
    state2 = State(store=state.store.copy(), clock=clock)  # type: ignore[attr-defined]
    flow2, _ = booking_flow(again, clock)
    async with Session(state2, clock=clock) as session:
        flow2.start(session)
        await clock.advance(0)
        assert again.counts == {"lookup": 1}
        await clock.advance(2)
        await clock.advance(0)
        assert state2.get("lookup:result") == {"slots": 3}


# -- session.resume for resolvers outside flows ---------------------------------------------------


def slow(name: str, effects: Effects, clock: ManualClock, value: Any = "v") -> Resolver:
    return Resolver.fetch(name, effects.source(name, value, clock, 5))


@pytest.mark.anyio
async def test_session_resume_redispatches_what_was_in_flight_and_nothing_else() -> None:
    clock, effects = ManualClock(), Effects()
    store = MemoryStore()
    state = State(store=store, clock=clock)
    fast = Resolver.fetch("fast", effects.source("fast", 1, clock, 0))
    async with Session(state, clock=clock) as session:
        await session.call(fast)
        session.dispatch(slow("weather", effects, clock))
        session.background(slow("news", effects, clock), lambda result: None)
        await clock.advance(1)
        crashed = store.copy()
    again = Effects()
    state2 = State(store=crashed, clock=clock)
    async with Session(state2, clock=clock) as session:
        assert sorted(session.in_flight()) == ["news", "weather"]
        runs = session.resume(
            slow("weather", again, clock, "sunny"),
            slow("news", again, clock, "quiet"),
            Resolver.fetch("fast", again.source("fast", 1, clock, 0)),
        )
        assert sorted(r.resolver.name for r in runs) == ["news", "weather"]
        assert [r.mode for r in sorted(runs, key=lambda r: r.resolver.name)] == [
            "background",
            "dispatch",
        ]
        assert session.in_flight() == []
        await clock.advance(5)
        await clock.advance(0)
        assert state2.get("weather:result") == "sunny"
        assert state2.get("news:result") == "quiet"
        assert again.counts == {"weather": 1, "news": 1}  # fast finished: not run again
        assert session.resume() == []  # nothing left


async def two_in_flight(clock: ManualClock) -> MemoryStore:
    """What a process killed with two dispatched resolvers, weather and news, half-way leaves."""
    effects = Effects()
    store = MemoryStore()
    state = State(store=store, clock=clock)
    async with Session(state, clock=clock) as session:
        session.dispatch(slow("weather", effects, clock))
        session.dispatch(slow("news", effects, clock))
        await clock.advance(1)
        return store.copy()


@pytest.mark.anyio
async def test_session_resume_refuses_a_missing_resolver_and_starts_nothing() -> None:
    clock = ManualClock()
    crashed = await two_in_flight(clock)
    again = Effects()
    state2 = State(store=crashed, clock=clock)
    async with Session(state2, clock=clock) as session:
        cursor = state2.journal.cursor
        with pytest.raises(RecoveryError, match=r"'news'.*abandon=True"):
            session.resume(slow("weather", again, clock))
        assert state2.journal.cursor == cursor
        assert again.counts == {}
        assert sorted(session.in_flight()) == ["news", "weather"]


@pytest.mark.anyio
async def test_session_resume_abandon_marks_the_unknown_ones_cancelled() -> None:
    clock = ManualClock()
    crashed = await two_in_flight(clock)
    again = Effects()
    state2 = State(store=crashed, clock=clock)
    async with Session(state2, clock=clock) as session:
        runs = session.resume(slow("weather", again, clock), abandon=True)
        assert [r.resolver.name for r in runs] == ["weather"]
        assert state2.get("news:status") == "cancelled"
        assert state2.provenance("news:status").meta == {"reason": "abandoned after a restart"}
        assert session.in_flight() == []
        await clock.advance(5)
        await clock.advance(0)
    assert again.counts == {"weather": 1}


@pytest.mark.anyio
async def test_runs_started_in_this_session_are_not_in_flight_leftovers() -> None:
    clock, effects = ManualClock(), Effects()
    state = State(store=MemoryStore(), clock=clock)
    async with Session(state, clock=clock) as session:
        session.dispatch(slow("weather", effects, clock))
        assert session.in_flight() == []
        assert session.resume() == []


# -- the marking ----------------------------------------------------------------------------------


def tool_flow() -> Flow:
    from slateflow import called_ok

    return Flow(
        "tools",
        [
            Step("ask", done=is_true("asked")),
            Step("search", after=["ask"], done=called_ok("search")),
        ],
    )


@pytest.mark.anyio
async def test_tool_counts_survive_a_restart() -> None:
    clock = ManualClock()
    store = MemoryStore()
    state = State(store=store, clock=clock)
    async with Session(state, clock=clock) as session:
        runner = tool_flow().start(session, enforcement="observe")
        runner.on_tool_ok("search")  # early: counted, but the step is not reached yet
        runner.on_tool_ok("search")
        crashed = store.copy()
    state2 = State(store=crashed, clock=clock)
    async with Session(state2, clock=clock) as session:
        runner = tool_flow().start(session, enforcement="observe")
        assert dict(runner.marking.tools_ok) == {"search": 2}
        assert runner.active_steps == ["ask"]
        state2.set("asked", True)
        assert runner.is_complete  # the search before the crash counts


@pytest.mark.anyio
async def test_a_marking_naming_a_step_the_flow_lost_is_refused() -> None:
    clock = ManualClock()
    store = MemoryStore()
    state = State(store=store, clock=clock)
    effects = Effects()
    flow, _ = booking_flow(effects, clock)
    async with Session(state, clock=clock) as session:
        flow.start(session)
        state.set("hi", True)
        await clock.advance(3)
        crashed = store.copy()
    changed = Flow("booking", [Step("hello", done=is_true("hi"))])
    state2 = State(store=crashed, clock=clock)
    async with Session(state2, clock=clock) as session:
        with pytest.raises(RecoveryError, match=r"step 'greet'.*clear the flow:booking: keys"):
            changed.start(session)


@pytest.mark.anyio
async def test_a_garbled_marking_is_refused_with_the_key_named() -> None:
    clock = ManualClock()
    store = MemoryStore()
    state = State(store=store, clock=clock)
    flow, _ = booking_flow(Effects(), clock)
    async with Session(state, clock=clock) as session:
        flow.start(session)
        state.set("hi", True)
        await clock.advance(0)
    state.set("flow:booking:marking", {"entered": "nope"})
    state2 = State(store=store.copy(), clock=clock)
    async with Session(state2, clock=clock) as session:
        with pytest.raises(RecoveryError, match="flow:booking:marking"):
            flow.start(session)


def test_a_flow_on_a_plain_state_writes_no_marking() -> None:
    async def main() -> None:
        clock = ManualClock()
        state = State(clock=clock)
        flow, _ = booking_flow(Effects(), clock)
        async with Session(state, clock=clock) as session:
            flow.start(session)
            state.set("hi", True)
        assert state.get("flow:booking:marking") is None
        assert state.get("flow:booking:done") == ["greet"]

    anyio.run(main)


# -- on a real SQLite file ------------------------------------------------------------------------


def crash_copy(path: Path, into: Path) -> None:
    """Copy a live store file the way a crash would leave it (every committed transaction)."""
    with sqlite3.connect(path) as source, sqlite3.connect(into) as target:
        source.backup(target)


@pytest.mark.anyio
async def test_a_sqlite_state_resumes_a_flow_mid_run(tmp_path: Path) -> None:
    clock, effects = ManualClock(), Effects()
    path, copy = tmp_path / "run.db", tmp_path / "crashed.db"
    state = State.open(path, clock=clock)
    flow, _ = booking_flow(effects, clock)
    async with Session(state, clock=clock) as session:
        flow.start(session)
        state.set("hi", True)
        await clock.advance(2)
        await clock.advance(0)
        await clock.advance(1)  # quote (3 s) is in flight
        state.sync()
        crash_copy(path, copy)
    state.close()
    assert effects.counts == {"lookup": 1, "quote": 1}
    again = Effects()
    state2 = State.open(copy, clock=clock)
    try:
        resumed = await drive(state2, clock, again)
    finally:
        state2.close()
    assert again.counts == {"quote": 1, "hold": 1, "book": 1}
    assert resumed["book:result"] == "B-17"
    assert resumed["flow:booking:complete"] is True
