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

from ..errors import StateValueError, StoreClosedError, StoreCorruptError, StoreError
from .base import Durability
from .checkpoints import Checkpoints
from .digests import base_digest, commit_digest
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
from .sqlite_format import (
    NO_CHAIN,
    STORE_FORMAT,
    STORE_FORMAT_VERSION,
    UPGRADE_1,
    chain_start,
    check_format,
    check_header,
)
from .sqlite_jobs import ChangeFn, Compact, EntryFn, Rewrite, rewrite_history
from .wal import check_wal

__all__ = ["STORE_FORMAT", "STORE_FORMAT_VERSION", "SQLiteStore"]

log = logging.getLogger("slateflow.stores")

_INSERT = "INSERT INTO commits (seq, at_ns, origin, changes, digest) VALUES (?, ?, ?, ?, ?)"

# What reading a damaged file can raise besides sqlite3.Error: text columns that are not UTF-8
# (UnicodeDecodeError is a ValueError), values of the wrong type, numbers out of range.
_DAMAGE = (sqlite3.Error, ValueError, TypeError, OverflowError)

# A commit as the writer thread gets it: its changes already encoded as JSON text.
_Encoded = tuple[int, int, str, str]


_Item = _Encoded | Compact | Rewrite


class SQLiteStore(Checkpoints):
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
    one fsync. ``state.sync()`` waits for everything queued, at either level: when the writer
    thread is idle, the caller writes the queue itself (one transaction, in order) rather than
    wake it and wait, which costs two thread switches more than the transaction.

    One State writes a file at a time: the store holds an exclusive ``flock`` on the file itself
    (where the OS has none, a second writer is caught when its commits collide), so a second
    writer, in this process or another, through any name of the file (a symlink, a hard link),
    is refused at open. The lock goes with the process, however it ends. A file deleted or
    moved while open is noticed at the next write: the store fails with ``StoreError``.
    ``readonly=True`` opens without the lock and without writing anything, beside the file
    either (what ``slateflow replay`` does); it may read a file another process is writing; a
    file nobody has open is read as immutable: a writer that opens it meanwhile is not seen. A
    damaged ``-wal`` is refused (:mod:`slateflow.stores.wal`); ``salvage=True`` opens the rest.
    Open it through ``State.open(path)``. Workflow checkpoints live in the same file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "batch",
        max_delay: float = 0.002,
        max_lag: float = 0.005,
        max_queue: int = 10_000,
        readonly: bool = False,
        salvage: bool = False,
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
        self._queue: deque[_Item] = deque()
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
        # Held by whoever writes queued commits (the writer thread, or a caller in sync).
        self._io = threading.RLock()
        self._owner = FileLock(self.path)  # one writer per file, on the file's inode
        self._side: sqlite3.Connection | None = None
        # The digest chain: where it starts, the column that holds it ("NULL" in a version-1
        # file opened read-only), and the digest of the newest commit written (the writer's).
        self._chained_after = 0
        self._columns = "digest"
        self._tip: bytes | None = None
        try:
            if not readonly and self.path.is_file():
                self._take_lock()  # nobody writes the -wal while it is checked
                check_wal(self.path, salvage=salvage)
            self._conn = self._connect(create=True)
        except BaseException:
            self._release_lock()
            raise

    # -- connections --------------------------------------------------------------------------

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        where = str(self.path)
        if not create and not self.path.exists():
            raise StoreError(f"no store at {where!r}")
        if create:
            if self.readonly and not self.path.is_file():
                raise StoreError(f"no store at {where!r}")
            check_header(self.path)
        try:
            if self.readonly:
                target = self.path.resolve().as_uri() + "?mode=ro"
                if not Path(f"{self.path}-wal").exists():
                    # No one has it open (a writer keeps its -wal while open): read it as the
                    # closed file it is, or SQLite leaves a -wal and -shm beside it.
                    target += "&immutable=1"
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
                version = check_format(conn, self.path, readonly=self.readonly)
                if not self.readonly:
                    self._take_lock()
                    if version == 1:
                        conn.executescript(UPGRADE_1)
                        version = 2
                self._chained_after = chain_start(conn, self.path, version)
                self._columns = "NULL" if self._chained_after == NO_CHAIN else "digest"
            if self.readonly:
                return conn
            conn.execute("PRAGMA journal_mode=WAL")
            # A compaction or a re-seal deletes what it replaces: overwrite it, rather than
            # leave old values (secrets written in clear among them) in free pages.
            conn.execute("PRAGMA secure_delete=ON")
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
        if not self._owner.held:
            self._owner.acquire()

    def _release_lock(self) -> None:
        self._owner.release()

    def _reader(self) -> sqlite3.Connection:
        if self._side is None:
            side = self._connect(create=False)
            side.execute("PRAGMA synchronous=FULL")  # checkpoints are saved through it
            self._side = side
        return self._side

    def load(self) -> Loaded:
        """Everything the store holds (raises ``StoreCorruptError`` for a damaged store)."""
        loaded, self._tip = self._read(None)
        self._appended = self._durable = loaded.head
        return loaded

    def _check_open(self) -> None:
        if self._closing:
            raise StoreClosedError(
                f"store {str(self.path)!r} is closed; open it again with State.open to read it"
            )

    def read(self, upto: int | None = None) -> Loaded:
        """The base and the commits up to ``upto`` (default: all), without side effects."""
        return self._read(upto)[0]

    def _read(self, upto: int | None) -> tuple[Loaded, bytes]:
        """The base and the commits up to ``upto``, every digest checked; and the digest of the
        last commit read (where the chain goes on)."""
        with self._lock:
            self._check_open()
            conn = self._reader()
            try:
                base_seq, base, chain = self._base(conn)
                commits, tip = self._rows(conn, base_seq, upto, chain)
            except StoreCorruptError as exc:
                raise self._damaged(exc) from None
            except _DAMAGE as exc:
                raise StoreCorruptError(
                    f"{str(self.path)!r} is damaged ({exc}); restore it from a backup"
                ) from None
        return Loaded(base_seq, base, commits), tip

    def _damaged(self, exc: StoreCorruptError) -> StoreCorruptError:
        """``exc`` (from the record decoders, which know no file) naming this file."""
        where = str(self.path)
        if where in str(exc):
            return exc
        return StoreCorruptError(f"{where!r}: {exc}; restore it from a backup or open a new file")

    def _base(self, conn: sqlite3.Connection) -> tuple[int, list[EntryRow], bytes]:
        """The compacted base (seq, entries) and the chain digest it carries forward."""
        columns = "chain, digest" if self._columns == "digest" else "NULL, NULL"
        row = conn.execute(f"SELECT seq, entries, {columns} FROM base WHERE id = 1").fetchone()
        if row is None:
            return 0, [], b""
        seq, entries, chain, digest = row
        if type(seq) is not int or seq < 0:
            raise StoreCorruptError(f"{str(self.path)!r}: the base seq is {seq!r}")
        if (digest is not None or seq > self._chained_after) and (
            type(chain) is not bytes
            or type(entries) is not str
            or digest != base_digest(chain, seq, entries)
        ):
            raise StoreCorruptError(
                f"{str(self.path)!r}: the compacted base (seq {seq}) does not match its "
                "digest; the file was edited or damaged: restore it from a backup"
            )
        return seq, decode_entries(entries, seq), chain if type(chain) is bytes else b""

    def _rows(
        self, conn: sqlite3.Connection, after: int, upto: int | None, prev: bytes
    ) -> tuple[list[CommitRow], bytes]:
        """The commits after ``after`` up to ``upto``, each checked against its digest chained
        from ``prev``; and the last digest."""
        cursor = conn.execute(
            f"SELECT seq, at_ns, origin, changes, {self._columns} FROM commits "
            "WHERE seq > ? AND seq <= ? ORDER BY seq",
            (after, (1 << 62) if upto is None else upto),
        )
        rows: list[CommitRow] = []
        expect = after + 1
        chained_after = self._chained_after
        for seq, at_ns, origin, changes, digest in cursor:
            if seq != expect:
                raise StoreCorruptError(
                    f"{str(self.path)!r}: commit {expect} is missing (the next one is {seq}); "
                    "the file was edited or damaged"
                )
            if type(at_ns) is not int or type(origin) is not str:
                raise StoreCorruptError(f"{str(self.path)!r}: commit {seq} has a bad header")
            if digest is None and seq <= chained_after:
                prev = b""  # written before digests existed: the chain starts again after it
            elif type(changes) is not str or digest != commit_digest(
                prev, seq, at_ns, origin, changes
            ):
                raise StoreCorruptError(
                    f"{str(self.path)!r}: commit {seq} does not match its digest (a flipped "
                    "bit or an edit); restore the file from a backup, or read it up to commit "
                    f"{seq - 1} with slateflow replay --to {seq - 1}"
                )
            else:
                prev = digest
            rows.append((seq, at_ns, origin, decode_changes(changes, seq)))
            expect += 1
        return rows, prev

    def commits(self, after: int = 0, upto: int | None = None) -> Iterator[CommitRow]:
        """The stored commits with ``after < seq <= upto``, in order."""
        # Read in one go under the lock: a generator must not hold the connection between steps.
        with self._lock:
            self._check_open()
            conn = self._reader()
            try:
                base_seq, _, chain = self._base(conn)
                start = max(after, base_seq)
                if start > base_seq:
                    chain = self._digest_of(conn, start)
                rows, _ = self._rows(conn, start, upto, chain)
            except StoreCorruptError as exc:
                raise self._damaged(exc) from None
            except _DAMAGE as exc:
                raise StoreCorruptError(f"{str(self.path)!r} is damaged ({exc})") from None
        yield from rows

    def _digest_of(self, conn: sqlite3.Connection, seq: int) -> bytes:
        """The stored digest of commit ``seq`` (empty where there is none), to check the
        commits after it."""
        row = conn.execute(f"SELECT {self._columns} FROM commits WHERE seq = ?", (seq,)).fetchone()
        return row[0] if row is not None and type(row[0]) is bytes else b""

    # -- writing ------------------------------------------------------------------------------

    def append(self, commit: CommitRow) -> None:
        """Accept one committed batch, under the State's lock before it applies it: encoded
        here, so a value JSON cannot hold is refused with nothing applied (I/O is the writer's)."""
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
            if not self._write_queued():
                return
            if self._closing and not queue:
                return

    def _write_queued(self) -> bool:
        """Write what is queued as one transaction (from the writer, or from a caller waiting
        in ``sync``: one thread at a time, in queue order); False once the store has failed."""
        queue = self._queue
        with self._io:
            if self.error is not None:
                return False
            if not queue:
                return True
            items: list[_Item] = []
            self._since = time.monotonic_ns()
            while queue:
                items.append(queue.popleft())
            try:
                self._check_in_place(self._conn)
                self._write(self._conn, items)
            except Exception as exc:
                self._fail(exc)
                return False
            commits = [i for i in items if isinstance(i, tuple)]
            with self._done:
                if commits:
                    self._durable = max(self._durable, commits[-1][0])
                self._done.notify_all()
            for item in items:
                if isinstance(item, Compact):
                    item.written.set()
                elif isinstance(item, Rewrite):
                    item.done.set()
            return True

    def _check_in_place(self, conn: sqlite3.Connection) -> None:
        try:
            self._owner.check_in_place()
        except StoreError:
            # The -wal file stayed behind under the old name: fold what it holds into the file
            # (wherever it went) so a moved file holds every commit that was durable.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            raise

    def _write(self, conn: sqlite3.Connection, items: list[_Item]) -> None:
        tip = self._tip if self._tip is not None else self._tip_on_disk(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows: list[tuple[int, int, str, str, bytes]] = []
            for item in items:
                if isinstance(item, Rewrite):
                    if rows:
                        conn.executemany(_INSERT, rows)
                        rows = []
                    tip = rewrite_history(conn, item, self._chained_after, tip)
                elif isinstance(item, Compact):
                    if rows:
                        conn.executemany(_INSERT, rows)
                        rows = []
                    # Queued right behind commit item.seq, so ``tip`` is that commit's digest.
                    conn.execute(
                        "INSERT OR REPLACE INTO base (id, seq, entries, chain, digest) "
                        "VALUES (1, ?, ?, ?, ?)",
                        (item.seq, item.entries, tip, base_digest(tip, item.seq, item.entries)),
                    )
                    conn.execute("DELETE FROM commits WHERE seq <= ?", (item.seq,))
                else:
                    seq, at_ns, origin, text = item
                    tip = commit_digest(tip, seq, at_ns, origin, text)
                    rows.append((seq, at_ns, origin, text, tip))
            if rows:
                conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._tip = tip
        if any(not isinstance(i, tuple) for i in items):
            # A compaction or a rewrite goes into the file now: until a checkpoint, the pages
            # it replaced stay in the file beside the -wal.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _tip_on_disk(self, conn: sqlite3.Connection) -> bytes:
        """The digest the next commit chains to, for a store written before it was loaded."""
        row = conn.execute("SELECT max(seq) FROM commits").fetchone()
        if row is not None and row[0] is not None:
            return self._digest_of(conn, row[0])
        base = conn.execute("SELECT chain FROM base WHERE id = 1").fetchone()
        return base[0] if base is not None and type(base[0]) is bytes else b""

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
        """Return once every commit up to ``seq`` (default: all appended) is durable."""
        target = self._appended if seq is None else seq
        if self._durable >= target:
            return
        if self._writer is not None and self._io.acquire(blocking=False):
            # The writer is not writing: write here rather than wake it and wait (two thread
            # switches cost more than the transaction itself).
            try:
                if self._durable < target and self.error is None:
                    self._write_queued()
            finally:
                self._io.release()
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
        """Replace the history up to ``seq`` by ``entries`` (the state as of ``seq``)."""
        # Queued behind every commit it summarises, so they are on disk before it replaces them.
        if self.readonly:
            raise self._readonly()
        job = Compact(seq, encode_entries(entries))
        self._run_job(job, job.written)

    def rewrite(self, change: ChangeFn, entry: EntryFn, hint: str | None = None) -> int:
        """Pass every stored change and base entry through ``change`` / ``entry`` and write back
        those that changed, digests re-chained (:mod:`~slateflow.stores.sqlite_jobs`; not read
        through when no record holds ``hint``); returns how many records were rewritten."""
        if self.readonly:
            raise self._readonly()
        job = Rewrite(change, entry, hint)
        self._run_job(job, job.done)
        return job.rewritten

    def _run_job(self, job: Compact | Rewrite, done: threading.Event) -> None:
        self._queue.append(job)
        if self._writer is None:
            self._start_writer()
        self._wake.set()
        while not done.wait(0.5):
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

    def _readonly(self) -> StoreError:
        return StoreError(
            f"store {str(self.path)!r} was opened read-only; open it with State.open to write"
        )

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SQLiteStore {str(self.path)!r} {self.durability}, durable to seq {self._durable}>"
