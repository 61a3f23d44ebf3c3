"""Why a flow is where it is: :class:`FlowExplanation`, built from a marking and the State."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..state import State
from .admission import ToolRules
from .compiled import StepRt
from .guard_base import Explanation, Marking
from .machine import Machine

__all__ = ["FlowExplanation", "explain"]


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


def explain(m: Machine, tools: ToolRules, state: State) -> FlowExplanation:
    """The explanation of machine ``m``'s marking now (call under the runner's lock)."""
    marking = m.mark()
    waiting: dict[str, Explanation] = {}
    for i, rt in enumerate(m.plan.rt):
        if m.done[i] or (m.complete and not m.active[i]):
            continue
        if m.active[i]:
            if rt.done is not None:
                waiting[rt.step.id] = rt.done.explain(state, marking)
            continue
        why = _why_pending(m, rt, marking, state)
        if why is not None:
            waiting[rt.step.id] = why
    allowed: list[str] = []
    blocked: dict[str, str] = {}
    for tool in m.plan.universe:
        denial = tools.denial(tool)
        if denial is None:
            allowed.append(tool)
        else:
            blocked[tool] = tools.reason(tool, *denial)
    return FlowExplanation(
        m.name,
        tuple(m.active_ids.ids),
        tuple(m.done_ids.ids),
        m.complete,
        waiting,
        tuple(allowed),
        blocked,
        tuple(m.steps[i].id for i in m.plan.required if not m.done[i]),
    )


def _why_pending(m: Machine, rt: StepRt, marking: Marking, state: State) -> Explanation | None:
    """For a pending step whose predecessors are done: what still keeps it from starting."""
    steps = m.steps
    parts: list[Explanation] = []
    ready = [m.done[e[0]] for e in rt.edges]
    if rt.edges and not (all(ready) if rt.join_all else any(ready)):
        return None  # not next in line: an earlier step is still open
    for src, when, _, _ in rt.edges:
        if when is not None and m.done[src]:
            parts.append(
                Explanation(
                    when.evaluate(state, marking),
                    f"the branch from {steps[src].id!r}",
                    (when.explain(state, marking),),
                )
            )
    for src in rt.before:
        first = f"step {steps[src].id!r} must be done first (before)"
        parts.append(Explanation(m.done[src], first))
    if rt.gate is not None:
        parts.append(rt.gate.explain(state, marking))
    if not parts:
        return None
    return Explanation(False, "it cannot start until", tuple(parts))
