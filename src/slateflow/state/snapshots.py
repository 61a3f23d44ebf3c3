"""Snapshots: the whole state as JSON-ready data, and back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import SnapshotError
from .keys import META_PREFIX, check_key
from .provenance import Provenance, Stamp, dt_to_ns
from .records import SECRET_MASK
from .values import JSON, clean, copy_json

__all__ = ["SNAPSHOT_FORMAT", "build", "parse"]

SNAPSHOT_FORMAT = "slateflow.snapshot/1"

Row = tuple[JSON, int, int, int, Stamp]


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
