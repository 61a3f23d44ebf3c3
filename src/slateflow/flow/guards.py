"""Guards: predicates over the State (and a flow's marking) that steps wait on.

A guard is data: a closed set of atoms (``is_set``, ``eq``, ``resolved``, ...) combined with
``all_`` / ``any_`` / ``not_`` (or ``&``, ``|``, ``~``). Data guards describe themselves in prose,
explain their value as a tree, list the state keys they read (so a runner re-evaluates only the
guards a change can affect), and round-trip through tagged, versioned JSON. ``custom(fn,
reads=...)`` is the escape hatch for code: it works everywhere, but refuses to serialise.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import GuardFormatError, TemplateError
from ..resolve.template import MISSING, Reference
from ..state.keys import check_key
from ..state.values import clean, copy_json, same

if TYPE_CHECKING:
    from ..state import State

__all__ = [
    "EMPTY_MARKING",
    "GUARD_FORMAT",
    "Explanation",
    "Guard",
    "Marking",
    "all_",
    "always",
    "any_",
    "called_ok",
    "captured",
    "custom",
    "done",
    "eq",
    "failed",
    "fresh",
    "is_set",
    "is_true",
    "not_",
    "pending",
    "resolved",
    "told",
    "told_key",
]

GUARD_FORMAT = "slateflow.guard/1"
"""The tag and version written by :meth:`Guard.to_json` and required by :meth:`Guard.from_json`."""


@dataclass(frozen=True, slots=True)
class Marking:
    """What a flow runner knows beyond the State: the steps done, the tools that succeeded and
    the steps whose postures reached the model.

    ``done`` holds step ids; ``tools_ok`` counts successful calls per tool name; ``told`` holds
    the steps whose posture was handed to the model since they were last entered, and ``flow``
    names the flow whose marking it is. Guards that read it (``done``, ``called_ok``, ``told``)
    see the runner's marking; evaluated without a runner they see :data:`EMPTY_MARKING`.
    """

    done: frozenset[str] = frozenset()
    tools_ok: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    told: frozenset[str] = frozenset()
    flow: str = ""

    def __post_init__(self) -> None:
        # Copies: changing the dict or set it was made from must not change the marking.
        object.__setattr__(self, "done", frozenset(self.done))
        object.__setattr__(self, "tools_ok", MappingProxyType(dict(self.tools_ok)))
        object.__setattr__(self, "told", frozenset(self.told))


EMPTY_MARKING = Marking()


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a guard is true or false: its value, a sentence, and the same for each part.

    ``str(explanation)`` is an indented tree of ``[true]`` / ``[false]`` lines naming the keys and
    the values that decided it.
    """

    holds: bool
    text: str
    parts: tuple[Explanation, ...] = ()

    def lines(self, depth: int = 0) -> list[str]:
        """The tree as indented lines."""
        out = [f"{'  ' * depth}[{'true' if self.holds else 'false'}] {self.text}"]
        for part in self.parts:
            out.extend(part.lines(depth + 1))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _show(value: Any) -> str:
    if value is MISSING:
        return "not set"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _found(state: State, key: str, value: Any, label: str) -> str:
    """``'label' is <value>``, with a secret key's value masked."""
    secret = value is not MISSING and state.is_secret(key)
    return f"'{label}' is {'***' if secret else _show(value)}"


class Guard(ABC):
    """A predicate over ``(state, marking)``; build one with the functions of this module.

    ``evaluate(state, marking)`` gives its value, ``keys_read()`` the state keys it depends on,
    ``describe()`` a prose clause ("'booking:date' must be known"), ``explain(state, marking)``
    a true/false tree, and ``to_json()`` / ``Guard.from_json()`` its serialised form. Guards are
    immutable and compare by value; ``a & b``, ``a | b`` and ``~a`` combine them.
    """

    __slots__ = ()
    op: ClassVar[str]

    @abstractmethod
    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        """Whether the guard holds now."""

    @abstractmethod
    def keys_read(self) -> frozenset[str]:
        """The state keys whose changes can change the guard's value."""

    def reads_marking(self) -> bool:
        """Whether the guard also depends on the flow's marking (done steps, tool calls)."""
        return False

    @abstractmethod
    def describe(self) -> str:
        """The guard as a short prose clause, for a model or a person."""

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        """The guard's value now, with what decided it."""
        return Explanation(self.evaluate(state, marking), self.describe())

    @abstractmethod
    def _node(self, path: str) -> dict[str, Any]:
        """This guard's JSON node (``path`` names it in errors)."""

    def to_json(self) -> dict[str, Any]:
        """The guard as JSON data: ``{"format": "slateflow.guard/1", "guard": {...}}``.

        Raises :class:`GuardFormatError` naming the path of a custom guard, which is code and
        cannot be serialised.
        """
        return {"format": GUARD_FORMAT, "guard": self._node("guard")}

    @staticmethod
    def from_json(data: Any) -> Guard:
        """The guard that :meth:`to_json` wrote; raises :class:`GuardFormatError` naming the
        path of the first bad node (``guard.of[1].key``)."""
        if not isinstance(data, Mapping):
            raise GuardFormatError(f"a serialised guard is a JSON object, got {_kind(data)}")
        tag = data.get("format")
        if tag != GUARD_FORMAT:
            raise GuardFormatError(
                f"format: expected {GUARD_FORMAT!r}, got {tag!r}; this guard was written by "
                "another version or is not a slateflow guard"
            )
        extra = sorted(set(data) - {"format", "guard"})
        if extra:
            raise GuardFormatError(f"unknown field(s) {extra} beside 'format' and 'guard'")
        from .guard_json import parse  # the parser builds guards with this module's makers

        return parse(data.get("guard"), "guard")

    def __and__(self, other: Guard) -> Guard:
        # a & b & c is one conjunction of three, not a nest of pairs.
        if isinstance(self, _All) and self.parts:
            return all_(*self.parts, other)
        return all_(self, other)

    def __or__(self, other: Guard) -> Guard:
        if isinstance(self, _Any) and self.parts:
            return any_(*self.parts, other)
        return any_(self, other)

    def __invert__(self) -> Guard:
        return not_(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.describe()}>"


def _kind(value: object) -> str:
    return type(value).__name__ if value is not None else "null"


# -- atoms ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class _Always(Guard):
    op: ClassVar[str] = "always"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return True

    def keys_read(self) -> frozenset[str]:
        return frozenset()

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
        seen = _found(state, self.key, state.get(self.key, MISSING), self.key)
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
        if state.engine.tx_open:
            return self.key in state
        # The hot path of a flow: the key was validated when the guard was built.
        return self.key in state.engine.entries

    def describe(self) -> str:
        return f"'{self.key}' must be known"


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class _Eq(Guard):
    op: ClassVar[str] = "eq"
    ref: Reference
    value: Any

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return same(self.ref.lookup(state), self.value)

    def keys_read(self) -> frozenset[str]:
        return frozenset([self.ref.key])

    def describe(self) -> str:
        return f"'{self.ref.text}' must be {_show(self.value)}"

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        seen = _found(state, self.ref.key, self.ref.lookup(state), self.ref.text)
        return Explanation(self.evaluate(state, marking), f"{self.describe()}: {seen}")

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "key": self.ref.text, "value": copy_json(self.value)}

    # JSON equality, as evaluate uses: eq("k", 1) and eq("k", True) are different guards.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Eq) and other.ref == self.ref and same(other.value, self.value)

    def __hash__(self) -> int:
        return hash((self.ref, json.dumps(self.value, sort_keys=True)))


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

    def describe(self) -> str:
        return f"step '{self.step}' must be complete"

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "step": self.step}


def told_key(flow: str) -> str:
    """Where a running flow records the steps whose postures reached the model."""
    return f"flow:{flow}:told"


@dataclass(frozen=True, slots=True, repr=False)
class _Told(Guard):
    op: ClassVar[str] = "told"
    step: str
    flow: str | None = None

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        if marking.flow and self.flow in (None, marking.flow):
            return self.step in marking.told  # inside the flow's own runner
        if self.flow is not None:
            keys = [told_key(self.flow)]
        else:
            keys = [k for k in state.keys("flow:") if k.endswith(":told")]
        for key in keys:
            told = state.get(key)
            if isinstance(told, list) and self.step in told:
                return True
        return False

    def keys_read(self) -> frozenset[str]:
        return frozenset() if self.flow is None else frozenset([told_key(self.flow)])

    def reads_marking(self) -> bool:
        return self.flow is None

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
        seen = _found(state, key, state.get(key, MISSING), key)
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
        return state.is_fresh(self.name)

    def keys_read(self) -> frozenset[str]:
        return frozenset([f"{self.name}:result"])

    def describe(self) -> str:
        return f"'{self.name}' must have a fresh result"


# -- combinators ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class _Many(Guard):
    parts: tuple[Guard, ...]
    word: ClassVar[str]

    def keys_read(self) -> frozenset[str]:
        return frozenset().union(*(p.keys_read() for p in self.parts))

    def reads_marking(self) -> bool:
        return any(p.reads_marking() for p in self.parts)

    def describe(self) -> str:
        clauses = [p.describe() for p in self.parts]
        if not clauses:
            return "nothing (always true)" if self.op == "all" else "never (no alternative)"
        if len(clauses) == 1:
            return clauses[0]
        return f" {self.word} ".join(
            f"({c})" if " and " in c or " or " in c else c for c in clauses
        )

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        parts = tuple(p.explain(state, marking) for p in self.parts)
        values = [p.holds for p in parts]
        holds = all(values) if self.op == "all" else any(values)
        return Explanation(holds, f"{self.word} of {len(parts)}", parts)

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "of": [p._node(f"{path}.of[{i}]") for i, p in enumerate(self.parts)]}


@dataclass(frozen=True, slots=True, repr=False)
class _All(_Many):
    op: ClassVar[str] = "all"
    word: ClassVar[str] = "and"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return all(p.evaluate(state, marking) for p in self.parts)


@dataclass(frozen=True, slots=True, repr=False)
class _Any(_Many):
    op: ClassVar[str] = "any"
    word: ClassVar[str] = "or"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return any(p.evaluate(state, marking) for p in self.parts)


@dataclass(frozen=True, slots=True, repr=False)
class _Not(Guard):
    op: ClassVar[str] = "not"
    part: Guard

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return not self.part.evaluate(state, marking)

    def keys_read(self) -> frozenset[str]:
        return self.part.keys_read()

    def reads_marking(self) -> bool:
        return self.part.reads_marking()

    def describe(self) -> str:
        return f"it must not be the case that {self.part.describe()}"

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        inner = self.part.explain(state, marking)
        return Explanation(not inner.holds, "not", (inner,))

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "of": self.part._node(f"{path}.of")}


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class _Custom(Guard):
    op: ClassVar[str] = "custom"
    fn: Callable[[State, Marking], Any]
    reads: frozenset[str]
    marking: bool
    text: str

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return bool(self.fn(state, marking))

    def keys_read(self) -> frozenset[str]:
        return self.reads

    def reads_marking(self) -> bool:
        return self.marking

    def describe(self) -> str:
        return self.text

    def _node(self, path: str) -> dict[str, Any]:
        raise GuardFormatError(
            f"{path} is a custom guard ({self.text}): it is code and cannot be serialised; "
            "build the guard from atoms (is_set, eq, all_, ...) to save or send it"
        )


# -- constructors ---------------------------------------------------------------------------


def _key(key: object, what: str) -> str:
    try:
        return check_key(key)
    except Exception as exc:
        raise GuardFormatError(f"{what}: {exc}") from None


def _name(value: object, what: str) -> str:
    if type(value) is not str or not value:
        raise GuardFormatError(f"{what} must be a non-empty string, got {value!r}")
    return value


def always() -> Guard:
    """A guard that always holds."""
    return _ALWAYS


_ALWAYS = _Always()


def is_true(key: str) -> Guard:
    """``key`` holds the boolean ``True``."""
    return _IsTrue(_key(key, "is_true key"))


def is_set(key: str) -> Guard:
    """``key`` is set (to anything, including ``None``)."""
    return _IsSet(_key(key, "is_set key"))


def eq(key: str, value: Any) -> Guard:
    """The value at ``key`` (or at a path inside it, ``"booking:slot.time"``) equals ``value``.

    Equality is JSON equality: ``1``, ``1.0`` and ``True`` differ. ``value`` must be JSON data.
    """
    try:
        ref = Reference(key)
    except (TemplateError, TypeError) as exc:
        raise GuardFormatError(f"eq key: {exc}") from None
    return _Eq(ref, clean(value, f"eq({key!r}) value"))


def captured(*keys: str) -> Guard:
    """Every one of ``keys`` is set (extracted slots, say)."""
    if not keys:
        raise GuardFormatError("captured() needs at least one key")
    return _Captured(tuple(_key(k, "captured key") for k in keys))


def called_ok(tool: str) -> Guard:
    """Tool ``tool`` has completed successfully at least once (the runner's marking)."""
    return _CalledOk(_name(tool, "called_ok tool"))


def done(step: str) -> Guard:
    """Step ``step`` of the flow is done (the runner's marking)."""
    return _Done(_name(step, "done step"))


def told(step: str, flow: str | None = None) -> Guard:
    """Step ``step``'s posture was handed to the model (in a turn context that was handed
    over) since the step was last entered: the question was asked, so a "yes" after it answers
    it. Inside its own flow, ``flow`` may be left out; elsewhere (``rule.accept_when``) it names
    the flow, or any running flow's step of that id counts. Reads ``flow:<name>:told``."""
    return _Told(_name(step, "told step"), None if flow is None else _name(flow, "told flow"))


def _resolver(name: object, what: str) -> str:
    # The name prefixes the resolver's keys, so it must make valid keys.
    _key(f"{_name(name, what)}:result", what)
    return str(name)


def resolved(name: str) -> Guard:
    """Resolver ``name`` has a result: ``<name>:result`` is set."""
    return _Resolved(_resolver(name, "resolved name"))


def failed(name: str) -> Guard:
    """Resolver ``name``'s last run failed: ``<name>:status`` is ``"error"``."""
    return _Failed(_resolver(name, "failed name"))


def pending(name: str) -> Guard:
    """Resolver ``name`` is running: ``<name>:status`` is ``"running"``."""
    return _Pending(_resolver(name, "pending name"))


def fresh(name: str) -> Guard:
    """Resolver ``name`` has a result younger than its ttl (``state.is_fresh(name)``)."""
    return _Fresh(_resolver(name, "fresh name"))


def _guards(parts: tuple[Guard, ...], what: str) -> tuple[Guard, ...]:
    for i, part in enumerate(parts):
        if not isinstance(part, Guard):
            raise TypeError(f"{what}() takes guards; argument {i} is {part!r}")
    return parts


def all_(*guards: Guard) -> Guard:
    """Every one of ``guards`` holds (``a & b``). ``all_()`` always holds."""
    return _All(_guards(guards, "all_"))


def any_(*guards: Guard) -> Guard:
    """At least one of ``guards`` holds (``a | b``). ``any_()`` never holds."""
    return _Any(_guards(guards, "any_"))


def not_(guard: Guard) -> Guard:
    """``guard`` does not hold (``~guard``)."""
    return _Not(_guards((guard,), "not_")[0])


def custom(
    fn: Callable[[State, Marking], Any],
    reads: Iterable[str] = (),
    *,
    marking: bool = False,
    describe: str | None = None,
) -> Guard:
    """A guard written as code: ``fn(state, marking)`` decides it.

    ``reads`` lists the state keys it depends on (a runner re-evaluates it when one changes);
    ``marking=True`` if it reads the marking. It combines with any other guard, but a guard
    containing it cannot be serialised.
    """
    if not callable(fn):
        raise TypeError(f"custom() takes a callable (state, marking) -> bool, got {fn!r}")
    keys = frozenset(
        _key(k, "custom reads") for k in ([reads] if isinstance(reads, str) else reads)
    )
    text = describe or f"{getattr(fn, '__qualname__', 'a condition')} holds"
    return _Custom(fn, keys, bool(marking), text)
