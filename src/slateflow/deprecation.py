"""Deprecated names: kept for one release, each warning with the name that replaces it.

``@deprecated("admit(tool, record=False)")`` on a method (or a property's getter) makes every
call emit a :class:`DeprecationWarning` naming the replacement, and marks the function with
``__deprecated__`` (as :pep:`702` does), which the structure check and the docs read: a
deprecated alias is not part of the API a class is measured by. :func:`moved` serves names that
left a module (a module ``__getattr__``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["deprecated", "moved"]

F = TypeVar("F", bound=Callable[..., Any])

_OWNERS = (
    ("StateAliases", "State"),
    ("ConversationAliases", "Session"),
    ("RunnerAliases", "FlowRunner"),
    ("AdmitAliases", "FlowRunner"),
)


def deprecated(replacement: str) -> Callable[[F], F]:
    """Mark a method deprecated in favour of ``replacement`` (the text names the new way)."""

    def mark(fn: F) -> F:
        # An aliases mixin names the class users know (StateAliases.derive is State.derive).
        owner = fn.__qualname__
        for mixin, cls in _OWNERS:
            owner = owner.replace(f"{mixin}.", f"{cls}.")
        message = (
            f"{owner} is deprecated and will be removed in the next release; use {replacement}"
        )

        @functools.wraps(fn)
        def alias(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return fn(*args, **kwargs)

        alias.__deprecated__ = message  # type: ignore[attr-defined]
        return alias  # type: ignore[return-value]

    return mark


def moved(module: str, name: str, table: Mapping[str, tuple[str, Callable[[], Any]]]) -> Any:
    """For a module ``__getattr__``: the object a moved ``name`` now is, with a warning naming
    where it lives; ``table`` maps old names to (new address, loader). Raises AttributeError
    for a name that never was."""
    entry = table.get(name)
    if entry is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    where, load = entry
    warnings.warn(
        f"{module}.{name} is deprecated and goes in the next release; use {where}",
        DeprecationWarning,
        stacklevel=3,
    )
    return load()
