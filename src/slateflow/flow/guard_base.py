"""The guard base: what every guard is (:class:`Guard`), the marking it may read, its
explanation tree, and the combinators (``all_`` / ``any_`` / ``not_``, ``custom``).

The atoms live in :mod:`slateflow.flow.guards` (state, marking and resolver atoms) and
:mod:`slateflow.flow.comparisons` (equality and numeric comparisons on values).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import GuardFormatError
from ..resolve.template import MISSING
from ..state.keys import check_key

if TYPE_CHECKING:
    from ..state import State

__all__ = [
    "EMPTY_MARKING",
    "GUARD_FORMAT",
    "NO_REFS",
    "Explanation",
    "Guard",
    "Marking",
    "MarkingRefs",
    "all_",
    "any_",
    "custom",
    "not_",
]

GUARD_FORMAT = "slateflow.guard/1"
"""The tag and version written by :meth:`Guard.to_json` and required by :meth:`Guard.from_json`."""


@dataclass(frozen=True, slots=True)
class Marking:
    """What a flow runner knows beyond the State: the steps done, the tools that succeeded and
    the steps whose postures reached the model.

    ``done`` holds step ids; ``tools_ok`` counts successful calls per tool name; ``told`` holds
    the steps whose posture was handed to the model since they were last entered, ``flow``
    names the flow whose marking it is, and ``entries`` counts how many times each step was
    entered (a reset that re-opens a step lets it be entered again: a retry). Guards that
    read it (``done``, ``called_ok``, ``told``, ``entered``) see the runner's marking;
    evaluated without a runner they see :data:`EMPTY_MARKING`.
    """

    done: frozenset[str] = frozenset()
    tools_ok: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    told: frozenset[str] = frozenset()
    flow: str = ""
    entries: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        # Copies: changing the dict or set it was made from must not change the marking.
        object.__setattr__(self, "done", frozenset(self.done))
        object.__setattr__(self, "tools_ok", MappingProxyType(dict(self.tools_ok)))
        object.__setattr__(self, "told", frozenset(self.told))
        object.__setattr__(self, "entries", MappingProxyType(dict(self.entries)))


EMPTY_MARKING = Marking()


@dataclass(frozen=True, slots=True)
class MarkingRefs:
    """What a guard reads from a flow's marking: the ``steps`` it asks are done (``done``), the
    ``tools`` it asks have run (``called_ok``), the steps whose entries it counts
    (``entered``), and whether it reads the rest of it (``whole``: ``told`` without a flow
    name, a custom guard that says it reads the marking). A runner re-evaluates the guard when
    one of those changes."""

    steps: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()
    whole: bool = False
    entered: frozenset[str] = frozenset()

    def __or__(self, other: MarkingRefs) -> MarkingRefs:
        whole = self.whole or other.whole
        if self.entered or other.entered:
            return MarkingRefs(
                self.steps | other.steps,
                self.tools | other.tools,
                whole,
                self.entered | other.entered,
            )
        return MarkingRefs(self.steps | other.steps, self.tools | other.tools, whole)


NO_REFS = MarkingRefs()


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


def show_value(value: Any) -> str:
    if value is MISSING:
        return "not set"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def shown_value(state: State, key: str, value: Any, label: str) -> str:
    """``'label' is <value>``, with a secret key's value masked."""
    secret = value is not MISSING and state.is_secret(key)
    return f"'{label}' is {'***' if secret else show_value(value)}"


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

    def children(self) -> tuple[Guard, ...]:
        """The guards this one combines (``all_``, ``any_``, ``not_``); empty for an atom."""
        return ()

    def marking_refs(self) -> MarkingRefs:
        """What the guard reads from the flow's marking (see :class:`MarkingRefs`)."""
        refs = NO_REFS
        for child in self.children():
            refs = refs | child.marking_refs()
        return refs

    def fresh_names(self) -> frozenset[str]:
        """The resolvers whose freshness the guard reads (``fresh(name)``)."""
        return frozenset().union(*(child.fresh_names() for child in self.children()))

    def truth(self) -> bool | None:
        """True when the guard holds whatever the state and marking (``always()``,
        ``all_()``), False when it never can (``any_()``, ``~always()``), else None."""
        return None

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
            raise GuardFormatError(f"a serialised guard is a JSON object, got {json_kind(data)}")
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


def json_kind(value: object) -> str:
    return type(value).__name__ if value is not None else "null"


# -- combinators ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class _Many(Guard):
    parts: tuple[Guard, ...]
    word: ClassVar[str]

    def children(self) -> tuple[Guard, ...]:
        return self.parts

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

    def truth(self) -> bool | None:
        truths = [p.truth() for p in self.parts]
        if False in truths:
            return False
        return True if all(t is True for t in truths) else None


@dataclass(frozen=True, slots=True, repr=False)
class _Any(_Many):
    op: ClassVar[str] = "any"
    word: ClassVar[str] = "or"

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return any(p.evaluate(state, marking) for p in self.parts)

    def truth(self) -> bool | None:
        truths = [p.truth() for p in self.parts]
        if True in truths:
            return True
        return False if all(t is False for t in truths) else None


@dataclass(frozen=True, slots=True, repr=False)
class _Not(Guard):
    op: ClassVar[str] = "not"
    part: Guard

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        return not self.part.evaluate(state, marking)

    def children(self) -> tuple[Guard, ...]:
        return (self.part,)

    def truth(self) -> bool | None:
        inner = self.part.truth()
        return None if inner is None else not inner

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

    def marking_refs(self) -> MarkingRefs:
        return MarkingRefs(whole=self.marking)

    def describe(self) -> str:
        return self.text

    def _node(self, path: str) -> dict[str, Any]:
        raise GuardFormatError(
            f"{path} is a custom guard ({self.text}): it is code and cannot be serialised; "
            "build the guard from atoms (is_set, eq, all_, ...) to save or send it"
        )


# -- constructors ---------------------------------------------------------------------------


def guard_key(key: object, what: str) -> str:
    try:
        return check_key(key)
    except Exception as exc:
        raise GuardFormatError(f"{what}: {exc}") from None


def guard_name(value: object, what: str) -> str:
    if type(value) is not str or not value:
        raise GuardFormatError(f"{what} must be a non-empty string, got {value!r}")
    return value


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
        guard_key(k, "custom reads") for k in ([reads] if isinstance(reads, str) else reads)
    )
    text = describe or f"{getattr(fn, '__qualname__', 'a condition')} holds"
    return _Custom(fn, keys, bool(marking), text)
