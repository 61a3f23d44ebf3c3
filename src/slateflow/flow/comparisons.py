"""Guards over values: equality and numeric comparisons, on a key or a path inside its value.

``eq("booking:slot.time", "10:00")`` holds when the value equals ``"10:00"`` (JSON equality:
``1``, ``1.0`` and ``True`` differ). ``gt`` / ``ge`` / ``lt`` / ``le`` compare a number with a
bound and ``between(ref, low, high)`` checks ``low <= value <= high``, both ends included:
``gt("fraud:result.score", 0.8)``. A comparison holds only when the value is a number (an int
or a float, never a bool): a missing value, a string such as ``"0.9"`` or ``True`` makes it
false, and ``explain()`` shows what was there. Every one round-trips through the guard JSON.
"""

from __future__ import annotations

import json
import math
import operator
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import GuardFormatError, TemplateError
from ..resolve.template import MISSING, Reference
from ..state.values import BIG_INT, MAX_INT_DIGITS, clean, copy_json, same
from .guard_base import EMPTY_MARKING, Explanation, Guard, Marking, show_value, shown_value

if TYPE_CHECKING:
    from ..state import State

__all__ = ["between", "eq", "ge", "gt", "le", "lt"]


def _reference(key: object, what: str) -> Reference:
    try:
        return Reference(key)  # type: ignore[arg-type]
    except (TemplateError, TypeError) as exc:
        raise GuardFormatError(f"{what} key: {exc}") from None


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
        return f"'{self.ref.text}' must be {show_value(self.value)}"

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        seen = shown_value(state, self.ref.key, self.ref.lookup(state), self.ref.text)
        return Explanation(self.evaluate(state, marking), f"{self.describe()}: {seen}")

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "key": self.ref.text, "value": copy_json(self.value)}

    # JSON equality, as evaluate uses: eq("k", 1) and eq("k", True) are different guards.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Eq) and other.ref == self.ref and same(other.value, self.value)

    def __hash__(self) -> int:
        return hash((self.ref, json.dumps(self.value, sort_keys=True)))


def eq(key: str, value: Any) -> Guard:
    """The value at ``key`` (or at a path inside it, ``"booking:slot.time"``) equals ``value``.

    Equality is JSON equality: ``1``, ``1.0`` and ``True`` differ. ``value`` must be JSON data.
    """
    return _Eq(_reference(key, "eq"), clean(value, f"eq({key!r}) value"))


_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
}


def _is_number(value: object) -> bool:
    t = type(value)
    return t is int or (t is float and math.isfinite(value))  # type: ignore[arg-type]


def _bound(value: object, what: str) -> int | float:
    if type(value) is int and not -BIG_INT < value < BIG_INT:
        # Its repr would raise: Python prints no int this long.
        raise GuardFormatError(
            f"{what} must be a number of at most {MAX_INT_DIGITS} digits, got a longer int"
        )
    if not _is_number(value):
        raise GuardFormatError(f"{what} must be a finite number (int or float), got {value!r}")
    return value  # type: ignore[return-value]


def _seen(state: State, ref: Reference) -> str:
    value = ref.lookup(state)
    text = shown_value(state, ref.key, value, ref.text)
    if value is not MISSING and not _is_number(value) and not state.is_secret(ref.key):
        text += " (not a number)"
    return text


@dataclass(frozen=True, slots=True, repr=False)
class _Numeric(Guard):
    """A test of the number at a key (or a path inside it); anything else fails it."""

    ref: Reference

    def evaluate(self, state: State, marking: Marking = EMPTY_MARKING) -> bool:
        value = self.ref.lookup(state)
        return _is_number(value) and self._test(value)

    @abstractmethod
    def _test(self, value: int | float) -> bool:
        """Whether the number passes."""

    def keys_read(self) -> frozenset[str]:
        return frozenset([self.ref.key])

    def explain(self, state: State, marking: Marking = EMPTY_MARKING) -> Explanation:
        return Explanation(
            self.evaluate(state, marking), f"{self.describe()}: {_seen(state, self.ref)}"
        )


@dataclass(frozen=True, slots=True, repr=False)
class _Compare(_Numeric):
    """The number compared with a bound."""

    bound: int | float
    words: ClassVar[str]

    def _test(self, value: int | float) -> bool:
        return _TESTS[self.op](value, self.bound)

    def describe(self) -> str:
        return f"'{self.ref.text}' must be {self.words} {show_value(self.bound)}"

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "key": self.ref.text, "value": self.bound}


@dataclass(frozen=True, slots=True, repr=False)
class _Gt(_Compare):
    op: ClassVar[str] = "gt"
    words = "greater than"


@dataclass(frozen=True, slots=True, repr=False)
class _Ge(_Compare):
    op: ClassVar[str] = "ge"
    words = "at least"


@dataclass(frozen=True, slots=True, repr=False)
class _Lt(_Compare):
    op: ClassVar[str] = "lt"
    words = "less than"


@dataclass(frozen=True, slots=True, repr=False)
class _Le(_Compare):
    op: ClassVar[str] = "le"
    words = "at most"


@dataclass(frozen=True, slots=True, repr=False)
class _Between(_Numeric):
    op: ClassVar[str] = "between"
    low: int | float
    high: int | float

    def _test(self, value: int | float) -> bool:
        return self.low <= value <= self.high

    def describe(self) -> str:
        low, high = show_value(self.low), show_value(self.high)
        return f"'{self.ref.text}' must be between {low} and {high}"

    def _node(self, path: str) -> dict[str, Any]:
        return {"op": self.op, "key": self.ref.text, "low": self.low, "high": self.high}


def _compare(kind: type[_Compare], key: str, value: int | float) -> Guard:
    what = f"{kind.op}({key!r})"
    return kind(_reference(key, kind.op), _bound(value, f"{what} bound"))


def gt(key: str, value: int | float) -> Guard:
    """The number at ``key`` (or a path inside it, ``"fraud:result.score"``) is greater than
    ``value``. A value that is not a number (missing, a string, a bool) never satisfies it."""
    return _compare(_Gt, key, value)


def ge(key: str, value: int | float) -> Guard:
    """The number at ``key`` (or a path inside it) is at least ``value`` (see :func:`gt`)."""
    return _compare(_Ge, key, value)


def lt(key: str, value: int | float) -> Guard:
    """The number at ``key`` (or a path inside it) is less than ``value`` (see :func:`gt`)."""
    return _compare(_Lt, key, value)


def le(key: str, value: int | float) -> Guard:
    """The number at ``key`` (or a path inside it) is at most ``value`` (see :func:`gt`)."""
    return _compare(_Le, key, value)


def between(key: str, low: int | float, high: int | float) -> Guard:
    """The number at ``key`` (or a path inside it) is in ``[low, high]``, both ends included
    (see :func:`gt`). Raises :class:`GuardFormatError` when ``low > high``."""
    what = f"between({key!r})"
    ref = _reference(key, "between")
    low, high = _bound(low, f"{what} low"), _bound(high, f"{what} high")
    if low > high:
        raise GuardFormatError(f"{what}: low ({low!r}) is above high ({high!r}); swap them")
    return _Between(ref, low, high)
