"""The FlowRunner: advances a flow the moment its guards hold, whoever wrote the keys they read.

The runner subscribes to the State for exactly the keys its guards read. A change re-evaluates
only the steps whose guards read a changed key (and, when a step is done, the steps that wait on
it), latching steps to a fixed point in the writer's thread. What changed is then published:
the ``flow:{name}:*`` keys, the blinker signals of :mod:`slateflow.flow.signals`, and each
entered step's ``on_enter`` action, started through the session on its event loop.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import logging
import math
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.lowlevel

from ..errors import FlowError, RecoveryError, SlateError, WaitTimeoutError
from ..resolve.background import BackgroundResult
from ..resolve.clock import SYSTEM_CLOCK, Clock, wait_on
from ..state import Change, Key, State
from ..state.provenance import Stamp
from ..state.values import Prefix
from . import signals
from .compiled import StepRt, compiled
from .definition import Flow
from .guards import (
    EMPTY_MARKING,
    Explanation,
    Guard,
    Marking,
)
from .repair import escalate_key, reprompt_key
from .steps import OnEnter
from .timing import DEFAULT_REPROMPT, VoiceTiming

if TYPE_CHECKING:
    from ..resolve.session import Session

__all__ = ["Admission", "Enforcement", "FlowExplanation", "FlowRunner", "Verdict", "Violation"]

log = logging.getLogger("slateflow.flow")


class Enforcement(StrEnum):
    """What the runner does with a tool call the flow does not admit."""

    ENFORCE = "enforce"
    """Refuse it: ``admit(tool).allowed`` is False, with the reason for the model."""
    OBSERVE = "observe"
    """Admit it, and record a :class:`Violation` (for audits and analytics)."""


class Verdict(StrEnum):
    """Where a step stands."""

    PENDING = "pending"
    """Not reachable yet."""
    ACTIVE = "active"
    """Reachable and not done: its posture, ground and tools apply."""
    DONE = "done"
    """Its done guard held while it was reachable (or it is a terminal step that was reached)."""
    SKIPPED = "skipped"
    """Never done, and the flow moved past it (a step after it is done, or the flow completed)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to ``runner.admit(tool)``; true when the call may go ahead.

    ``reason`` is empty for an admitted call; for a refused one it is written for the model
    (what is missing and what is available now). In observe mode a call the flow would refuse
    is admitted with ``violation=True`` and the would-be reason.
    """

    tool: str
    allowed: bool
    reason: str = ""
    violation: bool = False

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True, slots=True)
class Violation:
    """A tool call admitted in observe mode that the flow would have refused."""

    tool: str
    reason: str
    active: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FlowExplanation:
    """A snapshot of why the flow is where it is; ``str()`` gives a readable report.

    ``waiting`` maps each active step to what its ``done`` guard still needs, and each pending
    step that is next in line to what keeps it from starting; ``blocked_tools`` maps each
    refused tool to its reason.
    """

    flow: str
    active: tuple[str, ...]
    done: tuple[str, ...]
    complete: bool
    waiting: dict[str, Explanation] = field(default_factory=dict)
    allowed_tools: tuple[str, ...] = ()
    blocked_tools: dict[str, str] = field(default_factory=dict)
    unmet_requirements: tuple[str, ...] = ()
    terminated: str | None = None
    """The digression that ended the conversation (a ``FlowStack``), if one did."""

    def __str__(self) -> str:
        status = "complete" if self.complete else "not complete"
        if self.terminated is not None:
            status = f"terminated by digression {self.terminated!r}"
        lines = [
            f"flow {self.flow!r}: "
            + status
            + f"; active: {', '.join(self.active) or 'none'}"
            + f"; done: {', '.join(self.done) or 'none'}"
        ]
        for step, why in self.waiting.items():
            lines.append(f"step {step!r} waits for:")
            lines.extend(why.lines(1))
        if self.unmet_requirements:
            lines.append("unmet requirements: " + ", ".join(self.unmet_requirements))
        if self.allowed_tools or self.blocked_tools:
            lines.append("tools allowed: " + (", ".join(self.allowed_tools) or "none"))
        for tool, reason in self.blocked_tools.items():
            lines.append(f"tool {tool!r} refused: {reason}")
        return "\n".join(lines)


class _Ordered:
    """Step ids kept in flow order, updated one step at a time (publishing never rebuilds them).

    ``ids`` only ever grows in place: the State may hold a :class:`Prefix` of it (the versions of
    ``flow:{name}:done``), so any other change first replaces it by a copy.
    """

    __slots__ = ("ids", "index")

    def __init__(self) -> None:
        self.index: list[int] = []
        self.ids: list[str] = []

    def add(self, i: int, sid: str) -> None:
        index = self.index
        if not index or i > index[-1]:  # a flow mostly moves forward
            index.append(i)
            self.ids.append(sid)
            return
        at = bisect.bisect_left(index, i)
        index.insert(at, i)
        self.ids = self.ids.copy()
        self.ids.insert(at, sid)

    def discard(self, i: int) -> None:
        at = bisect.bisect_left(self.index, i)
        if at < len(self.index) and self.index[at] == i:
            del self.index[at]
            self.ids = self.ids.copy()
            del self.ids[at]

    def prefix(self) -> Prefix:
        """The ids as a value to store: O(1), sharing the list."""
        return Prefix(self.ids, len(self.ids))


class _Waiter:
    __slots__ = ("check", "event", "thread", "token")

    def __init__(self, check: Callable[[], bool]) -> None:
        self.check = check
        self.event = anyio.Event()
        self.token = anyio.lowlevel.current_token()
        self.thread = threading.get_ident()

    def wake(self) -> None:
        if threading.get_ident() == self.thread:
            self.event.set()
            return
        with contextlib.suppress(anyio.RunFinishedError, RuntimeError):
            self.token.backend_class.run_sync_soon(self.event.set, (), self.token.native_token)


# The runners on each State by flow name. Weak both ways: the State holds its runners (through
# their subscriptions), so a strong value here would keep every State alive forever.
_running: weakref.WeakKeyDictionary[State, dict[str, weakref.ref[FlowRunner]]] = (
    weakref.WeakKeyDictionary()
)
_running_lock = threading.Lock()
_NO_RESETS: set[int] = set()  # never added to: a flow without resets fires none


class FlowRunner:
    """Runs one flow over a State: latches steps, publishes progress, answers tool admission.

    Start one with ``session.run_flow(flow)`` (which also fires ``on_enter`` actions and closes
    it with the session), or ``FlowRunner(flow, state)`` for a flow with no ``on_enter``.
    Writes from any thread advance it (in that thread); its queries are safe from any thread.
    One runner per flow name per State at a time.

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
        # Only a policy can make a key secret: an ungoverned state has nothing to check.
        for s in flow.steps if state.engine.policy.active else ():
            shown = s.ground.shown_secrets(state) if s.ground is not None else []
            if shown:
                raise FlowError(
                    f"flow {flow.name!r}: step {s.id!r}'s ground shows {shown[0]!r}, a secret "
                    "key, to the model; test it instead ({" + shown[0] + "?known:unknown})"
                )
        if session is None:
            for s in flow.steps:
                if s.on_enter is not None:
                    raise FlowError(
                        f"flow {flow.name!r}: step {s.id!r} has an on_enter action, which needs "
                        "a session to run in; start the flow with session.run_flow(flow)"
                    )
        self.flow = flow
        self.state = state
        self.session = session
        self.name = flow.name
        self._lock = threading.RLock()
        self._closed = False
        self._starting = True
        self._compile(flow)
        n = len(flow.steps)
        self._done = [False] * n
        self._active = [False] * n
        self._entered = [False] * n
        self._tools_ok: dict[str, int] = {}
        self._marking: Marking | None = EMPTY_MARKING
        self._complete = False
        self._active_ids = _Ordered()
        self._done_ids = _Ordered()
        self._done_count = 0
        self._required_left = len(self._required)
        self._terminals_done = 0
        self._heap: list[int] = []
        self._queued = [False] * n
        self._dirty_resets: set[int] = set()
        # On a state with a store the runner also records its marking, to resume from it.
        self._durable = state.store is not None
        # Which flow keys to write next: 1 active, 2 done, 4 complete, 8 marking.
        self._keys_dirty = 15 if self._durable else 7
        # Per entered step with an on_enter action: the seq its resolver's status had then.
        self._fired: dict[int, int] = {}
        self._waiters: list[_Waiter] = []
        self._fresh_alarm: _Waiter | None = None
        self.violations: list[Violation] = []
        """Tool calls admitted in observe mode that the flow would have refused."""
        self.turns = 0
        """How many times :meth:`on_turn` ran."""
        self._suspended = False
        self._calls: list[OnEnter] = []
        self._lane: anyio.Event | None = None
        # Cancelled by close() (and so at session exit): a call-mode run must not keep the
        # session's block waiting.
        self._lane_scope: anyio.CancelScope | None = None
        self._stamp = Stamp("flow", flow.name, None, None)
        self._keys = tuple(
            f"flow:{flow.name}:{k}"
            for k in ("active", "done", "complete", "marking", "told", "over")
        )
        self._over = False  # complete, and its closing words were handed to the model
        # A FlowStack's layers leave "the call is over" to the stack.
        self._announces_over = True
        # Steps whose posture reached the model since they were entered: the user turn it was.
        self._told: dict[int, int] = {}
        self._turn_open = False  # begin_turn ran and on_turn has not finished
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
        watched = sorted(self._key_steps.keys() | self._key_resets.keys())
        # No keys at all must not mean every key: subscribe only when a guard reads one.
        self._sub = state.subscribe(self._changed, keys=watched) if watched else None
        try:
            with self._lock, self._committed():
                record = state.get(self._keys[3]) if self._durable and resume else None
                if record is not None:
                    self._restore(record, state.get(self._keys[1], []))
                    told = state.get(self._keys[4], [])
                    if isinstance(told, list):
                        self._told = {self._ids[t]: 0 for t in told if t in self._ids}
                for i in range(n):
                    self._push(i)
                self._dirty_resets.update(range(len(self._resets)))
                events = self._latch()
                self._starting = False
                self._write_keys()
                again = self._interrupted() if record is not None else []
            self._publish(events)
            for i in again:
                self._fire(i)
        except BaseException:
            self.close()  # unsubscribe and free the flow's name
            raise
        if session is not None and self._fresh_names:
            session._soon(session._spawn, self._watch_freshness)

    # -- compiling the flow for speed ---------------------------------------------------------

    def _compile(self, flow: Flow) -> None:
        # The plan is the flow's, shared by every runner of it; aliases keep lookups short.
        plan = compiled(flow)
        self._plan = plan
        self._ids = plan.ids
        self._repairs = plan.repairs
        self._rt = plan.rt
        self._timed = plan.timed
        self._key_steps = plan.key_steps
        self._on_done = plan.on_done
        self._on_tool = plan.on_tool
        self._any_marking = plan.any_marking
        self._succ = plan.succ
        self._resets = plan.resets
        self._key_resets = plan.key_resets
        self._reset_on_done = plan.reset_on_done
        self._reset_on_tool = plan.reset_on_tool
        self._reset_any = plan.reset_any
        self._once = plan.once
        self._never = plan.never
        self._ambient = plan.ambient
        self._required = plan.required
        self._required_set = plan.required_set
        self._terminals = plan.terminals
        self._universe = plan.universe
        self._fresh_names = plan.fresh_names
        self._fresh_keys = plan.fresh_keys
        self._reset_last = [False] * len(plan.resets)  # each reset guard's last value
        self._stuck: dict[int, int] = {}  # turns each step with a repair policy stayed active
        self._entered_turn: dict[int, int] = {}  # the turn a repaired step was entered on
        self._turn_no = 0  # user turns begun (begin_turn), so an entry knows its turn
        self._escalated: set[int] = set()

    # -- latching ---------------------------------------------------------------------------

    def _push(self, i: int) -> None:
        if not self._queued[i]:
            self._queued[i] = True
            heapq.heappush(self._heap, i)

    def _mark(self) -> Marking:
        marking = self._marking
        if marking is None:
            steps = self.flow.steps
            marking = Marking(
                frozenset(self._done_ids.ids),
                self._tools_ok,
                frozenset(steps[i].id for i in self._told),
                self.name,
            )
            self._marking = marking
        return marking

    def _holds(self, guard: Guard, marking: bool, where: Callable[[], str]) -> bool:
        """A guard's value; one that raises counts as not holding (and is logged), so a broken
        custom guard cannot stall the rest of the flow. ``where`` names it, only when needed."""
        try:
            return guard.evaluate(self.state, self._mark() if marking else EMPTY_MARKING)
        except Exception:
            return self._broken(where)

    def _broken(self, where: Callable[[], str]) -> bool:
        log.exception("flow %r: the guard %s raised; it counts as not holding", self.name, where())
        return False

    def _eligible(self, rt: StepRt) -> bool:
        done = self._done
        for src in rt.before:
            if not done[src]:
                return False
        if rt.escalations:
            escalated = self._escalated
            for src in rt.escalations:
                if done[src] and src in escalated:
                    gate = rt.gate
                    return gate is None or self._holds(gate, rt.gate_m, rt.gate_label)
            if not rt.edges:
                return False
        if rt.routed:
            # An escalated step counts as done only on the way to its escalation target.
            done = [d and i not in self._escalated for i, d in enumerate(done)]
        if rt.edges:
            if rt.join_all:
                for src, when, m in rt.edges:
                    if not done[src]:
                        return False
                    if when is not None and not self._holds(when, m, rt.edge_label):
                        return False
            else:
                for src, when, m in rt.edges:
                    if done[src] and (when is None or self._holds(when, m, rt.edge_label)):
                        break
                else:
                    return False
        gate = rt.gate
        return gate is None or self._holds(gate, rt.gate_m, rt.gate_label)

    def _latch(self) -> list[tuple[str, int]]:
        """Settle every queued step and reset to a fixed point; return what happened."""
        events: list[tuple[str, int]] = []
        heap = self._heap
        queued = self._queued
        # A reset fires at most once per settling: no ping-pong.
        fired: set[int] = set() if self._resets else _NO_RESETS
        settle = self._settle
        pop = heapq.heappop
        while True:
            if self._dirty_resets:
                dirty = sorted(self._dirty_resets)
                self._dirty_resets.clear()
                for r in dirty:
                    self._check_reset(r, fired, events)
            if not heap:
                break
            i = pop(heap)
            queued[i] = False
            settle(i, events)
        complete = self._is_complete()
        if complete != self._complete:
            self._complete = complete
            self._keys_dirty |= 4
            if complete:
                events.append(("complete", -1))
        return events

    def _set_done(self, i: int, value: bool) -> None:
        self._done[i] = value
        self._marking = None
        self._keys_dirty |= 2
        step = self.flow.steps[i]
        if value:
            self._done_ids.add(i, step.id)
            self._done_count += 1
        else:
            self._done_ids.discard(i)
            self._done_count -= 1
        if i in self._required_set:
            self._required_left += -1 if value else 1
        if step.terminal:
            self._terminals_done += 1 if value else -1
        queued = self._queued
        for j in self._on_done[i]:
            if not queued[j]:
                queued[j] = True
                heapq.heappush(self._heap, j)
        if self._reset_on_done[i]:
            self._dirty_resets.update(self._reset_on_done[i])

    def _set_active(self, i: int, value: bool) -> None:
        self._active[i] = value
        self._keys_dirty |= 1
        if value:
            self._active_ids.add(i, self.flow.steps[i].id)
        else:
            self._active_ids.discard(i)

    def _settle(self, i: int, events: list[tuple[str, int]]) -> None:
        """Decide step ``i`` now: done, active or neither (the hot path of every change)."""
        if self._done[i]:
            return
        rt = self._rt[i]
        simple = rt.simple
        if self._done[simple] if simple is not None else self._eligible(rt):
            done = rt.done
            if rt.terminal:
                finished = True
            elif done is None:
                finished = False
            else:
                try:
                    finished = done.evaluate(
                        self.state, self._mark() if rt.done_m else EMPTY_MARKING
                    )
                except Exception:
                    finished = self._broken(rt.done_label)
            if not finished and rt.escalates and i in self._escalated:
                finished = True  # the repair policy gave up on it and routed on
            if finished:
                if self._active[i]:
                    self._set_active(i, False)
                self._set_done(i, True)
                events.append(("done", i))
            elif not self._active[i]:
                self._set_active(i, True)
                if i in self._repairs:
                    self._entered_turn[i] = self._turn_no
                if not self._entered[i]:
                    self._entered[i] = True
                    events.append(("enter", i))
                    if self._durable:
                        self._note_entry(i)
                else:
                    events.append(("active", i))
        elif self._active[i]:
            self._set_active(i, False)
            events.append(("inactive", i))

    def _check_reset(self, r: int, fired: set[int], events: list[tuple[str, int]]) -> None:
        reset = self._resets[r]
        holds = self._holds(reset.guard, reset.marking, lambda: f"of reset constraint {r}")
        rising = holds and not self._reset_last[r]
        self._reset_last[r] = holds
        if not rising or r in fired or self._starting:
            return
        fired.add(r)
        for i in reset.targets:
            self._reopen(i, events)

    def _reopen(self, i: int, events: list[tuple[str, int]]) -> None:
        """Make step ``i`` not done, not active and not entered (its on_enter re-armed), forget
        its repair bookkeeping, and queue it (call under the lock)."""
        if self._done[i] or self._active[i] or self._entered[i]:
            if self._done[i]:
                self._set_done(i, False)
            if self._active[i]:
                self._set_active(i, False)
            self._entered[i] = False
            events.append(("reset", i))
            if self._durable:
                self._fired.pop(i, None)
                self._keys_dirty |= 8
        if i in self._repairs:
            self._forget_repair(i)
        if self._told.pop(i, None) is not None:
            self._marking = None
            self._keys_dirty |= 16  # entered again, it must be asked again
        self._push(i)

    def _is_complete(self) -> bool:
        if self._required:
            return self._required_left == 0 and (not self._terminals or self._terminals_done > 0)
        if self._terminals:
            return self._terminals_done > 0
        return self._done_count == len(self._done)

    # -- publishing --------------------------------------------------------------------------

    def _publish(self, events: list[tuple[str, int]]) -> None:
        """Send the signals, start on_enter actions, wake waiters, deliver the flow keys.

        The keys were committed under the runner's lock, right after the settling (so two
        threads never write them out of order), but are delivered only now, after the signals:
        a receiver reacting to them starts its own settling once this one is fully told.
        """
        steps = self.flow.steps
        for kind, i in events:
            if kind == "enter":
                if signals.step_entered.receivers:
                    self._send(signals.step_entered, step=steps[i].id)
                if steps[i].on_enter is not None:
                    self._fire(i)
            elif kind == "done":
                if signals.step_done.receivers:
                    self._send(signals.step_done, step=steps[i].id)
            elif kind == "reset":
                if signals.step_reset.receivers:
                    self._send(signals.step_reset, step=steps[i].id)
            elif kind == "complete" and signals.flow_completed.receivers:
                self._send(signals.flow_completed)
        if self._waiters:
            self._wake_waiters()
        self.state.engine.deliver()
        if self._repairs:
            self._show_repair()
        session = self.session
        if session is not None and events:
            told = self._told
            since = min(
                (told[i] for kind, i in events if kind in ("enter", "active") and i in told),
                default=None,
            )
            if since is not None or self._timed:
                session._steps_changed(since, self._timed)

    def _write_keys(self) -> None:
        """Commit the flow keys that changed (call under the lock; delivered by _publish)."""
        dirty, self._keys_dirty = self._keys_dirty, 0
        keys = self._keys
        writes: dict[str, Any] = {}
        if dirty & 1:
            writes[keys[0]] = list(self._active_ids.ids)
        if dirty & 2:
            writes[keys[1]] = self._done_ids.prefix()
        if dirty & 4:
            writes[keys[2]] = self._complete
        if dirty & 8 and self._durable:
            writes[keys[3]] = self._record()
        if dirty & 16:
            steps = self.flow.steps
            writes[keys[4]] = [steps[i].id for i in sorted(self._told)]
        if dirty & 32:
            writes[keys[5]] = self._over
        try:
            # Fresh lists of step ids (strings) the runner never changes: no need to copy them.
            engine = self.state.engine
            engine.commit_owned(writes, (), self._stamp, "flow", deliver=False, trusted=True)
        except SlateError as exc:
            log.error("flow %r: its progress keys could not be written: %s", self.name, exc)

    # -- resuming from a recorded marking ----------------------------------------------------

    def _note_entry(self, i: int) -> None:
        """Record that step ``i`` was entered (call under the lock, on a state with a store)."""
        self._keys_dirty |= 8
        action = self.flow.steps[i].on_enter
        if action is not None:
            row = self.state.engine.row(action.resolver.status_key)
            self._fired[i] = 0 if row is None else row[2]

    def _record(self) -> dict[str, Any]:
        """The marking as JSON: what a restarted runner needs beyond the State's own keys."""
        steps = self.flow.steps
        return {
            "entered": [steps[i].id for i, e in enumerate(self._entered) if e],
            "fired": {steps[i].id: seq for i, seq in sorted(self._fired.items())},
            "tools": dict(self._tools_ok),
            "escalated": [steps[i].id for i in sorted(self._escalated)],
            "stuck": {steps[i].id: n for i, n in sorted(self._stuck.items())},
        }

    def _restore(self, record: Any, done: Any) -> None:
        """Take up a marking recorded by an earlier runner of this flow (before the first
        latch): done and entered steps, tool counts and repair bookkeeping."""
        where = f"flow {self.name!r}: the recorded marking ({self._keys[3]!r})"
        fields = ("entered", "fired", "tools", "escalated", "stuck")
        if type(record) is not dict or any(k not in record for k in fields):
            raise RecoveryError(f"{where} is not a marking this runner wrote; remove the key")
        if type(done) is not list:
            raise RecoveryError(f"{where}: {self._keys[1]!r} is not a list of step ids")

        def index(step: object) -> int:
            i = self._ids.get(step) if type(step) is str else None
            if i is None:
                raise RecoveryError(
                    f"{where} names step {step!r}, which this flow does not have; the flow "
                    "changed since: resume with the same definition, or clear the flow:"
                    f"{self.name}: keys to start it over"
                )
            return i

        try:
            for step in done:
                self._set_done(index(step), True)
            for step in record["entered"]:
                self._entered[index(step)] = True
            for step, seq in record["fired"].items():
                self._fired[index(step)] = int(seq)
            for tool, count in record["tools"].items():
                self._tools_ok[str(tool)] = int(count)
            for step in record["escalated"]:
                self._escalated.add(index(step))
            for step, count in record["stuck"].items():
                self._stuck[index(step)] = int(count)
        except (AttributeError, TypeError, ValueError) as exc:
            raise RecoveryError(f"{where} is malformed ({exc}); remove the key") from None
        self._marking = None

    def _interrupted(self) -> list[int]:
        """Active steps whose ``on_enter`` run did not complete before the restart (never
        started, in flight, or cancelled by the session closing), claimed for re-dispatch."""
        again = []
        session = self.session
        for i, fired in sorted(self._fired.items()):
            action = self.flow.steps[i].on_enter
            if action is None or self._done[i] or not self._active[i] or session is None:
                continue
            row = self.state.engine.row(action.resolver.status_key)
            if row is not None and row[2] > fired:
                status, meta = row[0], row[4].meta or {}
                closed = status == "cancelled" and meta.get("reason") == "session closed"
                if status != "running" and not closed:
                    continue  # it completed: exactly once
            if session._claim(action.resolver.name):
                again.append(i)
        return again

    def _send(self, signal: Any, **kwargs: Any) -> None:
        if not signal.receivers:
            return
        for receiver in signal.receivers_for(self):
            try:
                receiver(self, flow=self.name, **kwargs)
            except Exception:
                log.exception(
                    "flow %r: a %s receiver failed; the flow goes on", self.name, signal.name
                )

    def _fire(self, i: int) -> None:
        session = self.session
        if session is None:
            return
        session._soon(self._start_action, i)

    def _start_action(self, i: int) -> None:
        step = self.flow.steps[i]
        action = step.on_enter
        session = self.session
        if action is None or session is None or self._closed:
            return
        try:
            if action.mode == "dispatch":
                session.dispatch(action.resolver)
            elif action.mode == "background":
                session.background(
                    action.resolver,
                    action.deliver or session.inbox_delivery(self),
                    action.scheduling,
                )
            else:
                self._calls.append(action)
                if self._lane is None:
                    self._lane = anyio.Event()
                    session._spawn(self._run_calls)
        except Exception:
            log.exception(
                "flow %r: step %r could not start resolver %r",
                self.name,
                step.id,
                action.resolver.name,
            )

    async def _run_calls(self) -> None:
        session = self.session
        assert session is not None
        try:
            with anyio.CancelScope() as self._lane_scope:
                if self._closed:
                    return
                while self._calls and not self._closed:
                    action = self._calls.pop(0)
                    with contextlib.suppress(SlateError):
                        # Its error is in '<name>:error' for the flow to see: nothing to raise.
                        await session.call(action.resolver)
        finally:
            lane, self._lane = self._lane, None
            if lane is not None:
                lane.set()

    def _wake_waiters(self) -> None:
        with self._lock:
            ready = [w for w in self._waiters if w.check()]
            if not ready:
                return
            self._waiters = [w for w in self._waiters if w not in ready]
        for w in ready:
            w.wake()

    async def _watch_freshness(self) -> None:
        """Move the flow the moment a result its ``fresh`` guards read goes stale, on the
        session's clock (a step waiting on freshness does not wait for the next turn)."""
        session = self.session
        assert session is not None
        clock, state = session.clock, self.state
        while not self._closed:
            alarm = self._fresh_alarm = _Waiter(lambda: True)
            delays = [d for n in self._fresh_names if (d := state.fresh_for(n))]
            if delays:
                with clock.deadline(min(delays)):
                    await alarm.event.wait()
            else:
                await alarm.event.wait()
            if self._closed:
                return
            if not self._suspended:
                self._advance_all()

    # -- inputs ------------------------------------------------------------------------------

    def _committed(self) -> AbstractContextManager[None]:
        """Evaluate guards against the committed State, even when called inside a transaction
        (whose writes are not the flow's facts until they commit)."""
        return self.state.engine.outside_transaction()

    def _changed(self, changes: tuple[Change, ...]) -> None:
        if self.state.engine.tx_open:
            with self._committed():
                self._settle_changes(changes)
        else:
            self._settle_changes(changes)

    def _settle_changes(self, changes: tuple[Change, ...]) -> None:
        key_steps = self._key_steps
        key_resets = self._key_resets
        push = self._push
        with self._lock:
            if self._closed or self._suspended:
                return
            for change in changes:
                key = change.key
                for i in key_steps.get(key, ()):
                    push(i)
                if key_resets:
                    self._dirty_resets.update(key_resets.get(key, ()))
                if key in self._fresh_keys and self._fresh_alarm is not None:
                    self._fresh_alarm.wake()  # a new result: a new moment it goes stale
            events = self._latch()
            if self._keys_dirty:
                self._write_keys()
        if events:
            self._publish(events)

    def _advance_all(self) -> None:
        with self._lock, self._committed():
            self._check_open()
            for i in range(len(self._rt)):
                self._push(i)
            self._dirty_resets.update(range(len(self._resets)))
            events = self._latch()
            if self._keys_dirty:
                self._write_keys()
        self._publish(events)

    def advance(self) -> None:
        """Re-evaluate every guard now (for guards over time, such as ``fresh``, or custom
        guards reading something other than the State)."""
        self._advance_all()

    def _entered_this_turn(self) -> None:
        """Count the steps active now as entered on the current turn (a digression started by
        this turn's words): repair starts counting at the next turn."""
        with self._lock:
            self._turn_no += 1
            for i in self._repairs:
                if self._active[i]:
                    self._entered_turn[i] = self._turn_no

    def begin_turn(self) -> None:
        """A user turn starts (the session calls this before its extractors run): a step the
        turn's words make active is entered on this turn, which repair does not count as a
        turn the caller was stuck on it."""
        with self._lock:
            self._turn_no += 1
            self._turn_open = True

    def abort_turn(self) -> None:
        """The turn begun was cancelled or failed before :meth:`on_turn` finished: it is not
        counted (a later turn takes its number)."""
        with self._lock:
            if self._turn_open:
                self._turn_open = False
                self._turn_no -= 1

    async def on_turn(self) -> None:
        """A conversation turn ended: re-evaluate every guard, then wait for ``on_enter``
        actions in call mode (started by this turn or before) to finish, re-advancing on their
        results."""
        self._advance_all()
        while self._lane is not None:
            await self._lane.wait()
        if self._repairs:
            self._count_turn()
        self.turns += 1
        self._turn_open = False

    # -- repair ----------------------------------------------------------------------------

    def _forget_repair(self, i: int) -> None:
        """Clear a step's repair bookkeeping (call under the lock): it was reset or restarted."""
        self._stuck.pop(i, None)
        self._escalated.discard(i)

    def _count_turn(self) -> None:
        """One more turn: count it for every stuck step, reprompt or escalate where due."""
        with self._lock, self._committed():
            self._check_open()
            for i, policy in self._repairs.items():
                if self._active[i] and self._entered_turn.get(i, -1) >= self._turn_no > 0:
                    continue  # entered by this very turn's words: the caller was not stuck yet
                if self._active[i]:
                    stuck = self._stuck[i] = self._stuck.get(i, 0) + 1
                    if stuck >= policy.escalate_after and i not in self._escalated:
                        self._escalated.add(i)
                        self._push(i)
                else:
                    self._stuck.pop(i, None)
                    if not self._done[i]:
                        self._escalated.discard(i)
            if self._durable:
                self._keys_dirty |= 8
            events = self._latch()
            if self._keys_dirty:
                self._write_keys()
        self._publish(events)

    def _repair_keys(self) -> dict[str, bool]:
        keys: dict[str, bool] = {}
        steps = self.flow.steps
        for i, policy in self._repairs.items():
            sid = steps[i].id
            keys[reprompt_key(sid)] = (
                self._active[i] and self._stuck.get(i, 0) >= policy.reprompt_after
            )
            keys[escalate_key(sid)] = i in self._escalated
            if policy.flag is not None:
                keys[policy.flag] = keys.get(policy.flag, False) or i in self._escalated
        return keys

    def _show_repair(self) -> None:
        """Write the repair keys that changed (true when due, false once cleared)."""
        with self._lock:
            wanted = self._repair_keys()
        # Compared with the State itself (an absent key reads as False): written on change only.
        changed = {k: v for k, v in wanted.items() if self.state.get(k, False) is not v}
        if changed:
            try:
                batch = cast("dict[str | Key[Any], Any]", changed)
                self.state.update(batch, source="flow", writer=self.name)
            except SlateError as exc:
                log.error("flow %r: its repair keys could not be written: %s", self.name, exc)

    def reprompts(self) -> list[str]:
        """What to tell the model for each active step its repair policy says to reprompt: the
        step's ``timing.reprompt`` text, else :data:`DEFAULT_REPROMPT`."""
        with self._lock:
            lines = []
            for i, policy in self._repairs.items():
                if self._active[i] and self._stuck.get(i, 0) >= policy.reprompt_after:
                    timing = self.flow.steps[i].timing
                    lines.append(timing.reprompt_text if timing is not None else DEFAULT_REPROMPT)
            return lines

    # -- suspension (FlowStack digressions) ----------------------------------------------------

    @property
    def suspended(self) -> bool:
        """Whether the runner is suspended (a digression has the floor): it ignores changes
        until :meth:`resume`."""
        return self._suspended

    def suspend(self) -> None:
        """Stop reacting to changes; the marking stays exactly as it is."""
        with self._lock:
            self._check_open()
            self._suspended = True

    def resume(self) -> None:
        """React again, first catching up on everything that changed while suspended."""
        with self._lock:
            self._check_open()
            self._suspended = False
        self._advance_all()

    def restart(self) -> None:
        """Start the flow over against the current State: every step is re-opened (``on_enter``
        re-armed, tool counts and repair bookkeeping cleared); the State itself is kept, so
        facts already known complete their steps again at once."""
        with self._lock, self._committed():
            self._check_open()
            events: list[tuple[str, int]] = []
            for i in range(len(self._rt)):
                self._reopen(i, events)
            self._tools_ok.clear()
            self._marking = None
            if self._told:
                self._told.clear()
                self._keys_dirty |= 16
            if self._over:
                self._over = False
                self._keys_dirty |= 32
            self._reset_last = [False] * len(self._resets)
            self._suspended = False
            self._starting = True  # a reset guard that already holds is not a rising edge
            try:
                self._dirty_resets.update(range(len(self._resets)))
                events += self._latch()
            finally:
                self._starting = False
            if self._keys_dirty:
                self._write_keys()
        self._publish(events)

    # -- what the session asks of a running flow ----------------------------------------------

    def known_tools(self) -> list[str]:
        """Every tool this flow knows: the ones it names, and the ones given to ``compile``."""
        return list(self._universe)

    def refusal(self, tool: str) -> str | None:
        """Why ``tool`` is refused now (for the model), or None when it is admitted."""
        if type(tool) is not str or not tool:
            raise FlowError(f"flow {self.name!r}: refusal takes a tool name, got {tool!r}")
        if self.enforcement is Enforcement.OBSERVE:
            return None  # admitted; a violation is recorded only when the model calls it
        with self._lock, self._committed():
            denial = self._denial(tool)
            return None if denial is None else self._reason(tool, *denial)

    def voice_timing(self) -> VoiceTiming | None:
        """The merged :class:`VoiceTiming` of the active steps (None when none has any)."""
        if not self._timed:
            return None
        merged: VoiceTiming | None = None
        with self._lock:
            speaking = self._speaking_rts()  # a closing terminal step's timing applies too
        for rt in speaking:
            timing = rt.step.timing
            if timing is not None:
                merged = timing if merged is None else merged.merge(timing)
        return merged

    def on_tool_ok(self, tool: str) -> None:
        """Tool ``tool`` completed successfully: count it (``called_ok``, ``once``) and advance."""
        if type(tool) is not str or not tool:
            raise FlowError(f"flow {self.name!r}: on_tool_ok takes a tool name, got {tool!r}")
        with self._lock, self._committed():
            self._check_open()
            self._tools_ok[tool] = self._tools_ok.get(tool, 0) + 1
            self._marking = None
            if self._durable:
                self._keys_dirty |= 8
            if self._suspended:
                return  # counted; the steps catch up when the runner resumes
            for i in self._on_tool.get(tool, self._any_marking):
                self._push(i)
            self._dirty_resets.update(self._reset_on_tool.get(tool, self._reset_any))
            events = self._latch()
            if self._keys_dirty:
                self._write_keys()
        self._publish(events)

    def told_marker(self) -> Callable[[int], None] | None:
        """The steps speaking now, to record as told when the context carrying their postures
        is handed to the model (the session calls the result with the user turn number)."""
        with self._lock:
            speaking = tuple(rt.index for rt in self._speaking_rts())
            # The complete flow's closing words (a stack's layer never ends the call itself).
            closing = self._announces_over and self._complete and not self._active_ids.index
        if not speaking:
            return None
        return lambda turn: self._mark_told(speaking, turn, closing)

    def _mark_told(self, steps: tuple[int, ...], turn: int, closing: bool = False) -> None:
        """Record ``steps`` as told at user turn ``turn``: ``flow:{name}:told`` and the marking
        (guards reading ``told`` re-evaluate); with ``closing`` (they were the complete flow's
        closing words) the flow is over (``flow:{name}:over``, ``signals.flow_over``)."""
        with self._lock, self._committed():
            if self._closed:
                return
            new = [i for i in steps if i not in self._told and (self._active[i] or self._done[i])]
            over = closing and not self._over
            if not new and not over:
                return
            if over:
                self._over = True
                self._keys_dirty |= 32
            for i in new:
                self._told[i] = turn
            self._marking = None
            self._keys_dirty |= 16
            for i in self._any_marking:
                self._push(i)
            self._dirty_resets.update(self._reset_any)
            events = [] if self._suspended else self._latch()
            self._write_keys()
        self._publish(events)
        if over and signals.flow_over.receivers:
            self._send(signals.flow_over)

    @property
    def is_over(self) -> bool:
        """Whether the flow is complete and its closing words were handed to the model (the
        moment a call may end without cutting them off): ``flow:{name}:over``."""
        return self._over

    @property
    def told_steps(self) -> list[str]:
        """The steps whose posture reached the model since they were last entered, in flow
        order (``flow:{name}:told``)."""
        with self._lock:
            return [self.flow.steps[i].id for i in sorted(self._told)]

    def _check_open(self) -> None:
        if self._closed:
            raise FlowError(f"flow {self.name!r}: the runner is closed; start the flow again")

    # -- queries -----------------------------------------------------------------------------

    def _index(self, step: str) -> int:
        i = self._ids.get(step) if isinstance(step, str) else None
        if i is None:
            raise FlowError(
                f"flow {self.name!r} has no step {step!r}; its steps: "
                + ", ".join(s.id for s in self.flow.steps)
            )
        return i

    @property
    def active_steps(self) -> list[str]:
        """The ids of the active steps (reachable and not done), in flow order."""
        with self._lock:
            return list(self._active_ids.ids)

    @property
    def done_steps(self) -> list[str]:
        """The ids of the done steps, in flow order."""
        with self._lock:
            return list(self._done_ids.ids)

    @property
    def marking(self) -> Marking:
        """The done steps and the successful tool calls so far."""
        with self._lock:
            return self._mark()

    @property
    def is_complete(self) -> bool:
        """Whether the flow is complete: every ``require``-d step done and, if the flow has
        terminal steps, one of them reached (with neither, every step done)."""
        with self._lock:
            return self._complete

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the runner no longer advances)."""
        return self._closed

    def _active_rts(self) -> list[StepRt]:
        rts = self._rt
        return [rts[i] for i in self._active_ids.index]

    def _speaking_rts(self) -> list[StepRt]:
        """The steps whose posture and ground apply: the active ones, or once the flow is
        complete with nothing active, the terminal steps it ended on (its closing words)."""
        active = self._active_rts()
        if active or not self._complete:
            return active
        return [self._rt[i] for i in self._terminals if self._done[i]]

    def postures(self) -> list[str]:
        """The active steps' postures (instructions for the model), in flow order; once the
        flow is complete, those of the terminal steps it ended on."""
        with self._lock:
            return [rt.step.posture for rt in self._speaking_rts() if rt.step.posture]

    def grounds(self) -> list[str]:
        """The active steps' grounds rendered from the State now (chosen like
        :meth:`postures`); blank lines are dropped."""
        with self._lock:
            grounds = [rt.step.ground for rt in self._speaking_rts() if rt.step.ground is not None]
        lines = []
        for ground in grounds:
            try:
                lines.append(ground.render(self.state))
            except SlateError as exc:
                # A key made secret after the flow started: the line is left out, not the turn.
                log.error("flow %r: a ground could not be rendered: %s", self.name, exc)
        return [line for line in lines if line.strip()]

    def unmet_requirements(self) -> list[str]:
        """The ``require``-d steps not done yet, in the order the constraints name them."""
        with self._lock:
            return [self.flow.steps[i].id for i in self._required if not self._done[i]]

    def verdict(self, step: str) -> Verdict:
        """Where ``step`` stands: pending, active, done or skipped."""
        i = self._index(step)
        with self._lock:
            if self._done[i]:
                return Verdict.DONE
            if self._active[i]:
                return Verdict.ACTIVE
            if self._complete or any(self._done[j] for j in self._succ[i]):
                return Verdict.SKIPPED
            return Verdict.PENDING

    def take_deliveries(self) -> list[BackgroundResult]:
        """Background results of ``on_enter`` actions with no ``deliver``, oldest first; taking
        them empties the queue."""
        return [] if self.session is None else self.session.inbox.take(self)

    # -- tools -------------------------------------------------------------------------------

    def _constraint_denial(self, tool: str) -> tuple[str, str] | None:
        """Why the flow-wide constraints (``once``, ``never``, ``commit``) refuse ``tool``."""
        if tool in self._once and self._tools_ok.get(tool, 0) > 0:
            return ("once", "")
        for name, until in self._never:
            if name == tool and not until.evaluate(self.state, self._mark()):
                return ("not_yet", until.describe())
        return None

    def _denial(self, tool: str) -> tuple[str, str] | None:
        """Why ``tool`` is refused now, as (kind, detail), or None if it is admitted."""
        denial = self._constraint_denial(tool)
        if denial is not None:
            return denial
        active = self._active_rts()
        for rt in active:
            if tool in rt.step.deny:
                return ("denied", rt.step.id)
        if tool in self._ambient:
            return None
        restricting = [rt for rt in active if rt.step.allow]
        if restricting and not any(tool in rt.step.allow for rt in restricting):
            return ("not_in_step", ", ".join(repr(rt.step.id) for rt in restricting))
        return None

    def constraint_refusal(self, tool: str) -> str | None:
        """Why the flow's constraints (``once``, ``never``, ``commit``) refuse ``tool`` now,
        whatever step is active, or None: what still binds while a digression has the floor."""
        if self.enforcement is Enforcement.OBSERVE:
            return None
        return self._constraint_reason(tool)

    def _constraint_reason(self, tool: str) -> str | None:
        with self._lock, self._committed():
            denial = self._constraint_denial(tool)
            return None if denial is None else self._reason(tool, *denial)

    def constraint_denial(self, tool: str) -> tuple[str, str] | None:
        """Why the flow-wide constraints (``once``, ``never``, ``commit``) would refuse ``tool``
        now, as ``(kind, detail)``, or None, in either enforcement mode (a stack asks it of a
        flow it has suspended)."""
        with self._lock, self._committed():
            return self._constraint_denial(tool)

    def refusal_text(
        self, tool: str, kind: str, detail: str, *, available: list[str] | None = None
    ) -> str:
        """The refusal of ``tool`` for ``(kind, detail)`` told from this flow's point of view:
        the tools it admits now (or ``available``, when the caller knows better) and its active
        posture."""
        with self._lock, self._committed():
            return self._reason(tool, kind, detail, available)

    def _reason(self, tool: str, kind: str, detail: str, available: list[str] | None = None) -> str:
        if kind == "once":
            return (
                f"'{tool}' has already run and may run only once in this conversation. "
                "Do not call it again."
            )
        if kind == "not_yet":
            head = f"'{tool}' is not permitted yet: first, {detail}."
        elif kind == "denied":
            head = f"'{tool}' is not allowed during the current step ('{detail}')."
        else:
            head = f"'{tool}' is not part of the current step ({detail})."
        if available is None:
            available = [t for t in self._universe if self._denial(t) is None]
        if available:
            head += " Available now: " + ", ".join(available) + "."
        else:
            head += " No tool is available right now; continue the conversation instead."
        postures = [rt.step.posture for rt in self._active_rts() if rt.step.posture]
        if postures:
            head += " " + postures[0]
        return head

    def admit(self, tool: str) -> Admission:
        """May the model call ``tool`` now? Checked in order: ``once``, ``never``/``commit``
        guards, an active step's ``deny``, ``ambient``, the active steps' ``allow`` lists.

        A refusal's reason tells the model what is missing and what it may call instead. In
        observe mode the call is admitted and the refusal is recorded in :attr:`violations`.
        """
        if type(tool) is not str or not tool:
            raise FlowError(f"flow {self.name!r}: admit takes a tool name, got {tool!r}")
        with self._lock, self._committed():
            denial = self._denial(tool)
            if denial is None:
                return Admission(tool, True)
            reason = self._reason(tool, *denial)
            if self.enforcement is Enforcement.ENFORCE:
                return Admission(tool, False, reason)
            active = tuple(rt.step.id for rt in self._active_rts())
            self.violations.append(Violation(tool, reason, active))
            return Admission(tool, True, reason, violation=True)

    def single(self, tool: str) -> bool:
        """Whether ``tool`` may succeed at most once (``once``, ``commit``): a session holds
        concurrent calls of it one at a time (``Session.claim``)."""
        return tool in self._once

    def why_blocked(self, tool: str) -> str | None:
        """The reason ``tool`` would be refused now, or None if it would be admitted (this
        records nothing, in either mode)."""
        with self._lock, self._committed():
            denial = self._denial(tool)
            return None if denial is None else self._reason(tool, *denial)

    def explain(self) -> FlowExplanation:
        """Where the flow is and why: what each active step waits for, what keeps the next
        steps from starting, which tools are allowed or refused (and why), what is unmet."""
        with self._lock:
            state = self.state
            marking = self._mark()
            waiting: dict[str, Explanation] = {}
            for i, rt in enumerate(self._rt):
                if self._done[i] or (self._complete and not self._active[i]):
                    continue
                if self._active[i]:
                    if rt.done is not None:
                        waiting[rt.step.id] = rt.done.explain(state, marking)
                    continue
                why = self._why_pending(rt, marking)
                if why is not None:
                    waiting[rt.step.id] = why
            allowed: list[str] = []
            blocked: dict[str, str] = {}
            for tool in self._universe:
                denial = self._denial(tool)
                if denial is None:
                    allowed.append(tool)
                else:
                    blocked[tool] = self._reason(tool, *denial)
            return FlowExplanation(
                self.name,
                tuple(self._active_ids.ids),
                tuple(self._done_ids.ids),
                self._complete,
                waiting,
                tuple(allowed),
                blocked,
                tuple(self.flow.steps[i].id for i in self._required if not self._done[i]),
            )

    def _why_pending(self, rt: StepRt, marking: Marking) -> Explanation | None:
        """For a pending step whose predecessors are done: what still keeps it from starting."""
        steps = self.flow.steps
        parts: list[Explanation] = []
        ready = [self._done[src] for src, _, _ in rt.edges]
        if rt.edges and not (all(ready) if rt.join_all else any(ready)):
            return None  # not next in line: an earlier step is still open
        for src, when, _ in rt.edges:
            if when is not None and self._done[src]:
                parts.append(
                    Explanation(
                        when.evaluate(self.state, marking),
                        f"the branch from {steps[src].id!r}",
                        (when.explain(self.state, marking),),
                    )
                )
        for src in rt.before:
            parts.append(
                Explanation(self._done[src], f"step {steps[src].id!r} must be done first (before)")
            )
        if rt.gate is not None:
            parts.append(rt.gate.explain(self.state, marking))
        if not parts:
            return None
        return Explanation(False, "it cannot start until", tuple(parts))

    # -- waiting -----------------------------------------------------------------------------

    async def wait_for_step(self, step: str, timeout: float | None = None) -> Verdict:
        """Wait until ``step`` is reached (active or done) and return its verdict.

        Raises :class:`WaitTimeoutError` after ``timeout`` seconds (on the session's clock, so
        a manual clock in tests) with the runner's explanation.
        """
        i = self._index(step)

        def reached() -> bool:
            return self._active[i] or self._done[i]

        await self._wait(reached, timeout, f"step {step!r} to be reached")
        return self.verdict(step)

    async def wait_complete(self, timeout: float | None = None) -> None:
        """Wait until the flow is complete; raises :class:`WaitTimeoutError` after ``timeout``."""
        await self._wait(lambda: self._complete, timeout, "the flow to complete")

    async def _wait(self, check: Callable[[], bool], timeout: float | None, what: str) -> None:
        if timeout is not None and (
            type(timeout) not in (int, float) or not math.isfinite(timeout)
        ):
            raise FlowError(
                f"flow {self.name!r}: the timeout waiting for {what} must be a finite number of "
                f"seconds or None, got {timeout!r}"
            )
        clock: Clock = self.session.clock if self.session is not None else SYSTEM_CLOCK
        deadline = None if timeout is None else clock.monotonic() + timeout
        while True:
            with self._lock:
                if check():
                    return
                self._check_open()
                waiter = _Waiter(check)
                self._waiters.append(waiter)
            try:
                left = None if deadline is None else max(deadline - clock.monotonic(), 0.0)
                # Under a manual clock, time jumps while every task is blocked: never a hang.
                outcome = await wait_on(clock, waiter.event, left)
                if outcome == "stuck" and not check():
                    raise WaitTimeoutError(
                        f"flow {self.name!r}: waiting for {what}, but nothing can ever get it "
                        f"there: every task is blocked and no timer is due on the manual "
                        f"clock\n{self.explain()}"
                    )
                if outcome == "timeout" and not waiter.event.is_set():
                    raise WaitTimeoutError(
                        f"flow {self.name!r}: waited {timeout}s for {what}\n{self.explain()}"
                    )
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if self._closed and not check():
                raise FlowError(
                    f"flow {self.name!r} was closed while waiting for {what}\n{self.explain()}"
                )
            # Woken: reached (checked at the top), or reached and left again before this task
            # ran (a gate flicker, a reset); then wait on.

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop advancing: unsubscribe from the State and drop queued call-mode actions (runs
        already started belong to the session). Queries keep answering from the last marking."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._calls.clear()
            if self._lane_scope is not None:
                self._lane_scope.cancel()
            waiters, self._waiters = self._waiters, []
            if self._fresh_alarm is not None:
                waiters.append(self._fresh_alarm)
        if self._sub is not None:
            self._sub.close()
        with _running_lock:
            mine = _running.get(self.state)
            ref = mine.get(self.name) if mine is not None else None
            if mine is not None and ref is not None and ref() is self:
                del mine[self.name]
        for w in waiters:
            w.wake()

    def __enter__(self) -> FlowRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        status = "closed" if self._closed else "complete" if self._complete else "running"
        active = ", ".join(self.active_steps) or "none"
        return f"<FlowRunner {self.name!r} {status}; active: {active}>"
