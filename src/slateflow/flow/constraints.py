"""Constraints: rules across a flow's steps and tools (ordering, once-only tools, resets)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import FlowDefinitionError, SlateError
from ..state.keys import check_key as _check_key
from ..state.keys import unprintable
from .guard_base import Guard

__all__ = [
    "Before",
    "Commit",
    "Constraint",
    "Never",
    "Once",
    "Require",
    "Reset",
    "before",
    "commit",
    "never",
    "once",
    "require",
    "reset",
]


def _name(value: object, what: str) -> str:
    if type(value) is not str or not value:
        raise FlowDefinitionError(f"{what} must be a non-empty string, got {value!r}")
    if why := unprintable(value):
        raise FlowDefinitionError(f"{what} {value!r} would print like another name: {why}")
    return value


def _guard(value: object, what: str) -> Guard:
    if not isinstance(value, Guard):
        raise FlowDefinitionError(f"{what} takes a guard, got {value!r}")
    return value


class Constraint:
    """Base of the constraint kinds; build them with the functions of this module."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Once(Constraint):
    """``tool`` may complete successfully at most once; later calls are refused."""

    tool: str


@dataclass(frozen=True, slots=True)
class Before(Constraint):
    """Step ``first`` must be done before step ``then`` may start."""

    first: str
    then: str


@dataclass(frozen=True, slots=True)
class Never(Constraint):
    """``tool`` is refused until ``until`` holds (built by ``never(tool).until(guard)``)."""

    tool: str
    until: Guard


@dataclass(frozen=True, slots=True)
class Require(Constraint):
    """The flow is complete only once every one of ``steps`` is done."""

    steps: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reset(Constraint):
    """When ``when`` becomes true, ``steps`` (and every step after them) are re-opened, and
    the keys in ``clear`` (exact keys, or prefixes ending in ``*``) are removed first."""

    steps: tuple[str, ...]
    when: Guard
    clear: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Commit(Constraint):
    """A side-effecting tool: at most once, and refused until ``until`` holds (a confirmation)."""

    tool: str
    until: Guard


def once(tool: str) -> Once:
    """``tool`` may complete successfully at most once in the conversation."""
    return Once(_name(tool, "once(tool)"))


def before(first: str, then: str) -> Before:
    """Step ``first`` must be done before step ``then`` may start (ordering without an edge)."""
    return Before(_name(first, "before(first)"), _name(then, "before(then)"))


class _NeverBuilder:
    """``never(tool)`` waiting for its ``.until(guard)``."""

    __slots__ = ("tool",)

    def __init__(self, tool: str) -> None:
        self.tool = tool

    def until(self, guard: Guard) -> Never:
        """Refuse the tool until ``guard`` holds."""
        return Never(self.tool, _guard(guard, f"never({self.tool!r}).until()"))

    def __repr__(self) -> str:
        return f"never({self.tool!r}) (call .until(guard) to finish it)"


def never(tool: str) -> _NeverBuilder:
    """Start ``never(tool).until(guard)``: refuse ``tool`` until ``guard`` holds."""
    return _NeverBuilder(_name(tool, "never(tool)"))


def require(*steps: str) -> Require:
    """The flow is complete only once every one of ``steps`` is done."""
    if not steps:
        raise FlowDefinitionError("require() needs at least one step id")
    return Require(tuple(_name(s, "require(step)") for s in steps))


class _ResetBuilder:
    """``reset(*steps)`` waiting for its ``.when(guard)``."""

    __slots__ = ("clear", "steps")

    def __init__(self, steps: tuple[str, ...], clear: tuple[str, ...]) -> None:
        self.steps = steps
        self.clear = clear

    def when(self, guard: Guard) -> Reset:
        """Re-open the steps each time ``guard`` goes from false to true."""
        return Reset(self.steps, _guard(guard, f"reset{self.steps!r}.when()"), self.clear)

    def __repr__(self) -> str:
        return f"reset{self.steps!r} (call .when(guard) to finish it)"


def check_key(key: str) -> None:
    try:
        _check_key(key)
    except SlateError as exc:
        raise FlowDefinitionError(f"reset(clear=...): {exc}") from None


def _clear_key(value: object) -> str:
    if type(value) is not str or not value or value == "*":
        raise FlowDefinitionError(
            f"reset(clear=...) holds state keys or prefixes such as 'patient:*', got {value!r}"
        )
    if "*" in value[:-1]:
        raise FlowDefinitionError(
            f"reset(clear=...): {value!r} may end in '*' (a prefix) but holds no other '*'"
        )
    check_key(value[:-1] + "x" if value.endswith("*") else value)  # a prefix: any key under it
    return value


def reset(*steps: str, clear: Iterable[str] = ()) -> _ResetBuilder:
    """Start ``reset(*steps).when(guard)``: re-open done steps when the guard turns true.

    Each time ``guard`` goes from false to true, the steps and every step after them (by
    ``after`` edges and ``before`` constraints) are no longer done; they are entered again,
    ``on_enter`` included, as their guards allow. A caller changing their mind ("actually,
    make it Wednesday") is the usual case.

    ``clear`` names keys removed (as the flow, in one batch) before the steps are decided
    again: the answers a retry must ask for again (``clear=["patient:name", "patient:dob"]``,
    or a prefix, ``"patient:*"``). Without it, a re-opened step whose ``done`` keys are still
    set passes straight through, and the steps after it run again with the old values.
    """
    if not steps:
        raise FlowDefinitionError("reset() needs at least one step id")
    keys = [clear] if isinstance(clear, str) else list(clear)
    return _ResetBuilder(
        tuple(_name(s, "reset(step)") for s in steps),
        tuple(dict.fromkeys(_clear_key(k) for k in keys)),
    )


def commit(tool: str, until: Guard) -> Commit:
    """A commit tool (a booking, a payment): at most once, and refused until ``until`` holds.

    ``flow.compile()`` rejects a commit whose guard is always true: it would guard nothing.
    """
    return Commit(_name(tool, "commit(tool)"), _guard(until, f"commit({tool!r}, until=)"))
