"""FlowStack: a main flow plus digressions that take the floor and hand it back.

Real calls leave the main task for a moment (a side question, a cancel, a hand-off) and expect
to come back to it. ``FlowStack(main, [Digression("faq", when=is_true("intent:faq"),
flow=faq)])`` runs like a flow: ``stack.start(session)`` returns a :class:`StackRunner`. At
each turn, if no digression is active, the first whose trigger holds takes the floor: the main
flow is suspended untouched and the digression's own flow drives the turn. When it completes, it
stays the speaking layer for that turn (its closing words are said), and at the next turn the
main flow continues as its ``then`` says: ``"previous"`` (where it was), ``"restart"`` (from
its start, keeping the State) or ``"terminate"`` (the conversation is over: nothing is
governed any more and every tool is refused with the reason).

Digressions are one level deep: while one is active no other triggers. The stack publishes
``flow:overlay`` (the active digression's name, or None) and ``flow:terminated``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import FlowError, SlateError
from ..resolve.clock import SYSTEM_CLOCK, Clock
from ..state import Change, State
from . import signals
from .admission import Admission, Enforcement, Violation
from .brief import Brief, TellMarker
from .digressions import Digression, FlowStack
from .explain import FlowExplanation
from .machine import Verdict
from .runner import FlowRunner
from .waits import Waits

if TYPE_CHECKING:
    from ..resolve.background import Deliver
    from ..resolve.session import Session

__all__ = ["OVERLAY_KEY", "OVER_KEY", "TERMINATED_KEY", "StackRunner"]

log = logging.getLogger("slateflow.flow")

OVERLAY_KEY = "flow:overlay"
"""The active digression's name, or None while the main flow drives."""
TERMINATED_KEY = "flow:terminated"
"""True once a ``then="terminate"`` digression ended the conversation."""
OVER_KEY = "flow:over"
"""True once the conversation ended (terminated, or the main flow complete) and its closing
words were handed to the model: a voice adapter hangs up on it."""


class StackRunner:
    """A running :class:`FlowStack`: a conversation sees it as it sees a ``FlowRunner``.

    ``current`` is the runner speaking now (the active digression's, else the main one);
    ``admit``, ``brief``, ``explain`` and the rest ask it. ``main`` keeps the main flow's
    runner, whose marking is untouched while a digression has the floor. ``tools`` are the
    agent's tools besides the flows' own (a refusal while a digression speaks lists those
    available); ``deliver`` receives every layer's background outcomes (see ``FlowRunner``).
    """

    def __init__(
        self,
        stack: FlowStack,
        state: State,
        *,
        session: Session | None = None,
        enforcement: Enforcement | str = Enforcement.ENFORCE,
        deliver: Deliver | None = None,
        tools: Iterable[str] = (),
    ) -> None:
        if not isinstance(stack, FlowStack):
            raise TypeError(f"StackRunner needs a FlowStack, got {type(stack).__name__}")
        stack.compile(stack.main.registry)
        if session is None:
            for d in stack.digressions:
                for step in d.flow.steps:
                    if step.on_enter is not None:
                        raise FlowError(
                            f"digression {d.name!r}: step {step.id!r} has an on_enter action, "
                            "which needs a session to run in; start the stack with "
                            "stack.start(session)"
                        )
        self.stack = stack
        self.state = state
        self.session = session
        self.enforcement = Enforcement(enforcement)
        self.tools = tuple(dict.fromkeys([tools] if isinstance(tools, str) else tools))
        self._deliver = deliver
        self.name = stack.main.name
        self.main = FlowRunner(
            stack.main, state, session=session, enforcement=enforcement, deliver=deliver
        )
        self.main.announces_over = False  # the stack says when the call is over
        self._active: tuple[Digression, FlowRunner] | None = None
        # The turn whose context says a completed digression's closing words (None: none).
        self._closing_turn: int | None = None
        self._closing_told = False  # its closing words reached the model (it may leave)
        # The untold closing words of a digression another one displaced: said with its lines.
        self._carry: Brief | None = None
        self._driving = False  # in on_turn or on_tool_ok, which check the closing themselves
        self.terminated: str | None = None
        """The digression that ended the conversation, once one has."""
        self._over = False
        self.history: list[tuple[int, str, str]] = []
        """``(turn, digression, "entered" | "resumed" | "restarted" | "terminated")``, in order."""
        self.turns = 0
        self._closed = False
        self._unregister: Callable[[], None] | None = None  # from session.on_close
        self._waits = Waits(self.name, threading.RLock(), lambda: self._closed, self.explain)
        # Waiters wake on any layer's progress and on the stack's own keys.
        names = [flow.name for flow in stack.flows]
        watched = [f"flow:{n}:{k}" for n in names for k in ("active", "done", "complete")]
        watched += [OVERLAY_KEY, TERMINATED_KEY, OVER_KEY]
        self._sub = state.subscribe(self._progressed, keys=watched)
        self._publish()
        if session is not None:
            self._unregister = session.on_close(self.close)

    # -- the layers -------------------------------------------------------------------------

    @property
    def current(self) -> FlowRunner:
        """The runner that drives now: the active digression's, else the main flow's."""
        return self._active[1] if self._active is not None else self.main

    @property
    def overlay(self) -> str | None:
        """The active digression's name, or None."""
        return self._active[0].name if self._active is not None else None

    @property
    def is_terminated(self) -> bool:
        """Whether a ``terminate`` digression ended the conversation."""
        return self.terminated is not None

    @property
    def is_complete(self) -> bool:
        """Whether the conversation is finished: terminated, or the main flow complete with no
        digression active."""
        return self.terminated is not None or (self._active is None and self.main.is_complete)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def _progressed(self, changes: tuple[Change, ...]) -> None:
        if self._waits.waiters:
            self._waits.wake()

    def _publish(self) -> None:
        try:
            self.state.update(
                {
                    OVERLAY_KEY: self.overlay,
                    TERMINATED_KEY: self.terminated is not None,
                    OVER_KEY: self._over,
                },
                source="flow",
                writer=self.name,
            )
        except SlateError as exc:
            log.error("flow stack %r: its keys could not be written: %s", self.name, exc)
        if self._waits.waiters:
            self._waits.wake()

    # -- waiting -----------------------------------------------------------------------------

    async def wait_for_step(
        self, step: str, timeout: float | None = None, *, flow: str | None = None
    ) -> Verdict:
        """Wait until ``step`` is reached (active or done) and return its verdict, as
        ``FlowRunner.wait_for_step`` does.

        ``flow`` names the main flow or a digression's flow (by the digression's or the flow's
        name); without it the step is looked up in the main flow, then in the digressions.
        Raises :class:`WaitTimeoutError` after ``timeout`` seconds on the session's clock.
        """
        name = self._flow_of(step, flow)
        if name == self.stack.main.name:
            return await self.main.wait_for_step(step, timeout)
        state = self.state

        def reached() -> bool:
            return step in _ids(state, f"flow:{name}:active") or step in _ids(
                state, f"flow:{name}:done"
            )

        where = f"step {step!r} of digression flow {name!r} to be reached"
        await self._waits.until(reached, timeout, where, self._clock())
        done = step in _ids(state, f"flow:{name}:done")
        return Verdict.DONE if done else Verdict.ACTIVE

    async def wait_complete(self, timeout: float | None = None) -> None:
        """Wait until the conversation is finished (:attr:`is_complete`: terminated, or the
        main flow complete with no digression active); raises :class:`WaitTimeoutError` after
        ``timeout`` seconds on the session's clock."""
        what = "the flow stack to complete"
        await self._waits.until(lambda: self.is_complete, timeout, what, self._clock())

    def _clock(self) -> Clock:
        return self.session.clock if self.session is not None else SYSTEM_CLOCK

    def _flow_of(self, step: str, flow: str | None) -> str:
        """The name of the flow holding ``step`` (see :meth:`wait_for_step`)."""
        layers = [(self.stack.main.name, self.stack.main)]
        layers += [(d.name, d.flow) for d in self.stack.digressions]
        for label, f in layers:
            if flow is not None and flow not in (label, f.name):
                continue
            if any(s.id == step for s in f.steps):
                return f.name
        where = f"flow {flow!r}" if flow is not None else "the main flow or any digression"
        if flow is not None and all(flow not in (label, f.name) for label, f in layers):
            where = f"no flow or digression named {flow!r} in this stack"
            raise FlowError(f"flow stack {self.name!r}: {where}")
        raise FlowError(f"flow stack {self.name!r}: {where} has no step {step!r}")

    # -- turns --------------------------------------------------------------------------------

    def _triggered(self) -> Digression | None:
        marking = self.main.marking
        for d in self.stack.digressions:
            try:
                if d.when.evaluate(self.state, marking):
                    return d
            except Exception:
                log.exception("flow stack %r: the trigger of %r raised", self.name, d.name)
        return None

    def begin_turn(self) -> None:
        """A user turn starts (before its extraction): steps entered from now on are entered
        on this turn, which does not count as a turn stuck on them."""
        self.main.begin_turn()
        if self._active is not None:
            self._active[1].begin_turn()

    def abort_turn(self) -> None:
        """The turn begun was cancelled or failed before it was counted: no layer counts it."""
        self.main.abort_turn()
        if self._active is not None:
            self._active[1].abort_turn()

    def _told(self, inner: TellMarker | None) -> TellMarker | None:
        """The speaking layer's marker, which once the conversation has ended (and its closing
        context reaches the model) also makes the call over."""
        if self._carry is not None:
            inner = self._carried_marker(inner)
        if self._closing_turn is not None and not self._closing_told and inner is not None:
            inner = self._closing_marker(inner)
        if not self._ending() or self._over:
            return inner

        def told_and_over(turn: int) -> None:
            if inner is not None:
                inner(turn)
            self._mark_over()

        return told_and_over

    def _carried_marker(self, inner: TellMarker | None) -> TellMarker:
        def told(turn: int) -> None:
            if inner is not None:
                inner(turn)
            self._carry = None

        return told

    def _ending(self) -> bool:
        return self.terminated is not None or (self._active is None and self.main.is_complete)

    def _closing_marker(self, inner: TellMarker) -> TellMarker:
        """A completed digression's marker, which also notes that its closing words were told:
        it keeps the floor until they are (a dropped context must not lose the answer)."""

        def told(turn: int) -> None:
            inner(turn)
            self._closing_told = True

        return told

    @property
    def ambient(self) -> frozenset[str]:
        """The main flow's ambient tools (see ``FlowRunner.ambient``)."""
        return self.main.ambient

    @property
    def is_over(self) -> bool:
        """Whether the conversation ended and its closing words were handed to the model
        (``flow:over``, ``signals.flow_over``): hang up then, not when it is merely
        terminated, or the goodbye is cut off."""
        return self._over

    def _mark_over(self) -> None:
        if self._over or self._closed:
            return
        self._over = True
        self._publish()
        if signals.flow_over.receivers:
            for receiver in signals.flow_over.receivers_for(self):
                try:
                    receiver(self, flow=self.name)
                except Exception:
                    log.exception("flow stack %r: a flow_over receiver failed", self.name)

    async def on_turn(self) -> None:
        """A turn ended: close a digression that completed last turn (resuming the main flow
        as it says), then advance the digression that has the floor, or start one whose
        trigger holds, or advance the main flow."""
        self._check_open()
        self._driving = True
        try:
            await self._turn()
        finally:
            self._driving = False
        # A digression that completed stays the speaking layer for this turn, so its closing
        # words are said; the main flow takes over at the next turn.
        self._check_closing()
        self._publish()

    async def _turn(self) -> None:
        self.turns += 1
        closing = self._closing_turn
        if self._active is not None and closing is not None and self.turns > closing:
            if self._closing_told:
                self._leave()
            elif (d := self._triggered()) is not None and d is not self._active[0]:
                # Another question came before this answer was told: both are said now.
                self._carry = self._active[1].brief()
                self._leave()
        if self.terminated is not None:
            return
        if self._active is not None:
            await self._active[1].on_turn()
        else:
            d = self._triggered()
            if d is None:
                await self.main.on_turn()
            else:
                # Built before the main flow is suspended: if it cannot start (a flow of that
                # name already runs on the State), the main flow goes on as it was.
                # A digression starts afresh each time (resume=False): on a durable State the
                # marking its last run left must not complete it at once.
                runner = FlowRunner(
                    d.flow,
                    self.state,
                    session=self.session,
                    enforcement=self.enforcement,
                    resume=False,
                    deliver=self._deliver,
                )
                runner.entered_this_turn()
                runner.announces_over = False
                self.main.pause()
                self._active = (d, runner)
                # Completed between turns by a write (a background result, a webhook): noticed
                # at once, so a terminating one refuses tools before the next turn.
                signals.flow_completed.connect(self._digression_completed, sender=runner)
                self.history.append((self.turns, d.name, "entered"))
                await runner.on_turn()

    def _check_closing(self, *, between_turns: bool = False) -> None:
        """Note a digression that completed: it speaks its closing words on this turn (or, when
        it completed between turns, on the next one), and one that terminates ends the
        conversation at once (no tool may run while they are said)."""
        active = self._active
        if active is None or not active[1].is_complete:
            self._closing_turn = None
            return
        if self._closing_turn is None:
            self._closing_turn = self.turns + (1 if between_turns else 0)
            # Run by a session, the conversation tells the model and says so; nothing to say
            # (no speaking step), or driven by hand: nothing to wait for before it leaves.
            self._closing_told = self.session is None or active[1].brief().told is None
        if (
            self._active is not None
            and self._active[0].then == "terminate"
            and self.terminated is None
        ):
            self.terminated = self._active[0].name
            self.history.append((self.turns, self.terminated, "terminated"))

    def _digression_completed(self, runner: FlowRunner, **_: Any) -> None:
        if self._active is not None and self._active[1] is runner and not self._driving:
            # During a turn (its extractors wrote) the turn is not counted yet: it says them.
            self._check_closing(between_turns=True)
            self._publish()

    def _leave(self) -> None:
        assert self._active is not None
        d, runner = self._active
        self._active = None
        self._closing_turn = None
        signals.flow_completed.disconnect(self._digression_completed, sender=runner)
        runner.close()
        if d.then == "terminate":
            pass  # terminated on the turn it completed
        elif d.then == "restart":
            self.main.restart()
            self.history.append((self.turns, d.name, "restarted"))
        else:
            self.main.unpause()
            self.history.append((self.turns, d.name, "resumed"))

    def on_tool_ok(self, tool: str) -> None:
        """A tool succeeded: count it in the layer that has the floor, and in the suspended
        main flow too (its ``once`` holds across digressions); nothing once terminated."""
        self._check_open()
        if self.terminated is None:
            self._driving = True
            try:
                self.current.on_tool_ok(tool)
            finally:
                self._driving = False
            if self._active is not None:
                self.main.on_tool_ok(tool)
                self._check_closing()  # a tool may complete (and so end) the digression
                self._publish()

    def advance(self) -> None:
        """Re-evaluate the guards of the layer that has the floor."""
        self._check_open()
        if self.terminated is None:
            self.current.advance()

    # -- what the model is told ------------------------------------------------------------

    def _ended(self) -> str:
        return f"The conversation has ended: digression '{self.terminated}' terminated it."

    def _silent(self) -> bool:
        # Terminated, and the closing words of the digression that ended it were said.
        return self.terminated is not None and self._active is None

    def brief(self, tools: Iterable[str] = ()) -> Brief:
        """What the stack says now: the speaking layer's brief (see ``FlowRunner.brief``),
        with every tool the main flow or a digression knows. Once terminated only the closing
        turn's postures, grounds and timing are said, nothing is unmet or reprompted, and every
        tool is refused with the reason (read ``main.brief()`` for what the call never
        finished)."""
        asked = tuple(dict.fromkeys([*tools, *self.tools]))
        known = tuple(dict.fromkeys([*asked, *self._known_tools()]))
        if self._silent():
            inner = Brief()
        else:
            inner = self.current.brief(known)
            if self.terminated is not None:
                # The closing turn: its words and timing are said; nothing is unmet or reprompted.
                inner = Brief(inner.postures, inner.grounds, timing=inner.timing, told=inner.told)
        carry = self._carry
        if carry is not None:
            inner = replace(
                inner,
                postures=carry.postures + inner.postures,
                grounds=carry.grounds + inner.grounds,
            )
        refused: dict[str, str] = {}
        if self.enforcement is Enforcement.ENFORCE:
            for tool in known:
                admission = self.admit(tool, record=False)
                if not admission.allowed:
                    refused[tool] = admission.reason
        return Brief(
            inner.postures,
            inner.grounds,
            inner.reprompts,
            inner.unmet,
            known,
            refused,
            inner.timing,
            self._told(inner.told),
            self._ending() and not self._over,
        )

    @property
    def active_steps(self) -> list[str]:
        """The speaking layer's active steps; none once terminated."""
        return [] if self.terminated is not None else self.current.active_steps

    def _known_tools(self) -> list[str]:
        """Every tool the main flow or a digression knows."""
        found = dict.fromkeys(self.main.rules.plan.universe)
        for d in self.stack.digressions:
            found.update(dict.fromkeys(sorted(set(d.flow.tools()) | (d.flow.registry or set()))))
        return list(found)

    def admit(self, tool: str, *, record: bool = True) -> Admission:
        """May the model call ``tool`` now? The speaking layer decides, and while a digression
        has the floor the main flow's ``once``, ``never`` and ``commit`` constraints still
        bind; once terminated, every tool is refused with the reason. ``record`` as in
        ``FlowRunner.admit`` (observe-mode breaches go to ``main.violations``)."""
        once = tool in self.main.rules.plan.once
        if self.terminated is not None:
            if self.enforcement is Enforcement.OBSERVE:
                # Admitted, and audited like any other breach.
                if record:
                    self.main.violations.append(Violation(tool, self._ended(), ()))
                return Admission(tool, True, self._ended(), violation=True, once=once)
            return Admission(tool, False, self._ended(), once=once)
        current = self.current
        if current is not self.main and current.is_complete:
            # A digression speaking its closing words has handed the floor back: the main
            # flow's step decides (a complete flow would refuse everything but its ambient).
            current = self.main
        admission = current.admit(tool, record=record)
        once = once or admission.once
        if admission.allowed and not admission.violation and self._active is not None:
            binding = self._binding(tool)
            if binding is not None:
                if self.enforcement is Enforcement.OBSERVE:
                    if record:
                        active = tuple(self.current.active_steps)
                        self.main.violations.append(Violation(tool, binding, active))
                    return Admission(tool, True, binding, violation=True, once=once)
                return Admission(tool, False, binding, once=once)
        if once != admission.once:
            return Admission(tool, admission.allowed, admission.reason, admission.violation, once)
        return admission

    def _binding(self, tool: str) -> str | None:
        """Why the suspended main flow's constraints refuse ``tool`` while a digression speaks:
        told in the digression's words (its tools and posture), since the model follows it."""
        denial = self.main.rules.constraint_denial(tool)
        if denial is None:
            return None
        candidates = dict.fromkeys([*self.tools, *self._known_tools()])
        available = [
            t
            for t in candidates
            if not self.current.admit(t, record=False).reason
            and self.main.rules.constraint_denial(t) is None
        ]
        return self.current.rules.reason(tool, *denial, available)

    def explain(self) -> FlowExplanation:
        """The speaking layer's explanation; once terminated, the truth of it: no step active,
        every tool refused with the reason, nothing unmet any more."""
        if self.terminated is None:
            return self.current.explain()
        ended = self._ended()
        return FlowExplanation(
            self.name,
            tuple(self.active_steps),
            tuple(self.main.done_steps),
            True,
            blocked_tools=dict.fromkeys(self._known_tools(), ended),
            terminated=self.terminated,
        )

    def verdict(self, step: str) -> Verdict:
        """Where a step of the speaking layer stands."""
        return self.current.verdict(step)

    # -- lifecycle ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise FlowError(f"flow stack {self.name!r} is closed; start it again")

    def close(self) -> None:
        """Stop every layer (the session does this when it ends)."""
        if self._closed:
            return
        self._closed = True
        if self._active is not None:
            self._active[1].close()
        self.main.close()
        self._sub.close()
        self._waits.close()
        if self._unregister is not None:
            self._unregister()

    def __enter__(self) -> StackRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"in {self.overlay!r}" if self.overlay else "main"
        if self.terminated:
            where = f"terminated by {self.terminated!r}"
        return f"<StackRunner {self.name!r} {where}>"


def _ids(state: State, key: str) -> list[str]:
    value = state.get(key, [])
    return value if isinstance(value, list) else []
