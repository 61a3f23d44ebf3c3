"""Schemas: types declared for keys or ``*`` patterns, validated on every write."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..errors import SchemaError
from .keys import Key, Pattern, compile_pattern
from .values import JSON

__all__ = ["Schemas"]


class _Declaration:
    __slots__ = ("adapter", "order", "pattern", "type")

    def __init__(self, pattern: Pattern, type_: Any, adapter: TypeAdapter[Any], order: int) -> None:
        self.pattern = pattern
        self.type = type_
        self.adapter = adapter
        self.order = order


def _type_name(type_: Any) -> str:
    # Plain classes read best by name; typing constructs (Annotated, unions) by their repr.
    if isinstance(type_, type) and not hasattr(type_, "__origin__"):
        return type_.__name__
    return repr(type_)


def explain(exc: Exception, secret: bool) -> str:
    """Pydantic's explanation of a failed validation; for a secret key, without the input."""
    if not isinstance(exc, ValidationError):
        return f"{type(exc).__name__}: {exc}" if not secret else type(exc).__name__
    if not secret:
        return str(exc)
    problems = exc.errors(include_input=False, include_url=False)
    lines = [f"{'.'.join(map(str, p['loc'])) or 'value'}: {p['msg']}" for p in problems]
    return "\n".join(lines) + "\n(the value is not shown: the key is secret)"


def validate_with(
    adapter: TypeAdapter[Any], key: str, value: JSON, type_: Any, *, secret: bool = False
) -> JSON:
    """Validate ``value`` for ``key`` and return the JSON form of the validated value.

    Any failure, including an exception a custom validator raises, becomes a :class:`SchemaError`.
    """
    try:
        return adapter.dump_python(adapter.validate_python(value), mode="json")
    except Exception as exc:
        raise SchemaError(
            f"value for {key!r} does not match its declared type {_type_name(type_)}:\n"
            + explain(exc, secret)
        ) from (None if isinstance(exc, ValidationError) else exc)


class Schemas:
    """The declarations of one state; the most specific declaration matching a key wins.

    An exact key beats every pattern; among patterns the one with more literal characters wins;
    on a tie the later declaration wins.
    """

    def __init__(self) -> None:
        self.decls: list[_Declaration] = []
        self._cache: dict[str, _Declaration | None] = {}

    def __bool__(self) -> bool:
        return bool(self.decls)

    def add(self, target: str | Key[Any], type_: Any | None) -> _Declaration:
        """Build a declaration for a key or pattern (not yet active: see :meth:`activate`)."""
        if isinstance(target, Key):
            pattern, type_, adapter = compile_pattern(target.name), target.type, target.adapter
        else:
            if type_ is None:
                raise TypeError(f"declare({target!r}) needs a type, e.g. declare({target!r}, int)")
            pattern, adapter = compile_pattern(target), TypeAdapter(type_)
        return _Declaration(pattern, type_, adapter, len(self.decls))

    def activate(self, decl: _Declaration) -> None:
        """Make ``decl`` govern later writes."""
        self.decls.append(decl)
        self._cache = {}

    def deactivate(self, decl: _Declaration) -> None:
        """Withdraw ``decl`` (a declaration refused after activation)."""
        self.decls.remove(decl)
        self._cache = {}

    def find(self, key: str) -> _Declaration | None:
        """The declaration governing ``key``, if any."""
        # One read of the cache and the list: a declaration added meanwhile replaces the cache,
        # and what is computed here from the old list must not land in the new cache.
        cache, decls = self._cache, self.decls[:]
        try:
            return cache[key]
        except KeyError:
            pass
        best: _Declaration | None = None
        for decl in decls:
            if decl.pattern.matches(key) and (
                best is None or decl.pattern.specificity >= best.pattern.specificity
            ):
                best = decl
        if len(cache) > 100_000:
            cache.clear()
        cache[key] = best
        return best

    @staticmethod
    def check(decl: _Declaration, key: str, value: JSON, *, secret: bool = False) -> JSON:
        """Validate ``value`` for ``key`` against one declaration."""
        return validate_with(decl.adapter, key, value, decl.type, secret=secret)
