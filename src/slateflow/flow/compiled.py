"""A flow compiled for its runners: built once per :class:`Flow`, shared by every runner of it.

Compiling turns step ids into indices and guards into the indexes a runner needs to re-evaluate
only what a change can affect: which steps read a key, which wait on a step or a tool, which
resets re-open which steps. Nothing here changes after it is built; the runner keeps its own
marking. ``compiled(flow)`` returns the flow's plan, building it the first time.
"""

from __future__ import annotations

import threading

from .constraints import Before, Commit, Never, Once, Require, Reset
from .definition import Flow
from .guard_base import Guard
from .repair import RepairPolicy
from .steps import Step

__all__ = ["CompiledFlow", "ResetRt", "StepRt", "compiled"]

_lock = threading.Lock()


def compiled(flow: Flow) -> CompiledFlow:
    """The flow's compiled plan (built on first use, then shared; a flow is immutable)."""
    plan: CompiledFlow | None = flow._plan
    if plan is None or plan.registry != flow.registry:
        with _lock:
            plan = flow._plan
            if plan is None or plan.registry != flow.registry:
                plan = CompiledFlow(flow)
                flow._plan = plan
    return plan


class StepRt:
    """A step compiled for the runner: indices instead of ids, flags instead of lookups."""

    __slots__ = (
        "before",
        "done",
        "done_m",
        "edges",
        "ends",
        "escalates",
        "escalations",
        "gate",
        "gate_m",
        "index",
        "join_all",
        "routed",
        "simple",
        "step",
        "terminal",
    )

    def __init__(
        self,
        index: int,
        step: Step,
        ids: dict[str, int],
        before: list[int],
        escalations: tuple[int, ...] = (),
        routed: frozenset[int] = frozenset(),
    ) -> None:
        self.index = index
        self.step = step
        # (source, condition, whether it reads the marking, whether it is live)
        self.edges = tuple(
            (ids[e.step], e.when, e.when is not None and e.when.reads_marking(), e.live)
            for e in step.after
        )
        self.ends = step.ends
        self.join_all = step.join == "all"
        self.before = tuple(before)
        self.gate = step.gate
        self.gate_m = step.gate is not None and step.gate.reads_marking()
        # Lowered from other steps' repair policies: entered from the stuck step when it
        # escalates (the only way in for a step with no edges of its own).
        self.escalations = escalations
        self.escalates = step.repair is not None and step.repair.escalate_to is not None
        self.done = step.done
        self.done_m = self.done is not None and self.done.reads_marking()
        self.terminal = step.terminal
        # The common shape, one plain edge and nothing else: eligible exactly when that step is
        # done (the runner skips the general check).
        only = self.edges[0] if len(self.edges) == 1 else None
        self.simple = (
            only[0]
            if only is not None
            and only[1] is None
            and not self.before
            and self.gate is None
            and not escalations
            and only[0] not in routed
            else None
        )
        # Edges out of a step that may escalate elsewhere: not taken once it has escalated.
        self.routed = any(e[0] in routed for e in self.edges)

    def edge_label(self) -> str:
        return f"on an edge into step {self.step.id!r}"

    def gate_label(self) -> str:
        return f"gate of step {self.step.id!r}"

    def done_label(self) -> str:
        return f"done of step {self.step.id!r}"


class ResetRt:
    """A reset constraint compiled: its guard and the steps it re-opens."""

    __slots__ = ("clear", "guard", "marking", "targets")

    def __init__(self, guard: Guard, targets: tuple[int, ...], clear: tuple[str, ...]) -> None:
        self.guard = guard
        self.marking = guard.reads_marking()
        self.targets = targets
        self.clear = clear


class CompiledFlow:
    """Everything a runner derives from a flow alone (see the module docstring)."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.registry = flow.registry
        ids = {s.id: i for i, s in enumerate(flow.steps)}
        self.ids = ids
        before: dict[int, list[int]] = {}
        for c in flow.constraints:
            if isinstance(c, Before):
                before.setdefault(ids[c.then], []).append(ids[c.first])
        escalations: dict[int, list[int]] = {}
        self.repairs: dict[int, RepairPolicy] = {}
        for i, s in enumerate(flow.steps):
            if s.repair is None:
                continue
            self.repairs[i] = s.repair
            if s.repair.escalate_to is not None:
                escalations.setdefault(ids[s.repair.escalate_to], []).append(i)
        routed = frozenset(i for sources in escalations.values() for i in sources)
        self.rt = [
            StepRt(i, s, ids, before.get(i, []), tuple(escalations.get(i, ())), routed)
            for i, s in enumerate(flow.steps)
        ]
        self.timed = any(s.timing is not None for s in flow.steps)
        n = len(flow.steps)
        key_steps: dict[str, set[int]] = {}
        on_done: list[set[int]] = [set() for _ in range(n)]
        on_enter: list[set[int]] = [set() for _ in range(n)]
        on_tool: dict[str, set[int]] = {}
        any_marking: set[int] = set()
        for i, rt in enumerate(self.rt):
            for src, *_ in rt.edges:
                on_done[src].add(i)
            for src in rt.before:
                on_done[src].add(i)
            for src in rt.escalations:
                on_done[src].add(i)
            for _, guard in rt.step.guards():
                for key in guard.keys_read():
                    key_steps.setdefault(key, set()).add(i)
                refs = guard.marking_refs()
                if refs.whole:
                    any_marking.add(i)
                for sid in refs.steps:
                    on_done[ids[sid]].add(i)
                for sid in refs.entered:
                    on_enter[ids[sid]].add(i)
                for tool in refs.tools:
                    on_tool.setdefault(tool, set()).add(i)
        self.key_steps = {k: tuple(sorted(v)) for k, v in key_steps.items()}
        self.on_done = [tuple(sorted(v | any_marking)) for v in on_done]
        # Steps whose guards count a step's entries (entered(step, times=n)).
        self.on_enter = [tuple(sorted(v | any_marking)) for v in on_enter]
        self.on_tool = {k: tuple(sorted(v | any_marking)) for k, v in on_tool.items()}
        self.any_marking = tuple(sorted(any_marking))
        # Resets: their guards, and the steps they re-open (with every step after those).
        after_me: list[list[int]] = [[] for _ in range(n)]
        for i, rt in enumerate(self.rt):
            for src, *_ in rt.edges:
                after_me[src].append(i)
            for src in rt.before:  # before(src, i): ordered after it as an edge would be
                after_me[src].append(i)
            for src in rt.escalations:
                after_me[src].append(i)
        self.succ = [tuple(a) for a in after_me]
        self.resets: list[ResetRt] = []
        key_resets: dict[str, set[int]] = {}
        reset_on_done: list[set[int]] = [set() for _ in range(n)]
        reset_on_enter: list[set[int]] = [set() for _ in range(n)]
        reset_on_tool: dict[str, set[int]] = {}
        reset_any: set[int] = set()
        for c in flow.constraints:
            if not isinstance(c, Reset):
                continue
            r = len(self.resets)
            targets: set[int] = set()
            stack = [ids[s] for s in c.steps]
            while stack:
                i = stack.pop()
                if i not in targets:
                    targets.add(i)
                    stack.extend(after_me[i])
            self.resets.append(ResetRt(c.when, tuple(sorted(targets)), c.clear))
            for key in c.when.keys_read():
                key_resets.setdefault(key, set()).add(r)
            refs = c.when.marking_refs()
            if refs.whole:
                reset_any.add(r)
            for sid in refs.steps:
                reset_on_done[ids[sid]].add(r)
            for sid in refs.entered:
                reset_on_enter[ids[sid]].add(r)
            for tool in refs.tools:
                reset_on_tool.setdefault(tool, set()).add(r)
        self.key_resets = {k: tuple(sorted(v)) for k, v in key_resets.items()}
        self.reset_on_done = [tuple(sorted(v | reset_any)) for v in reset_on_done]
        self.reset_on_tool = {k: tuple(sorted(v | reset_any)) for k, v in reset_on_tool.items()}
        self.reset_any = tuple(sorted(reset_any))
        self.reset_on_enter = [tuple(sorted(v | reset_any)) for v in reset_on_enter]
        # Whether any guard may read the entry counts: only then does the marking carry them.
        self.reads_entries = any(self.on_enter) or any(self.reset_on_enter)
        # Admission.
        self.once = {c.tool for c in flow.constraints if isinstance(c, Once | Commit)}
        self.never: list[tuple[str, Guard]] = [
            (c.tool, c.until) for c in flow.constraints if isinstance(c, Never | Commit)
        ]
        self.ambient = frozenset(flow.ambient)
        required = [ids[s] for c in flow.constraints if isinstance(c, Require) for s in c.steps]
        self.required = tuple(dict.fromkeys(required))
        self.required_set = frozenset(self.required)
        self.terminals = tuple(i for i, s in enumerate(flow.steps) if s.terminal)
        # Steps that end the flow when entered: latched before any other queued step, so a
        # step the same change made eligible is not entered only to give way at once.
        self.ends = tuple(i for i, s in enumerate(flow.steps) if s.ends)
        self.universe = sorted(set(flow.tools()) | (flow.registry or frozenset()))
        fresh: set[str] = set()
        for s in flow.steps:
            for _, guard in s.guards():
                fresh |= guard.fresh_names()
        for reset in self.resets:
            fresh |= reset.guard.fresh_names()
        self.fresh_names = tuple(sorted(fresh))
        self.fresh_keys = frozenset(f"{n}:result" for n in fresh)
        # What every runner of the flow subscribes to and writes, made once.
        self.watched = sorted(self.key_steps.keys() | self.key_resets.keys())
        name = flow.name
        self.progress_keys = tuple(
            f"flow:{name}:{k}" for k in ("active", "done", "complete", "marking", "told", "over")
        )
