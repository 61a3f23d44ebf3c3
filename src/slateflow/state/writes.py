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


def _shared(engine: Engine, attempt: Callable[[], Any]) -> Any:
    """``attempt()``; on a shared State, again while another process changed what it read
    (its commit checks the versions read, and a conflict catches the replica up)."""
    if engine.shared is None:
        return attempt()
    return engine.shared.retrying(attempt)


def remove(engine: Engine, key: str | Key[Any], default: Any, stamp: Stamp) -> Any:
    """Remove ``key`` and return its value (``default``, or MissingKeyError, when absent)."""
    name = key_name(key)
    engine.check_remove(name, stamp)

    def attempt() -> Any:
        with engine.lock:
            row = engine.row(name)
            if row is None:
                if default is MISSING:
                    raise MissingKeyError(f"cannot remove {name!r}: it is not set")
                return default
            engine.commit([(name, REMOVED, stamp)], "remove", expected={name: row[1]},
                          deliver=False)  # fmt: skip
        return copy_json(row[0])

    try:
        return _shared(engine, attempt)
    finally:
        engine.deliver()


def modify(
    engine: Engine, key: str | Key[Any], default: Any, fn: Callable[[Any], Any], stamp: Stamp
) -> Any:
    """Replace ``key``'s value with ``fn(current)`` with no write in between; the new value."""
    if engine.shared is not None:
        return engine.shared.modify(key, default, fn, stamp)
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

    def attempt() -> int:
        with engine.lock:
            row = entries.get(old)
            if row is None:
                check_key(old)
                raise MissingKeyError(f"cannot rename {old!r}: it is not set")
            if new == old:
                return row[1]
            there = entries.get(new)
            if there is not None and not overwrite:
                raise KeyExistsError(
                    f"cannot rename {old!r} to {new!r}: {new!r} exists; pass overwrite=True"
                )
            kept = row[4]
            name, cleaned = engine.prepare(new, row[0], kept)
            if engine.policy.active:
                # The renamer writes `new` too, whoever wrote the value originally.
                engine.policy.check(name, cleaned, stamp)
            expected = {old: row[1], name: 0 if there is None else there[1]}
            engine.commit([(old, REMOVED, stamp), (name, cleaned, kept)], "rename",
                          expected=expected, deliver=False)  # fmt: skip
            return entries[name][1]

    try:
        return int(_shared(engine, attempt))
    finally:
        engine.deliver()


def clear(engine: Engine, prefixes: tuple[str, ...], source: str, writer: str | None) -> int:
    """Remove every key starting with one of ``prefixes`` in one batch, written by ``source`` /
    ``writer``; how many."""
    stamp = engine.stamp(prefixes[0] if prefixes else "", source, writer, None, None)
    if engine.shared is not None:
        engine.shared.sync()  # the keys other processes made under the prefixes go too
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
