"""Values: what the state accepts, how it copies them, and when two values are the same.

The state stores plain JSON data only: ``None``, ``bool``, ``int``, finite ``float``, ``str``,
``list`` and ``dict`` with ``str`` keys. A pydantic model is stored as its JSON dump
(``model_dump(mode="json")``); read it back typed through a :class:`~slateflow.Key`. NaN and the
infinities are refused because JSON has no spelling for them. Tuples, sets, bytes and other objects
are refused rather than silently converted, so what you read back is what you meant to write.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeAlias

from pydantic import BaseModel

from ..errors import StateValueError

__all__ = [
    "JSON",
    "MISSING",
    "REMOVED",
    "Prefix",
    "clean",
    "copy_json",
    "plain",
    "same",
    "serialized_size",
]

JSON: TypeAlias = Any
"""A JSON-compatible value (kept as ``Any`` so user code needs no casts)."""

_CONTAINERS = (dict, list)

MISSING: Any = object()
"""Sentinel: no value (no default given, or the key is absent)."""
REMOVED: Any = object()
"""Sentinel: a buffered or batched removal."""
MAX_DEPTH = 200
_PLAIN = frozenset({str, int, bool})
MAX_INT_DIGITS = 4300
"""The most digits an integer may have: Python cannot print a longer one (``str()`` raises),
so it could not be shown, snapshotted or stored."""
BIG_INT = 10**MAX_INT_DIGITS


class Prefix:
    """A stored JSON list held as the first ``n`` items of a list that only ever grows.

    The runtime writes progress lists (a flow's done steps) a step at a time: every version
    shares one list of scalars, so a step costs O(1) and the journal keeps O(1) per version
    instead of a copy each. Readers never see it: every read (``get``, a Change's ``old`` /
    ``new``, a snapshot, the store) gets a plain ``list``. Whoever makes one promises to only
    append to ``items`` (copy it before any other change) and to put only scalars in it.
    """

    __slots__ = ("items", "n")

    def __init__(self, items: list[JSON], n: int) -> None:
        self.items = items
        self.n = n

    def list(self) -> list[JSON]:
        """The value: a new plain list."""
        return self.items[: self.n]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Prefix):
            if self.n != other.n:
                return False
            return self.items is other.items or self.list() == other.list()
        if isinstance(other, list):
            return self.list() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return repr(self.list())


def plain(value: JSON) -> JSON:
    """``value`` with a :class:`Prefix` turned into its list (anything else as it is)."""
    return value.items[: value.n] if type(value) is Prefix else value


def _where(path: str) -> str:
    if len(path) > 80:
        path = f"{path[:40]}...{path[-30:]}"
    return f" at {path}" if path else ""


def _too_big(value: int, key: str, path: str) -> StateValueError:
    return StateValueError(
        f"value for {key!r}{_where(path)} is an integer of more than {MAX_INT_DIGITS} digits, "
        "which cannot be shown, snapshotted or stored; store it as a string"
    )


def _clean(value: object, key: str, path: str, depth: int) -> JSON:
    t = type(value)
    if t is int:
        if -BIG_INT < value < BIG_INT:
            return value
        raise _too_big(value, key, path)  # type: ignore[arg-type]
    if t is str or t is bool or value is None:
        return value
    if t is float:
        if math.isfinite(value):  # type: ignore[arg-type]
            return value
        raise StateValueError(
            f"value for {key!r}{_where(path)} is {value!r}; JSON has no NaN or infinity, "
            "store None or a string instead"
        )
    if depth >= MAX_DEPTH:  # this container would be level depth + 1
        raise StateValueError(
            f"value for {key!r}{_where(path)} is nested more than {MAX_DEPTH} levels deep "
            "(or contains itself)"
        )
    if isinstance(value, dict):
        out: dict[str, JSON] = {}
        for k, v in value.items():
            if type(k) is not str:
                if not isinstance(k, str):
                    raise StateValueError(
                        f"value for {key!r}{_where(path)} has a {type(k).__name__} dict key {k!r}; "
                        "JSON objects have string keys, convert it with str()"
                    )
                k = str.__str__(k)
            out[k] = _clean(v, key, f"{path}[{k!r}]", depth + 1)
        return out
    if isinstance(value, list):
        kinds = {*map(type, value)}
        if kinds <= _PLAIN:
            if int in kinds:
                for i, v in enumerate(value):
                    if type(v) is int and not -BIG_INT < v < BIG_INT:
                        raise _too_big(v, key, f"{path}[{i}]")
            return list(value)  # strings, ints and bools need no per-item walk (C speed)
        return [_clean(v, key, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, BaseModel):
        # pydantic keeps NaN floats in a JSON-mode dump; check it like any other value.
        return _clean(value.model_dump(mode="json"), key, path, depth + 1)
    # Subclasses of the JSON scalars (str/int enums, numpy-free int subclasses) are stored as
    # the plain scalar so that reads, snapshots and equality behave like JSON.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return _clean(int.__index__(value), key, path, depth)
    if isinstance(value, float):
        return _clean(float(value), key, path, depth)
    hint = " (use a list)" if isinstance(value, tuple | set | frozenset) else ""
    raise StateValueError(
        f"value for {key!r}{_where(path)} is a {t.__name__}{hint}; the state holds JSON-compatible "
        "data (None, bool, int, float, str, list, dict with str keys) or pydantic models"
    )


def clean(value: object, key: str) -> JSON:
    """Validate ``value`` for ``key`` and return a private deep copy of it as plain JSON data.

    Raises :class:`StateValueError` naming the key and the path of the offending part.
    """
    t = type(value)
    if t is str or t is bool or value is None or (t is int and -BIG_INT < value < BIG_INT):
        return value
    if t is Prefix:
        value = value.list()  # type: ignore[attr-defined]
    return _clean(value, key, "", 0)


def copy_json(value: JSON) -> JSON:
    """A deep copy of JSON data (scalars are immutable and returned as they are)."""
    t = type(value)
    if t is dict:
        return {k: copy_json(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    if t is list:
        return [copy_json(v) if type(v) in _CONTAINERS else v for v in value]
    if t is Prefix:
        return value.items[: value.n]  # scalars only: the slice is a private copy
    return value


def same(a: JSON, b: JSON) -> bool:
    """JSON equality: ``==`` except that ``1``, ``1.0``, ``True`` (and ``0.0``, ``-0.0``) differ."""
    if a is b:
        return True
    if type(a) is not type(b) or a != b:
        return False
    t = type(a)
    if t is dict:
        return all(same(v, b[k]) for k, v in a.items())
    if t is list:
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    if t is float:
        return math.copysign(1.0, a) == math.copysign(1.0, b)
    return True


def serialized_size(value: JSON) -> int:
    """Size in bytes of ``value`` as compact UTF-8 JSON (what a store or the wire would carry)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
