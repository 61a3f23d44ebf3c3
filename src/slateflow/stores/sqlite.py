"""SQLiteStore: committed batches in a SQLite file (WAL), written by one background thread."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import StateValueError, StoreClosedError, StoreCorruptError, StoreError
from .base import Durability
from .filelock import FileLock
from .records import (
    CommitRow,
    EntryRow,
    Loaded,
    decode_changes,
    decode_entries,
    encode_changes,
    encode_entries,
    unstorable,
)

__all__ = ["STORE_FORMAT", "STORE_FORMAT_VERSION", "SQLiteStore"]

log = logging.getLogger("slateflow.stores")

STORE_FORMAT = "slateflow.store"
STORE_FORMAT_VERSION = 1
"""Bumped on incompatible changes to the file layout; a newer file is refused, never guessed at."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
    seq INTEGER PRIMARY KEY, at_ns INTEGER NOT NULL, origin TEXT NOT NULL, changes TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS base (
    id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, entries TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    workflow_id TEXT PRIMARY KEY, data TEXT NOT NULL, updated_ns INTEGER NOT NULL
);
"""

_INSERT = "INSERT INTO commits (seq, at_ns, origin, changes) VALUES (?, ?, ?, ?)"

_HEADER = b"SQLite format 3\x00"

# What reading a damaged file can raise besides sqlite3.Error: text columns that are not UTF-8
# (UnicodeDecodeError is a ValueError), values of the wrong type, numbers out of range.
_DAMAGE = (sqlite3.Error, ValueError, TypeError, OverflowError)

# A commit as the writer thread gets it: its changes already encoded as JSON text.
_Encoded = tuple[int, int, str, str]


class _Compact:
    __slots__ = ("entries", "seq", "written")

    def __init__(self, seq: int, entries: str) -> None:
        self.seq = seq
        self.entries = entries
        self.written = threading.Event()


class SQLiteStore:
    """Keeps every committed batch in a SQLite file, so a State survives a crash.

    ``durability="batch"`` (the default): ``set`` returns at once and a background thread commits
    what has queued up as one transaction at most ``max_delay`` seconds later (group commit; the
    WAL is synced at checkpoints, ``synchronous=NORMAL``). The backlog is bounded: once the
    oldest queued commit is ``max_lag`` seconds old, or ``max_queue`` commits wait, the next
    ``set`` waits for the writer to catch up (a writer looping on the CPU would otherwise starve
    the writer thread, and a crash would lose everything it queued). A killed process loses
    only the commits still queued, those acknowledged in about the last ``max_lag`` seconds; a
    power cut may also lose the last transactions the disk had not synced. Either way the file
    is never left with half a batch. ``durability="sync"``: ``set``
    returns once its commit is on disk (``synchronous=FULL``); writers in several threads share
    one fsync. ``state.flush()`` waits for everything queued, at either level.

    One State writes a file at a time: the store holds an exclusive ``flock`` on the file itself
    (where the OS has none, a second writer is caught when its commits collide), so a second
    writer, in this process or another, through any name of the file (a symlink, a hard link),
    is refused at open. The lock goes with the process, however it ends. A file deleted or
    moved while open is noticed at the next write: the store fails with ``StoreError``.
    ``readonly=True`` opens without the lock and without writing anything (what ``slateflow
    replay`` does; it may read a file another process is writing).
    Open it through ``State.open(path)``. Workflow checkpoints live in the same file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "batch",
        max_delay: float = 0.002,
        max_lag: float = 0.010,
        max_queue: int = 10_000,
        readonly: bool = False,
    ) -> None:
        if durability not in ("batch", "sync"):
            raise StoreError(
                f"durability must be 'batch' or 'sync' for SQLiteStore({str(path)!r}), got "
                f"{durability!r} (use no store, or MemoryStore, for memory only)"
            )
        if not (type(max_delay) in (int, float) and 0 <= max_delay <= 1):
            raise StoreError(f"max_delay must be between 0 and 1 second, got {max_delay!r}")
        if not (type(max_lag) in (int, float) and max_delay <= max_lag <= 10):
            raise StoreError(
                f"max_lag must be between max_delay ({max_delay!r}) and 10 seconds, got {max_lag!r}"
            )
        if not (type(max_queue) is int and max_queue >= 1):
            raise StoreError(f"max_queue must be a positive int, got {max_queue!r}")
        self.path = Path(path)
        self.readonly = readonly
        self.durability: Durability = durability
        self.max_delay = float(max_delay) if durability == "batch" else 0.0
        self.error: Exception | None = None
        self._queue: deque[_Encoded | _Compact] = deque()
        self._max_lag_ns = int(max_lag * 1e9)
        self._max_queue = max_queue
        # No commit in the queue is older than this (monotonic ns): reset by append when the
        # queue is empty and by the writer as it drains, so it only ever errs on the old side.
        self._since = 0
        self._wake = threading.Event()
        # Set by a caller waiting for durability (flush, sync): the writer stops lingering.
        self._hurry = threading.Event()
        self._done = threading.Condition()
        self._appended = 0
        self._durable = 0
        self._closing = False
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()  # guards the side connection (reads, checkpoints)
        self._owner = FileLock(self.path)  # one writer per file, on the file's inode
        self._side: sqlite3.Connection | None = None
        self._conn = self._connect(create=True)

    # -- connections --------------------------------------------------------------------------

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        where = str(self.path)
        if not create and not self.path.exists():
            raise StoreError(f"no store at {where!r}")
        if create:
            if self.readonly and not self.path.is_file():
                raise StoreError(f"no store at {where!r}")
            self._check_header()
        try:
            if self.readonly:
                target = self.path.resolve().as_uri() + "?mode=ro"
                conn = sqlite3.connect(
                    target, uri=True, isolation_level=None, check_same_thread=False, timeout=10.0
                )
            else:
                conn = sqlite3.connect(
                    where, isolation_level=None, check_same_thread=False, timeout=10.0
                )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {where!r}: {exc}") from None
        try:
            if create:
                # Before any pragma: a file that is not ours must be left exactly as it was.
                self._check_format(conn)
                if not self.readonly:
                    self._take_lock()
            if self.readonly:
                return conn
            conn.execute("PRAGMA journal_mode=WAL")
            sync = "FULL" if self.durability == "sync" else "NORMAL"
            conn.execute(f"PRAGMA synchronous={sync}")
        except StoreError:
            conn.close()
            self._release_lock()
            raise
        except _DAMAGE as exc:
            conn.close()
            self._release_lock()
            raise StoreCorruptError(
                f"{where!r} is not a readable slateflow store ({exc}); restore it from a backup "
                "or open a new file"
            ) from None
        return conn

    def _take_lock(self) -> None:
        self._owner.acquire()

    def _release_lock(self) -> None:
        self._owner.release()

    def _check_header(self) -> None:
        # SQLite takes a file shorter than its header for an empty database and would write
        # over it: look at the bytes first.
        try:
            with self.path.open("rb") as file:
                header = file.read(len(_HEADER))
        except (FileNotFoundError, IsADirectoryError):
            return  # a new file; or sqlite3 says why it cannot open a directory
        except OSError as exc:
            raise StoreError(f"cannot open store {str(self.path)!r}: {exc}") from None
        if header and header != _HEADER:
            raise StoreCorruptError(
                f"{str(self.path)!r} is not a SQLite file, so not a slateflow store; pass "
                "another path (nothing was written to it)"
            )

    def _check_format(self, conn: sqlite3.Connection) -> None:
        where = str(self.path)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables and self.readonly:
            raise StoreCorruptError(f"{where!r} is empty, not a slateflow store")
        if not tables:
            # One script, one transaction: a crash while creating leaves an empty file.
            conn.executescript(
                "BEGIN IMMEDIATE;"
                + _SCHEMA
                + f"INSERT OR IGNORE INTO meta VALUES ('format', '{STORE_FORMAT}');"
                + f"INSERT OR IGNORE INTO meta VALUES ('version', '{STORE_FORMAT_VERSION}');"
                + "COMMIT;"
            )
            return
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
        missing = {"commits", "base", "checkpoints"} - tables
        if missing:
            raise StoreCorruptError(f"{where!r} lacks its {', '.join(sorted(missing))} table(s)")

    def _reader(self) -> sqlite3.Connection:
        if self._side is None:
            side = self._connect(create=False)
            side.execute("PRAGMA synchronous=FULL")  # checkpoints are saved through it
            self._side = side
        return self._side

    # -- loading and reading ------------------------------------------------------------------

    def load(self) -> Loaded:
        loaded = self.read()
        self._appended = self._durable = loaded.head
        return loaded

    def _check_open(self) -> None:
        if self._closing:
            raise StoreClosedError(
                f"store {str(self.path)!r} is closed; open it again with State.open to read it"
            )

    def read(self, upto: int | None = None) -> Loaded:
        with self._lock:
            self._check_open()
            conn = self._reader()
            try:
                base_row = conn.execute("SELECT seq, entries FROM base WHERE id = 1").fetchone()
                base_seq = 0
                base: list[EntryRow] = []
                if base_row is not None:
                    base_seq = base_row[0]
                    if type(base_seq) is not int or base_seq < 0:
                        raise StoreCorruptError(f"{str(self.path)!r}: the base seq is {base_seq!r}")
                    base = decode_entries(base_row[1], base_seq)
                commits = list(self._rows(conn, base_seq, upto))
            except StoreCorruptError as exc:
                raise self._damaged(exc) from None
            except _DAMAGE as exc:
                raise StoreCorruptError(
                    f"{str(self.path)!r} is damaged ({exc}); restore it from a backup"
                ) from None
        return Loaded(base_seq, base, commits)

    def _damaged(self, exc: StoreCorruptError) -> StoreCorruptError:
        """``exc`` (from the record decoders, which know no file) naming this file."""
        where = str(self.path)
        if where in str(exc):
            return exc
        return StoreCorruptError(f"{where!r}: {exc}; restore it from a backup or open a new file")

    def _rows(self, conn: sqlite3.Connection, after: int, upto: int | None) -> Iterator[CommitRow]:
        cursor = conn.execute(
            "SELECT seq, at_ns, origin, changes FROM commits WHERE seq > ? AND seq <= ? "
            "ORDER BY seq",
            (after, (1 << 62) if upto is None else upto),
        )
        expect = after + 1
        for seq, at_ns, origin, changes in cursor:
            if seq != expect:
                raise StoreCorruptError(
                    f"{str(self.path)!r}: commit {expect} is missing (the next one is {seq}); "
                    "the file was edited or damaged"
                )
            if type(at_ns) is not int or type(origin) is not str:
                raise StoreCorruptError(f"{str(self.path)!r}: commit {seq} has a bad header")
            yield (seq, at_ns, origin, decode_changes(changes, seq))
            expect += 1

    def commits(self, after: int = 0, upto: int | None = None) -> Iterator[CommitRow]:
        # Read in one go under the lock: a generator must not hold the connection between steps.
        with self._lock:
            self._check_open()
            conn = self._reader()
            try:
                base_row = conn.execute("SELECT seq FROM base WHERE id = 1").fetchone()
                start = max(after, base_row[0] if base_row else 0)
                rows = list(self._rows(conn, start, upto))
            except StoreCorruptError as exc:
                raise self._damaged(exc) from None
            except _DAMAGE as exc:
                raise StoreCorruptError(f"{str(self.path)!r} is damaged ({exc})") from None
        yield from rows

    # -- writing ------------------------------------------------------------------------------

    def append(self, commit: CommitRow) -> None:
        # Called under the State's lock, before the State applies the batch: encoded here, so
        # a value JSON cannot hold is refused with nothing applied; the I/O happens in the
        # writer thread.
        if self.readonly:
            raise self._readonly()
        seq, at_ns, origin, changes = commit
        try:
            text = encode_changes(changes)
        except (ValueError, TypeError, RecursionError):
            key, why = unstorable(changes) or (changes[0][0], "it cannot be encoded")
            raise StateValueError(
                f"the value of {key!r} cannot be stored in {str(self.path)!r} ({why}); store "
                "it as a string, or keep it out of the durable state"
            ) from None
        queue = self._queue
        if queue:
            if (
                time.monotonic_ns() - self._since > self._max_lag_ns
                or len(queue) >= self._max_queue
            ):
                self._catch_up()
                self._since = time.monotonic_ns()
        else:
            self._since = time.monotonic_ns()
        queue.append((seq, at_ns, origin, text))
        self._appended = seq
        if self._writer is None:
            self._start_writer()
        if not self._wake.is_set():
            self._wake.set()

    def _catch_up(self) -> None:
        """Wait until the writer has written the backlog (the bound on what a crash can lose)."""
        if self._writer is None:  # compact() queued alone; nothing of ours is waiting
            self._start_writer()
        self.sync(self._appended)

    def _start_writer(self) -> None:
        self._writer = threading.Thread(
            target=self._write_loop, name=f"slateflow-store:{self.path.name}", daemon=True
        )
        self._writer.start()

    def _write_loop(self) -> None:
        queue = self._queue
        conn = self._conn
        while True:
            self._wake.wait()
            self._wake.clear()
            if self.max_delay and not self._closing:
                # Let a burst of commits share one transaction, unless someone is waiting.
                self._hurry.wait(self.max_delay)
            self._hurry.clear()
            if not queue:
                if self._closing:
                    return
                continue
            items: list[_Encoded | _Compact] = []
            self._since = time.monotonic_ns()
            while queue:
                items.append(queue.popleft())
            try:
                self._check_in_place(conn)
                self._write(conn, items)
            except Exception as exc:
                self._fail(exc)
                return
            commits = [i for i in items if not isinstance(i, _Compact)]
            with self._done:
                if commits:
                    self._durable = max(self._durable, commits[-1][0])
                self._done.notify_all()
            for item in items:
                if isinstance(item, _Compact):
                    item.written.set()
            if self._closing and not queue:
                return

    def _check_in_place(self, conn: sqlite3.Connection) -> None:
        try:
            self._owner.check_in_place()
        except StoreError:
            # The -wal file stayed behind under the old name: fold what it holds into the file
            # (wherever it went) so a moved file holds every commit that was durable.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            raise

    def _write(self, conn: sqlite3.Connection, items: list[_Encoded | _Compact]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows: list[_Encoded] = []
            for item in items:
                if isinstance(item, _Compact):
                    if rows:
                        conn.executemany(_INSERT, rows)
                        rows = []
                    conn.execute(
                        "INSERT OR REPLACE INTO base (id, seq, entries) VALUES (1, ?, ?)",
                        (item.seq, item.entries),
                    )
                    conn.execute("DELETE FROM commits WHERE seq <= ?", (item.seq,))
                else:
                    rows.append(item)
            if rows:
                conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _fail(self, exc: Exception) -> None:
        log.error("store %s: commits could not be persisted", self.path, exc_info=exc)
        if isinstance(exc, StoreError):  # says what happened and what to do already
            self.error = StoreError(f"{exc} (the file holds the commits up to seq {self._durable})")
            with self._done:
                self._done.notify_all()
            return
        if isinstance(exc, sqlite3.IntegrityError):
            why = "another process is writing the same file (one writer per file)"
        else:
            why = str(exc)
        self.error = StoreError(
            f"store {str(self.path)!r} could not persist commits after seq {self._durable}: "
            f"{why}; the State refuses further writes: reopen the file with State.open to "
            "continue from what is on disk"
        )
        with self._done:
            self._done.notify_all()

    def sync(self, seq: int | None = None) -> None:
        target = self._appended if seq is None else seq
        if self._durable >= target:
            return
        self._hurry.set()
        with self._done:
            while self._durable < target:
                if self.error is not None and not isinstance(self.error, StoreClosedError):
                    raise self.error
                if self._writer is None or not self._writer.is_alive():
                    if self.error is not None:
                        raise self.error
                    raise StoreError(f"store {str(self.path)!r}: its writer is not running")
                if not self._wake.is_set():
                    self._wake.set()
                self._done.wait(0.5)

    def compact(self, seq: int, entries: list[EntryRow]) -> None:
        # Queued behind every commit it summarises, so they are on disk before it replaces them.
        if self.readonly:
            raise self._readonly()
        job = _Compact(seq, encode_entries(entries))
        self._queue.append(job)
        if self._writer is None:
            self._start_writer()
        self._wake.set()
        while not job.written.wait(0.5):
            if self.error is not None:
                raise self.error

    def close(self) -> None:
        """Write what is queued, stop the writer and close the file (idempotent)."""
        if self._closing:
            return
        self._closing = True
        writer = self._writer
        if writer is not None:
            self._wake.set()
            writer.join()
        with self._lock:
            for conn in (self._conn, self._side):
                if conn is not None:
                    conn.close()
            self._side = None  # reads after close raise StoreClosedError, not "damaged"
            self._release_lock()
        if self.error is None:
            self.error = StoreClosedError(
                f"store {str(self.path)!r} is closed; open it again with State.open to write"
            )

    # -- workflow checkpoints -----------------------------------------------------------------

    def _readonly(self) -> StoreError:
        return StoreError(
            f"store {str(self.path)!r} was opened read-only; open it with State.open to write"
        )

    def _side_write(self, sql: str, args: tuple[Any, ...]) -> None:
        if self.readonly:
            raise self._readonly()
        with self._lock:
            if self._closing:
                raise StoreClosedError(f"store {str(self.path)!r} is closed")
            self._owner.check_in_place()
            conn = self._reader()
            try:
                conn.execute(sql, args)
            except sqlite3.Error as exc:
                raise StoreError(f"store {str(self.path)!r}: {exc}") from None

    def load_checkpoint(self, workflow_id: str) -> str | None:
        with self._lock:
            if self._closing:
                raise StoreClosedError(f"store {str(self.path)!r} is closed")
            try:
                row = (
                    self._reader()
                    .execute("SELECT data FROM checkpoints WHERE workflow_id = ?", (workflow_id,))
                    .fetchone()
                )
            except sqlite3.Error as exc:
                raise StoreCorruptError(f"store {str(self.path)!r} is damaged ({exc})") from None
        if row is None:
            return None
        data = row[0]
        if type(data) is not str:
            raise StoreCorruptError(
                f"store {str(self.path)!r}: the checkpoint of {workflow_id!r} is not text"
            )
        return data

    def save_checkpoint(self, workflow_id: str, data: str) -> None:
        self._side_write(
            "INSERT OR REPLACE INTO checkpoints (workflow_id, data, updated_ns) VALUES (?, ?, ?)",
            (workflow_id, data, time.time_ns()),
        )

    def delete_checkpoint(self, workflow_id: str) -> None:
        self._side_write("DELETE FROM checkpoints WHERE workflow_id = ?", (workflow_id,))

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SQLiteStore {str(self.path)!r} {self.durability}, durable to seq {self._durable}>"
