"""Scoped views: ``ScopedView(state, "user")`` reads and writes the keys under one prefix."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ReadOnlyError
from .records import Entry
from .values import MISSING as _MISSING

if TYPE_CHECKING:
    from .state import State

__all__ = ["SCOPES", "ReadOnlyView", "ScopedView"]

SCOPES = ("app", "user", "session", "temp", "turn", "bg", "derived")
"""The built-in scope prefixes (a conversation clears ``turn:`` and ``temp:`` after each turn)."""


class ScopedView:
    """The keys under one prefix, named without it: ``ScopedView(state, "user").set("name",
    "Ada")`` writes ``user:name``. Writes keep all of the state's validation, governance and
    signals."""

    __slots__ = ("_state", "prefix")

    def __init__(self, state: State, scope: str) -> None:
        self._state = state
        self.prefix = f"{scope}:"

    def _key(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``<scope>:key`` (a private copy), or ``default``."""
        return self._state.get(self.prefix + key, default)

    def __getitem__(self, key: str) -> Any:
        """``view[key]``: the value of ``<scope>:key``; raises ``MissingKeyError`` if absent."""
        return self._state[self.prefix + key]

    def __contains__(self, key: str) -> bool:
        """``key in view``: whether ``<scope>:key`` exists."""
        return self.prefix + key in self._state

    def entry(self, key: str) -> Entry | None:
        """The entry of ``<scope>:key``, or None."""
        return self._state.entry(self.prefix + key)

    def keys(self) -> list[str]:
        """The keys in this scope, without the prefix."""
        n = len(self.prefix)
        return [k[n:] for k in self._state.keys(self.prefix)]

    def items(self) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs in this scope, keys without the prefix."""
        n = len(self.prefix)
        return [(k[n:], v) for k, v in self._state.items(self.prefix)]

    def to_dict(self) -> dict[str, Any]:
        """This scope as a dict, keys without the prefix."""
        return dict(self.items())

    def set(self, key: str, value: Any, **kwargs: Any) -> int:
        """Write ``<scope>:key``; takes the same keyword arguments as :meth:`State.set`."""
        return self._state.set(self.prefix + key, value, **kwargs)

    def update(self, mapping: Mapping[str, Any], **kwargs: Any) -> int:
        """Write several keys of this scope in one batch (``remove=`` and
        ``expected_versions=`` name keys of this scope too)."""
        p = self.prefix
        if "remove" in kwargs:
            kwargs["remove"] = [p + k for k in kwargs["remove"]]
        if kwargs.get("expected_versions") is not None:
            kwargs["expected_versions"] = {p + k: v for k, v in kwargs["expected_versions"].items()}
        return self._state.update({p + k: v for k, v in mapping.items()}, **kwargs)

    def modify(self, key: str, default: Any, fn: Callable[[Any], Any], **kwargs: Any) -> Any:
        """Atomic read-modify-write of ``<scope>:key``."""
        return self._state.modify(self.prefix + key, default, fn, **kwargs)

    def remove(self, key: str, default: Any = _MISSING, **kwargs: Any) -> Any:
        """Remove ``<scope>:key`` and return its value."""
        if default is _MISSING:
            return self._state.remove(self.prefix + key, **kwargs)
        return self._state.remove(self.prefix + key, default, **kwargs)

    def clear(self, **kwargs: Any) -> int:
        """Remove every key of this scope in one batch; returns how many."""
        return self._state.clear_prefix(self.prefix, **kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.prefix}* ({len(self.keys())} keys)>"


class ReadOnlyView(ScopedView):
    """A scope that can be read but not written through the view (``ReadOnlyView(state,
    "derived")``).

    Derived values are written by the library's own computations with ``state.set`` on the full
    key; the view protects them from accidental writes by application code.
    """

    __slots__ = ()

    def _refuse(self, key: object = None) -> Any:
        if isinstance(key, str):
            target = repr(self.prefix + key)
        elif isinstance(key, Mapping):
            target = ", ".join(repr(self.prefix + str(k)) for k in key)
        else:
            target = f"the {self.prefix!r} scope"
        raise ReadOnlyError(
            f"cannot write {target}: the {self.prefix!r} scope is read-only through this view; "
            "its values are computed by Derived(state, ...), so write the inputs they are "
            "derived from instead"
        )

    def set(self, key: str, value: Any, **kwargs: Any) -> int:
        """Refused: raises :class:`~slateflow.errors.ReadOnlyError`."""
        return self._refuse(key)  # type: ignore[no-any-return]

    def update(self, mapping: Mapping[str, Any], **kwargs: Any) -> int:
        """Refused: raises :class:`~slateflow.errors.ReadOnlyError`."""
        return self._refuse(mapping)  # type: ignore[no-any-return]

    def modify(self, key: str, default: Any, fn: Callable[[Any], Any], **kwargs: Any) -> Any:
        """Refused: raises :class:`~slateflow.errors.ReadOnlyError`."""
        return self._refuse(key)

    def remove(self, key: str, default: Any = _MISSING, **kwargs: Any) -> Any:
        """Refused: raises :class:`~slateflow.errors.ReadOnlyError`."""
        return self._refuse(key)

    def clear(self, **kwargs: Any) -> int:
        """Refused: raises :class:`~slateflow.errors.ReadOnlyError`."""
        return self._refuse()  # type: ignore[no-any-return]
