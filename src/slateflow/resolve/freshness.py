"""Whether a resolver's result is still fresh: younger than the ``ttl`` it was written with.

A resolver with ``ttl=`` stamps its result's provenance with it; age is measured on the State's
clock (give the Session's clock to ``State(clock=...)`` too). ``fresh(name)`` guards read it,
and a flow with such a guard moves the moment the result goes stale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..state.keys import result_key

if TYPE_CHECKING:
    from ..state import State

__all__ = ["fresh_for", "is_fresh"]

_NS = 1_000_000_000


def _ttl_and_age(state: State, name: str) -> tuple[Any, int] | None:
    row = state.engine.row(result_key(name))
    if row is None:
        return None
    meta = row[4].meta
    ttl = meta.get("ttl") if meta else None
    if not isinstance(ttl, int | float) or isinstance(ttl, bool):
        ttl = None
    return ttl, state.engine.now() - row[3]


def is_fresh(state: State, name: str) -> bool:
    """Whether resolver ``name`` has a result younger than the ``ttl`` it was written with.

    False when ``<name>:result`` is not set; True for a result written without a ttl.
    """
    found = _ttl_and_age(state, name)
    if found is None:
        return False
    ttl, age = found
    return ttl is None or age < ttl * _NS


def fresh_for(state: State, name: str) -> float | None:
    """Seconds (on the State's clock) until resolver ``name``'s result stops being fresh: 0.0
    once stale, None when there is no result or it was written without a ttl."""
    found = _ttl_and_age(state, name)
    if found is None or found[0] is None:
        return None
    ttl, age = found
    left: float = max(ttl * _NS - age, 0) / _NS
    return left
