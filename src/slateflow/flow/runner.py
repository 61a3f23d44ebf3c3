"""The FlowRunner: advances a flow the moment its guards hold, whoever wrote the keys they read.

The runner glues a flow's parts to a State and, when it has one, a Session. It is a receiver of
the State's change signal for exactly the keys its guards read; every input (a change, a tool
success, a turn, a told posture) goes through one place, :meth:`FlowRunner._apply`, which feeds
the flow's :class:`~slateflow.flow.machine.Machine` under the runner's lock, latches it in the
writer's thread, records the progress it made (:mod:`~slateflow.flow.progress`), and then
publishes it: step signals, ``on_enter`` actions (:mod:`~slateflow.flow.actions`), waiters,
the progress keys. Tool admission is :mod:`~slateflow.flow.admission`; what the flow says at a
turn is one :class:`~slateflow.flow.brief.Brief`.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import FlowError, SlateError
from ..resolve.clock import SYSTEM_CLOCK, Clock
from ..resolve.freshness import fresh_for
from ..state import Change, State
from . import signals
from .actions import Actions, check_actions, send
from .admission import Admission, Enforcement, ToolRules, Violation
from .brief import Brief, TellMarker, merge_timing, reprompt_text
from .compiled import compiled
from .definition import Flow
from .explain import FlowExplanation, explain
from .ground import Ground, check_grounds
from .guard_base import Marking
from .machine import Event, Machine, Verdict, evaluating
from .progress import Progress
from .timing import VoiceTiming
from .waits import Waiter, Waits

if TYPE_CHECKING:
    from ..resolve.background import Deliver
    from ..resolve.session import Session

__all__ = ["FlowRunner"]

log = logging.getLogger("slateflow.flow")

# The runners on each State by flow name. Weak both ways: the State holds its runners (through
# their subscriptions), so a strong value here would keep every State alive forever.
_running: weakref.WeakKeyDictionary[State, dict[str, weakref.ref[FlowRunner]]] = (
    weakref.WeakKeyDictionary()
)
_running_lock = threading.Lock()

_SIGNALS = {
    "enter": signals.step_entered,
    "done": signals.step_done,
    "reset": signals.step_reset,
}


class FlowRunner:
    """Runs one flow over a State: latches steps, publishes progress, answers tool admission.

    ``flow.start(session)`` (or a conversation's ``run_flow``) makes one that fires ``on_enter``
    actions in the session and closes with it; ``FlowRunner(flow, state)`` runs a flow with no
    ``on_enter`` and no session. Writes from any thread advance it (in that thread); its
    queries are safe from any thread. One runner per flow name per State at a time.
    ``deliver`` receives the outcomes of ``background`` actions that name no ``deliver`` of
    their own (a conversation passes its own, so they reach the model).

    Keys it writes (source ``"flow"``, writer the flow's name): ``flow:{name}:active`` and
    ``flow:{name}:done`` (step ids, in flow order) and ``flow:{name}:complete``; on a State with
    a store also ``flow:{name}:marking``, which a runner started later on a recovered State
    resumes from (``resume=False`` starts over instead, as a digression entered again does).
    """

    def __init__(
        self,
        flow: Flow,
        state: State,
        *,
        session: Session | None = None,
        enforcement: Enforcement | str = Enforcement.ENFORCE,
        resume: bool = True,
        deliver: Deliver | None = None,
    ) -> None:
        if not isinstance(flow, Flow):
            raise TypeError(f"FlowRunner needs a Flow, got {type(flow).__name__}")
        if not isinstance(state, State):
            raise TypeError(f"FlowRunner needs a State, got {type(state).__name__}")
        try:
            self.enforcement = Enforcement(enforcement)
        except ValueError:
            raise FlowError(
                f"flow {flow.name!r}: enforcement must be 'enforce' or 'observe', "
                f"got {enforcement!r}"
            ) from None
        flow.compile(flow.registry)
        check_grounds(flow, state)
        check_actions(flow, session)
        if session is not None:
            session.runtime.check()
        self.flow = flow
        self.state = state
        self.session = session
        self.name = flow.name
        self._lock = threading.RLock()
        self._closed = False
        self._paused = False
        self._plan = plan = compiled(flow)

        self._machine = machine = Machine(plan, evaluating(state))
        self._progress = Progress(machine, state)
        self.rules = ToolRules(plan, machine, state, self._lock)
        """The flow's tool rules, read by the layer above (a ``FlowStack``); use :meth:`admit`."""
        self._actions = Actions(flow.name, flow.steps, session, deliver)
        self._waits = Waits(flow.name, self._lock, lambda: self._closed, self.explain)
        self._fresh_alarm: Waiter | None = None
        self._unregister: Callable[[], None] | None = None  # from session.on_close
        self.violations: list[Violation] = []
        """Tool calls admitted in observe mode that the flow would have refused."""
        self.turns = 0
        """How many times :meth:`on_turn` ran."""
        self._turn_open = False  # begin_turn ran and on_turn has not finished
        # A FlowStack's layers leave "the call is over" to the stack.
        self.announces_over = True
        with _running_lock:
            mine = _running.setdefault(state, {})
            ref = mine.get(flow.name)
            other = ref() if ref is not None else None
            if other is not None and not other._closed:
                raise FlowError(
                    f"a flow named {flow.name!r} is already running on this State; close it "
                    "(runner.close()) or give this flow another name"
                )
            mine[flow.name] = weakref.ref(self)
        watched = plan.watched
        # No keys at all must not mean every key: subscribe only when a guard reads one.
        self._sub = state.subscribe(self._changed, keys=watched) if watched else None
        try:
            with self._lock, state.engine.context.outside_transaction():
                resumed = resume and self._progress.resume()
                machine.start()
                machine.starting = True
                events = self._transition()
                again = self._progress.interrupted(session) if resumed else []
            self._publish(events)
            for i in again:
                self._actions.fire(i)
        except BaseException:
            self.close()  # unsubscribe and free the flow's name
            raise
        if session is not None:
            self._unregister = session.on_close(self.close)
            if plan.fresh_names:
                session.runtime.soon(session.runtime.spawn, self._watch_freshness)

    # -- the one place a transition is applied -----------------------------------------------

    def _apply(
        self,
        feed: Callable[..., object] | None,
        args: tuple[Any, ...] = (),
        quiet: bool = False,
        while_paused: bool = True,
    ) -> None:
        """Feed the machine an input (``feed(*args)``), latch it (unless paused), record and
        publish the result, under the lock and against the committed State (a transaction's
        writes are not facts yet). ``quiet``: a closed runner ignores the input;
        ``while_paused=False``: a paused one does too (it catches up when unpaused), else it
        takes it in without latching. Positional on the hot path: keywords cost a change
        about a tenth of a microsecond each."""
        context = self.state.engine.context
        lock = self._lock
        lock.acquire()  # a third of a with-block's cost: this runs on every change
        try:
            if self._closed:
                if quiet:
                    return
                self._check_open()
            if self._paused and not while_paused:
                return
            if context.tx_open:
                with context.outside_transaction():
                    events = self._transition(feed, args)
            else:
                events = self._transition(feed, args)
        finally:
            lock.release()
        self._publish(events)

    def _transition(
        self, feed: Callable[..., object] | None = None, args: tuple[Any, ...] = ()
    ) -> list[Event]:
        """Under the lock: feed, latch and commit the progress keys (delivered by _publish)."""
        m = self._machine
        if feed is not None:
            feed(*args)
        events = [] if self._paused else m.latch()
        while m.clearing:
            # A reset with clear=...: remove its keys, then decide the re-opened steps on
            # the State without them.
            patterns, m.clearing = m.clearing, []
            m.changed(self._progress.clear(patterns))
            events += m.latch()
        if events and self._progress.durable:
            self._progress.note(events)
        if m.dirty:
            self._progress.write()
        return events

    def _publish(self, events: list[Event]) -> None:
        """Send the signals, start on_enter actions, wake waiters, deliver the progress keys.

        The keys were committed under the runner's lock, right after the latching (so two
        threads never write them out of order), but are delivered only now, after the signals:
        a receiver reacting to them starts its own latching once this one is fully told.
        """
        steps = self.flow.steps
        for kind, i in events:
            signal = _SIGNALS.get(kind)
            if signal is not None and signal.receivers:
                send(signal, self, self.name, step=steps[i].id)
            if kind == "enter" and steps[i].on_enter is not None:
                self._actions.fire(i)
            elif kind == "complete" and signals.flow_completed.receivers:
                send(signals.flow_completed, self, self.name)
        if self._waits.waiters:
            self._waits.wake()
        engine = self.state.engine
        if engine.delivery.pending:
            engine.deliver()
        if self._plan.repairs:
            with self._lock:
                wanted = self._machine.repair_keys()
            self._progress.show_repair(wanted)
        if events and signals.steps_changed.receivers:
            told = self._machine.told
            since = min(
                (told[i] for kind, i in events if kind in ("enter", "active") and i in told),
                default=None,
            )
            if since is not None or self._plan.timed:
                send(signals.steps_changed, self, self.name, since=since, timed=self._plan.timed)

    # -- inputs ------------------------------------------------------------------------------

    def _changed(self, changes: tuple[Change, ...]) -> None:
        plan = self._plan
        alarm = self._fresh_alarm
        if alarm is not None and any(c.key in plan.fresh_keys for c in changes):
            alarm.wake()  # a new result: a new moment it goes stale
        keys = (changes[0].key,) if len(changes) == 1 else [c.key for c in changes]
        self._apply(self._machine.changed, (keys,), True, False)

    def advance(self) -> None:
        """Re-evaluate every guard now (for guards over time, such as ``fresh``, or custom
        guards reading something other than the State)."""
        self._apply(self._machine.start)

    async def _watch_freshness(self) -> None:
        """Move the flow the moment a result its ``fresh`` guards read goes stale, on the
        session's clock (a step waiting on freshness does not wait for the next turn)."""
        clock, state = self._clock(), self.state
        while not self._closed:
            alarm = self._fresh_alarm = Waiter(lambda: True)
            delays = [d for n in self._plan.fresh_names if (d := fresh_for(state, n))]
            if delays:
                with clock.deadline(min(delays)):
                    await alarm.event.wait()
            else:
                await alarm.event.wait()
            if self._closed:
                return
            self._apply(self._machine.start, (), True, False)

    def on_tool_ok(self, tool: str) -> None:
        """Tool ``tool`` completed successfully: count it (``called_ok``, ``once``) and advance."""
        if type(tool) is not str or not tool:
            raise FlowError(f"flow {self.name!r}: on_tool_ok takes a tool name, got {tool!r}")
        self._apply(self._machine.tool_ok, (tool,))

    def begin_turn(self) -> None:
        """A user turn starts (a conversation calls this before its extractors run): a step
        the turn's words make active is entered on this turn, which repair does not count as a
        turn the caller was stuck on it."""
        with self._lock:
            self._machine.begin_turn()
            self._turn_open = True

    def abort_turn(self) -> None:
        """The turn begun was cancelled or failed before :meth:`on_turn` finished: it is not
        counted (a later turn takes its number)."""
        with self._lock:
            if self._turn_open:
                self._turn_open = False
                self._machine.abort_turn()

    async def on_turn(self) -> None:
        """A conversation turn ended: re-evaluate every guard, then wait for ``on_enter``
        actions in call mode (started by this turn or before) to finish, re-advancing on their
        results."""
        self.advance()
        if self._actions.lane is not None:
            await self._actions.idle()
        if self._plan.repairs:
            self._apply(self._machine.count_turn)
        self.turns += 1
        self._turn_open = False

    def entered_this_turn(self) -> None:
        """Count the steps active now as entered on the current turn (a digression started by
        this turn's words): repair starts counting at the next turn."""
        with self._lock:
            self._machine.entered_this_turn()

    # -- pausing (FlowStack digressions) -----------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether the runner is paused (a digression has the floor): it ignores changes
        until :meth:`unpause`."""
        return self._paused

    def pause(self) -> None:
        """Stop reacting to changes; the marking stays exactly as it is."""
        self._set_paused(True)

    def unpause(self) -> None:
        """React again, first catching up on everything that changed while paused."""
        self._set_paused(False)
        self.advance()

    def restart(self) -> None:
        """Start the flow over against the current State: every step is re-opened (``on_enter``
        re-armed, tool counts and repair bookkeeping cleared); the State itself is kept, so
        facts already known complete their steps again at once."""
        self._set_paused(False)
        self._apply(self._machine.restart)

    def _set_paused(self, paused: bool) -> None:
        with self._lock:
            self._check_open()
            self._paused = paused

    # -- where the flow stands ---------------------------------------------------------------

    @property
    def active_steps(self) -> list[str]:
        """The ids of the active steps (reachable and not done), in flow order."""
        with self._lock:
            return list(self._machine.active_ids.ids)

    @property
    def done_steps(self) -> list[str]:
        """The ids of the done steps, in flow order."""
        with self._lock:
            return list(self._machine.done_ids.ids)

    @property
    def marking(self) -> Marking:
        """The done steps and the successful tool calls so far."""
        with self._lock:
            return self._machine.mark()

    @property
    def is_complete(self) -> bool:
        """Whether the flow is complete: every ``require``-d step done and, if the flow has
        terminal steps, one of them reached (with neither, every step done)."""
        return self._machine.complete

    @property
    def ambient(self) -> frozenset[str]:
        """The flow's ambient tools (admitted whatever step is active, even after the call is
        over: an escalation, an end-call tool)."""
        return frozenset(self.flow.ambient)

    @property
    def is_over(self) -> bool:
        """Whether the flow is complete and its closing words were handed to the model (the
        moment a call may end without cutting them off): ``flow:{name}:over``."""
        return self._machine.over

    @property
    def told_steps(self) -> list[str]:
        """The steps whose posture reached the model since they were last entered, in flow
        order (``flow:{name}:told``)."""
        with self._lock:
            return [self.flow.steps[i].id for i in sorted(self._machine.told)]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the runner no longer advances)."""
        return self._closed

    def verdict(self, step: str) -> Verdict:
        """Where ``step`` stands: pending, active, done or skipped."""
        i = self._index(step)
        with self._lock:
            return self._machine.verdict(i)

    def explain(self) -> FlowExplanation:
        """Where the flow is and why: what each active step waits for, what keeps the next
        steps from starting, which tools are allowed or refused (and why), what is unmet."""
        with self._lock, self.state.engine.context.outside_transaction():
            return explain(self._machine, self.rules, self.state)

    def _index(self, step: str) -> int:
        i = self._plan.ids.get(step) if isinstance(step, str) else None
        if i is None:
            raise FlowError(
                f"flow {self.name!r} has no step {step!r}; its steps: "
                + ", ".join(s.id for s in self.flow.steps)
            )
        return i

    def _check_open(self) -> None:
        if self._closed:
            raise FlowError(f"flow {self.name!r}: the runner is closed; start the flow again")

    # -- what the model is told --------------------------------------------------------------

    def brief(self, tools: Iterable[str] = ()) -> Brief:
        """What the flow says now (see :class:`~slateflow.flow.brief.Brief`): the speaking
        steps' postures, grounds (rendered from the State now) and reprompts, the unmet
        requirements, the tools it knows with ``tools`` and why each refused one is refused,
        the merged voice timing, and the marker recording the speaking steps as told."""
        plan, steps = self._plan, self.flow.steps
        with self._lock:
            m = self._machine
            speaking = m.speaking()
            reprompts = []
            for i in plan.repairs:
                if m.reprompt_due(i):
                    reprompts.append(reprompt_text(steps[i].timing))
            unmet = []
            for i in plan.required:
                if not m.done[i]:
                    unmet.append(steps[i].said_as)
            # The complete flow's closing words (a stack's layer never ends the call itself).
            closing = self.announces_over and m.complete and not m.active_ids.index
        postures: list[str] = []
        grounds: list[str] = []
        timings: list[VoiceTiming] = []
        indices: list[int] = []
        for rt in speaking:  # one pass: a turn's context is built from this
            step = rt.step
            indices.append(rt.index)
            if step.posture:
                postures.append(step.posture)
            if step.ground is not None:
                line = self._ground(step.ground)
                if line.strip():
                    grounds.append(line)
            if step.timing is not None:
                timings.append(step.timing)
        known = tuple(dict.fromkeys([*tools, *plan.universe]))
        refused: dict[str, str] = {}
        if self.enforcement is Enforcement.ENFORCE:
            refused = self.rules.refusals(known)
        told: TellMarker | None = None
        if indices:
            marked = tuple(indices)
            told = lambda turn: self._mark_told(marked, turn, closing)  # noqa: E731
        return Brief(
            tuple(postures),
            tuple(grounds),
            tuple(reprompts),
            tuple(unmet),
            known,
            refused,
            merge_timing(timings) if timings else None,
            told,
            closing and told is not None,
        )

    def _ground(self, ground: Ground) -> str:
        try:
            return ground.render(self.state)
        except SlateError as exc:
            # A key made secret after the flow started: the line is left out, not the turn.
            log.error("flow %r: a ground could not be rendered: %s", self.name, exc)
            return ""

    def _mark_told(self, steps: tuple[int, ...], turn: int, closing: bool = False) -> None:
        """Record ``steps`` as told at user turn ``turn`` (guards reading ``told`` re-evaluate);
        with ``closing`` (the complete flow's closing words) the flow is over."""
        was_over = self._machine.over
        self._apply(self._machine.tell, (steps, turn, closing), True)
        if self._machine.over and not was_over and signals.flow_over.receivers:
            send(signals.flow_over, self, self.name)

    # -- tools -------------------------------------------------------------------------------

    def admit(self, tool: str, *, record: bool = True) -> Admission:
        """May the model call ``tool`` now? The one way to ask, with the reason. Checked in
        order: ``once``, ``never``/``commit`` guards, an active step's ``deny``, ``ambient``,
        the active steps' ``allow`` lists.

        A refusal's reason tells the model what is missing and what it may call instead. In
        observe mode the call is admitted with ``violation=True`` and the would-be reason, and
        recorded in :attr:`violations` (``record=False``: a question, not a call, records
        nothing). ``admit(tool, record=False).reason`` is empty exactly when nothing stands in
        the way, in either mode.
        """
        if type(tool) is not str or not tool:
            raise FlowError(f"flow {self.name!r}: admit takes a tool name, got {tool!r}")
        once = tool in self._plan.once
        reason = self.rules.refusal(tool)
        if reason is None:
            return Admission(tool, True, once=once)
        if self.enforcement is Enforcement.ENFORCE:
            return Admission(tool, False, reason, once=once)
        if record:
            self.violations.append(Violation(tool, reason, tuple(self.active_steps)))
        return Admission(tool, True, reason, violation=True, once=once)

    # -- waiting -----------------------------------------------------------------------------

    async def wait_for_step(self, step: str, timeout: float | None = None) -> Verdict:
        """Wait until ``step`` is reached (active or done) and return its verdict.

        Raises :class:`WaitTimeoutError` after ``timeout`` seconds (on the session's clock, so
        a manual clock in tests) with the runner's explanation.
        """
        i = self._index(step)
        m = self._machine

        def reached() -> bool:
            return m.active[i] or m.done[i]

        await self._waits.until(reached, timeout, f"step {step!r} to be reached", self._clock())
        return self.verdict(step)

    async def wait_complete(self, timeout: float | None = None) -> None:
        """Wait until the flow is complete; raises :class:`WaitTimeoutError` after ``timeout``."""
        m = self._machine
        await self._waits.until(lambda: m.complete, timeout, "the flow to complete", self._clock())

    def _clock(self) -> Clock:
        return self.session.clock if self.session is not None else SYSTEM_CLOCK

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop advancing: unsubscribe from the State and drop queued call-mode actions (runs
        already started belong to the session). Queries keep answering from the last marking."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._actions.close()
        if self._sub is not None:
            self._sub.close()
        with _running_lock:
            mine = _running.get(self.state)
            ref = mine.get(self.name) if mine is not None else None
            if mine is not None and ref is not None and ref() is self:
                del mine[self.name]
        self._waits.close()
        if self._fresh_alarm is not None:
            self._fresh_alarm.wake()
        if self._unregister is not None:
            self._unregister()

    def __enter__(self) -> FlowRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        status = "closed" if self._closed else "complete" if self.is_complete else "running"
        active = ", ".join(self.active_steps) or "none"
        return f"<FlowRunner {self.name!r} {status}; active: {active}>"
