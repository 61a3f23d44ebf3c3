"""Guards: predicates over the State (and a flow's marking) that steps wait on.

A guard is data: a closed set of atoms (``is_set``, ``eq``, ``gt``, ``resolved``, ...) combined with
``all_`` / ``any_`` / ``not_`` (or ``&``, ``|``, ``~``). Data guards describe themselves in prose,
explain their value as a tree, list the state keys they read (so a runner re-evaluates only the
guards a change can affect), and round-trip through tagged, versioned JSON. ``custom(fn,
reads=...)`` is the escape hatch for code: it works everywhere, but refuses to serialise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import GuardFormatError
from ..resolve.freshness import is_fresh
from ..resolve.template import MISSING
from .guard_base import (
    EMPTY_MARKING,
    Explanation,
    Guard,
    Marking,
    MarkingRefs,
    guard_key,
    guard_name,
    shown_value,
)

if TYPE_CHECKING:
    from ..state import State

__all__ = [
    "active",
    "active_key",
    "always",
    "called_ok",
    "captured",
    "done",
    "entered",
    "failed",
    "fresh",
    "is_set",
    "is_true",
    "pending",
    "resolved",
    "told",
    "told_key",
]


# -- atoms ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class _Always(Guard):
    op: ClassVar[str] = "always"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return True

    def keys_read(self) -> frozenset[str]:
        return frozenset()

    def truth(self) -> bool | None:
        return True

    def describe(self) -> str:
        return "nothing (always true)"

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op}


@dataclass(frozen=True, slots=True, repr=False)
class _KeyAtom(Guard):
    """An atom over one state key."""

    key: str

    def keys_read(self) -> frozenset[str]:
        return frozenset([self.key])

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "key": self.key}

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        seen = shown_value(state, self.key, state.get(self.key, MISSING), self.key)
        return Explanation(self.evaluate(state, marking), f"{self.describe()}: {seen}")


@dataclass(frozen=True, slots=True, repr=False)
class _IsTrue(_KeyAtom):
    op: ClassVar[str] = "is_true"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return state.get(self.key) is True

    def describe(self) -> str:
        return f"'{self.key}' must be true"


@dataclass(frozen=True, slots=True, repr=False)
class _IsSet(_KeyAtom):
    op: ClassVar[str] = "is_set"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        if state.engine.context.tx_open:
            return self.key in state
        # The hot path of a flow: the key was validated when the guard was built.
        return self.key in state.engine.entries

    def describe(self) -> str:
        return f"'{self.key}' must be known"


@dataclass(frozen=True, slots=True, repr=False)
class _Captured(Guard):
    op: ClassVar[str] = "captured"
    keys: tuple[str, ...]

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return all(k in state for k in self.keys)

    def keys_read(self) -> frozenset[str]:
        return frozenset(self.keys)

    def describe(self) -> str:
        return f"these must be known: {', '.join(repr(k) for k in self.keys)}"

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        missing = [k for k in self.keys if k not in state]
        detail = f"missing {', '.join(repr(k) for k in missing)}" if missing else "all known"
        return Explanation(not missing, f"{self.describe()}: {detail}")

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "keys": list(self.keys)}


@dataclass(frozen=True, slots=True, repr=False)
class _CalledOk(Guard):
    op: ClassVar[str] = "called_ok"
    tool: str

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return marking.tools_ok.get(self.tool, 0) > 0

    def keys_read(self) -> frozenset[str]:
        return frozenset()

    def reads_marking(self) -> bool:
        return True

    def marking_refs(self) -> MarkingRefs:
        return MarkingRefs(tools=frozenset([self.tool]))

    def describe(self) -> str:
        return f"tool '{self.tool}' must have run successfully"

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        n = marking.tools_ok.get(self.tool, 0)
        return Explanation(n > 0, f"{self.describe()}: {n} successful call(s)")

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "tool": self.tool}


@dataclass(frozen=True, slots=True, repr=False)
class _Done(Guard):
    op: ClassVar[str] = "done"
    step: str

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return self.step in marking.done

    def keys_read(self) -> frozenset[str]:
        return frozenset()

    def reads_marking(self) -> bool:
        return True

    def marking_refs(self) -> MarkingRefs:
        return MarkingRefs(steps=frozenset([self.step]))

    def describe(self) -> str:
        return f"step '{self.step}' must be complete"

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "step": self.step}


def told_key(flow: str) -> str:
    """Where a running flow records the steps whose postures reached the model."""
    return f"flow:{flow}:told"


def _listed(state: State, step: str, flow: str | None, what: str) -> bool:
    """Whether ``step`` is in ``flow:<flow>:<what>`` (a list of step ids a runner publishes),
    or, without ``flow``, in that key of any running flow."""
    if flow is not None:
        keys = [f"flow:{flow}:{what}"]
    else:
        keys = [k for k in state.keys("flow:") if k.endswith(f":{what}")]
    for key in keys:
        steps = state.get(key)
        if isinstance(steps, list) and step in steps:
            return True
    return False


@dataclass(frozen=True, slots=True, repr=False)
class _Told(Guard):
    op: ClassVar[str] = "told"
    step: str
    flow: str | None = None

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        if marking.flow and self.flow in (None, marking.flow):
            return self.step in marking.told  # inside the flow's own runner
        return _listed(state, self.step, self.flow, "told")

    def keys_read(self) -> frozenset[str]:
        return frozenset() if self.flow is None else frozenset([told_key(self.flow)])

    def reads_marking(self) -> bool:
        return self.flow is None

    def marking_refs(self) -> MarkingRefs:
        # Told is re-checked whenever the marking changes (a told posture is a marking change).
        return MarkingRefs(whole=self.flow is None)

    def describe(self) -> str:
        where = f" of flow '{self.flow}'" if self.flow is not None else ""
        return f"the posture of step '{self.step}'{where} must have reached the model"

    def _node(self, path: str) -> dict[str, Any]:
        node: dict[str, Any] = {"op": self.op, "step": self.step}
        if self.flow is not None:
            node["flow"] = self.flow
        return node


@dataclass(frozen=True, slots=True, repr=False)
class _NameAtom(Guard):
    """An atom over a resolver's keys (``<name>:result`` / ``:status``)."""

    name: str

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "name": self.name}

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        key = f"{self.name}:status"
        seen = shown_value(state, key, state.get(key, MISSING), key)
        return Explanation(self.evaluate(state, marking), f"{self.describe()}: {seen}")


@dataclass(frozen=True, slots=True, repr=False)
class _Resolved(_NameAtom):
    op: ClassVar[str] = "resolved"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return f"{self.name}:result" in state

    def keys_read(self) -> frozenset[str]:
        return frozenset([f"{self.name}:result"])

    def describe(self) -> str:
        return f"'{self.name}' must have a result"


@dataclass(frozen=True, slots=True, repr=False)
class _StatusIs(_NameAtom):
    status: ClassVar[str]

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return bool(state.get(f"{self.name}:status") == self.status)

    def keys_read(self) -> frozenset[str]:
        return frozenset([f"{self.name}:status"])


@dataclass(frozen=True, slots=True, repr=False)
class _Failed(_StatusIs):
    op: ClassVar[str] = "failed"
    status: ClassVar[str] = "error"

    def describe(self) -> str:
        return f"'{self.name}' must have failed"


@dataclass(frozen=True, slots=True, repr=False)
class _Pending(_StatusIs):
    op: ClassVar[str] = "pending"
    status: ClassVar[str] = "running"

    def describe(self) -> str:
        return f"'{self.name}' must be running"


@dataclass(frozen=True, slots=True, repr=False)
class _Fresh(_NameAtom):
    op: ClassVar[str] = "fresh"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return is_fresh(state, self.name)

    def keys_read(self) -> frozenset[str]:
        return frozenset([f"{self.name}:result"])

    def fresh_names(self) -> frozenset[str]:
        return frozenset([self.name])

    def describe(self) -> str:
        return f"'{self.name}' must have a fresh result"


# -- constructors ---------------------------------------------------------------------------


def always() -> Guard:
    """A guard that always holds."""
    return _ALWAYS


_ALWAYS = _Always()


def is_true(key: str) -> Guard:
    """``key`` holds the boolean ``True``."""
    return _IsTrue(guard_key(key, "is_true key"))


def is_set(key: str) -> Guard:
    """``key`` is set (to anything, including ``None``)."""
    return _IsSet(guard_key(key, "is_set key"))


def captured(*keys: str) -> Guard:
    """Every one of ``keys`` is set (extracted slots, say)."""
    if not keys:
        raise GuardFormatError("captured() needs at least one key")
    return _Captured(tuple(guard_key(k, "captured key") for k in keys))


def called_ok(tool: str) -> Guard:
    """Tool ``tool`` has completed successfully at least once (the runner's marking)."""
    return _CalledOk(guard_name(tool, "called_ok tool"))


def done(step: str) -> Guard:
    """Step ``step`` of the flow is done (the runner's marking)."""
    return _Done(guard_name(step, "done step"))


def told(step: str, flow: str | None = None) -> Guard:
    """Step ``step``'s posture was handed to the model (in a turn context that was handed
    over) since the step was last entered: the question was asked, so a "yes" after it answers
    it. Inside its own flow, ``flow`` may be left out; elsewhere (``rule.accept_when``) it names
    the flow, or any running flow's step of that id counts. Reads ``flow:<name>:told``."""
    named = None if flow is None else guard_name(flow, "told flow")
    return _Told(guard_name(step, "told step"), named)


def _resolver(name: object, what: str) -> str:
    # The name prefixes the resolver's keys, so it must make valid keys.
    guard_key(f"{guard_name(name, what)}:result", what)
    return str(name)


def resolved(name: str) -> Guard:
    """Resolver ``name`` has a result: ``<name>:result`` is set."""
    return _Resolved(_resolver(name, "resolved name"))


def failed(name: str, times: int = 1) -> Guard:
    """Resolver ``name``'s last run failed: ``<name>:status`` is ``"error"``; with ``times``,
    its last ``times`` runs in a row failed (``<name>:failures``, which a success removes):
    ``failed("find_patient", times=2)`` hands off after a second miss."""
    resolver = _resolver(name, "failed name")
    n = _times(times, f"failed({name!r})")
    return _Failed(resolver) if n == 1 else _FailedTimes(resolver, n)


def pending(name: str) -> Guard:
    """Resolver ``name`` is running: ``<name>:status`` is ``"running"``."""
    return _Pending(_resolver(name, "pending name"))


def fresh(name: str) -> Guard:
    """Resolver ``name`` has a result younger than its ttl
    (``slateflow.resolve.is_fresh(state, name)``)."""
    return _Fresh(_resolver(name, "fresh name"))


# -- retries: counts and the active step --------------------------------------------------------


def _times(times: object, what: str) -> int:
    if type(times) is not int or times < 1:
        raise GuardFormatError(f"{what}: times is a whole number >= 1, got {times!r}")
    return times


@dataclass(frozen=True, slots=True, repr=False)
class _FailedTimes(_NameAtom):
    op: ClassVar[str] = "failed"
    times: int = 2

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        n = state.get(f"{self.name}:failures", 0)
        return type(n) is int and n >= self.times

    def keys_read(self) -> frozenset[str]:
        return frozenset([f"{self.name}:failures"])

    def describe(self) -> str:
        return f"'{self.name}' must have failed {self.times} times in a row"

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        n = state.get(f"{self.name}:failures", 0)
        return Explanation(self.evaluate(state, marking), f"{self.describe()}: {n} so far")

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "name": self.name, "times": self.times}


@dataclass(frozen=True, slots=True, repr=False)
class _Entered(Guard):
    op: ClassVar[str] = "entered"
    step: str
    times: int = 1

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return marking.entries.get(self.step, 0) >= self.times

    def keys_read(self) -> frozenset[str]:
        return frozenset()

    def reads_marking(self) -> bool:
        return True

    def marking_refs(self) -> MarkingRefs:
        return MarkingRefs(entered=frozenset([self.step]))

    def describe(self) -> str:
        return f"step '{self.step}' must have been entered {self.times} time(s)"

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        n = marking.entries.get(self.step, 0)
        return Explanation(self.evaluate(state, marking), f"{self.describe()}: {n} so far")

    def _node(self, path: str) -> dict[str, Any]:
        node: dict[str, Any] = {"op": self.op, "step": self.step}
        if self.times != 1:
            node["times"] = self.times
        return node


def active_key(flow: str) -> str:
    """Where a running flow records its active steps."""
    return f"flow:{flow}:active"


@dataclass(frozen=True, slots=True, repr=False)
class _Active(Guard):
    op: ClassVar[str] = "active"
    step: str
    flow: str | None = None

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return _listed(state, self.step, self.flow, "active")

    def keys_read(self) -> frozenset[str]:
        return frozenset() if self.flow is None else frozenset([active_key(self.flow)])

    def describe(self) -> str:
        where = f" of flow '{self.flow}'" if self.flow is not None else ""
        return f"step '{self.step}'{where} must be active"

    def _node(self, path: str) -> dict[str, Any]:
        node: dict[str, Any] = {"op": self.op, "step": self.step}
        if self.flow is not None:
            node["flow"] = self.flow
        return node


def entered(step: str, times: int = 1) -> Guard:
    """Step ``step`` has been entered at least ``times`` times (the runner's marking): each
    reset that re-opens it lets it be entered again, so ``entered("ask_again", times=2)``
    says the caller was asked twice."""
    return _Entered(guard_name(step, "entered step"), _times(times, f"entered({step!r})"))


def active(step: str, flow: str | None = None) -> Guard:
    """Step ``step`` is active now (read from ``flow:<flow>:active``; without ``flow``, in
    any running flow). For promotion rules: ``keep_known().accept_when(active("pick_slot"))``
    takes an answer only while its question is the one being asked. Inside a flow's own
    guards, prefer ``done`` and edges: a guard on the flow's own active steps would chase
    itself."""
    named = None if flow is None else guard_name(flow, "active flow")
    return _Active(guard_name(step, "active step"), named)
