"""The jobs a SQLite store's writer runs besides commits: compacting, and rewriting history in
place, digests and all (what re-sealing needs).

A value written before its key was declared secret sits in clear in every commit and the base
that hold it. :func:`rewrite_history` passes each stored change and base entry through a
function (the sealing store's: seal what is now secret), writes back only the records that
changed, and re-chains the digests from the first changed commit on, so the file opens as
before. It runs inside the writer's transaction; the store then folds the WAL into the file
with ``secure_delete`` on, so the old bytes are overwritten rather than left in free pages.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable

from .digests import base_digest, commit_digest
from .records import (
    ChangeRow,
    EntryRow,
    decode_changes,
    decode_entries,
    encode_changes,
    encode_entries,
)

__all__ = ["ChangeFn", "Compact", "EntryFn", "Rewrite", "rewrite_history"]

ChangeFn = Callable[[ChangeRow], ChangeRow]
EntryFn = Callable[[EntryRow], EntryRow]


class Compact:
    """A compaction queued for the writer: the base becomes ``entries`` at ``seq``."""

    __slots__ = ("entries", "seq", "written")

    def __init__(self, seq: int, entries: str) -> None:
        self.seq = seq
        self.entries = entries
        self.written = threading.Event()


class Rewrite:
    """A rewrite queued for the store's writer thread; ``done`` is set once it is on disk."""

    __slots__ = ("change", "done", "entry", "hint", "rewritten")

    def __init__(self, change: ChangeFn, entry: EntryFn, hint: str | None = None) -> None:
        self.change = change
        self.entry = entry
        self.hint = hint  # text every record it would change holds (None: look at all)
        self.rewritten = 0
        self.done = threading.Event()


def _holds(conn: sqlite3.Connection, text: str) -> bool:
    """Whether any commit or the base holds ``text`` (SQLite searches it in place)."""
    for sql in (
        "SELECT 1 FROM commits WHERE instr(changes, ?) > 0 LIMIT 1",
        "SELECT 1 FROM base WHERE instr(entries, ?) > 0 LIMIT 1",
    ):
        if conn.execute(sql, (text,)).fetchone() is not None:
            return True
    return False


def rewrite_history(
    conn: sqlite3.Connection, job: Rewrite, chained_after: int, tip: bytes
) -> bytes:
    """Pass every stored record through ``job`` (in the open transaction); returns the digest
    the next commit chains to (``tip`` when nothing changed). Sets ``job.rewritten`` to the
    number of records written back."""
    if job.hint is not None and not _holds(conn, job.hint):
        return tip  # no record could change: no pass over the file
    row = conn.execute("SELECT seq, entries, chain, digest FROM base WHERE id = 1").fetchone()
    chain = b""
    if row is not None:
        seq, text, chain, digest = row
        entries = list(decode_entries(text, seq))
        changed = [job.entry(e) for e in entries]
        if changed != entries:
            text = encode_entries(changed)
            new = base_digest(chain, seq, text) if digest is not None else None
            conn.execute("UPDATE base SET entries = ?, digest = ? WHERE id = 1", (text, new))
            job.rewritten += 1
        chain = chain if type(chain) is bytes else b""
    prev = chain
    rechain = False
    cursor = conn.execute("SELECT seq, at_ns, origin, changes, digest FROM commits ORDER BY seq")
    updates: list[tuple[str, bytes | None, int]] = []
    for seq, at_ns, origin, text, digest in cursor.fetchall():
        changes = tuple(decode_changes(text, seq))
        resealed = tuple(job.change(c) for c in changes)
        if resealed != changes:
            text = encode_changes(resealed)
            job.rewritten += 1
            rechain = True
        elif not rechain:
            prev = digest if type(digest) is bytes else b""
            continue
        if digest is None and seq <= chained_after:
            new, prev = None, b""  # written before digests existed: no chain to keep
        else:
            new = prev = commit_digest(prev, seq, at_ns, origin, text)
        updates.append((text, new, seq))
    conn.executemany("UPDATE commits SET changes = ?, digest = ? WHERE seq = ?", updates)
    return prev if rechain else tip
