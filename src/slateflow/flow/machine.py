"""The marking machine: a flow's transition function, with no State, no clock and no task.

A :class:`Machine` holds one flow's marking (which steps are done, active and entered; tool
successes; told steps; repair bookkeeping) and moves it. Inputs queue what a change can affect
(:meth:`Machine.changed` for changed keys, :meth:`Machine.tool_ok`, :meth:`Machine.tell`, ...);
:meth:`Machine.latch` then latches every queued step and reset to a fixed point and returns the
effects as events, ``(kind, step index)`` with ``kind`` one of ``"enter"``, ``"active"`` (entered
again after a gate flicker), ``"done"``, ``"inactive"``, ``"reset"`` and ``"complete"``.

Guards are read through the ``holds`` function the machine is built with (the runner's reads the
State); which progress keys the transition changed is left in :attr:`Machine.dirty` for whoever
records them. Nothing here locks: the runner applies transitions one at a time.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

from ..state.values import Prefix
from .compiled import CompiledFlow, StepRt
from .guard_base import EMPTY_MARKING, Guard, Marking
from .repair import escalate_key, reprompt_key

__all__ = ["Event", "Holds", "Machine", "Ordered", "Verdict", "evaluating"]

log = logging.getLogger("slateflow.flow")

Event = tuple[str, int]
"""What a transition did: ``(kind, step index)`` (``-1`` for ``"complete"``)."""

Holds = Callable[[Guard, Marking], bool]
"""How a machine reads a guard: its value against the facts, given the marking."""


def evaluating(facts: Any) -> Holds:
    """The predicate a machine latches with: each guard evaluated over ``facts`` (a State)."""

    def holds(guard: Guard, marking: Marking) -> bool:
        return guard.evaluate(facts, marking)

    return holds


# Progress flags in Machine.dirty: which flow keys a transition changed.
ACTIVE, DONE, COMPLETE, RECORD, TOLD, OVER = 1, 2, 4, 8, 16, 32

_NO_RESETS: set[int] = set()  # never added to: a flow without resets fires none


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


class Ordered:
    """Step ids kept in flow order, updated one step at a time (recording never rebuilds them).

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


class Machine:
    """One flow's marking and the transition that moves it (see the module docstring)."""

    __slots__ = (
        "_dirty_resets",
        "_done_count",
        "_early",
        "_entered_turn",
        "_heap",
        "_holds",
        "_marking",
        "_queued",
        "_repairs",
        "_required_left",
        "_reset_last",
        "_rt",
        "_terminals_done",
        "_turn_no",
        "active",
        "active_ids",
        "clearing",
        "complete",
        "dirty",
        "done",
        "done_ids",
        "ended",
        "entered",
        "entries",
        "escalated",
        "name",
        "over",
        "plan",
        "starting",
        "steps",
        "stuck",
        "told",
        "tools_ok",
    )

    def __init__(self, plan: CompiledFlow, holds: Holds) -> None:
        self.plan = plan
        self._holds = holds
        self.name = plan.flow.name
        self.steps = plan.flow.steps
        # The plan's tables the hot path reads, one attribute away.
        self._rt = plan.rt
        self._repairs = plan.repairs
        n = len(plan.rt)
        self.done = [False] * n
        self.active = [False] * n
        self.entered = [False] * n
        self.entries: dict[int, int] = {}  # step -> how many times it was entered
        self.clearing: list[str] = []  # keys a fired reset clears before the latch goes on
        self.tools_ok: dict[str, int] = {}
        self.told: dict[int, int] = {}  # step -> the user turn its posture reached the model
        self.over = False  # complete, and its closing words were handed to the model
        self.complete = False
        self.ended = -1  # the ending step entered (Step(ends=True)), if any
        self.active_ids = Ordered()
        self.done_ids = Ordered()
        self._done_count = 0
        self._required_left = len(plan.required)
        self._terminals_done = 0
        # Repair: turns each step stayed active, the turn it was entered on, and the steps
        # whose policy gave up on them.
        self.stuck: dict[int, int] = {}
        self._entered_turn: dict[int, int] = {}
        self._turn_no = 0
        self.escalated: set[int] = set()
        self._reset_last = [False] * len(plan.resets)
        self._heap: list[int] = []
        self._queued = [False] * n
        self._dirty_resets: set[int] = set()
        self.dirty = ACTIVE | DONE | COMPLETE
        self.starting = False  # a reset guard that already holds then is not a rising edge
        self._early: list[Event] = []  # events of an input, reported by the next latch
        self._marking: Marking | None = EMPTY_MARKING

    # -- inputs: each queues what it can affect; latch() applies it ----------------------------

    def start(self) -> None:
        """Queue every step and reset (a first settling, or a catch-up after suspension)."""
        for i in range(len(self.done)):
            self._push(i)
        self._dirty_resets.update(range(len(self._reset_last)))

    def changed(self, keys: Iterable[str]) -> None:
        """Queue the steps and resets whose guards read one of ``keys``."""
        plan = self.plan
        key_steps = plan.key_steps
        key_resets = plan.key_resets
        push = self._push
        for key in keys:
            for i in key_steps.get(key, ()):
                push(i)
            if key_resets:
                self._dirty_resets.update(key_resets.get(key, ()))

    def tool_ok(self, tool: str) -> None:
        """Count a successful call of ``tool``; queue what reads it."""
        self.tools_ok[tool] = self.tools_ok.get(tool, 0) + 1
        self._marking = None
        self.dirty |= RECORD
        plan = self.plan
        for i in plan.on_tool.get(tool, plan.any_marking):
            self._push(i)
        self._dirty_resets.update(plan.reset_on_tool.get(tool, plan.reset_any))

    def tell(self, steps: Iterable[int], turn: int, closing: bool) -> bool:
        """Record ``steps`` as told at user turn ``turn`` (those still active or done); with
        ``closing`` the complete flow's closing words reached the model, so it is over. Returns
        whether anything changed."""
        new = [i for i in steps if i not in self.told and (self.active[i] or self.done[i])]
        over = closing and not self.over
        if not new and not over:
            return False
        if over:
            self.over = True
            self.dirty |= OVER
        for i in new:
            self.told[i] = turn
        self._marking = None
        self.dirty |= TOLD
        for i in self.plan.any_marking:
            self._push(i)
        self._dirty_resets.update(self.plan.reset_any)
        return True

    def restart(self) -> None:
        """Re-open every step and forget tool counts, told steps and reset edges (for the next
        settling, a reset guard that already holds is not a rising edge)."""
        for i in range(len(self.done)):
            self._reopen(i, self._early)
        self.tools_ok.clear()
        self._marking = None
        if self.told:
            self.told.clear()
            self.dirty |= TOLD
        if self.over:
            self.over = False
            self.dirty |= OVER
        self._reset_last = [False] * len(self._reset_last)
        self._dirty_resets.update(range(len(self._reset_last)))
        self.starting = True

    # -- turns and repair --------------------------------------------------------------------

    def begin_turn(self) -> None:
        self._turn_no += 1

    def abort_turn(self) -> None:
        self._turn_no -= 1

    def entered_this_turn(self) -> None:
        """A new turn on which the steps active now count as entered (a digression started by
        this turn's words): repair starts counting at the next turn."""
        self._turn_no += 1
        for i in self.plan.repairs:
            if self.active[i]:
                self._entered_turn[i] = self._turn_no

    def count_turn(self) -> None:
        """One more turn: count it for every stuck step; queue the ones now escalated."""
        for i, policy in self.plan.repairs.items():
            if self.active[i] and self._entered_turn.get(i, -1) >= self._turn_no > 0:
                continue  # entered by this very turn's words: the caller was not stuck yet
            if self.active[i]:
                stuck = self.stuck[i] = self.stuck.get(i, 0) + 1
                if stuck >= policy.escalate_after and i not in self.escalated:
                    self.escalated.add(i)
                    self._push(i)
            else:
                self.stuck.pop(i, None)
                if not self.done[i]:
                    self.escalated.discard(i)
        self.dirty |= RECORD

    def reprompt_due(self, i: int) -> bool:
        """Whether step ``i``'s repair policy says to reprompt now."""
        policy = self.plan.repairs[i]
        return self.active[i] and self.stuck.get(i, 0) >= policy.reprompt_after

    # -- the transition ----------------------------------------------------------------------

    def _push(self, i: int) -> None:
        if not self._queued[i]:
            self._queued[i] = True
            heapq.heappush(self._heap, i)

    def forget_marking(self) -> None:
        """Drop the cached :meth:`mark` (the marking changed from outside, as a restore)."""
        self._marking = None

    def mark(self) -> Marking:
        """The marking as guards read it (cached until it changes)."""
        marking = self._marking
        if marking is None:
            steps = self.steps
            marking = Marking(
                frozenset(self.done_ids.ids),
                self.tools_ok,
                frozenset(steps[i].id for i in self.told),
                self.name,
                {steps[i].id: n for i, n in self.entries.items()}
                if self.plan.reads_entries
                else {},
            )
            self._marking = marking
        return marking

    def _check(self, guard: Guard, marking: bool, where: Callable[[], str]) -> bool:
        """A guard's value; one that raises counts as not holding (and is logged), so a broken
        custom guard cannot stall the rest of the flow. ``where`` names it, only when needed."""
        try:
            return self._holds(guard, self.mark() if marking else EMPTY_MARKING)
        except Exception:
            return self._broken(where)

    def _broken(self, where: Callable[[], str]) -> bool:
        log.exception("flow %r: the guard %s raised; it counts as not holding", self.name, where())
        return False

    def latch(self) -> list[Event]:
        """Settle every queued step and reset to a fixed point; return what happened (with what
        the inputs since the last settling did themselves)."""
        events: list[Event] = []
        if self._early:
            events, self._early = self._early, events
        heap = self._heap
        queued = self._queued
        # A reset fires at most once per settling: no ping-pong.
        fired: set[int] = set() if self._reset_last else _NO_RESETS
        latch_step = self._latch_step
        pop = heapq.heappop
        ends = self.plan.ends
        while True:
            if self._dirty_resets:
                dirty = sorted(self._dirty_resets)
                self._dirty_resets.clear()
                for r in dirty:
                    self._check_reset(r, fired, events)
                if self.clearing:
                    # The runner removes the keys, then latches on: the steps re-opened must
                    # not pass straight through on the answers being cleared.
                    return events
            if not heap:
                break
            if ends:
                for e in ends:
                    if queued[e]:  # its stale heap entry latches again: a no-op
                        queued[e] = False
                        latch_step(e, events)
            i = pop(heap)
            queued[i] = False
            latch_step(i, events)
        complete = self._is_complete()
        if complete != self.complete:
            self.complete = complete
            self.dirty |= COMPLETE
            if complete:
                events.append(("complete", -1))
        self.starting = False
        return events

    def _latch_step(self, i: int, events: list[Event]) -> None:
        """Decide step ``i`` now: done, active or neither (the hot path of every change)."""
        if self.done[i]:
            return
        rt = self._rt[i]
        simple = rt.simple
        ended = self.ended
        if ended >= 0 and i != ended:
            eligible = False  # the flow ended at another step
        else:
            eligible = self.done[simple] if simple is not None else self._eligible(rt)
        if eligible:
            done = rt.done
            if rt.terminal:
                finished = True
            elif done is None:
                finished = False
            else:
                try:
                    finished = self._holds(done, self.mark() if rt.done_m else EMPTY_MARKING)
                except Exception:
                    finished = self._broken(rt.done_label)
            if not finished and rt.escalates and i in self.escalated:
                finished = True  # the repair policy gave up on it and routed on
            if rt.ends and ended < 0:
                self._end(i, events)
            if finished:
                if self.active[i]:
                    self._set_active(i, False)
                self.set_done(i, True)
                events.append(("done", i))
            elif not self.active[i]:
                self._set_active(i, True)
                if i in self._repairs:
                    self._entered_turn[i] = self._turn_no
                if not self.entered[i]:
                    self.entered[i] = True
                    self.entries[i] = self.entries.get(i, 0) + 1
                    self.dirty |= RECORD
                    plan = self.plan
                    if plan.reads_entries:  # an entered(...) guard counts this
                        self._marking = None
                        for j in plan.on_enter[i]:
                            self._push(j)
                        if plan.reset_on_enter[i]:
                            self._dirty_resets.update(plan.reset_on_enter[i])
                    events.append(("enter", i))
                else:
                    events.append(("active", i))
        elif self.active[i]:
            self._set_active(i, False)
            events.append(("inactive", i))

    def _end(self, i: int, events: list[Event]) -> None:
        """Step ``i`` ends the flow: every other active step gives way to it."""
        self.ended = i
        for j in list(self.active_ids.index):
            if j != i:
                self._set_active(j, False)
                events.append(("inactive", j))

    def _eligible(self, rt: StepRt) -> bool:
        done = self.done
        for src in rt.before:
            if not done[src]:
                return False
        if rt.escalations:
            for src in rt.escalations:
                if done[src] and src in self.escalated:
                    gate = rt.gate
                    return gate is None or self._check(gate, rt.gate_m, rt.gate_label)
            if not rt.edges:
                return False
        if rt.routed:
            # An escalated step counts as done only on the way to its escalation target.
            done = [d and i not in self.escalated for i, d in enumerate(done)]
        if rt.edges:
            # A branch taken stays taken: once the step was entered, a condition that is not
            # live counts as holding (until a reset re-opens the step).
            taken = self.entered[rt.index]
            if rt.join_all:
                for src, when, m, live in rt.edges:
                    if not done[src]:
                        return False
                    if (
                        when is not None
                        and (live or not taken)
                        and not self._check(when, m, rt.edge_label)
                    ):
                        return False
            else:
                for src, when, m, live in rt.edges:
                    if done[src] and (
                        when is None or (taken and not live) or self._check(when, m, rt.edge_label)
                    ):
                        break
                else:
                    return False
        gate = rt.gate
        return gate is None or self._check(gate, rt.gate_m, rt.gate_label)

    def set_done(self, i: int, value: bool) -> None:
        self.done[i] = value
        self._marking = None
        self.dirty |= DONE
        plan = self.plan
        step = self.steps[i]
        if value:
            self.done_ids.add(i, step.id)
            self._done_count += 1
        else:
            self.done_ids.discard(i)
            self._done_count -= 1
        if i in plan.required_set:
            self._required_left += -1 if value else 1
        if step.terminal:
            self._terminals_done += 1 if value else -1
        queued = self._queued
        for j in plan.on_done[i]:
            if not queued[j]:
                queued[j] = True
                heapq.heappush(self._heap, j)
        if plan.reset_on_done[i]:
            self._dirty_resets.update(plan.reset_on_done[i])

    def _set_active(self, i: int, value: bool) -> None:
        self.active[i] = value
        self.dirty |= ACTIVE
        if value:
            self.active_ids.add(i, self.steps[i].id)
        else:
            self.active_ids.discard(i)

    def _check_reset(self, r: int, fired: set[int], events: list[Event]) -> None:
        reset = self.plan.resets[r]
        holds = self._check(reset.guard, reset.marking, lambda: f"of reset constraint {r}")
        rising = holds and not self._reset_last[r]
        self._reset_last[r] = holds
        if not rising or r in fired or self.starting:
            return
        fired.add(r)
        for i in reset.targets:
            self._reopen(i, events)
        self.clearing.extend(reset.clear)

    def _reopen(self, i: int, events: list[Event]) -> None:
        """Make step ``i`` not done, not active and not entered (its on_enter re-armed), forget
        its repair bookkeeping, and queue it."""
        if self.done[i] or self.active[i] or self.entered[i]:
            if self.done[i]:
                self.set_done(i, False)
            if self.active[i]:
                self._set_active(i, False)
            self.entered[i] = False
            events.append(("reset", i))
            self.dirty |= RECORD
        if i == self.ended:
            self.ended = -1
            for j in range(len(self.done)):  # the steps that gave way may start again
                self._push(j)
        if i in self.plan.repairs:
            self.stuck.pop(i, None)
            self.escalated.discard(i)
        if self.told.pop(i, None) is not None:
            self._marking = None
            self.dirty |= TOLD  # entered again, it must be asked again
        self._push(i)

    def _is_complete(self) -> bool:
        if self.ended >= 0:
            return self.done[self.ended]
        plan = self.plan
        if plan.required:
            return self._required_left == 0 and (not plan.terminals or self._terminals_done > 0)
        if plan.terminals:
            return self._terminals_done > 0
        return self._done_count == len(self.done)

    # -- reading the marking -----------------------------------------------------------------

    def verdict(self, i: int) -> Verdict:
        """Where step ``i`` stands: pending, active, done or skipped."""
        if self.done[i]:
            return Verdict.DONE
        if self.active[i]:
            return Verdict.ACTIVE
        if self.complete or self.ended >= 0 or any(self.done[j] for j in self.plan.succ[i]):
            return Verdict.SKIPPED
        return Verdict.PENDING

    def speaking(self) -> list[StepRt]:
        """The steps whose posture and ground apply: the active ones, or once the flow is
        complete with nothing active, the terminal steps it ended on (its closing words)."""
        rts = self.plan.rt
        active = [rts[i] for i in self.active_ids.index]
        if active or not self.complete:
            return active
        closing = [i for i in self.plan.terminals if self.done[i]]
        if self.ended >= 0 and self.ended not in closing:
            closing.append(self.ended)
        return [rts[i] for i in sorted(closing)]

    def repair_keys(self) -> dict[str, bool]:
        """The repair keys' values now (reprompt due, escalated, and each policy's flag)."""
        keys: dict[str, bool] = {}
        for i, policy in self.plan.repairs.items():
            sid = self.steps[i].id
            keys[reprompt_key(sid)] = self.reprompt_due(i)
            keys[escalate_key(sid)] = i in self.escalated
            if policy.flag is not None:
                keys[policy.flag] = keys.get(policy.flag, False) or i in self.escalated
        return keys
