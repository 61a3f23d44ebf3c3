"""Recovery: a State rebuilt from its store's base and commits, checked as it goes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidKeyError, StoreCorruptError
from ..stores.records import Loaded
from .keys import check_key
from .provenance import Stamp
from .records import RawChange

if TYPE_CHECKING:
    from .engine import Engine, Row

__all__ = ["follow", "recover"]


def follow(entries: dict[str, Row], key: str, version: int, seq: int) -> Row | None:
    """The row a change of commit ``seq`` replaces; raises :class:`StoreCorruptError` when the
    change does not follow it (a bad key, a version jump, a removal of an absent key)."""
    row = entries.get(key)
    if row is None:
        try:
            check_key(key)
        except InvalidKeyError as exc:
            raise StoreCorruptError(f"commit {seq}: {exc}; the store is damaged") from None
    if version and version != (row[1] + 1 if row is not None else 1):
        raise StoreCorruptError(
            f"commit {seq}: {key!r} jumps to version {version} from "
            f"{row[1] if row else 0}; the store is damaged"
        )
    if not version and row is None:
        raise StoreCorruptError(
            f"commit {seq} removes {key!r}, which is not set; the store is damaged"
        )
    return row


def recover(engine: Engine, loaded: Loaded) -> None:
    """Rebuild entries, seq and the journal ring from a store's contents (at construction).

    A bulk form of :meth:`Engine.apply` (the same checks), with one stamp per distinct provenance.
    """
    entries = engine.entries
    stamps: dict[tuple[str, str | None, float | None], Stamp] = {}

    def stamp_of(
        source: str, writer: str | None, conf: float | None, meta: dict[str, Any] | None
    ) -> Stamp:
        if meta:
            return Stamp(source, writer, conf, meta)
        stamp = stamps.get((source, writer, conf))
        if stamp is None:
            stamp = stamps[(source, writer, conf)] = Stamp(source, writer, conf, None)
        return stamp

    for key, value, version, row_seq, at, source, writer, conf, meta in loaded.base:
        try:
            check_key(key)
        except InvalidKeyError as exc:
            raise StoreCorruptError(
                f"the base at seq {loaded.base_seq}: {exc}; the store is damaged"
            ) from None
        entries[key] = (value, version, row_seq, at, stamp_of(source, writer, conf, meta))
    commits = loaded.commits
    size = engine.ring.size
    tail = len(commits) - size  # commits from here on may feed the journal ring
    policy = engine.policy
    ring: list[RawChange] = []
    seq = loaded.base_seq
    for n, (seq, at, origin, changes) in enumerate(commits):
        for key, value, version, source, writer, conf, meta in changes:
            row = entries.get(key)
            if row is None or not version or version != row[1] + 1:
                follow(entries, key, version, seq)  # the slow path names what is wrong, if anything
            stamp = stamp_of(source, writer, conf, meta)
            if version:
                entries[key] = (value, version, seq, at, stamp)
            else:
                del entries[key]
            if n >= tail:
                old = None if row is None else row[0]
                ring.append((key, old, value, version, seq, origin, not version, at, stamp, policy))
    engine.seq = seq
    engine.ring.clear(commits[tail - 1][0] if 0 < tail <= len(commits) else loaded.base_seq)
    engine.ring.append(ring)
    engine.ring.trim()
