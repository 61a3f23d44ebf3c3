"""Predicates over a key's ``(old, new)`` values, for :meth:`State.watch <slateflow.State.watch>`.

``state.watch("score", when.crossed_above(0.8), alert)`` calls ``alert(change)`` each time the
value of ``score`` goes from at most 0.8 to above it. A missing or removed key counts as ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .values import same

__all__ = [
    "Transition",
    "became_false",
    "became_true",
    "changed",
    "changed_from",
    "changed_to",
    "crossed_above",
    "crossed_below",
    "custom",
]


class Transition:
    """A named predicate over ``(old, new)``; call it to test a change."""

    __slots__ = ("_fn", "description")

    def __init__(self, fn: Callable[[Any, Any], bool], description: str) -> None:
        self._fn = fn
        self.description = description

    def __call__(self, old: Any, new: Any) -> bool:
        return bool(self._fn(old, new))

    def __repr__(self) -> str:
        return f"when.{self.description}"


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def changed() -> Transition:
    """Any committed change (every write that changes the value, and removal)."""
    return Transition(lambda old, new: True, "changed()")


def changed_to(value: Any) -> Transition:
    """The value became ``value`` (and was something else before)."""
    return Transition(
        lambda old, new: same(new, value) and not same(old, value), f"changed_to({value!r})"
    )


def changed_from(value: Any) -> Transition:
    """The value was ``value`` and is now something else."""
    return Transition(
        lambda old, new: same(old, value) and not same(new, value), f"changed_from({value!r})"
    )


def crossed_above(threshold: float) -> Transition:
    """A number went from ``<= threshold`` (or absent) to ``> threshold``."""

    def test(old: Any, new: Any) -> bool:
        return _number(new) and new > threshold and not (_number(old) and old > threshold)

    return Transition(test, f"crossed_above({threshold!r})")


def crossed_below(threshold: float) -> Transition:
    """A number went from ``>= threshold`` (or absent) to ``< threshold``."""

    def test(old: Any, new: Any) -> bool:
        return _number(new) and new < threshold and not (_number(old) and old < threshold)

    return Transition(test, f"crossed_below({threshold!r})")


def became_true() -> Transition:
    """The value went from falsy (or absent) to truthy."""
    return Transition(lambda old, new: not old and bool(new), "became_true()")


def became_false() -> Transition:
    """The value went from truthy to falsy (removal counts as falsy)."""
    return Transition(lambda old, new: bool(old) and not new, "became_false()")


def custom(fn: Callable[[Any, Any], bool], description: str | None = None) -> Transition:
    """Your own predicate over ``(old, new)``."""
    return Transition(fn, description or f"custom({getattr(fn, '__name__', 'fn')})")
