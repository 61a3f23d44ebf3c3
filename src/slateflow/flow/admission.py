"""Tool admission: whether a running flow lets the model call a tool now, and why not.

The checks, in order: ``once`` (a tool that already succeeded), ``never`` / ``commit`` guards,
an active step's ``deny``, the flow's ``ambient`` tools, the active steps' ``allow`` lists. A
refusal is a ``(kind, detail)`` pair, told to the model by :meth:`ToolRules.reason`: what is
missing, what it may call instead, and the active step's posture. :class:`Admission` is the one
answer to "may the model call this tool now?", whoever asks (a runner, a flow stack, a
conversation).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from ..state import State
from .compiled import CompiledFlow
from .machine import Machine
from .steps import ANY_TOOL

__all__ = ["Admission", "Denial", "Enforcement", "ToolRules", "Violation"]


class Enforcement(StrEnum):
    """What the runner does with a tool call the flow does not admit."""

    ENFORCE = "enforce"
    """Refuse it: ``admit(tool).allowed`` is False, with the reason for the model."""
    OBSERVE = "observe"
    """Admit it, and record a :class:`Violation` (for audits and analytics)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to ``admit(tool)`` (of a runner, a stack or a conversation); true when the
    call may go ahead.

    ``reason`` is empty for an admitted call; for a refused one it is written for the model
    (what is missing and what is available now). In observe mode a call the flow would refuse
    is admitted with ``violation=True`` and the would-be reason. ``once`` says the tool may
    succeed only once (``once``, ``commit``): a session holds concurrent calls of it one at a
    time.
    """

    tool: str
    allowed: bool
    reason: str = ""
    violation: bool = False
    once: bool = field(default=False, compare=False)

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True, slots=True)
class Violation:
    """A tool call admitted in observe mode that the flow would have refused."""

    tool: str
    reason: str
    active: tuple[str, ...]


Denial = tuple[str, str]
"""Why a tool is refused: ``(kind, detail)``, kind one of once, not_yet, denied, not_in_step."""


ANY = (ANY_TOOL,)


class ToolRules:
    """A running flow's tool rules: answers tool admission for one runner from its plan,
    marking and State (``runner.rules``).

    Every answer is taken under the runner's lock, against the committed State (even inside a
    transaction, whose writes are not the flow's facts until they commit).
    """

    __slots__ = ("lock", "machine", "plan", "state")

    def __init__(
        self, plan: CompiledFlow, machine: Machine, state: State, lock: threading.RLock
    ) -> None:
        self.plan = plan
        self.machine = machine
        self.state = state
        self.lock = lock

    def constraint_denial(self, tool: str) -> Denial | None:
        """Why the flow-wide constraints (``once``, ``never``, ``commit``) refuse ``tool`` now,
        whatever step is active (what still binds while a digression has the floor)."""
        with self.lock, self.state.engine.context.outside_transaction():
            return self._constraint_denial(tool)

    def _constraint_denial(self, tool: str) -> Denial | None:
        m = self.machine
        if tool in self.plan.once and m.tools_ok.get(tool, 0) > 0:
            return ("once", "")
        for name, until in self.plan.never:
            if name == tool and not until.evaluate(self.state, m.mark()):
                return ("not_yet", until.describe())
        return None

    def denial(self, tool: str) -> Denial | None:
        """Why ``tool`` is refused now, or None if it is admitted."""
        with self.lock, self.state.engine.context.outside_transaction():
            return self._denial(tool)

    def _denial(self, tool: str) -> Denial | None:
        denial = self._constraint_denial(tool)
        if denial is not None:
            return denial
        rts = self.plan.rt
        active = [rts[i] for i in self.machine.active_ids.index]
        for rt in active:
            if tool in rt.step.deny:
                return ("denied", rt.step.id)
        if tool in self.plan.ambient:
            return None
        if not active:
            # Complete: the plan is done and only its ambient tools (an end-call tool, a
            # transfer) still run, or a model could book again on its way out. Waiting on a
            # gate with nothing active (a side flow not started): it restricts nothing.
            return ("complete", "") if self.machine.complete else None
        for rt in active:
            allow = rt.step.allow
            if tool in allow or allow == ANY:
                return None
        return ("not_in_step", ", ".join(repr(rt.step.id) for rt in active))

    def reason(self, tool: str, kind: str, detail: str, available: list[str] | None = None) -> str:
        """A refusal told to the model: what is missing, what it may call instead (``available``
        when the caller knows better), and the active step's posture."""
        with self.lock, self.state.engine.context.outside_transaction():
            return self._reason(tool, kind, detail, available)

    def _reason(self, tool: str, kind: str, detail: str, available: list[str] | None) -> str:
        if kind == "once":
            return (
                f"'{tool}' has already run and may run only once in this conversation. "
                "Do not call it again."
            )
        if kind == "complete":
            return (
                f"'{tool}' may not run any more: the conversation's plan is complete. Do not "
                "call tools; finish the call."
            )
        if kind == "not_yet":
            head = f"'{tool}' is not permitted yet: first, {detail}."
        elif kind == "denied":
            head = f"'{tool}' is not allowed during the current step ('{detail}')."
        else:
            head = f"'{tool}' is not part of the current step ({detail})."
        if available is None:
            available = [t for t in self.plan.universe if self._denial(t) is None]
        if available:
            head += " Available now: " + ", ".join(available) + "."
        else:
            head += " No tool is available right now; continue the conversation instead."
        rts = self.plan.rt
        for i in self.machine.active_ids.index:
            posture = rts[i].step.posture
            if posture:
                return head + " " + posture
        return head

    def refusal(self, tool: str) -> str | None:
        """The reason ``tool`` is refused now, or None (whatever the enforcement mode)."""
        with self.lock, self.state.engine.context.outside_transaction():
            denial = self._denial(tool)
            return None if denial is None else self._reason(tool, *denial, None)

    def refusals(self, tools: Iterable[str]) -> dict[str, str]:
        """Why each of ``tools`` refused now is refused (:meth:`refusal` of each, with what
        is available worked out once)."""
        with self.lock, self.state.engine.context.outside_transaction():
            denials = {tool: self._denial(tool) for tool in tools}
            if not any(denials.values()):
                return {}
            available = [
                t
                for t in self.plan.universe
                if (denials[t] if t in denials else self._denial(t)) is None
            ]
            return {t: self._reason(t, *d, available) for t, d in denials.items() if d is not None}

    def constraint_refusal(self, tool: str) -> str | None:
        """The reason the flow-wide constraints refuse ``tool`` now, or None."""
        with self.lock, self.state.engine.context.outside_transaction():
            denial = self._constraint_denial(tool)
            return None if denial is None else self._reason(tool, *denial, None)
