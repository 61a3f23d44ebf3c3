"""Guards as JSON: the parser behind ``Guard.from_json`` and the flow format.

Every node is checked (its op, its fields, their types) and nesting is capped, so a document
that is not a guard raises :class:`~slateflow.errors.GuardFormatError` naming the path of the
first bad node (``guard.of[1].key``), never another exception.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import GuardFormatError
from .comparisons import between, eq, ge, gt, le, lt
from .guard_base import Guard, all_, any_, guard_key, json_kind, not_
from .guards import (
    active,
    always,
    called_ok,
    captured,
    done,
    entered,
    failed,
    fresh,
    is_set,
    is_true,
    pending,
    resolved,
    told,
)

__all__ = ["MAX_GUARD_DEPTH", "parse"]


def _field(node: Mapping[str, Any], name: str, path: str) -> Any:
    if name not in node:
        raise GuardFormatError(f"{path}: missing field {name!r}")
    return node[name]


MAX_GUARD_DEPTH = 100
"""How deeply a serialised guard may nest (``all`` / ``any`` / ``not``)."""


def parse(node: Any, path: str, depth: int = 0) -> Guard:
    """The guard of JSON node ``node`` (``path`` names it in errors; ``depth`` is how deep it
    nests): raises :class:`GuardFormatError` naming the path of the first bad node."""
    if depth >= MAX_GUARD_DEPTH:
        raise GuardFormatError(
            f"{path[:60]}...: the guard nests more than {MAX_GUARD_DEPTH} levels deep; "
            "flatten it (all_ and any_ take any number of parts)"
        )
    if not isinstance(node, Mapping):
        raise GuardFormatError(f"{path}: a guard node is a JSON object, got {json_kind(node)}")
    op = node.get("op")
    fields = _FIELDS.get(op) if isinstance(op, str) else None
    if fields is None or not isinstance(op, str):
        known = ", ".join(sorted(_FIELDS))
        raise GuardFormatError(f"{path}.op: unknown guard {op!r}; known: {known}")
    extra = sorted(set(node) - {"op", *fields})
    if extra:
        raise GuardFormatError(f"{path}: unknown field(s) {extra} for op {op!r}")
    try:
        return _build(op, node, path, depth)
    except GuardFormatError:
        raise
    except (ValueError, TypeError) as exc:
        raise GuardFormatError(f"{path}: {exc}") from None


def _build(op: str, node: Mapping[str, Any], path: str, depth: int = 0) -> Guard:
    if op == "always":
        return always()
    if op in ("all", "any"):
        parts = _field(node, "of", path)
        if not isinstance(parts, list):
            raise GuardFormatError(f"{path}.of: expected a list of guards, got {json_kind(parts)}")
        built = tuple(parse(p, f"{path}.of[{i}]", depth + 1) for i, p in enumerate(parts))
        return all_(*built) if op == "all" else any_(*built)
    if op == "not":
        return not_(parse(_field(node, "of", path), f"{path}.of", depth + 1))
    if op == "captured":
        keys = _field(node, "keys", path)
        if not isinstance(keys, list) or not keys:
            raise GuardFormatError(f"{path}.keys: expected a non-empty list of keys")
        for i, k in enumerate(keys):
            guard_key(k, f"{path}.keys[{i}]")
        return captured(*keys)
    if op in ("failed", "entered") and "times" in node:
        one = _FIELDS[op][0]
        value, times = _field(node, one, path), node["times"]
        if type(value) is not str or type(times) is not int:
            raise GuardFormatError(f"{path}: {op} takes a {one} and a whole number of times")
        return failed(value, times) if op == "failed" else entered(value, times)
    if op in ("active", "told"):
        step = _field(node, "step", path)
        where = node.get("flow")
        if type(step) is not str or (where is not None and type(where) is not str):
            raise GuardFormatError(f"{path}: {op} takes a step id and an optional flow name")
        return active(step, where) if op == "active" else told(step, where)
    if op == "eq":
        key = _field(node, "key", path)
        if type(key) is not str:
            raise GuardFormatError(f"{path}.key: expected a string, got {json_kind(key)}")
        value = _field(node, "value", path)
        try:
            return eq(key, value)
        except GuardFormatError as exc:
            raise GuardFormatError(f"{path}.key: {exc}") from None
    if op in _COMPARE or op == "between":
        key = _field(node, "key", path)
        if type(key) is not str:
            raise GuardFormatError(f"{path}.key: expected a string, got {json_kind(key)}")
        try:
            if op == "between":
                return between(key, _field(node, "low", path), _field(node, "high", path))
            return _COMPARE[op](key, _field(node, "value", path))
        except GuardFormatError as exc:
            if str(exc).startswith(path):
                raise
            raise GuardFormatError(f"{path}: {exc}") from None
    one = _FIELDS[op][0]
    value = _field(node, one, path)
    if type(value) is not str:
        raise GuardFormatError(f"{path}.{one}: expected a string, got {json_kind(value)}")
    try:
        return _MAKERS[op](value)
    except GuardFormatError as exc:
        raise GuardFormatError(f"{path}.{one}: {exc}") from None


_MAKERS: dict[str, Callable[[str], Guard]] = {
    "is_true": is_true,
    "is_set": is_set,
    "called_ok": called_ok,
    "done": done,
    "resolved": resolved,
    "failed": failed,
    "entered": entered,
    "pending": pending,
    "fresh": fresh,
}
_COMPARE: dict[str, Callable[[str, Any], Guard]] = {"gt": gt, "ge": ge, "lt": lt, "le": le}
_FIELDS: dict[str, tuple[str, ...]] = {
    "always": (),
    "is_true": ("key",),
    "is_set": ("key",),
    "eq": ("key", "value"),
    "gt": ("key", "value"),
    "ge": ("key", "value"),
    "lt": ("key", "value"),
    "le": ("key", "value"),
    "between": ("key", "low", "high"),
    "captured": ("keys",),
    "called_ok": ("tool",),
    "done": ("step",),
    "told": ("step", "flow"),
    "active": ("step", "flow"),
    "entered": ("step", "times"),
    "resolved": ("name",),
    "failed": ("name", "times"),
    "pending": ("name",),
    "fresh": ("name",),
    "all": ("of",),
    "any": ("of",),
    "not": ("of",),
}
