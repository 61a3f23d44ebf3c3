"""Promotion rules: whether a value an extractor recognised may be written over what is known.

A rule looks at the value, the key's current value and the State, and decides; every decision
is kept with its reason (``Decision``), so a test or a person can see why a value was or was
not written. Rules: :func:`keep_known` (default), :func:`overwrite`, :func:`true_only`,
:func:`non_empty`; any of them ``.to(key)`` (write elsewhere) and ``.accept_when(pred)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..flow.guard_base import Guard

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Decision", "Promotion", "keep_known", "non_empty", "overwrite", "true_only"]

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class Decision:
    """What happened to one recognised value: ``written`` or not, and ``reason`` in words."""

    field: str
    key: str
    value: Any
    confidence: float
    written: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Promotion:
    """A promotion rule; build one with :func:`keep_known`, :func:`overwrite`, ... ."""

    kind: str
    target: str | None = None
    accept: Callable[[Any, State], bool] | None = None
    accept_text: str = ""

    def to(self, key: str) -> Promotion:
        """The same rule, writing to ``key`` instead of the field's own key."""
        return replace(self, target=key)

    def accept_when(
        self, pred: Callable[[Any, State], Any] | Guard, describe: str = ""
    ) -> Promotion:
        """The same rule, writing only when ``pred(value, state)`` holds as well; ``pred`` may
        be a guard (``told("confirm")``), which must hold over the State."""
        if isinstance(pred, Guard):
            guard = pred
            text = describe or guard.describe()

            def holds(value: Any, state: State) -> bool:
                return guard.evaluate(state)

            return replace(self, accept=holds, accept_text=text)
        if not callable(pred):
            raise TypeError(
                f"accept_when takes a guard or a callable (value, state) -> bool, got {pred!r}"
            )
        text = describe or getattr(pred, "__name__", "a condition")
        return replace(self, accept=pred, accept_text=text)

    def decide(self, state: State, key: str, value: Any) -> tuple[bool, str]:
        """(write?, why) for ``value`` going to ``key``."""
        current = state.get(key, _MISSING)
        if current is None:
            current = _MISSING  # a field reset to None is unknown again, as extractors read it
        if self.accept is not None and not self.accept(value, state):
            return False, f"not accepted: {self.accept_text} does not hold"
        if self.kind == "true_only" and value is not True:
            return False, f"true_only: {value!r} is not true"
        if self.kind == "non_empty" and value in (None, "", [], {}):
            return False, f"non_empty: {value!r} is empty"
        if current is not _MISSING and current == value and type(current) is type(value):
            return False, "already known with this value"
        if self.kind == "keep_known" and current is not _MISSING:
            return False, f"keep_known: {key!r} is already known ({current!r})"
        verb = "overwrites" if current is not _MISSING else "new value"
        return True, f"{self.kind}: {verb}"


def keep_known() -> Promotion:
    """Write only when the key is not known yet (the default: a later mishearing cannot undo
    what the caller said first)."""
    return Promotion("keep_known")


def overwrite() -> Promotion:
    """Write whenever the value differs (the caller corrects themselves: "make it five")."""
    return Promotion("overwrite")


def true_only() -> Promotion:
    """Write only ``True`` (a confirmation flag that a later "no" must not clear)."""
    return Promotion("true_only")


def non_empty() -> Promotion:
    """Write only a value that is not empty (no ``None``, ``""``, ``[]`` or ``{}``)."""
    return Promotion("non_empty")
