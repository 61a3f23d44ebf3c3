"""What a durable file guarantees under abuse: a bounded loss window, a file moved or shared
behind the store's back, and records flipped or edited on disk."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slateflow import State
from slateflow.errors import StoreClosedError, StoreError
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
    state.flush()
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
    state.flush()
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
