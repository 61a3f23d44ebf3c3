"""Flows as tagged, versioned JSON: written by ``Flow.to_json``, read by ``Flow.from_json``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import FlowDefinitionError, FlowFormatError, GuardFormatError
from ..resolve.background import Scheduling
from .constraints import (
    Before,
    Commit,
    Constraint,
    Never,
    Once,
    Require,
    Reset,
    before,
    commit,
    never,
    once,
    require,
    reset,
)
from .definition import Flow
from .guard_base import Guard
from .guard_json import parse
from .repair import RepairPolicy
from .steps import Edge, Step
from .timing import VoiceTiming

if TYPE_CHECKING:
    from ..resolve.resolver import Resolver

__all__ = ["FLOW_FORMAT", "flow_from_json", "flow_to_json"]

FLOW_FORMAT = "slateflow.flow/1"
"""The tag and version written by ``Flow.to_json`` and required by ``Flow.from_json``."""


def _guard_node(guard: Guard, path: str) -> dict[str, Any]:
    try:
        return guard._node(path)
    except GuardFormatError as exc:
        raise FlowFormatError(str(exc)) from None


def _edge_node(e: Edge, path: str) -> str | dict[str, Any]:
    if e.when is None:
        return e.step
    node: dict[str, Any] = {"step": e.step, "when": _guard_node(e.when, f"{path}.when")}
    if e.live:
        node["live"] = True
    return node


def _step_node(step: Step, path: str) -> dict[str, Any]:
    node: dict[str, Any] = {"id": step.id}
    if step.after:
        node["after"] = [_edge_node(e, f"{path}.after[{i}]") for i, e in enumerate(step.after)]
    if step.join != "all":
        node["join"] = step.join
    if step.gate is not None:
        node["gate"] = _guard_node(step.gate, f"{path}.gate")
    if step.done is not None:
        node["done"] = _guard_node(step.done, f"{path}.done")
    if step.posture is not None:
        node["posture"] = step.posture
    if step.summary is not None:
        node["summary"] = step.summary
    if step.ground is not None:
        node["ground"] = step.ground.text
    if step.allow:
        node["allow"] = list(step.allow)
    if step.deny:
        node["deny"] = list(step.deny)
    if step.terminal:
        node["terminal"] = True
    if step.ends:
        node["ends"] = True
    if step.on_enter is not None:
        action = step.on_enter
        if action.deliver is not None:
            raise FlowFormatError(
                f"{path}.on_enter: its deliver callable is code and cannot be serialised; "
                "leave deliver unset (results queue on the runner) to save the flow"
            )
        out: dict[str, Any] = {"resolver": action.resolver.name, "mode": action.mode}
        if action.scheduling != Scheduling.WHEN_IDLE:
            out["scheduling"] = action.scheduling.value
        node["on_enter"] = out
    if step.repair is not None:
        node["repair"] = step.repair.model_dump(mode="json", exclude_none=True)
    if step.timing is not None:
        node["timing"] = step.timing.model_dump(mode="json", exclude_none=True)
    return node


def _constraint_node(c: Constraint, path: str) -> dict[str, Any]:
    if isinstance(c, Once):
        return {"kind": "once", "tool": c.tool}
    if isinstance(c, Before):
        return {"kind": "before", "first": c.first, "then": c.then}
    if isinstance(c, Never):
        return {"kind": "never", "tool": c.tool, "until": _guard_node(c.until, f"{path}.until")}
    if isinstance(c, Require):
        return {"kind": "require", "steps": list(c.steps)}
    if isinstance(c, Reset):
        when = _guard_node(c.when, f"{path}.when")
        node = {"kind": "reset", "steps": list(c.steps), "when": when}
        if c.clear:
            node["clear"] = list(c.clear)
        return node
    if isinstance(c, Commit):
        return {"kind": "commit", "tool": c.tool, "until": _guard_node(c.until, f"{path}.until")}
    raise FlowFormatError(f"{path}: {c!r} is not a known constraint")


def flow_to_json(flow: Flow) -> dict[str, Any]:
    """See :meth:`Flow.to_json`."""
    body: dict[str, Any] = {
        "name": flow.name,
        "steps": [_step_node(s, f"flow.steps[{i}]") for i, s in enumerate(flow.steps)],
    }
    if flow.constraints:
        body["constraints"] = [
            _constraint_node(c, f"flow.constraints[{i}]") for i, c in enumerate(flow.constraints)
        ]
    if flow.ambient:
        body["ambient"] = list(flow.ambient)
    return {"format": FLOW_FORMAT, "flow": body}


# -- reading ----------------------------------------------------------------------------


def _kind(value: object) -> str:
    return type(value).__name__ if value is not None else "null"


class _Node:
    """A JSON object being read, with its path for error messages."""

    __slots__ = ("data", "path")

    def __init__(self, data: Any, path: str, allowed: Iterable[str]) -> None:
        if not isinstance(data, Mapping):
            raise FlowFormatError(f"{path}: expected a JSON object, got {_kind(data)}")
        extra = sorted(set(data) - set(allowed))
        if extra:
            raise FlowFormatError(f"{path}: unknown field(s) {extra}")
        self.data = data
        self.path = path

    def has(self, name: str) -> bool:
        return name in self.data

    def get(
        self, name: str, check: Callable[[Any], bool], expected: str, default: Any = None
    ) -> Any:
        if name not in self.data:
            if default is _REQUIRED:
                raise FlowFormatError(f"{self.path}: missing field {name!r}")
            return default
        value = self.data[name]
        if not check(value):
            raise FlowFormatError(f"{self.path}.{name}: expected {expected}, got {_kind(value)}")
        return value

    def text(self, name: str, default: Any = None) -> Any:
        return self.get(name, lambda v: type(v) is str, "a string", default)

    def names(self, name: str) -> list[str]:
        value = self.get(name, lambda v: isinstance(v, list), "a list of strings", [])
        for i, item in enumerate(value):
            if type(item) is not str or not item:
                raise FlowFormatError(f"{self.path}.{name}[{i}]: expected a non-empty string")
        return list(value)

    def guard(self, name: str, required: bool = False) -> Guard | None:
        if name not in self.data:
            if required:
                raise FlowFormatError(f"{self.path}: missing field {name!r}")
            return None
        try:
            return parse(self.data[name], f"{self.path}.{name}")
        except GuardFormatError as exc:
            raise FlowFormatError(str(exc)) from None


_REQUIRED: Any = object()
_STEP_FIELDS = (
    "id",
    "after",
    "join",
    "gate",
    "done",
    "posture",
    "summary",
    "ground",
    "allow",
    "deny",
    "terminal",
    "ends",
    "on_enter",
    "repair",
    "timing",
)


def _resolver_table(
    resolvers: Mapping[str, Resolver] | Iterable[Resolver],
) -> Mapping[str, Resolver]:
    table = dict(resolvers) if isinstance(resolvers, Mapping) else {r.name: r for r in resolvers}
    for name, resolver in table.items():
        if getattr(resolver, "name", None) != name:
            raise FlowFormatError(
                f"resolvers[{name!r}] is {resolver!r}, whose name is not {name!r}: a step's "
                "on_enter names the resolver itself, so the key must be its name"
            )
    return table


def _read_step(data: Any, path: str, table: Mapping[str, Resolver]) -> Step:
    node = _Node(data, path, _STEP_FIELDS)
    sid = node.text("id", _REQUIRED)
    after: list[str | Edge] = []
    raw_after = node.get("after", lambda v: isinstance(v, list), "a list", [])
    for i, entry in enumerate(raw_after):
        where = f"{path}.after[{i}]"
        if type(entry) is str:
            after.append(entry)
            continue
        e = _Node(entry, where, ("step", "when", "live"))
        when = e.guard("when")
        live = e.get("live", lambda v: type(v) is bool, "true or false", False)
        try:
            after.append(Edge(e.text("step", _REQUIRED), when, live))
        except FlowDefinitionError as exc:
            raise FlowFormatError(f"{where}: {exc}") from None
    on_enter = None
    if node.has("on_enter"):
        act = _Node(node.data["on_enter"], f"{path}.on_enter", ("resolver", "mode", "scheduling"))
        name = act.text("resolver", _REQUIRED)
        resolver = table.get(name)
        if resolver is None:
            known = ", ".join(sorted(table)) or "none were given"
            raise FlowFormatError(
                f"{path}.on_enter.resolver: no resolver named {name!r}; pass it to "
                f"Flow.from_json(..., resolvers=[...]) (given: {known})"
            )
        mode = act.text("mode", "dispatch")
        scheduling = act.text("scheduling", Scheduling.WHEN_IDLE.value)
        from .steps import run

        try:
            on_enter = run(resolver, mode, scheduling=scheduling)
        except FlowDefinitionError as exc:
            raise FlowFormatError(f"{path}.on_enter: {exc}") from None
    repair = _model(node, "repair", RepairPolicy, path)
    timing = _model(node, "timing", VoiceTiming, path)
    try:
        return Step(
            sid,
            after=after,
            join=node.text("join", "all"),
            gate=node.guard("gate"),
            done=node.guard("done"),
            posture=node.text("posture"),
            summary=node.text("summary"),
            ground=node.text("ground"),
            allow=node.names("allow"),
            deny=node.names("deny"),
            terminal=node.get("terminal", lambda v: type(v) is bool, "true or false", False),
            ends=node.get("ends", lambda v: type(v) is bool, "true or false", False),
            on_enter=on_enter,
            repair=repair,
            timing=timing,
        )
    except FlowDefinitionError as exc:
        raise FlowFormatError(f"{path}: {exc}") from None


_M = TypeVar("_M", bound=BaseModel)


def _model(node: _Node, name: str, model: type[_M], path: str) -> _M | None:
    if not node.has(name):
        return None
    try:
        return model.model_validate(node.data[name])
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        raise FlowFormatError(f"{path}.{name}: {problems}") from None


def _read_constraint(data: Any, path: str) -> Constraint:
    if not isinstance(data, Mapping):
        raise FlowFormatError(f"{path}: expected a JSON object, got {_kind(data)}")
    kind = data.get("kind")
    fields = _CONSTRAINT_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise FlowFormatError(
            f"{path}.kind: unknown constraint {kind!r}; known: {', '.join(_CONSTRAINT_FIELDS)}"
        )
    node = _Node(data, path, ("kind", *fields))
    try:
        if kind == "once":
            return once(node.text("tool", _REQUIRED))
        if kind == "before":
            return before(node.text("first", _REQUIRED), node.text("then", _REQUIRED))
        if kind in ("never", "commit"):
            tool = node.text("tool", _REQUIRED)
            until = node.guard("until", required=True)
            assert until is not None
            return never(tool).until(until) if kind == "never" else commit(tool, until)
        steps = node.names("steps")
        if kind == "require":
            return require(*steps)
        when = node.guard("when", required=True)
        assert when is not None
        clear = node.names("clear") if node.has("clear") else []
        return reset(*steps, clear=clear).when(when)
    except FlowDefinitionError as exc:
        raise FlowFormatError(f"{path}: {exc}") from None


_CONSTRAINT_FIELDS: dict[str, tuple[str, ...]] = {
    "once": ("tool",),
    "before": ("first", "then"),
    "never": ("tool", "until"),
    "require": ("steps",),
    "reset": ("steps", "when", "clear"),
    "commit": ("tool", "until"),
}


def flow_from_json(data: Any, resolvers: Mapping[str, Resolver] | Iterable[Resolver]) -> Flow:
    """See :meth:`Flow.from_json`."""
    if not isinstance(data, Mapping):
        raise FlowFormatError(f"a serialised flow is a JSON object, got {_kind(data)}")
    tag = data.get("format")
    if tag != FLOW_FORMAT:
        raise FlowFormatError(
            f"format: expected {FLOW_FORMAT!r}, got {tag!r}; this flow was written by another "
            "version or is not a slateflow flow"
        )
    extra = sorted(set(data) - {"format", "flow"})
    if extra:
        raise FlowFormatError(f"unknown field(s) {extra} beside 'format' and 'flow'")
    body = _Node(data.get("flow"), "flow", ("name", "steps", "constraints", "ambient"))
    name = body.text("name", _REQUIRED)
    raw_steps = body.get("steps", lambda v: isinstance(v, list), "a list of steps", _REQUIRED)
    table = _resolver_table(resolvers)
    steps = [_read_step(s, f"flow.steps[{i}]", table) for i, s in enumerate(raw_steps)]
    raw_constraints = body.get("constraints", lambda v: isinstance(v, list), "a list", [])
    constraints = [
        _read_constraint(c, f"flow.constraints[{i}]") for i, c in enumerate(raw_constraints)
    ]
    try:
        return Flow(name, steps, constraints, body.names("ambient"))
    except FlowDefinitionError as exc:
        raise FlowFormatError(f"flow: {exc}") from None
