"""Snapshots: the whole state as JSON-ready data, and back; and the State's other renderings of
its rows (a listing for people, a typed read, a missing key's answer)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..errors import SchemaError, SnapshotError
from .keys import META_PREFIX, Key, check_key
from .provenance import Provenance, Stamp, dt_to_ns, ns_to_dt
from .records import SECRET_MASK, Entry
from .schema import explain
from .values import JSON, clean, copy_json

__all__ = ["SNAPSHOT_FORMAT", "build", "describe", "entry", "missing", "parse", "typed"]

T = TypeVar("T")

SNAPSHOT_FORMAT = "slateflow.snapshot/1"

Row = tuple[JSON, int, int, int, Stamp]


def entry(key: str, row: Row, secret: bool) -> Entry:
    """The :class:`Entry` a State shows for ``key``'s ``row``."""
    return Entry(
        key=key,
        value=copy_json(row[0]),
        version=row[1],
        seq=row[2],
        provenance=row[4].provenance(row[3]),
        updated_at=ns_to_dt(row[3]),
        secret=secret,
    )


def build(
    rows: list[tuple[str, Row]], seq: int, is_secret: Callable[[str], bool] | None
) -> dict[str, Any]:
    """A snapshot of ``rows`` at ``seq``; with ``is_secret``, secret values are masked."""
    entries = {}
    for key, (value, version, row_seq, at, stamp) in rows:
        masked = is_secret is not None and is_secret(key)
        entries[key] = {
            "value": SECRET_MASK if masked else copy_json(value),
            "version": version,
            "seq": row_seq,
            "provenance": stamp.provenance(at).model_dump(mode="json"),
        }
    redacted = is_secret is not None
    return {"format": SNAPSHOT_FORMAT, "seq": seq, "redacted": redacted, "entries": entries}


def parse(snapshot: Mapping[str, Any]) -> tuple[int, dict[str, Row]]:
    """The ``(seq, rows)`` of a snapshot; raises :class:`SnapshotError` naming the bad part."""
    if not isinstance(snapshot, Mapping) or snapshot.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(
            f"not a slateflow snapshot (expected format {SNAPSHOT_FORMAT!r}); "
            "pass what state.snapshot() returned"
        )
    if snapshot.get("redacted"):
        raise SnapshotError(
            "cannot restore a redacted snapshot: its secret values are masked; "
            "take one with snapshot(redact=False)"
        )
    seq = snapshot.get("seq")
    raw = snapshot.get("entries")
    if type(seq) is not int or seq < 0 or not isinstance(raw, Mapping):
        raise SnapshotError("snapshot needs an int 'seq' >= 0 and an 'entries' mapping")
    rows: dict[str, Row] = {}
    for key, item in raw.items():
        try:
            check_key(key)
            if key.startswith(META_PREFIX):
                raise SnapshotError(f"{key!r} is a reserved key")
            value = clean(item["value"], key)
            version, row_seq = item["version"], item["seq"]
            if type(version) is not int or version < 1:
                raise SnapshotError(f"version {version!r} is not an int >= 1")
            if type(row_seq) is not int or not 1 <= row_seq <= seq:
                raise SnapshotError(f"seq {row_seq!r} is not between 1 and {seq}")
            prov = Provenance.model_validate(item["provenance"])
        except SnapshotError as exc:
            raise SnapshotError(f"snapshot entry {key!r}: {exc}") from None
        except Exception as exc:
            raise SnapshotError(f"snapshot entry {key!r} is invalid: {exc}") from None
        rows[key] = (value, version, row_seq, dt_to_ns(prov.at), Stamp.of(prov))
    return seq, rows


def describe(
    rows: list[tuple[str, Row]], is_secret: Callable[[str], bool], provenance: bool
) -> str:
    """``rows`` listed for people, one key per line, secrets masked (``State.describe``)."""
    lines = []
    for key, row in rows:
        line = f"{key} = {SECRET_MASK if is_secret(key) else repr(row[0])}"
        if provenance:
            stamp = row[4]
            who = stamp.source + (f"/{stamp.writer}" if stamp.writer else "")
            conf = "" if stamp.confidence is None else f", confidence {stamp.confidence:g}"
            line += f"  (v{row[1]}, {who}{conf})"
        lines.append(line)
    return "\n".join(lines)


def typed(key: Key[T], raw: JSON, secret: bool) -> T:
    """A stored value read through a typed :class:`Key` (SchemaError when it does not fit)."""
    try:
        return key.adapter.validate_python(copy_json(raw))
    except Exception as exc:
        raise SchemaError(
            f"stored value of {key.name!r} does not match {key!r}; declare the key "
            f"(state.declare({key.name!r}, ...)) so writes are checked:\n" + explain(exc, secret)
        ) from None


def missing(
    entries: Mapping[str, Row], key: object, default: Any, is_secret: Callable[[str], bool]
) -> Any:
    """What ``get(key, default)`` answers when ``key`` is not a stored string key: a typed
    Key's value, ``state_meta:<key>``'s provenance, or ``default`` (a bad key raises)."""
    if isinstance(key, Key):
        row = entries.get(key.name)
        return default if row is None else typed(key, row[0], is_secret(key.name))
    if type(key) is str and key.startswith(META_PREFIX):
        row = entries.get(key[len(META_PREFIX) :])
        if row is not None:
            return row[4].provenance(row[3]).as_meta()
    check_key(key)
    return default
