"""The FlowRunner inside a Session: on_enter actions in their three modes, activations, writes
from other threads, waiting on a flow, ``flow.start(session)``, several flows on one State, and the
voice booking flow driven end to end.

Everything timed runs on a :class:`ManualClock` (``Session(state, clock=clock)``);
``await clock.advance(0)`` lets every ready task run until it blocks again. Tests wait on the
flow (``wait_for_step``, ``on_turn``) or on the clock, never on the wall clock. The only real-time
bound is ``anyio.fail_after`` around waits for another thread, as a safety net that a working
flow never reaches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from builders import conversation_on, example_module
from helpers import run_threads
from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Scheduling,
    Session,
    State,
    Step,
    always,
    any_,
    called_ok,
    captured,
    commit,
    edge,
    eq,
    failed,
    is_true,
    require,
    reset,
    resolved,
    run,
)
from slateflow.errors import (
    DispatchRejectedError,
    FlowDefinitionError,
    FlowError,
    SessionError,
    WaitTimeoutError,
)
from slateflow.flow import Enforcement, FlowRunner, Verdict, signals
from slateflow.resolve import BackgroundResult

MODES = ["dispatch", "background", "call"]
SAFETY = 10.0  # seconds of real time a thread test may take before it counts as hung


# -- helpers --------------------------------------------------------------------------------------


class Source:
    """An async resolver source: counts its calls and the threads they ran in, tracks how many
    run at once, and sleeps ``delay`` on the manual clock before returning ``value`` (or raising
    ``fail``)."""

    def __init__(
        self,
        value: Any = "ok",
        *,
        clock: ManualClock | None = None,
        delay: float = 0.0,
        fail: Exception | None = None,
        shared: Source | None = None,
    ) -> None:
        self.value = value
        self.clock = clock
        self.delay = delay
        self.fail = fail
        self.calls = 0
        self.threads: list[int] = []
        self.active = 0
        self.max_active = 0
        # Sources sharing one "lane" counter (to see whether they ever overlap).
        self.shared = shared if shared is not None else self

    async def __call__(self, state: State) -> Any:
        self.calls += 1
        self.threads.append(threading.get_ident())
        lane = self.shared
        lane.active += 1
        lane.max_active = max(lane.max_active, lane.active)
        try:
            if self.delay:
                assert self.clock is not None
                await self.clock.sleep(self.delay)
            if self.fail is not None:
                raise self.fail
            return self.value
        finally:
            lane.active -= 1


class Signals:
    """Records every flow signal as (kind, flow, step, thread id). Blinker holds receivers
    weakly, so this object keeps them alive; ``close()`` disconnects them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None, int]] = []
        self._connected: list[tuple[Any, Callable[..., None]]] = []
        for kind, signal in (
            ("entered", signals.step_entered),
            ("done", signals.step_done),
            ("reset", signals.step_reset),
            ("complete", signals.flow_completed),
        ):
            receiver = self._receiver(kind)
            signal.connect(receiver)
            self._connected.append((signal, receiver))

    def _receiver(self, kind: str) -> Callable[..., None]:
        def receiver(sender: FlowRunner, *, flow: str, step: str | None = None) -> None:
            self.events.append((kind, flow, step, threading.get_ident()))

        return receiver

    def steps(self, flow: str, kind: str) -> list[str | None]:
        return [step for k, f, step, _ in self.events if f == flow and k == kind]

    def threads(self, flow: str, kind: str, step: str) -> list[int]:
        return [t for k, f, s, t in self.events if f == flow and k == kind and s == step]

    def close(self) -> None:
        for signal, receiver in self._connected:
            signal.disconnect(receiver)


@pytest.fixture
def sigs() -> Iterator[Signals]:
    recorder = Signals()
    yield recorder
    recorder.close()


def lookup_flow(resolver: Resolver, mode: str, **run_options: Any) -> Flow:
    """ask (done when 'go' is true) -> lookup (runs ``resolver`` on enter, done when it has a
    result) -> answer (done when 'answered' is true)."""
    return Flow(
        "lookup",
        [
            Step("ask", done=is_true("go")),
            Step(
                "lookup",
                after=["ask"],
                done=resolved(resolver.name),
                on_enter=run(resolver, mode, **run_options),  # type: ignore[arg-type]
            ),
            Step("answer", after=["lookup"], done=is_true("answered")),
        ],
    )


class Waiting:
    """A wait started in its own task: ``result`` is its value or the exception it raised."""

    def __init__(self) -> None:
        self.finished = False
        self.result: Any = None

    async def __call__(self, wait: Callable[[], Any]) -> None:
        try:
            self.result = await wait()
        except Exception as exc:
            self.result = exc
        self.finished = True


# -- on_enter: the three modes --------------------------------------------------------------------


@pytest.mark.anyio
async def test_dispatch_on_enter_runs_the_resolver_and_its_result_completes_the_step() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source({"open": True}, clock=clock, delay=2)
    lookup = Resolver.fetch("availability", source)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(lookup_flow(lookup, "dispatch"))
        assert runner.active_steps == ["ask"]
        assert state.get("availability:status") is None  # not entered: nothing started

        state.set("go", True)
        assert runner.active_steps == ["lookup"]
        # Dispatched the moment the step was entered, in the writer's call.
        assert state.get("availability:status") == "running"
        assert session.is_running("availability")
        await clock.advance(0)
        assert source.calls == 1
        await clock.advance(1.5)
        assert runner.active_steps == ["lookup"]  # still waiting on the result

        await clock.advance(0.5)
        assert state.get("availability:result") == {"open": True}
        assert runner.active_steps == ["answer"]
        assert runner.done_steps == ["ask", "lookup"]
        assert runner.verdict("lookup") is Verdict.DONE
        provenance = state.provenance("availability:result")
        assert provenance is not None
        assert (provenance.source, provenance.writer) == ("fetch", "availability")
        assert conversation.take_deliveries() == []  # dispatch mode delivers nothing
        assert source.calls == 1


@pytest.mark.anyio
async def test_a_step_entered_when_the_flow_starts_dispatches_inside_run_flow() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source(7)
    flow = Flow(
        "start",
        [Step("load", done=resolved("load"), on_enter=run(Resolver.fetch("load", source)))],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        assert state.get("load:status") == "running"
        assert runner.active_steps == ["load"]
        await clock.advance(0)
        assert state.get("load:result") == 7
        assert runner.is_complete
        assert state.get("flow:start:complete") is True
        assert source.calls == 1


@pytest.mark.anyio
@pytest.mark.parametrize("scheduling", list(Scheduling))
async def test_background_on_enter_queues_the_outcome_with_its_scheduling_hint(
    scheduling: Scheduling,
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source({"open": False, "alternative": "19:30"}, clock=clock, delay=1)
    lookup = Resolver.fetch("availability", source)
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(
            lookup_flow(lookup, "background", scheduling=scheduling.value)
        )
        state.set("go", True)
        assert state.get("availability:status") == "running"
        await clock.advance(0.5)
        assert conversation.take_deliveries() == []  # nothing yet: the lookup is still running

        await clock.advance(0.5)
        assert runner.active_steps == ["answer"]
        delivered = conversation.take_deliveries()
        assert len(delivered) == 1
        result = delivered[0]
        assert isinstance(result, BackgroundResult)
        assert (result.name, result.status) == ("availability", "completed")
        assert result.value == {"open": False, "alternative": "19:30"}
        assert result.scheduling is scheduling
        assert result.response == {
            "status": "completed",
            "resolver": "availability",
            "result": {"open": False, "alternative": "19:30"},
        }
        assert conversation.take_deliveries() == []  # taking them empties the queue


@pytest.mark.anyio
@pytest.mark.parametrize("is_async", [False, True], ids=["sync_deliver", "async_deliver"])
async def test_background_on_enter_hands_the_outcome_to_its_deliver_callable(
    is_async: bool,
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    received: list[BackgroundResult] = []
    deliver: Callable[[BackgroundResult], Any]
    if is_async:

        async def deliver_async(result: BackgroundResult) -> None:
            await anyio.lowlevel.checkpoint()
            received.append(result)

        deliver = deliver_async
    else:
        deliver = received.append
    lookup = Resolver.fetch("availability", Source({"open": True}, clock=clock, delay=1))
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(
            lookup_flow(lookup, "background", scheduling="interrupt", deliver=deliver)
        )
        state.set("go", True)
        await clock.advance(1)
        assert [(r.name, r.status, r.value, r.scheduling) for r in received] == [
            ("availability", "completed", {"open": True}, Scheduling.INTERRUPT)
        ]
        assert conversation.take_deliveries() == []  # given to deliver, not queued
        assert runner.active_steps == ["answer"]


@pytest.mark.anyio
async def test_call_on_enter_is_awaited_by_on_turn_so_the_next_turn_sees_its_result() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source("Tuesday at 3")
    lookup = Resolver.fetch("calendar", source)
    async with Session(state, clock=clock) as session:
        runner = lookup_flow(lookup, "call").start(session)
        state.set("go", True)
        assert runner.active_steps == ["lookup"]
        await runner.on_turn()
        # on_turn waited for the call, and the step that waited on its result moved on.
        assert state.get("calendar:result") == "Tuesday at 3"
        assert runner.active_steps == ["answer"]
        assert runner.turns == 1
        assert source.calls == 1
        assert session.active_count == 0  # a call runs in the runner's lane, not as a session run


@pytest.mark.anyio
async def test_on_turn_waits_for_a_slow_call_on_the_clock() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    lookup = Resolver.fetch("calendar", Source("ok", clock=clock, delay=3))
    async with Session(state, clock=clock) as session:
        runner = lookup_flow(lookup, "call").start(session)
        state.set("go", True)
        turn = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(turn, runner.on_turn)
            await clock.advance(2.9)
            assert not turn.finished
            assert state.get("calendar:status") == "running"
            await clock.advance(0.1)
            assert turn.finished
        assert turn.result is None
        assert runner.active_steps == ["answer"]


@pytest.mark.anyio
async def test_call_actions_run_one_after_another_in_the_runners_lane() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    first = Source("a", clock=clock, delay=1)
    second = Source("b", clock=clock, delay=1, shared=first)
    flow = Flow(
        "lane",
        [
            Step("start", done=is_true("go")),
            Step(
                "one",
                after=["start"],
                done=resolved("one"),
                on_enter=run(Resolver.fetch("one", first), "call"),
            ),
            Step(
                "two",
                after=["start"],
                done=resolved("two"),
                on_enter=run(Resolver.fetch("two", second), "call"),
            ),
            Step("end", after=["one", "two"], terminal=True),
        ],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        state.set("go", True)
        assert runner.active_steps == ["one", "two"]
        await clock.advance(1)
        assert runner.active_steps == ["two"]  # the second call starts only after the first
        assert second.calls == 1
        await clock.advance(1)
        assert runner.is_complete
        assert first.max_active == 1  # never two calls at once
        await runner.on_turn()  # nothing left to wait for: returns at once


@pytest.mark.anyio
async def test_a_call_whose_result_enters_another_call_step_is_awaited_by_the_same_turn() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    flow = Flow(
        "chain",
        [
            Step("start", done=is_true("go")),
            Step(
                "a",
                after=["start"],
                done=resolved("a"),
                on_enter=run(Resolver.fetch("a", Source(1)), "call"),
            ),
            Step(
                "b",
                after=["a"],
                done=resolved("b"),
                on_enter=run(Resolver.fetch("b", Source(2)), "call"),
            ),
            Step("end", after=["b"], terminal=True),
        ],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        state.set("go", True)
        await runner.on_turn()
        assert runner.is_complete
        assert runner.done_steps == ["start", "a", "b", "end"]


# -- on_enter: once per activation ----------------------------------------------------------------


def gated_flow(resolver: Resolver, mode: str) -> Flow:
    return Flow(
        "gated",
        [
            Step(
                "a",
                gate=is_true("open"),
                done=is_true("a:done"),
                on_enter=run(resolver, mode),  # type: ignore[arg-type]
            ),
            Step("b", after=["a"], done=is_true("b:done")),
        ],
        constraints=[reset("a").when(is_true("again"))],
    )


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_on_enter_fires_once_per_activation_not_again_on_a_gate_flicker(
    mode: str, sigs: Signals
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source()
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(gated_flow(Resolver.fetch("work", source), mode))
        await clock.advance(0)
        assert runner.active_steps == []
        assert source.calls == 0

        state.set("open", True)
        await clock.advance(0)
        assert runner.active_steps == ["a"]
        assert source.calls == 1

        for _ in range(3):  # the gate flickers: the step is left and re-entered, not re-armed
            state.set("open", False)
            assert runner.verdict("a") is Verdict.PENDING
            state.set("open", True)
            assert runner.active_steps == ["a"]
            await clock.advance(0)
        assert source.calls == 1
        assert sigs.steps("gated", "entered") == ["a"]
        conversation.take_deliveries()


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_reset_re_opens_the_step_and_fires_its_on_enter_again(
    mode: str, sigs: Signals
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source()
    async with Session(state, clock=clock) as session:
        runner = (gated_flow(Resolver.fetch("work", source), mode)).start(session)
        state.set("open", True)
        state.set("a:done", True)
        await clock.advance(0)
        assert runner.active_steps == ["b"]
        assert source.calls == 1

        state.set("a:done", False)  # done stays done ...
        assert runner.active_steps == ["b"]
        state.set("again", True)  # ... until a reset re-opens it
        await clock.advance(0)
        assert runner.active_steps == ["a"]
        assert runner.done_steps == []
        assert source.calls == 2
        assert sigs.steps("gated", "entered") == ["a", "b", "a"]
        assert sigs.steps("gated", "reset") == ["a", "b"]  # b, after a, re-opens with it

        state.set("again", True)  # no edge: nothing fires
        state.set("again", False)
        await clock.advance(0)
        assert source.calls == 2
        state.set("again", True)  # a second rising edge: the active step re-opens and re-arms
        await clock.advance(0)
        assert source.calls == 3
        assert sigs.steps("gated", "reset") == ["a", "b", "a"]


@pytest.mark.anyio
async def test_a_reset_re_arms_on_enter_of_the_steps_after_the_reset_one() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    slot_source = Source({"open": True})
    flow = Flow(
        "rebook",
        [
            Step("slot", done=captured("booking:time")),
            Step(
                "check",
                after=["slot"],
                done=eq("availability:result.time", "ok"),
                on_enter=run(Resolver.fetch("availability", slot_source)),
            ),
        ],
        constraints=[reset("slot").when(is_true("caller:changed_mind"))],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        state.set("booking:time", "19:00")
        await clock.advance(0)
        assert runner.active_steps == ["check"]
        assert slot_source.calls == 1

        state.remove("booking:time")
        state.set("caller:changed_mind", True)
        assert runner.active_steps == ["slot"]
        assert runner.verdict("check") is Verdict.PENDING
        state.set("booking:time", "19:30")
        await clock.advance(0)
        assert runner.active_steps == ["check"]
        assert slot_source.calls == 2  # re-armed with the step it follows


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_step_already_done_when_reached_is_not_entered_and_runs_nothing(
    mode: str, sigs: Signals
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source()
    lookup = Resolver.fetch("availability", source)
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(lookup_flow(lookup, mode))
        state.set("availability:result", {"open": True})  # known before the step is reached
        state.set("go", True)
        await runner.on_turn()
        await clock.advance(0)
        assert runner.active_steps == ["answer"]
        assert runner.done_steps == ["ask", "lookup"]
        assert source.calls == 0
        assert state.get("availability:status") is None
        assert sigs.steps("lookup", "entered") == ["ask", "answer"]
        assert sigs.steps("lookup", "done") == ["ask", "lookup"]
        assert conversation.take_deliveries() == []


@pytest.mark.anyio
async def test_a_first_step_done_when_the_flow_starts_runs_nothing(sigs: Signals) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("load:result", "cached")
    source = Source()
    flow = Flow(
        "warm",
        [
            Step("load", done=resolved("load"), on_enter=run(Resolver.fetch("load", source))),
            Step("next", after=["load"], done=is_true("x")),
        ],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        await clock.advance(0)
        assert runner.active_steps == ["next"]
        assert source.calls == 0
        assert sigs.steps("warm", "entered") == ["next"]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_failing_resolver_writes_its_error_and_the_flow_branches_on_failed(
    mode: str,
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source(fail=ConnectionError("booking system down"), clock=clock, delay=1)
    lookup = Resolver.fetch("availability", source)
    flow = Flow(
        "branch",
        [
            Step("ask", done=is_true("go")),
            Step(
                "check",
                after=["ask"],
                done=any_(resolved("availability"), failed("availability")),
                on_enter=run(lookup, mode),  # type: ignore[arg-type]
            ),
            Step(
                "confirm",
                after=[edge("check", when=resolved("availability"))],
                done=is_true("confirmed"),
                posture="Confirm the booking.",
            ),
            Step(
                "apologise",
                after=[edge("check", when=failed("availability"))],
                terminal=True,
                posture="Apologise and offer a call back.",
            ),
        ],
    )
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(flow)
        state.set("go", True)
        await clock.advance(1)
        await runner.on_turn()
        assert state.get("availability:status") == "error"
        assert "booking system down" in state.get("availability:error")
        assert "availability:result" not in state
        assert runner.done_steps == ["ask", "check", "apologise"]
        assert runner.verdict("confirm") is Verdict.SKIPPED
        assert runner.is_complete
        deliveries = conversation.take_deliveries()
        if mode == "background":
            assert [(d.status, d.error) for d in deliveries] == [
                ("error", state.get("availability:error"))
            ]
        else:
            assert deliveries == []


@pytest.mark.anyio
async def test_a_step_entered_by_a_sources_own_write_starts_its_action_unfenced() -> None:
    """A source writing its own progress key enters a step whose on_enter starts another
    resolver: that run writes its keys as itself, not fenced in as the first source."""
    clock = ManualClock()
    state = State(clock=clock)

    async def first(state: State) -> str:
        state.set("first:stage", "half")  # its own key: allowed by its fence
        await clock.sleep(1)
        return "first done"

    second = Source("second done")
    flow = Flow(
        "nested",
        [
            Step("one", done=resolved("first"), on_enter=run(Resolver.fetch("first", first))),
            Step(
                "two",
                gate=eq("first:stage", "half"),
                done=resolved("second"),
                on_enter=run(Resolver.fetch("second", second)),
            ),
        ],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        await clock.advance(0)
        assert second.calls == 1
        assert state.get("second:result") == "second done"
        provenance = state.provenance("second:result")
        assert provenance is not None
        assert (provenance.source, provenance.writer) == ("fetch", "second")
        assert runner.done_steps == ["two"]
        assert runner.active_steps == ["one"]
        await clock.advance(1)
        assert runner.is_complete


@pytest.mark.anyio
async def test_an_on_enter_dispatch_the_session_refuses_is_logged_and_the_flow_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source({"open": True}, clock=clock, delay=1)
    lookup = Resolver.fetch("availability", source, on_conflict="reject")
    after = Source("noted")
    flow = Flow(
        "refused",
        [
            Step("ask", done=is_true("go")),
            Step("check", after=["ask"], done=resolved("availability"), on_enter=run(lookup)),
            Step(
                "note",
                after=["check"],
                done=resolved("note"),
                on_enter=run(Resolver.fetch("note", after)),
            ),
        ],
    )
    caplog.set_level(logging.ERROR, logger="slateflow.flow")
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        session.dispatch(lookup)  # already running when the step is entered
        state.set("go", True)  # the on_enter dispatch is refused: logged, not raised
        assert runner.active_steps == ["check"]
        refusals = [r for r in caplog.records if r.name == "slateflow.flow"]
        assert len(refusals) == 1
        assert "could not start resolver 'availability'" in refusals[0].getMessage()
        assert refusals[0].exc_info is not None
        assert refusals[0].exc_info[0] is DispatchRejectedError

        await clock.advance(1)  # the run that was already going completes the step
        assert source.calls == 1
        assert runner.active_steps == []
        assert runner.is_complete  # the next step's on_enter ran as usual
        assert after.calls == 1


# -- a property: on_enter runs exactly once per entry ---------------------------------------------


def activation_model(ops: list[tuple[str, bool]]) -> tuple[list[str], list[str], int, int]:
    """The spec's semantics for ``gated_flow`` plus a step ``b`` with its own on_enter: returns
    (active, done, entries of a, entries of b)."""
    keys = {"open": False, "a:done": False, "b:done": False, "again": False}
    done = {"a": False, "b": False}
    active = {"a": False, "b": False}
    entered = {"a": False, "b": False}
    entries = {"a": 0, "b": 0}

    def settle() -> None:
        for step in ("a", "b"):  # b depends only on a: one pass in flow order is a fixed point
            eligible = keys["open"] if step == "a" else done["a"]
            finished = keys[f"{step}:done"]
            if done[step]:
                continue
            if eligible:
                if finished:
                    done[step] = True
                    active[step] = False
                elif not active[step]:
                    active[step] = True
                    if not entered[step]:
                        entered[step] = True
                        entries[step] += 1
            else:
                active[step] = False

    for key, value in ops:
        rising = key == "again" and value and not keys["again"]
        keys[key] = value
        if rising:
            for step in ("a", "b"):  # b is after a: it re-opens with it
                done[step] = active[step] = entered[step] = False
        settle()
    order = ("a", "b")
    return (
        [s for s in order if active[s]],
        [s for s in order if done[s]],
        entries["a"],
        entries["b"],
    )


activation_ops = st.lists(
    st.tuples(st.sampled_from(["open", "a:done", "b:done", "again"]), st.booleans()),
    max_size=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(activation_ops)
@example([("open", True), ("open", False), ("open", True)])  # a gate flicker
@example([("open", True), ("a:done", True), ("a:done", False), ("again", True)])  # a reset
@example([("open", True), ("a:done", True), ("again", True)])  # reset, done guard still holds
@example([("b:done", True), ("open", True), ("a:done", True)])  # b done before it is reached
def test_on_enter_runs_exactly_once_per_entry_whatever_the_writes(
    ops: list[tuple[str, bool]],
) -> None:
    active, done_, entries_a, entries_b = activation_model(ops)
    for backend in ("asyncio", "trio"):
        recorder = Signals()
        try:

            async def body(recorder: Signals = recorder) -> None:
                clock = ManualClock()
                state = State(clock=clock)
                source_a, source_b = Source(), Source()
                flow = Flow(
                    "prop",
                    [
                        Step(
                            "a",
                            gate=is_true("open"),
                            done=is_true("a:done"),
                            on_enter=run(Resolver.fetch("work_a", source_a)),
                        ),
                        Step(
                            "b",
                            after=["a"],
                            done=is_true("b:done"),
                            on_enter=run(Resolver.fetch("work_b", source_b), "call"),
                        ),
                    ],
                    constraints=[reset("a").when(is_true("again"))],
                )
                async with Session(state, clock=clock) as session:
                    runner = flow.start(session)
                    for key, value in ops:
                        state.set(key, value)
                        await clock.advance(0)
                    assert runner.active_steps == active
                    assert runner.done_steps == done_
                    assert (source_a.calls, source_b.calls) == (entries_a, entries_b)
                    entered = recorder.steps("prop", "entered")
                    assert (entered.count("a"), entered.count("b")) == (entries_a, entries_b)

            anyio.run(body, backend=backend)
        finally:
            recorder.close()


# -- writes from other threads --------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_step_advanced_from_another_thread_fires_on_enter_on_the_sessions_loop(
    mode: str, sigs: Signals
) -> None:
    loop_thread = threading.get_ident()
    clock = ManualClock()
    state = State(clock=clock)
    source = Source("ok")
    writer_threads: list[int] = []

    def write_from_a_thread() -> None:
        writer_threads.append(threading.get_ident())
        state.set("go", True)

    async with Session(state, clock=clock) as session:
        conversation = Conversation(session)
        runner = conversation.run_flow(lookup_flow(Resolver.fetch("lookup", source), mode))
        await anyio.to_thread.run_sync(write_from_a_thread)
        assert writer_threads[0] != loop_thread
        with anyio.fail_after(SAFETY):
            assert await runner.wait_for_step("answer") is Verdict.ACTIVE
        assert source.threads == [loop_thread]  # the action ran on the session's loop
        # The flow latched (and sent its signal) in the writer's thread.
        assert sigs.threads("lookup", "entered", "lookup") == writer_threads
        assert runner.done_steps == ["ask", "lookup"]
        assert len(conversation.take_deliveries()) == (1 if mode == "background" else 0)


@pytest.mark.anyio
async def test_writes_from_many_threads_each_fire_their_steps_action_once() -> None:
    loop_thread = threading.get_ident()
    clock = ManualClock()
    state = State(clock=clock)
    n = 8
    sources = [Source(i) for i in range(n)]
    flow = Flow(
        "fanout",
        [
            *(
                Step(
                    f"s{i}",
                    gate=is_true(f"go:{i}"),
                    done=resolved(f"r{i}"),
                    on_enter=run(Resolver.fetch(f"r{i}", sources[i])),
                )
                for i in range(n)
            ),
            Step("end", after=[f"s{i}" for i in range(n)], terminal=True),
        ],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)

        def go(i: int) -> None:
            state.set(f"go:{i}", True)

        await anyio.to_thread.run_sync(run_threads, go, n)
        with anyio.fail_after(SAFETY):
            await runner.wait_complete()
        assert [s.calls for s in sources] == [1] * n
        assert all(s.threads == [loop_thread] for s in sources)
        assert state.get("flow:fanout:done") == [*(f"s{i}" for i in range(n)), "end"]


@pytest.mark.anyio
async def test_a_waiter_is_woken_by_a_write_from_another_thread() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    flow = Flow("t", [Step("a", done=is_true("x")), Step("b", after=["a"], done=is_true("y"))])
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        waiting = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting, lambda: runner.wait_for_step("b"))
            await clock.advance(0)
            assert not waiting.finished
            await anyio.to_thread.run_sync(state.set, "x", True)
            with anyio.fail_after(SAFETY):
                await runner.wait_for_step("b")  # this one returns at once: b is active
                while not waiting.finished:
                    await anyio.lowlevel.checkpoint()
        assert waiting.result is Verdict.ACTIVE


# -- waiting --------------------------------------------------------------------------------------


def two_steps() -> Flow:
    return Flow(
        "wait",
        [
            Step("a", done=is_true("x"), posture="Ask for x."),
            Step("b", after=["a"], done=is_true("y")),
        ],
    )


@pytest.mark.anyio
async def test_waits_return_at_once_when_the_step_is_already_reached() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        runner = two_steps().start(session)
        # A zero timeout on the manual clock expires at once: returning proves no wait.
        assert await runner.wait_for_step("a", timeout=0) is Verdict.ACTIVE
        state.set("x", True)
        assert await runner.wait_for_step("a", timeout=0) is Verdict.DONE
        assert await runner.wait_for_step("b") is Verdict.ACTIVE
        state.set("y", True)
        await runner.wait_complete(timeout=0)
        assert clock.pending == 0


@pytest.mark.anyio
async def test_waits_wake_when_the_step_is_reached_later() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        runner = two_steps().start(session)
        for_b = Waiting()
        passed_through = Waiting()
        complete = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(for_b, lambda: runner.wait_for_step("b", timeout=60))
            tg.start_soon(complete, runner.wait_complete)
            await clock.advance(30)
            assert not for_b.finished
            assert not complete.finished
            state.set("x", True)
            await clock.advance(0)
            assert for_b.finished
            assert for_b.result is Verdict.ACTIVE
            assert not complete.finished

            state.set("y", True)
            await clock.advance(0)
            assert complete.finished
            assert complete.result is None
        assert clock.pending == 0  # the 60 s deadline was dropped with the wait

    # A step passed straight through to done wakes its waiter with DONE.
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        runner = two_steps().start(session)
        async with anyio.create_task_group() as tg:
            tg.start_soon(passed_through, lambda: runner.wait_for_step("b"))
            await clock.advance(0)
            state.update({"x": True, "y": True})
            await clock.advance(0)
            assert passed_through.finished
        assert passed_through.result is Verdict.DONE


@pytest.mark.anyio
async def test_a_wait_times_out_on_the_session_clock_with_the_explanation() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        runner = two_steps().start(session)
        waiting = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting, lambda: runner.wait_for_step("b", timeout=5))
            await clock.advance(4.999)
            assert not waiting.finished  # real time does not count, only the session clock
            await clock.advance(0.001)
            assert waiting.finished
        error = waiting.result
        assert isinstance(error, WaitTimeoutError)
        assert isinstance(error, TimeoutError)
        message = str(error)
        assert "step 'b' to be reached" in message
        assert "5" in message.splitlines()[0]
        assert str(runner.explain()) in message
        assert "'x' must be true" in message  # what the active step waits for

        complete = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(complete, lambda: runner.wait_complete(timeout=1))
            await clock.advance(1)
            assert complete.finished
        assert isinstance(complete.result, WaitTimeoutError)
        assert "the flow to complete" in str(complete.result)
        assert str(runner.explain()) in str(complete.result)
        assert runner.active_steps == ["a"]  # a timed-out wait leaves the flow alone


@pytest.mark.anyio
async def test_closing_the_runner_wakes_its_waiters_with_flow_error() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        runner = two_steps().start(session)
        for_b = Waiting()
        complete = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(for_b, lambda: runner.wait_for_step("b", timeout=100))
            tg.start_soon(complete, runner.wait_complete)
            await clock.advance(0)
            runner.close()
            await clock.advance(0)
            assert for_b.finished
            assert complete.finished
        for error in (for_b.result, complete.result):
            assert isinstance(error, FlowError)
            assert "closed" in str(error)
        assert runner.closed

        # Waiting on a closed runner: FlowError at once, unless already reached.
        with pytest.raises(FlowError, match="closed"):
            await runner.wait_for_step("b")
        assert await runner.wait_for_step("a") is Verdict.ACTIVE


@pytest.mark.anyio
async def test_waiting_for_an_unknown_step_names_the_steps() -> None:
    clock = ManualClock()
    async with Session(State(clock=clock), clock=clock) as session:
        runner = two_steps().start(session)
        with pytest.raises(FlowError, match="no step 'c'; its steps: a, b"):
            await runner.wait_for_step("c")


@pytest.mark.anyio
async def test_session_exit_closes_its_runners_and_wakes_their_waiters() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    waiting = Waiting()
    async with anyio.create_task_group() as tg:
        async with Session(state, clock=clock) as session:
            runner = two_steps().start(session)
            tg.start_soon(waiting, runner.wait_complete)
            await clock.advance(0)
            assert not runner.closed
        await clock.advance(0)
        assert waiting.finished  # woken by the session's exit
    assert runner.closed
    assert isinstance(waiting.result, FlowError)

    before = state.snapshot()
    state.set("x", True)  # a closed runner does not advance
    assert runner.active_steps == ["a"]
    assert runner.done_steps == []
    assert state.get("flow:wait:active") == ["a"]
    assert {k: v for k, v in state.snapshot().items() if k.startswith("flow:")} == {
        k: v for k, v in before.items() if k.startswith("flow:")
    }
    with pytest.raises(FlowError, match="closed"):
        runner.advance()
    with pytest.raises(FlowError, match="closed"):
        runner.on_tool_ok("book")
    with pytest.raises(FlowError, match="closed"):
        await runner.on_turn()

    # The name is free again: a new session runs the flow afresh on the same State.
    async with Session(state, clock=clock) as session:
        again = two_steps().start(session)
        assert again.active_steps == ["b"]


@pytest.mark.anyio
async def test_session_exit_stops_on_enter_actions_of_its_runners() -> None:
    """After the session, a write that would enter a step with on_enter starts nothing."""
    clock = ManualClock()
    state = State(clock=clock)
    source = Source()
    async with Session(state, clock=clock) as session:
        runner = (lookup_flow(Resolver.fetch("lookup", source), "dispatch")).start(session)
    state.set("go", True)
    assert runner.active_steps == ["ask"]
    assert source.calls == 0
    assert state.get("lookup:status") is None


# -- flow.start(session) ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_run_flow_compiles_the_flow_and_reports_every_problem() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    broken = Flow(
        "broken",
        [
            Step("a", done=is_true("x")),
            Step("b", after=["nowhere"], done=is_true("y")),
            Step("c", after=["a"]),  # not terminal and no done guard
        ],
    )
    async with Session(state, clock=clock) as session:
        with pytest.raises(FlowDefinitionError) as caught:
            broken.start(session)
        problems = caught.value.problems
        assert len(problems) == 2  # every problem at once
        assert any("unknown step 'nowhere'" in p for p in problems)
        assert any("step 'c' has no done guard" in p for p in problems)
        assert "flow:broken:active" not in state  # nothing started

        fixed = Flow(
            "broken",
            [
                Step("a", done=is_true("x")),
                Step("b", after=["a"], gate=is_true("never"), done=is_true("y")),
                Step("c", after=[edge("b", when=is_true("z"))], done=is_true("w")),
            ],
            constraints=[commit("pay", until=is_true("ok")), require("c")],
        )
        runner = fixed.start(session)  # a valid flow of the same name still starts
        assert runner.active_steps == ["a"]


@pytest.mark.anyio
async def test_run_flow_reports_a_commit_guarded_by_an_always_true_guard() -> None:
    clock = ManualClock()
    flow = Flow(
        "commit",
        [Step("a", done=is_true("x"))],
        constraints=[commit("book", until=always())],
    )
    async with Session(State(clock=clock), clock=clock) as session:
        with pytest.raises(FlowDefinitionError, match="book"):
            flow.start(session)


@pytest.mark.anyio
async def test_a_flow_refuses_to_start_outside_an_open_session() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    session = Session(state, clock=clock)
    with pytest.raises(SessionError, match="not open"):
        two_steps().start(session)
    async with session:
        pass
    with pytest.raises(SessionError, match="not open"):
        two_steps().start(session)
    assert "flow:wait:active" not in state


@pytest.mark.anyio
async def test_a_flow_refuses_to_start_from_another_thread() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        with pytest.raises(SessionError, match="thread"):
            await anyio.to_thread.run_sync(two_steps().start, session)
        assert "flow:wait:active" not in state
        two_steps().start(session)  # the refusal left nothing registered


def test_a_runner_without_a_session_refuses_a_flow_with_on_enter() -> None:
    state = State()
    flow = lookup_flow(Resolver.fetch("lookup", Source()), "dispatch")
    with pytest.raises(FlowError, match=r"step 'lookup' has an on_enter.*flow\.start\(session\)"):
        FlowRunner(flow, state)
    assert "flow:lookup:active" not in state
    plain = Flow("lookup", [Step("ask", done=is_true("go"))])
    with FlowRunner(plain, state) as runner:  # the name was not taken by the refusal
        assert runner.active_steps == ["ask"]


@pytest.mark.anyio
@pytest.mark.parametrize("enforcement", ["observe", Enforcement.OBSERVE])
async def test_observe_enforcement_through_run_flow_admits_and_records(
    enforcement: str,
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    flow = Flow(
        "shop",
        [
            Step("browse", done=is_true("cart:ready"), allow=["search"], posture="Help them."),
            Step("pay", after=["browse"], done=called_ok("charge"), allow=["charge"]),
        ],
        constraints=[commit("charge", until=is_true("cart:confirmed"))],
    )
    async with Session(state, clock=clock) as session:
        runner = flow.start(session, enforcement=enforcement)
        assert runner.enforcement is Enforcement.OBSERVE
        admission = runner.admit("charge")
        assert admission.allowed
        assert admission.violation
        assert "'cart:confirmed' must be true" in admission.reason
        assert [(v.tool, v.active) for v in runner.violations] == [("charge", ("browse",))]
        ok = runner.admit("search")
        assert ok.allowed
        assert not ok.violation
        assert len(runner.violations) == 1


@pytest.mark.anyio
async def test_run_flow_enforces_by_default() -> None:
    clock = ManualClock()
    flow = Flow(
        "shop",
        [Step("browse", done=is_true("cart:ready"), allow=["search"])],
    )
    async with Session(State(clock=clock), clock=clock) as session:
        runner = flow.start(session)
        assert runner.enforcement is Enforcement.ENFORCE
        refusal = runner.admit("charge")
        assert not refusal.allowed
        assert not refusal.violation
        assert runner.violations == []


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["strict", "", None, 1])
async def test_run_flow_with_a_bad_enforcement_raises_flow_error(bad: Any) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        with pytest.raises(FlowError, match="enforcement must be 'enforce' or 'observe'"):
            two_steps().start(session, enforcement=bad)
        assert "flow:wait:active" not in state
        two_steps().start(session)  # the name was not taken


@pytest.mark.anyio
async def test_one_runner_per_flow_name_per_state() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        first = two_steps().start(session)
        with pytest.raises(FlowError, match="already running"):
            two_steps().start(session)
        first.close()
        second = two_steps().start(session)
        state.set("x", True)
        assert second.active_steps == ["b"]
        assert first.active_steps == ["a"]
        # Another State is another namespace.
        other = State(clock=clock)
        async with Session(other, clock=clock) as elsewhere:
            assert two_steps().start(elsewhere).active_steps == ["a"]


# -- several flows on one State -------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("b_first", [False, True], ids=["A_then_B", "B_then_A"])
async def test_one_flows_on_enter_result_advances_another_flow(b_first: bool) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source({"open": True}, clock=clock, delay=1)
    lookup = Resolver.fetch("lookup", source)
    flow_a = Flow(
        "A",
        [
            Step("fetch", done=resolved("lookup"), on_enter=run(lookup)),
            Step("confirm", after=["fetch"], done=is_true("a:confirmed")),
            Step("end", after=["confirm"], terminal=True),
        ],
    )
    flow_b = Flow(
        "B",
        [
            Step("have_lookup", done=resolved("lookup")),
            Step(
                "after_a",
                after=["have_lookup"],
                gate=is_true("flow:A:complete"),
                done=is_true("b:finished"),
            ),
        ],
    )
    async with Session(state, clock=clock) as session:
        if b_first:
            runner_b = flow_b.start(session)
            runner_a = flow_a.start(session)
        else:
            runner_a = flow_a.start(session)
            runner_b = flow_b.start(session)
        assert runner_b.active_steps == ["have_lookup"]
        assert state.get("flow:A:complete") is False

        await clock.advance(1)  # A's on_enter result lands: it completes B's first step
        assert runner_a.active_steps == ["confirm"]
        assert runner_b.done_steps == ["have_lookup"]
        assert runner_b.active_steps == []  # gated on A being complete
        assert "flow:A:complete" in str(runner_b.explain())

        state.set("a:confirmed", True)
        assert runner_a.is_complete
        assert state.get("flow:A:complete") is True
        provenance = state.provenance("flow:A:complete")
        assert provenance is not None
        assert (provenance.source, provenance.writer) == ("flow", "A")
        assert runner_b.active_steps == ["after_a"]

        state.set("b:finished", True)
        assert runner_b.is_complete
        assert state.get("flow:B:done") == ["have_lookup", "after_a"]
        assert source.calls == 1


# -- the worked example: a voice booking ----------------------------------------------------------


def availability(clock: ManualClock, calls: list[str]) -> Resolver:
    """The booking system: 19:00 is taken (19:30 is free), anything else is open; it answers in
    0.4 s on the manual clock."""

    async def check(state: State) -> dict[str, Any]:
        wanted = state["booking:time"]
        calls.append(wanted)
        await clock.sleep(0.4)
        if wanted == "19:00":
            return {"open": False, "alternative": "19:30"}
        return {"open": True}

    return Resolver.fetch("availability", check, reads=["booking:date", "booking:time"])


def booking_flow(lookup: Resolver) -> Flow:
    """The flow of ``examples/voice_booking_flow.py`` over ``lookup``, with ``small_talk`` as a
    tool the agent has beside the flow's."""
    flow: Flow = example_module("voice_booking_flow").booking_flow(lookup)
    return flow.compile(tools=["book_table", "transfer_to_human", "small_talk"])


@pytest.mark.anyio
async def test_voice_booking_with_the_time_taken_offers_another_and_books_once(
    sigs: Signals,
) -> None:
    clock = ManualClock()
    state = State(clock=clock)
    asked: list[str] = []
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(booking_flow(availability(clock, asked)))

        # Turn 1: nothing known yet.
        assert runner.active_steps == ["slot"]
        assert list(runner.brief().postures) == ["Ask which day and time the caller would like."]
        assert list(runner.brief().grounds) == ["Known so far: date not yet, time not yet."]
        refusal = runner.admit("book_table")
        assert not refusal
        assert refusal.reason.startswith("'book_table' is not permitted yet: first, ")
        assert "'booking:confirmed' must be true" in refusal.reason
        assert "Available now: transfer_to_human." in refusal.reason
        assert refusal.reason.endswith("Ask which day and time the caller would like.")
        assert not runner.admit("small_talk")  # a step without allow admits only ambient tools
        assert list(runner.brief().unmet) == ["book"]

        # Turn 2: the date alone does not finish the slot.
        state.set("booking:date", "Saturday", source="extraction", writer="slots")
        await runner.on_turn()
        assert runner.active_steps == ["slot"]
        assert list(runner.brief().grounds) == ["Known so far: date Saturday, time not yet."]
        assert asked == []

        # Turn 3: the time arrives; the lookup starts in the background.
        state.set("booking:time", "19:00", source="extraction", writer="slots")
        assert runner.active_steps == ["check"]
        assert list(runner.brief().postures) == [
            "Say you are checking the book; keep the caller company meanwhile."
        ]
        assert state.get("availability:status") == "running"
        await runner.on_turn()  # a background lookup does not hold up the turn
        assert conversation.take_deliveries() == []
        assert not runner.admit("book_table")

        # The booking system answers 0.4 s later: the time is taken.
        await clock.advance(0.39)
        assert runner.active_steps == ["check"]
        await clock.advance(0.01)
        assert await runner.wait_for_step("offer", timeout=0) is Verdict.ACTIVE
        assert list(runner.brief().postures) == [
            "That time is taken: offer the alternative and ask if it suits."
        ]
        assert list(runner.brief().grounds) == ["Alternative on offer: 19:30."]
        delivered = conversation.take_deliveries()
        assert [(d.value, d.scheduling) for d in delivered] == [
            ({"open": False, "alternative": "19:30"}, Scheduling.WHEN_IDLE)
        ]
        assert runner.verdict("confirm") is Verdict.PENDING

        # The caller takes the alternative.
        state.update({"booking:time": "19:30", "booking:alternative_accepted": True})
        assert runner.active_steps == ["confirm"]
        assert list(runner.brief().grounds) == ["Booking: Saturday at 19:30."]
        assert "'booking:confirmed' must be true" in runner.admit("book_table").reason
        assert asked == ["19:00"]  # the lookup ran once; the new time needs no second check

        # The caller confirms: the booking tool is admitted, and only it (plus ambient).
        state.set("booking:confirmed", True, source="extraction", writer="yes_no")
        assert runner.active_steps == ["book"]
        assert list(runner.brief().postures) == ["Book the table now."]
        assert runner.admit("book_table")
        assert runner.admit("transfer_to_human")  # ambient
        off_topic = runner.admit("small_talk")
        assert not off_topic
        assert "not part of the current step ('book')" in off_topic.reason
        assert "Available now: book_table, transfer_to_human." in off_topic.reason

        runner.on_tool_ok("book_table")
        assert runner.is_complete
        assert runner.done_steps == ["slot", "check", "offer", "confirm", "book", "goodbye"]
        assert runner.active_steps == []
        again = runner.admit("book_table")  # committed once: a second booking is refused
        assert not again
        assert again.reason == (
            "'book_table' has already run and may run only once in this conversation. "
            "Do not call it again."
        )
        await runner.wait_complete(timeout=0)
        assert state.get("flow:booking:complete") is True
        assert sigs.steps("booking", "complete") == [None]
        assert sigs.steps("booking", "entered") == ["slot", "check", "offer", "confirm", "book"]


@pytest.mark.anyio
async def test_voice_booking_with_the_time_open_confirms_and_skips_the_offer() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    asked: list[str] = []
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(booking_flow(availability(clock, asked)))
        state.update({"booking:date": "Friday", "booking:time": "18:00"})
        assert runner.active_steps == ["check"]
        await clock.advance(0.4)
        assert runner.active_steps == ["confirm"]
        # Not skipped yet: nothing after it is done.
        assert runner.verdict("offer") is Verdict.PENDING
        assert list(runner.brief().grounds) == ["Booking: Friday at 18:00."]
        assert conversation.take_deliveries()[0].value == {"open": True}

        state.set("booking:confirmed", True)
        assert runner.verdict("offer") is Verdict.SKIPPED  # confirm, after it, is done
        assert runner.admit("book_table")
        runner.on_tool_ok("book_table")
        assert runner.is_complete
        assert not runner.admit("book_table")  # commit is once plus never-until
        assert list(runner.brief().unmet) == []
        assert asked == ["18:00"]


@pytest.mark.anyio
async def test_voice_booking_a_caller_changing_the_slot_rechecks_availability() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    asked: list[str] = []
    lookup = availability(clock, asked)
    base = booking_flow(lookup)
    flow = Flow(
        "booking",
        list(base.steps),
        constraints=[*base.constraints, reset("slot").when(is_true("caller:changed_mind"))],
        ambient=list(base.ambient),
    )
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(flow)
        state.update({"booking:date": "Friday", "booking:time": "18:00"})
        await clock.advance(0.4)
        assert runner.active_steps == ["confirm"]
        conversation.take_deliveries()

        # The caller changes their mind: the slot re-opens, the old answer is stale.
        state.update(
            {"caller:changed_mind": True},
            remove=["booking:time", "availability:result"],
        )
        assert runner.active_steps == ["slot"]
        state.set("booking:time", "19:00")
        assert runner.active_steps == ["check"]
        await clock.advance(0.4)
        assert runner.active_steps == ["offer"]
        assert asked == ["18:00", "19:00"]
        assert [d.value for d in conversation.take_deliveries()] == [
            {"open": False, "alternative": "19:30"}
        ]


# -- pytest-asyncio (strict mode) ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_asyncio_dispatch_on_enter_completes_the_step_and_wakes_a_waiter() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source({"open": True}, clock=clock, delay=1)
    async with Session(state, clock=clock) as session:
        runner = (lookup_flow(Resolver.fetch("availability", source), "dispatch")).start(session)
        waiting = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting, lambda: runner.wait_for_step("answer", timeout=10))
            state.set("go", True)
            await clock.advance(0.5)
            assert not waiting.finished
            await clock.advance(0.5)
            assert waiting.finished
        assert waiting.result is Verdict.ACTIVE
        assert state.get("availability:result") == {"open": True}
        assert source.calls == 1


@pytest.mark.asyncio
async def test_asyncio_call_on_enter_is_awaited_by_on_turn() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source("Tuesday")
    async with Session(state, clock=clock) as session:
        runner = (lookup_flow(Resolver.fetch("calendar", source), "call")).start(session)
        state.set("go", True)
        await runner.on_turn()
        assert runner.active_steps == ["answer"]
        assert source.calls == 1


@pytest.mark.asyncio
async def test_asyncio_background_on_enter_and_a_timed_out_wait() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    source = Source({"open": True}, clock=clock, delay=2)
    async with conversation_on(state, clock) as conversation:
        runner = conversation.run_flow(
            lookup_flow(Resolver.fetch("availability", source), "background")
        )
        state.set("go", True)
        waiting = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting, lambda: runner.wait_for_step("answer", timeout=1))
            await clock.advance(1)
            assert waiting.finished
        assert isinstance(waiting.result, WaitTimeoutError)
        assert "step 'lookup' waits for" in str(waiting.result)
        await clock.advance(1)
        assert [d.value for d in conversation.take_deliveries()] == [{"open": True}]
        assert runner.active_steps == ["answer"]


@pytest.mark.asyncio
async def test_asyncio_a_thread_write_fires_on_enter_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    clock = ManualClock()
    state = State(clock=clock)
    source = Source("ok")
    async with Session(state, clock=clock) as session:
        runner = (lookup_flow(Resolver.fetch("lookup", source), "dispatch")).start(session)
        await anyio.to_thread.run_sync(state.set, "go", True)
        with anyio.fail_after(SAFETY):
            await runner.wait_for_step("answer")
        assert source.threads == [loop_thread]


# -- found while writing these tests (fixed) ----------------------------------------------


@pytest.mark.anyio
async def test_a_gate_flicker_does_not_make_a_waiter_report_a_closed_runner() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    flow = Flow("flicker", [Step("a", gate=is_true("g"), done=is_true("d"))])
    async with Session(state, clock=clock) as session:
        runner = flow.start(session)
        waiting = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting, lambda: runner.wait_for_step("a"))
            await clock.advance(0)
            state.set("g", True)  # reached: the waiter is woken ...
            state.set("g", False)  # ... and left again before the waiter runs
            await clock.advance(0)
            assert not runner.closed
            state.set("g", True)
            await clock.advance(0)
            tg.cancel_scope.cancel()
        # Keep waiting (and return once reached again) or return a verdict at the wake-up;
        # never claim that the open runner was closed.
        assert isinstance(waiting.result, Verdict)


@pytest.mark.anyio
async def test_session_exit_cancels_a_call_mode_on_enter_still_running() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    lookup = Resolver.fetch("slow", Source("late", clock=clock, delay=60))
    flow = Flow("slow", [Step("a", done=resolved("slow"), on_enter=run(lookup, "call"))])
    leave = anyio.Event()
    exited = anyio.Event()

    async def body() -> None:
        async with Session(state, clock=clock) as session:
            flow.start(session)
            await leave.wait()
        exited.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await clock.advance(0)
        assert state.get("slow:status") == "running"
        leave.set()
        await clock.advance(0)  # every task has run until it blocks: the block should be over
        left = exited.is_set()
        tg.cancel_scope.cancel()  # clean up if it hung
    assert left
    assert state.get("slow:status") == "cancelled"


@pytest.mark.anyio
async def test_a_nan_timeout_is_refused() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        runner = two_steps().start(session)
        waiting = Waiting()
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting, lambda: runner.wait_for_step("b", timeout=float("nan")))
            for _ in range(10):  # not clock.advance(): that is what never returns
                await anyio.lowlevel.checkpoint()
            refused = waiting.finished
            tg.cancel_scope.cancel()
        assert refused  # refused at once, like any other bad argument
        assert isinstance(waiting.result, ValueError | FlowError)
