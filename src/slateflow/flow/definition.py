"""Flow: a conversation plan of steps and constraints, checked as a whole before it runs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import FlowDefinitionError, InvalidKeyError
from ..state.keys import check_key, unprintable
from .constraints import Before, Commit, Constraint, Never, Once, Require, Reset
from .guard_base import Guard
from .steps import Step

if TYPE_CHECKING:
    from ..resolve.background import Deliver
    from ..resolve.resolver import Resolver
    from ..resolve.session import Session
    from .admission import Enforcement
    from .runner import FlowRunner

__all__ = ["Flow"]


def _find_cycle(deps: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle over ``step -> the steps it waits on``, as the ids along it, or None."""
    color: dict[str, int] = {}
    for root in deps:
        if color.get(root):
            continue
        # Iterative DFS: a long linear flow must not hit the recursion limit.
        path: list[str] = [root]
        stack = [iter(deps.get(root, ()))]
        color[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                color[path.pop()] = 2
                continue
            if nxt not in deps:
                continue
            seen = color.get(nxt, 0)
            if seen == 1:
                cycle = path[path.index(nxt) :]
                return [*reversed(cycle), cycle[-1]] if len(cycle) > 1 else [nxt, nxt]
            if seen == 0:
                color[nxt] = 1
                path.append(nxt)
                stack.append(iter(deps.get(nxt, ())))
    return None


class Flow:
    """A named conversation plan: steps, constraints, and ambient tools.

    ``Flow("booking", [Step(...), ...], constraints=[once("book"), ...], ambient=["escalate"])``
    only stores what it is given; ``build()`` checks the steps against each other and
    ``compile(tools=...)`` checks the whole plan, each raising one
    :class:`FlowDefinitionError` that lists every problem. :meth:`start` (and a conversation's
    ``run_flow``) compiles it for you. ``ambient`` tools are exempt from steps' ``allow``
    lists (still bound by ``deny``, ``once``, ``never`` and ``commit``).
    """

    __slots__ = ("_built", "_checked", "_plan", "_tools", "ambient", "constraints", "name", "steps")

    def __init__(
        self,
        name: str,
        steps: Iterable[Step],
        constraints: Iterable[Constraint] = (),
        ambient: Iterable[str] = (),
    ) -> None:
        if type(name) is not str or not name:
            raise FlowDefinitionError(f"a flow name is a non-empty string, got {name!r}")
        try:
            check_key(f"flow:{name}:active")
        except InvalidKeyError as exc:
            raise FlowDefinitionError(
                f"flow name {name!r} must make valid state keys (flow:{name}:active): {exc}"
            ) from None
        self.name = name
        self.steps: tuple[Step, ...] = tuple(steps)
        for step in self.steps:
            if not isinstance(step, Step):
                raise FlowDefinitionError(f"flow {name!r}: steps holds Step objects, got {step!r}")
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        for c in self.constraints:
            if not isinstance(c, Constraint):
                hint = (
                    " (finish it with .until(guard) / .when(guard))"
                    if hasattr(c, "until") or hasattr(c, "when")
                    else ""
                )
                raise FlowDefinitionError(
                    f"flow {name!r}: constraints holds once(), before(), never().until(), "
                    f"require(), reset().when() or commit(); got {c!r}{hint}"
                )
        amb = [ambient] if isinstance(ambient, str) else list(ambient)
        for tool in amb:
            if type(tool) is not str or not tool or unprintable(tool):
                raise FlowDefinitionError(
                    f"flow {name!r}: ambient holds tool names, got {tool!r} (a name is "
                    "printable: no invisible or control characters)"
                )
        self.ambient: tuple[str, ...] = tuple(dict.fromkeys(amb))
        self._built = False
        self._checked = False  # compile() passed (with the registry in _tools)
        self._tools: frozenset[str] | None = None
        # The runners' compiled plan (slateflow.flow.compiled), built once on first use.
        self._plan: Any = None

    # -- lookups -------------------------------------------------------------------------

    def step(self, step_id: str) -> Step:
        """The step with this id; raises ``KeyError`` naming the known ids."""
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(
            f"flow {self.name!r} has no step {step_id!r}; its steps: "
            + ", ".join(s.id for s in self.steps)
        )

    def tools(self) -> list[str]:
        """Every tool the flow names (steps' allow/deny, once, never, commit, ambient), sorted."""
        found: set[str] = set(self.ambient)
        for s in self.steps:
            found.update(t for t in s.allow if t != "*")
            found.update(s.deny)
        for c in self.constraints:
            if isinstance(c, Once | Never | Commit):
                found.add(c.tool)
        return sorted(found)

    @property
    def registry(self) -> frozenset[str] | None:
        """The tool names given to :meth:`compile` (None if it was given none)."""
        return self._tools

    def guards(self) -> list[tuple[str, Guard]]:
        """Every guard in the flow with where it sits (``steps[2].done``, ``constraints[0]``)."""
        found: list[tuple[str, Guard]] = []
        for s in self.steps:
            found.extend((f"step {s.id!r} {where}", g) for where, g in s.guards())
        for i, c in enumerate(self.constraints):
            if isinstance(c, Never | Commit):
                found.append((f"constraints[{i}] ({_label(c)})", c.until))
            elif isinstance(c, Reset):
                found.append((f"constraints[{i}] ({_label(c)})", c.when))
        return found

    # -- checks --------------------------------------------------------------------------

    def _problems(self) -> list[str]:
        problems: list[str] = []
        if not self.steps:
            problems.append("it has no steps")
        ids = [s.id for s in self.steps]
        known = set(ids)
        seen: set[str] = set()
        for sid in ids:
            if sid in seen:
                problems.append(f"step id {sid!r} is used more than once")
            seen.add(sid)
        for s in self.steps:
            for e in s.after:
                if e.step not in known:
                    problems.append(f"step {s.id!r} comes after unknown step {e.step!r}")
            if not s.terminal and s.done is None:
                problems.append(
                    f"step {s.id!r} has no done guard and is not terminal, so it can never "
                    "complete; give it done=... or terminal=True"
                )
            if s.terminal and s.done is not None:
                problems.append(
                    f"terminal step {s.id!r} has a done guard, which is never used (a terminal "
                    "step is done as soon as it is reached); drop one of them"
                )
            for tool in set(s.allow) & set(s.deny):
                problems.append(f"step {s.id!r} both allows and denies tool {tool!r}")
            target = s.repair.escalate_to if s.repair is not None else None
            if target is not None and target not in known:
                problems.append(f"step {s.id!r} escalates to unknown step {target!r}")
        for where, guard in self.guards():
            refs = guard.marking_refs()
            for ref in sorted(refs.steps - known):
                problems.append(f"{where} reads done({ref!r}), but there is no such step")
            for ref in sorted(refs.entered - known):
                problems.append(f"{where} reads entered({ref!r}), but there is no such step")
        for i, c in enumerate(self.constraints):
            names: tuple[str, ...] = ()
            if isinstance(c, Before):
                names = (c.first, c.then)
            elif isinstance(c, Require | Reset):
                names = c.steps
            for ref in names:
                if ref not in known:
                    problems.append(f"constraints[{i}] ({_label(c)}) names unknown step {ref!r}")
        cycle = _find_cycle({s.id: [e.step for e in s.after] for s in self.steps})
        if cycle:
            problems.append(
                "the steps' after edges form a cycle: "
                + " -> ".join(cycle)
                + " (a flow is a DAG; use reset(...).when(...) to go back)"
            )
        return problems

    def build(self) -> Flow:
        """Check the steps against each other; returns the flow itself.

        Raises :class:`FlowDefinitionError` listing every problem: duplicate step ids, edges to
        unknown steps, a non-terminal step without ``done``, cycles, constraints and
        ``done(step)`` guards naming unknown steps.
        """
        problems = self._problems()
        if problems:
            raise _error(self.name, problems)
        self._built = True
        return self

    def compile(self, tools: Iterable[str] | None = None) -> Flow:
        """``build()``, then check the plan as a whole; returns the flow itself.

        Also reports steps no path reaches, ordering cycles closed by ``before``, commit tools
        guarded by an always-true guard, and (when ``tools`` lists the session's tools) every
        tool name the flow uses that is not among them. The registry is kept: refusals then
        offer every admissible tool of it ("Available now: ...").
        """
        if isinstance(tools, str):
            tools = [tools]
        registry = None if tools is None else frozenset(tools)
        if self._checked and registry == self._tools:
            return self  # a flow is immutable: checked once, it stays good
        problems = self._problems()
        # Every problem is reported at once, whatever else is wrong (a cycle must not hide a
        # misspelt tool or an unreachable step elsewhere).
        problems.extend(p for p in self._plan_problems() if p not in problems)
        for c in self.constraints:
            if isinstance(c, Commit) and c.until.truth() is True:
                problems.append(
                    f"commit tool {c.tool!r} is guarded by a guard that always holds, so it "
                    "guards nothing; use the confirmation it should wait for"
                )
        if registry is not None:
            for tool in self.tools():
                if tool not in registry:
                    problems.append(
                        f"tool {tool!r} is not among the session's tools "
                        f"({', '.join(sorted(registry)) or 'none'}); check its spelling"
                    )
        if problems:
            raise _error(self.name, problems)
        self._built = True
        self._tools = registry
        self._checked = True
        # Compiled for the runners now, once (a cycle-free import: compiled imports this module).
        from .compiled import compiled

        compiled(self)
        return self

    def _plan_problems(self) -> list[str]:
        problems: list[str] = []
        known = {s.id for s in self.steps}
        # Edges to unknown steps are reported by _problems; the plan is judged without them.
        deps: dict[str, list[str]] = {
            s.id: [e.step for e in s.after if e.step in known] for s in self.steps
        }
        for c in self.constraints:
            if isinstance(c, Before) and c.then in known and c.first in known:
                deps[c.then].append(c.first)
        for c in self.constraints:
            if isinstance(c, Never | Commit) and c.until.truth() is False:
                problems.append(
                    f"{_label(c)} waits for a guard that can never hold, so {c.tool!r} could "
                    "never be called"
                )
        cycle = _find_cycle(deps)
        if cycle:
            if _find_cycle({s.id: [e.step for e in s.after] for s in self.steps}) is None:
                problems.append(  # an after-edge cycle alone is reported by _problems
                    "after edges and before() constraints form an ordering cycle: "
                    + " -> ".join(cycle)
                    + "; no step on it can ever start"
                )
            return problems
        # A step is reachable when its gate can hold, the before() constraints naming it are
        # met, and enough of its edges (all, or any one, per join) can be taken: each from a
        # reachable step, with a guard that can hold. One pass in dependency order decides it.
        by_id = {s.id: s for s in self.steps}
        waiting = {sid: len(d) for sid, d in deps.items()}
        dependents: dict[str, list[str]] = {sid: [] for sid in deps}
        for sid, d in deps.items():
            for first in d:
                dependents[first].append(sid)
        ready = [sid for sid, count in waiting.items() if count == 0]
        reached: set[str] = set()
        while ready:
            sid = ready.pop()
            s = by_id[sid]
            edges = [e for e in s.after if e.step in known]
            open_ = [
                e.step in reached and (e.when is None or e.when.truth() is not False) for e in edges
            ]
            firsts = [
                c.first
                for c in self.constraints
                if isinstance(c, Before) and c.then == sid and c.first in known
            ]
            if (
                (s.gate is None or s.gate.truth() is not False)
                and all(f in reached for f in firsts)
                and (not edges or (all(open_) if s.join == "all" else any(open_)))
            ):
                reached.add(sid)
            for nxt in dependents[sid]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    ready.append(nxt)
        for s in self.steps:
            if s.id not in reached:
                problems.append(
                    f"step {s.id!r} is unreachable: its gate, or the edges and before() "
                    "constraints leading to it, can never all be satisfied"
                )
        return problems

    # -- views ---------------------------------------------------------------------------

    def to_mermaid(self) -> str:
        """The flow as a Mermaid ``flowchart TD`` (terminal steps rounded, branches labelled)."""
        ids = {s.id: f"s{i}" for i, s in enumerate(self.steps)}
        lines = ["flowchart TD"]
        for s in self.steps:
            label = _mermaid_text(s.id)
            node = ids[s.id]
            lines.append(f'    {node}(["{label}"])' if s.terminal else f'    {node}["{label}"]')
        for s in self.steps:
            for e in s.after:
                src = ids.get(e.step)
                if src is None:
                    continue
                if e.when is not None:
                    lines.append(f'    {src} -->|"{_mermaid_text(e.when.describe())}"| {ids[s.id]}')
                else:
                    lines.append(f"    {src} --> {ids[s.id]}")
        for c in self.constraints:
            if isinstance(c, Before) and c.first in ids and c.then in ids:
                lines.append(f'    {ids[c.first]} -.->|"before"| {ids[c.then]}')
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """The flow as JSON data (``{"format": "slateflow.flow/1", "flow": {...}}``).

        ``on_enter`` is written as the resolver's name and mode; custom guards and ``deliver``
        callables are code and raise :class:`FlowFormatError` naming their path.
        """
        from .serialize import flow_to_json

        return flow_to_json(self)

    @staticmethod
    def from_json(
        data: Any, *, resolvers: Mapping[str, Resolver] | Iterable[Resolver] = ()
    ) -> Flow:
        """The flow :meth:`to_json` wrote. ``resolvers`` supplies the resolvers that steps'
        ``on_enter`` name. Raises :class:`FlowFormatError` naming the path of a bad node."""
        from .serialize import flow_from_json

        return flow_from_json(data, resolvers)

    def start(
        self,
        session: Session,
        *,
        enforcement: Enforcement | str = "enforce",
        deliver: Deliver | None = None,
    ) -> FlowRunner:
        """Run this flow over the session's State, its ``on_enter`` actions in the session,
        until the session closes; returns its :class:`~slateflow.flow.FlowRunner`.

        The flow is compiled first (``FlowDefinitionError`` lists its problems). Steps advance
        the moment their guards hold, whoever writes the keys. ``enforcement`` is
        ``"enforce"`` (refuse tools the flow does not admit) or ``"observe"`` (admit them and
        record violations). ``deliver`` receives the outcomes of background actions that name
        none. To let the flow govern a conversation's turns, use its ``run_flow`` instead.
        """
        from .runner import FlowRunner  # the runner builds on this module

        return FlowRunner(
            self, session.state, session=session, enforcement=enforcement, deliver=deliver
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Flow):
            return NotImplemented
        return (self.name, self.steps, self.constraints, self.ambient) == (
            other.name,
            other.steps,
            other.constraints,
            other.ambient,
        )

    def __hash__(self) -> int:
        return hash((Flow, self.name, len(self.steps)))

    def __repr__(self) -> str:
        return f"<Flow {self.name!r}: {len(self.steps)} steps, {len(self.constraints)} constraints>"


def _label(c: Constraint) -> str:
    if isinstance(c, Once):
        return f"once({c.tool!r})"
    if isinstance(c, Before):
        return f"before({c.first!r}, {c.then!r})"
    if isinstance(c, Never):
        return f"never({c.tool!r}).until(...)"
    if isinstance(c, Require):
        return "require(" + ", ".join(map(repr, c.steps)) + ")"
    if isinstance(c, Reset):
        return "reset(" + ", ".join(map(repr, c.steps)) + ").when(...)"
    if isinstance(c, Commit):
        return f"commit({c.tool!r}, until=...)"
    return repr(c)


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;")


def _error(name: str, problems: list[str]) -> FlowDefinitionError:
    lines = "\n".join(f"  - {p}" for p in problems)
    return FlowDefinitionError(f"flow {name!r} has {len(problems)} problem(s):\n{lines}", problems)
