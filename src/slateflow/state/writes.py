"""The State's compound writes, each one batch through the engine's commit: remove, modify,
rename and clearing prefixes.

The State façade fences and routes a write into an open transaction first; these run the rest
under the engine's lock (a read and the write it depends on, with no other write between them)
and deliver the batch after it is released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import KeyExistsError, MissingKeyError
from .engine import Engine, Op
from .keys import Key, check_key, key_name
from .provenance import Stamp
from .values import MISSING, REMOVED, clean, copy_json

__all__ = ["clear", "modify", "remove", "rename"]


def remove(engine: Engine, key: str | Key[Any], default: Any, stamp: Stamp) -> Any:
    """Remove ``key`` and return its value (``default``, or MissingKeyError, when absent)."""
    name = key_name(key)
    engine.check_remove(name, stamp)
    with engine.lock:
        row = engine.row(name)
        if row is None:
            if default is MISSING:
                raise MissingKeyError(f"cannot remove {name!r}: it is not set")
            return default
        engine.commit([(name, REMOVED, stamp)], "remove", deliver=False)
    engine.deliver()
    return copy_json(row[0])


def modify(
    engine: Engine, key: str | Key[Any], default: Any, fn: Callable[[Any], Any], stamp: Stamp
) -> Any:
    """Replace ``key``'s value with ``fn(current)`` with no write in between; the new value."""
    with engine.lock:
        row = engine.row(key_name(key))
        current = copy_json(row[0]) if row is not None else clean(default, key_name(key))
        name, cleaned = engine.prepare(key, fn(current), stamp)
        engine.commit([(name, cleaned, stamp)], "modify", deliver=False)
    engine.deliver()
    return copy_json(cleaned)


def rename(engine: Engine, old: str, new: str, overwrite: bool, stamp: Stamp) -> int:
    """Move ``old``'s value (and provenance) to ``new`` in one batch; ``new``'s version."""
    engine.check_remove(old, stamp)
    entries = engine.entries
    with engine.lock:
        row = entries.get(old)
        if row is None:
            check_key(old)
            raise MissingKeyError(f"cannot rename {old!r}: it is not set")
        if new == old:
            return row[1]
        if new in entries and not overwrite:
            raise KeyExistsError(
                f"cannot rename {old!r} to {new!r}: {new!r} exists; pass overwrite=True"
            )
        kept = row[4]
        name, cleaned = engine.prepare(new, row[0], kept)
        if engine.policy.active:
            # The renamer writes `new` too, whoever wrote the value originally.
            engine.policy.check(name, cleaned, stamp)
        engine.commit([(old, REMOVED, stamp), (name, cleaned, kept)], "rename", deliver=False)
        version = entries[name][1]
    engine.deliver()
    return version


def clear(engine: Engine, prefixes: tuple[str, ...], source: str, writer: str | None) -> int:
    """Remove every key starting with one of ``prefixes`` in one batch, written by ``source`` /
    ``writer``; how many."""
    stamp = engine.stamp(prefixes[0] if prefixes else "", source, writer, None, None)
    with engine.lock:
        ops: list[Op] = []
        for key in engine.entries:
            if key.startswith(prefixes):
                engine.check_remove(key, stamp)
                ops.append((key, REMOVED, stamp))
        engine.commit(ops, "clear_prefix", deliver=False)
    if engine.delivery.pending:
        engine.deliver()
    return len(ops)
