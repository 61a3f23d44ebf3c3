"""The plain records a store keeps: committed batches and entries, and their JSON form.

A store sits below the State and knows nothing of its classes; the State hands it plain tuples,
built in the commit path without copying (the values are the State's own immutable copies):

* a :data:`ChangeRow` is ``(key, value, version, source, writer, confidence, meta)``, where
  ``version == 0`` means the key was removed (its ``value`` is then ``None``);
* a :data:`CommitRow` is ``(seq, at_ns, origin, changes)``: one committed batch;
* an :data:`EntryRow` is ``(key, value, version, seq, at_ns, source, writer, confidence,
  meta)``: one key as it stood at a compaction.

On disk every record is JSON (arrays, in the order above); nothing is ever unpickled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..errors import StoreCorruptError

__all__ = [
    "ChangeRow",
    "CommitRow",
    "EntryRow",
    "Loaded",
    "decode_changes",
    "decode_commit",
    "decode_entries",
    "encode_canonical",
    "encode_changes",
    "encode_entries",
    "encode_value",
    "unstorable",
]

ChangeRow: TypeAlias = tuple[str, Any, int, str, str | None, float | None, dict[str, Any] | None]
CommitRow: TypeAlias = tuple[int, int, str, tuple[ChangeRow, ...]]
EntryRow: TypeAlias = tuple[
    str, Any, int, int, int, str, str | None, float | None, dict[str, Any] | None
]

# ASCII output: a str holding a lone surrogate (which Python allows and UTF-8 cannot encode)
# is written as its \\u escape and reads back unchanged.
_dumps = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode


_canonical = json.JSONEncoder(
    ensure_ascii=True, allow_nan=False, separators=(",", ":"), sort_keys=True
).encode


def encode_value(value: Any) -> str:
    """A value as the JSON text a store keeps (ASCII, compact, no NaN)."""
    return _dumps(value)


def encode_canonical(value: Any) -> str:
    """A value's JSON text with object keys sorted: equal values, equal texts."""
    return _canonical(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999 parses as inf, a value no State holds
        raise ValueError(f"{text} is out of range")
    return number


_loads = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite).decode


@dataclass(slots=True)
class Loaded:
    """What a store holds: a base (the entries as of ``base_seq``, from the last compaction)
    and every commit after it, in seq order."""

    base_seq: int = 0
    base: list[EntryRow] = field(default_factory=list)
    commits: list[CommitRow] = field(default_factory=list)

    @property
    def head(self) -> int:
        """The newest seq the store holds."""
        return self.commits[-1][0] if self.commits else self.base_seq


def encode_changes(changes: Iterable[ChangeRow]) -> str:
    """The JSON text of a commit's changes.

    Raises ``ValueError`` for a value JSON cannot hold although the State accepts it (an int
    beyond Python's int-to-str digit limit); :func:`unstorable` names the key."""
    return _dumps(list(changes))


def unstorable(changes: Iterable[ChangeRow]) -> tuple[str, str] | None:
    """The first change whose value cannot be encoded, as ``(key, why)``, or None."""
    for change in changes:
        try:
            _dumps(change)
        except (ValueError, TypeError, RecursionError) as exc:
            return change[0], str(exc)
    return None


def encode_entries(entries: Iterable[EntryRow]) -> str:
    """The JSON text of a compaction's entries."""
    return _dumps(list(entries))


def _bad(where: str, why: str) -> StoreCorruptError:
    return StoreCorruptError(f"{where}: {why}; the store is damaged or not a slateflow store")


def _text(value: object, where: str, what: str, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if type(value) is not str or not value:
        raise _bad(where, f"{what} is {value!r}, not a non-empty string")


def _int(value: object, where: str, what: str, low: int) -> None:
    if type(value) is not int or value < low:
        raise _bad(where, f"{what} is {value!r}, not an int >= {low}")


def _stamp_parts(row: Sequence[Any], where: str) -> None:
    source, writer, confidence, meta = row[-4:]
    _text(source, where, "source")
    _text(writer, where, "writer", optional=True)
    if confidence is not None and (
        type(confidence) not in (int, float) or not 0 <= confidence <= 1
    ):
        raise _bad(where, f"confidence is {confidence!r}")
    if meta is not None and type(meta) is not dict:
        raise _bad(where, f"meta is {type(meta).__name__}, not an object")


def _parse(text: object, where: str) -> Any:
    if type(text) is not str:
        raise _bad(where, f"expected JSON text, found {type(text).__name__}")
    try:
        return _loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _bad(where, f"unreadable JSON ({exc})") from None


def decode_changes(text: object, seq: int) -> tuple[ChangeRow, ...]:
    """A commit's changes from their JSON text; raises :class:`StoreCorruptError` when the text
    is not what :func:`encode_changes` writes."""
    where = f"commit {seq}"
    return _changes(_parse(text, where), where)


def decode_commit(text: object, where: str) -> CommitRow:
    """A whole commit, ``[seq, at_ns, origin, changes]``, from its JSON text (a shared store
    keeps commits so); raises :class:`StoreCorruptError` naming ``where`` when it is not one."""
    row = _parse(text, where)
    if type(row) is not list or len(row) != 4:
        raise _bad(where, f"a commit is {row!r:.80}, not a 4-item array")
    seq, at_ns, origin, changes = row
    _int(seq, where, "the seq", 1)
    _int(at_ns, where, "the time", 0)
    _text(origin, where, "the origin")
    return seq, at_ns, origin, _changes(changes, f"{where} (commit {seq})")


def _changes(rows: Any, where: str) -> tuple[ChangeRow, ...]:
    if type(rows) is not list or not rows:
        raise _bad(where, "its changes are not a non-empty array")
    out = []
    for row in rows:
        # The checks of the slow path below, inlined for the rows that pass them (recovery
        # reads every commit of a file).
        if type(row) is list and len(row) == 7:
            key, _, version, source, writer, confidence, meta = row
            if (
                type(key) is str
                and key
                and type(version) is int
                and version >= 0
                and type(source) is str
                and source
                and (writer is None or (type(writer) is str and writer))
                and (confidence is None or _confidence_ok(confidence))
                and (meta is None or type(meta) is dict)
            ):
                out.append(tuple(row))
                continue
        if type(row) is not list or len(row) != 7:
            raise _bad(where, f"a change is {row!r:.80}, not a 7-item array")
        key, version = row[0], row[2]
        _text(key, where, "a key")
        _int(version, f"{where}, key {key!r}", "the version", 0)
        _stamp_parts(row, f"{where}, key {key!r}")
        raise _bad(where, f"a change is {row!r:.80}")  # unreachable: a check above failed
    return tuple(out)


def _confidence_ok(confidence: object) -> bool:
    return type(confidence) in (int, float) and 0 <= confidence <= 1  # type: ignore[operator]


def decode_entries(text: object, seq: int) -> list[EntryRow]:
    """A compaction's entries from their JSON text (see :func:`decode_changes`)."""
    where = f"the base at seq {seq}"
    rows = _parse(text, where)
    if type(rows) is not list:
        raise _bad(where, "its entries are not an array")
    out = []
    for row in rows:
        if type(row) is not list or len(row) != 9:
            raise _bad(where, f"an entry is {row!r:.80}, not a 9-item array")
        key = row[0]
        _text(key, where, "a key")
        _int(row[2], f"{where}, key {key!r}", "the version", 1)
        _int(row[3], f"{where}, key {key!r}", "the seq", 1)
        if row[3] > seq:
            raise _bad(where, f"key {key!r} has seq {row[3]}, after the base")
        _int(row[4], f"{where}, key {key!r}", "the time", 0)
        _stamp_parts(row, f"{where}, key {key!r}")
        out.append(tuple(row))
    return out
