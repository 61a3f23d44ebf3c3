"""What a durable file guarantees under abuse: a bounded loss window, a file moved or shared
behind the store's back, and records flipped or edited on disk."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from slateflow import State
from slateflow.errors import StoreClosedError, StoreCorruptError, StoreError
from slateflow.replay import replay
from slateflow.stores import SQLiteStore


@pytest.fixture
def opened() -> Iterator[list[State]]:
    """States to close at the end of a test (a failed store's close raises: ignored)."""
    states: list[State] = []
    yield states
    for state in states:
        with contextlib.suppress(StoreError):
            state.close()


def durable(path: Path, opened: list[State], **options: Any) -> State:
    state = State(store=SQLiteStore(path, **options))
    opened.append(state)
    return state


# -- the batch backlog is bounded --------------------------------------------------------------


class StalledDisk:
    """Holds the writer thread inside its next transaction until released; notes when a
    writer had to wait for it."""

    def __init__(self, store: SQLiteStore) -> None:
        self.release = threading.Event()
        self.writing = threading.Event()
        self.waited = threading.Event()
        write, sync = store._write, store.sync

        def stalled_write(conn: sqlite3.Connection, items: list[Any]) -> None:
            self.writing.set()
            self.release.wait(30)
            write(conn, items)

        def noted_sync(seq: int | None = None) -> None:
            self.waited.set()
            sync(seq)

        store._write = stalled_write  # type: ignore[method-assign]
        store.sync = noted_sync  # type: ignore[method-assign]


def test_a_batch_writer_waits_when_max_queue_commits_are_waiting(
    tmp_path: Path, opened: list[State]
) -> None:
    state = durable(tmp_path / "s.db", opened, max_queue=3, max_lag=10)
    store = state.store
    assert isinstance(store, SQLiteStore)
    disk = StalledDisk(store)
    state.set("n", 0)
    assert disk.writing.wait(10)  # the writer holds commit 1 in its transaction
    wrote: list[int] = []

    def writer() -> None:
        for n in range(1, 8):
            state.set("n", n)
            wrote.append(n)

    thread = threading.Thread(target=writer)
    thread.start()
    assert disk.waited.wait(10)
    # Three commits queued behind the stalled transaction; the fourth set waits for the disk.
    assert wrote == [1, 2, 3]
    assert len(store._queue) == 3
    disk.release.set()
    thread.join(10)
    assert wrote == list(range(1, 8))
    state.sync()
    state.close()
    with State.open(tmp_path / "s.db") as again:
        assert again.get("n") == 7


def test_a_batch_writer_waits_once_the_oldest_queued_commit_is_max_lag_old(
    tmp_path: Path, opened: list[State]
) -> None:
    # max_lag 0: every set that finds a commit still queued waits for the writer first, so
    # nothing acknowledged is ever more than one transaction ahead of the disk.
    state = durable(tmp_path / "s.db", opened, max_delay=0, max_lag=0)
    store = state.store
    assert isinstance(store, SQLiteStore)
    disk = StalledDisk(store)
    state.set("n", 0)
    assert disk.writing.wait(10)
    state.set("n", 1)  # queued behind the stalled transaction

    thread = threading.Thread(target=state.set, args=("n", 2))
    thread.start()
    assert disk.waited.wait(10)
    assert len(store._queue) == 1
    disk.release.set()
    thread.join(10)
    state.sync()
    assert state.get("n") == 2


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        ("max_lag", -1),
        ("max_lag", 11),
        ("max_lag", 0.001),  # below max_delay (2 ms): the writer could never keep up
        ("max_lag", "1"),
        ("max_queue", 0),
        ("max_queue", 1.5),
        ("max_queue", True),
    ],
)
def test_backlog_bounds_are_checked(tmp_path: Path, option: str, bad: Any) -> None:
    with pytest.raises(StoreError, match=option):
        SQLiteStore(tmp_path / "s.db", **{option: bad})
    assert not (tmp_path / "s.db").exists()


def test_a_closed_store_still_refuses_writes_after_backpressure(
    tmp_path: Path, opened: list[State]
) -> None:
    state = durable(tmp_path / "s.db", opened, max_queue=1)
    for n in range(50):
        state.set("n", n)
    state.close()
    with pytest.raises(StoreClosedError):
        state.set("n", 99)
    with State.open(tmp_path / "s.db") as again:
        assert again.get("n") == 49


# -- one writer per file, whatever its name ----------------------------------------------------


def test_a_second_writer_through_a_symlink_is_refused(tmp_path: Path, opened: list[State]) -> None:
    path = tmp_path / "s.db"
    first = durable(path, opened)
    first.set("a", 1)
    link = tmp_path / "link.db"
    link.symlink_to(path)
    with pytest.raises(StoreError, match=rf"link\.db.* open for writing .*process {os.getpid()}"):
        State.open(link)
    first.set("a", 2)  # the first writer is unaffected
    first.sync()
    first.close()
    with State.open(link) as again:  # closed: the file is free through any name
        assert again.get("a") == 2


def test_a_second_writer_through_another_spelling_is_refused(
    tmp_path: Path, opened: list[State], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    first = durable(tmp_path / "s.db", opened)
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(StoreError, match="open for writing"):
        State.open(Path("..") / "s.db")
    first.set("a", 1)  # a chdir does not make the open file look moved
    first.sync()


def test_a_second_writer_through_a_hard_link_is_told_about_the_links(
    tmp_path: Path, opened: list[State]
) -> None:
    path = tmp_path / "s.db"
    first = durable(path, opened)
    first.set("a", 1)
    first.sync()
    os.link(path, tmp_path / "hard.db")
    with pytest.raises(StoreError, match=r"hard\.db.*2 names \(hard links\)") as info:
        State.open(tmp_path / "hard.db")
    assert "damaged" not in str(info.value)
    first.set("a", 2)
    first.sync()
    first.close()
    with State.open(tmp_path / "hard.db") as again:
        assert again.get("a") == 2


def test_a_refused_second_writer_leaves_no_lock_file_behind(
    tmp_path: Path, opened: list[State]
) -> None:
    path = tmp_path / "s.db"
    first = durable(path, opened)
    first.set("a", 1)
    with pytest.raises(StoreError):
        State.open(path)
    first.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


# -- a file deleted or moved while open ----------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "moved", "replaced"])
@pytest.mark.parametrize("durability", ["batch", "sync"])
def test_a_file_deleted_or_moved_while_open_fails_the_next_write(
    tmp_path: Path, opened: list[State], how: str, durability: str
) -> None:
    path = tmp_path / "s.db"
    state = durable(path, opened, durability=durability)
    state.set("a", 1)
    state.sync()
    if how == "deleted":
        path.unlink()
    elif how == "moved":
        path.rename(tmp_path / "rotated.db")
    else:
        path.rename(tmp_path / "rotated.db")
        with State.open(path) as other:  # a new file under the old name
            other.set("other", True)
    # Under "batch" the set is queued and its flush finds out; under "sync" the set itself.
    with pytest.raises(StoreError, match=r"s\.db.* deleted or moved while open"):  # noqa: PT012
        state.set("a", 2)
        state.sync()
    with pytest.raises(StoreError, match="deleted or moved"):
        state.set("b", 3)  # refused: nothing more is applied
    assert state.get("b") is None
    with contextlib.suppress(StoreError):
        state.close()
    if how == "moved":
        # The -wal stayed under the old name; the store folded it into the moved file.
        with State.open(tmp_path / "rotated.db") as moved:
            assert moved.get("a") == 1


def test_a_checkpoint_save_into_a_moved_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    try:
        store.save_checkpoint("w", "{}")
        path.rename(tmp_path / "moved.db")
        with pytest.raises(StoreError, match="deleted or moved while open"):
            store.save_checkpoint("w", "{}")
    finally:
        with contextlib.suppress(StoreError):
            store.close()


# -- integrity: a digest chain over the records --------------------------------------------------


def write_history(path: Path, *, compact_at: int | None = None) -> list[str]:
    """Twelve commits of assorted values (compacted after ``compact_at`` if given); the
    snapshot after each, by seq."""
    seen = [""]
    with State.open(path) as state:
        for n in range(1, 13):
            if n % 3 == 0:
                state.update({f"k{n}": {"n": n, "list": [n, -0.0, "x" * n]}, "count": n})
            else:
                state.set("count", n, source="llm", writer=f"w{n}", confidence=0.5)
            if n == compact_at:
                state.journal.compact()
            seen.append(snapshot_text(state))
        state.store.save_checkpoint("wf", '{"x": 1}')  # type: ignore[union-attr]
    return seen


def snapshot_text(state: State) -> str:
    return json.dumps(state.snapshot(), sort_keys=True)


def edit(path: Path, sql: str, *args: Any) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(sql, args)
        conn.commit()


@pytest.mark.parametrize("compact_at", [None, 6])
def test_a_flipped_bit_anywhere_loads_the_same_state_or_fails_closed(
    tmp_path: Path, compact_at: int | None
) -> None:
    source = tmp_path / "source.db"
    seen = write_history(source, compact_at=compact_at)
    data = source.read_bytes()
    rng = random.Random(18)
    outcomes: collections.Counter[str] = collections.Counter()
    # Half anywhere in the file (mostly free space), half inside the stored records.
    records = [m.start() for m in re.finditer(rb'\[\["', data)]
    assert records
    for n in range(300):
        at = rng.randrange(len(data)) if n % 2 else rng.choice(records) + rng.randrange(48)
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        path = tmp_path / f"flip{n}.db"
        path.write_bytes(bytes(flipped))
        try:
            state = State.open(path)
        except StoreError as exc:
            refusal = str(exc)
            assert str(path) in refusal, refusal
            outcomes["refused"] += 1
            continue
        try:
            # The flip landed where nothing is read (free space, the checkpoint row): the
            # state must be exactly the one written, never another.
            assert snapshot_text(state) == seen[-1], f"byte {at} changed the state silently"
            outcomes["same state"] += 1
        finally:
            with contextlib.suppress(StoreError):
                state.close()
    assert outcomes["refused"] > 0
    assert outcomes["same state"] > 0


def test_an_sql_edit_of_a_historic_value_is_refused_naming_the_commit(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    write_history(path)
    # A valid record with another value, written the way a person with sqlite3 would.
    edit(
        path,
        "UPDATE commits SET changes = ? WHERE seq = 4",
        '[["count",400,4,"llm","w4",0.5,null]]',
    )
    with pytest.raises(StoreCorruptError, match=r"s\.db.*commit 4 does not match its digest"):
        State.open(path)
    with pytest.raises(StoreCorruptError, match="commit 4"):
        replay(path)
    assert replay(path, end=3)  # what comes before the edit still reads


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("UPDATE commits SET at_ns = at_ns + 1 WHERE seq = 9", "commit 9 does not match"),
        ("UPDATE commits SET origin = 'update' WHERE seq = 2", "commit 2 does not match"),
        ("UPDATE commits SET digest = NULL WHERE seq = 12", "commit 12 does not match"),
        ("UPDATE commits SET digest = zeroblob(16) WHERE seq = 1", "commit 1 does not match"),
        ("DELETE FROM meta WHERE name = 'chained_after'", "digest chain starts"),
        ("UPDATE meta SET value = 'x' WHERE name = 'chained_after'", "digest chain starts"),
    ],
)
def test_an_edited_header_or_digest_is_refused(tmp_path: Path, sql: str, says: str) -> None:
    path = tmp_path / "s.db"
    write_history(path)
    edit(path, sql)
    with pytest.raises(StoreCorruptError, match=says):
        State.open(path)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE base SET entries = replace(entries, '\"count\",6', '\"count\",60')",
        "UPDATE base SET digest = NULL",
        "UPDATE base SET chain = zeroblob(16)",
    ],
)
def test_an_edited_compacted_base_is_refused(tmp_path: Path, sql: str) -> None:
    path = tmp_path / "s.db"
    write_history(path, compact_at=6)
    edit(path, sql)
    with pytest.raises(StoreCorruptError, match=r"compacted base \(seq 6\) does not match"):
        State.open(path)


def test_a_compacted_store_chains_on_across_reopens(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    seen = write_history(path, compact_at=6)
    with State.open(path) as state:
        assert snapshot_text(state) == seen[-1]
        state.set("more", 1)
        state.journal.compact()
        state.set("more", 2)
    with State.open(path) as again:
        assert again.get("more") == 2
        assert again.journal.cursor == 14


def downgrade_to_version_1(path: Path) -> None:
    """Turn a store file into what slateflow wrote before digests (format 1)."""
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(
            "ALTER TABLE commits DROP COLUMN digest; ALTER TABLE base DROP COLUMN chain;"
            "ALTER TABLE base DROP COLUMN digest; DELETE FROM meta WHERE name = 'chained_after';"
            "UPDATE meta SET value = '1' WHERE name = 'version';"
        )


def test_a_version_1_file_is_upgraded_and_chained_from_then_on(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    seen = write_history(path)
    downgrade_to_version_1(path)
    assert replay(path)  # read-only: read as it is, left at version 1
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone() == ("1",)
    with State.open(path) as state:
        assert snapshot_text(state) == seen[-1]
        state.set("after", 1)
    with closing(sqlite3.connect(path)) as conn:
        meta = dict(conn.execute("SELECT name, value FROM meta"))
    assert (meta["version"], meta["chained_after"]) == ("2", "12")
    with State.open(path) as again:
        assert again.get("after") == 1
    # Commits the old version wrote carry no digest (an edit there is not seen); new ones do.
    edit(
        path,
        "UPDATE commits SET changes = ? WHERE seq = 13",
        '[["after",2,1,"user",null,null,null]]',
    )
    with pytest.raises(StoreCorruptError, match="commit 13 does not match"):
        State.open(path)
