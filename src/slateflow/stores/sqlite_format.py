"""The SQLite store's file format: its schema, the checks that a file is one, and upgrades.

A file is checked before anything is written to it: a file that is not a slateflow store (not
SQLite, another application's database, a newer format) is refused and left exactly as it was.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import StoreCorruptError, StoreError

__all__ = [
    "NO_CHAIN",
    "SCHEMA",
    "STORE_FORMAT",
    "STORE_FORMAT_VERSION",
    "UPGRADE_1",
    "chain_start",
    "check_format",
    "check_header",
]

STORE_FORMAT = "slateflow.store"
STORE_FORMAT_VERSION = 2
"""Bumped on incompatible changes to the file layout; a newer file is refused, never guessed at.

2: every commit and the base carry a digest chained to the one before (``stores/digests.py``);
a version-1 file is upgraded when opened for writing, its older commits left unchained.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
    seq INTEGER PRIMARY KEY, at_ns INTEGER NOT NULL, origin TEXT NOT NULL, changes TEXT NOT NULL,
    digest BLOB
);
CREATE TABLE IF NOT EXISTS base (
    id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, entries TEXT NOT NULL,
    chain BLOB, digest BLOB
);
CREATE TABLE IF NOT EXISTS checkpoints (
    workflow_id TEXT PRIMARY KEY, data TEXT NOT NULL, updated_ns INTEGER NOT NULL
);
"""

# Upgrades a version-1 file (no digests) in place; its commits so far stay unchained.
UPGRADE_1 = """
BEGIN IMMEDIATE;
ALTER TABLE commits ADD COLUMN digest BLOB;
ALTER TABLE base ADD COLUMN chain BLOB;
ALTER TABLE base ADD COLUMN digest BLOB;
INSERT OR REPLACE INTO meta VALUES ('chained_after', (SELECT max(
    coalesce((SELECT max(seq) FROM commits), 0), coalesce((SELECT seq FROM base), 0))));
UPDATE meta SET value = '2' WHERE name = 'version';
COMMIT;
"""

NO_CHAIN = 1 << 62
"""``chain_start`` of a file without digests: no commit is checked."""

_HEADER = b"SQLite format 3\x00"


def check_header(path: Path) -> None:
    """Refuse (``StoreCorruptError``) a file that is not SQLite, before SQLite touches it."""
    # SQLite takes a file shorter than its header for an empty database and would write
    # over it: look at the bytes first.
    try:
        with path.open("rb") as file:
            header = file.read(len(_HEADER))
    except (FileNotFoundError, IsADirectoryError):
        return  # a new file; or sqlite3 says why it cannot open a directory
    except OSError as exc:
        raise StoreError(f"cannot open store {str(path)!r}: {exc}") from None
    if header and header != _HEADER:
        raise StoreCorruptError(
            f"{str(path)!r} is not a SQLite file, so not a slateflow store; pass "
            "another path (nothing was written to it)"
        )


def check_format(conn: sqlite3.Connection, path: Path, *, readonly: bool) -> int:
    """The file's format version, after checking it is a store this slateflow reads; a new
    file gets the schema."""
    where = str(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables and readonly:
        raise StoreCorruptError(f"{where!r} is empty, not a slateflow store")
    if not tables:
        # One script, one transaction: a crash while creating leaves an empty file.
        conn.executescript(
            "BEGIN IMMEDIATE;"
            + SCHEMA
            + f"INSERT OR IGNORE INTO meta VALUES ('format', '{STORE_FORMAT}');"
            + f"INSERT OR IGNORE INTO meta VALUES ('version', '{STORE_FORMAT_VERSION}');"
            + "INSERT OR IGNORE INTO meta VALUES ('chained_after', '0');"
            + "COMMIT;"
        )
        return STORE_FORMAT_VERSION
    meta = dict(conn.execute("SELECT name, value FROM meta")) if "meta" in tables else {}
    if meta.get("format") != STORE_FORMAT:
        raise StoreCorruptError(
            f"{where!r} is a SQLite file but not a slateflow store; pass another path"
        )
    try:
        version = int(meta.get("version", ""))
    except (TypeError, ValueError):
        raise StoreCorruptError(
            f"{where!r}: its format version {meta.get('version')!r} is unreadable"
        ) from None
    if version > STORE_FORMAT_VERSION:
        raise StoreCorruptError(
            f"{where!r} was written by a newer slateflow (store format {version}, this one "
            f"reads up to {STORE_FORMAT_VERSION}); upgrade slateflow to open it"
        )
    if version < 1:
        raise StoreCorruptError(f"{where!r}: its format version {version} does not exist")
    missing = {"commits", "base", "checkpoints"} - tables
    if missing:
        raise StoreCorruptError(f"{where!r} lacks its {', '.join(sorted(missing))} table(s)")
    return version


def chain_start(conn: sqlite3.Connection, path: Path, version: int) -> int:
    """The seq after which every commit carries a digest (meta ``chained_after``): commits up
    to it were written by a version-1 slateflow. A version-1 file opened read-only has no
    digests at all: :data:`NO_CHAIN`."""
    if version < 2:
        return NO_CHAIN
    row = conn.execute("SELECT value FROM meta WHERE name = 'chained_after'").fetchone()
    try:
        after = int(row[0]) if row is not None else -1
    except (TypeError, ValueError):
        after = -1
    if after < 0:
        raise StoreCorruptError(
            f"{str(path)!r}: where its digest chain starts is missing or unreadable; "
            "restore it from a backup"
        )
    return after
