"""Stores: exact recovery from a MemoryStore or a SQLite file, time travel (``at``), compaction,
durability levels, closed and failed stores, checkpoints, and the import layering."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slateflow import State
from slateflow.conversation import end_turn
from slateflow.errors import (
    HistoryError,
    KeyExistsError,
    MissingKeyError,
    StateValueError,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
)
from slateflow.replay import replay
from slateflow.stores import CheckpointStore, MemoryStore, SQLiteStore, Store
from slateflow.stores.digests import commit_digest
from slateflow.stores.sqlite import STORE_FORMAT_VERSION

SRC = Path(__file__).resolve().parents[2] / "src" / "slateflow"


# -- helpers ---------------------------------------------------------------------------------


def as_json(value: Any) -> str:
    """Exact JSON text: tells 1 from 1.0 from True and 0.0 from -0.0 (``==`` does not)."""
    return json.dumps(value, allow_nan=False, sort_keys=True)


def snap(state: State) -> str:
    return as_json(state.snapshot())


def tail(state: State, cursor: int) -> str:
    """The journal after ``cursor`` as exact JSON (Changes of two states never compare equal:
    their stamps and policies are different objects)."""
    return as_json([m.to_dict(redact=False) for m in state.journal.since(cursor)])


def max_seq(path: Path) -> int | None:
    """The newest commit a separate, raw sqlite3 connection sees in the file."""
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT max(seq) FROM commits").fetchone()
    return None if row is None else row[0]


class Backend:
    """Opens a state on one kind of store and reopens it as a restart would."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind = kind
        self.path = directory / "state.db"
        self.opened: list[State] = []

    def open(self) -> State:
        if self.kind == "memory":
            state = State(store=MemoryStore())
        else:
            state = State.open(self.path, durability=self.kind)  # type: ignore[arg-type]
        self.opened.append(state)
        return state

    def reopen(self, state: State) -> State:
        store = state.store
        assert store is not None
        state.close()
        if self.kind == "memory":
            again = State(store=store)
        else:
            again = State.open(self.path, durability=self.kind)  # type: ignore[arg-type]
        self.opened.append(again)
        return again

    def close_all(self) -> None:
        for state in self.opened:
            with contextlib.suppress(StoreError):
                state.close()


@pytest.fixture(params=["memory", "batch", "sync"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = Backend(request.param, tmp_path)
    yield b
    b.close_all()


@pytest.fixture(params=["batch", "sync"])
def durability(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def opened() -> Iterator[list[State]]:
    """States to close at the end of a test (a failed store's close raises: ignored)."""
    states: list[State] = []
    yield states
    for state in states:
        with contextlib.suppress(StoreError):
            state.close()


def open_file(path: Path, opened: list[State], durability: str = "batch") -> State:
    state = State.open(path, durability=durability)  # type: ignore[arg-type]
    opened.append(state)
    return state


# -- recovery is exact -----------------------------------------------------------------------


def w_set(s: State) -> None:
    s.set("a", 1)
    s.set(
        "a",
        {"x": [1, 1.0, True, None, -0.0, 1e300]},
        source="llm",
        writer="ex",
        confidence=0.25,
        meta={"turn": 2, "why": "caller said so \u2028 \U0001f600"},
    )
    s.set("b", "\u2028\u2029\U0001f680", source="tool")
    s.set("b", "\u2028\u2029\U0001f680", source="tool")  # unchanged: no commit
    s.set("c", 2**80, confidence=1)
    s.set("c", -(2**70), writer="w", expected_version=1)


def w_update(s: State) -> None:
    s.update({"a": 1, "b": 2, "c": [3]})
    s.update(
        {"c": 3, "a": 1.0, "d": {"e": None}},
        writer="u",
        source="agent",
        confidence=0.0,
        meta={"k": [1]},
        remove=["b", "missing"],
    )
    s.update({}, remove="d")
    s.update({"a": 1.0})  # unchanged: no commit


def w_remove(s: State) -> None:
    s.set("a", [1, 2])
    s.set("b", 1)
    assert s.remove("a", source="tool", writer="cleaner") == [1, 2]
    assert s.remove("zz", None) is None
    s.set("a", "back")


def w_modify(s: State) -> None:
    for _ in range(3):
        s.modify("n", 0, lambda v: v + 1, source="agent", meta={"step": "inc"})
    s.modify("l", [], lambda v: [*v, "x"])


def w_rename(s: State) -> None:
    s.set("a", [1], source="tool", writer="t", confidence=0.5, meta={"m": 1})
    s.rename("a", "b", writer="mover")
    s.set("c", 1)
    s.rename("b", "c", overwrite=True)
    s.set("c2", 0)
    with pytest.raises(KeyExistsError):
        s.rename("c", "c2")


def w_clear_prefix(s: State) -> None:
    s.update({"p:a": 1, "p:b": 2, "q": 3})
    assert s.clear_prefix("p:", writer="janitor") == 2
    assert s.clear_prefix("nothing:") == 0


def w_end_turn(s: State) -> None:
    s.update({"turn:x": 1, "temp:y": [2], "session:z": 3})
    assert end_turn(s) == 2
    s.set("turn:x", "again")


def w_transaction(s: State) -> None:
    s.set("a", 1)
    with s.transaction() as tx:
        tx.set("a", 2, source="llm")
        s.set("b", {"v": 1})
        tx.remove("a")
        s.set("c", 3)
    before = s.journal.cursor
    with s.transaction() as tx:
        s.set("rolled", 1)
        tx.set("c", 99)
        tx.rollback()

    def failing() -> None:
        with s.transaction():
            s.set("rolled", 2)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        failing()
    assert s.journal.cursor == before
    assert s.get("rolled") is None


def w_threads(s: State) -> None:
    def work(n: int) -> None:
        for i in range(25):
            s.set(f"t{n}:k{i % 5}", i, writer=f"thread{n}")
            s.modify("shared", 0, lambda v: v + 1)
            if i % 7 == 0:
                s.update({f"t{n}:u": i}, remove=f"t{n}:k0")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.get("shared") == 100


WRITES: dict[str, Callable[[State], None]] = {
    "set": w_set,
    "update": w_update,
    "remove": w_remove,
    "modify": w_modify,
    "rename": w_rename,
    "clear_prefix": w_clear_prefix,
    "end_turn": w_end_turn,
    "transaction": w_transaction,
    "threads": w_threads,
}


@pytest.mark.parametrize("write", list(WRITES))
def test_recovery_is_exact(backend: Backend, write: str) -> None:
    state = backend.open()
    state.set("before", "x", source="system")
    mid = state.journal.cursor
    WRITES[write](state)
    assert state.journal.cursor > mid
    expected_snap, expected_tail, expected_all = snap(state), tail(state, mid), tail(state, 0)
    cursor = state.journal.cursor

    again = backend.reopen(state)
    assert again.journal.cursor == cursor
    assert snap(again) == expected_snap
    assert tail(again, mid) == expected_tail
    assert tail(again, 0) == expected_all
    for key in again.keys(prefix=""):
        assert again.provenance(key) == state.provenance(key)
        assert again.entry(key) == state.entry(key)

    # The recovered state carries on from there, and that survives another restart.
    again.set("after", 1)
    assert again.journal.cursor == cursor + 1
    third = backend.reopen(again)
    assert third.journal.cursor == cursor + 1
    assert third.get("after") == 1
    after = json.loads(tail(third, cursor))
    assert tail(third, mid) == as_json([*json.loads(expected_tail), *after])


def test_recovery_of_an_empty_store(backend: Backend) -> None:
    state = backend.open()
    again = backend.reopen(state)
    assert again.journal.cursor == 0
    assert again.snapshot()["entries"] == {}
    assert again.journal.since(0) == []


def test_the_store_property_names_the_store_and_its_durability(backend: Backend) -> None:
    state = backend.open()
    assert state.store is not None
    assert isinstance(state.store, Store)
    assert state.store.durability == backend.kind
    plain = State()
    assert plain.store is None
    plain.sync()
    plain.close()  # nothing to close
    plain.set("a", 1)


def test_recovery_respects_a_small_journal(tmp_path: Path, opened: list[State]) -> None:
    state = open_file(tmp_path / "s.db", opened)
    for i in range(20):
        state.update({"a": i, "b": -i})
    state.close()
    again = State.open(tmp_path / "s.db", journal_size=5)
    opened.append(again)
    assert [m.seq for m in again.journal.since(18)] == [19, 19, 20, 20]
    assert again.journal.cursor == 20
    assert again.get("a") == 19


def test_a_memory_store_recovers_while_the_first_state_is_open() -> None:
    store = MemoryStore()
    first = State(store=store)
    first.set("a", 1, writer="w")
    second = State(store=store)
    assert snap(second) == snap(first)
    second.set("a", 2)
    # The first state no longer owns the store: its next commit collides and is refused.
    with pytest.raises(StoreError):
        first.set("b", 1)
    with pytest.raises(StoreError):
        first.set("c", 1)
    assert first.get("c") is None
    assert State(store=store).get("a") == 2


@pytest.mark.parametrize("write", ["set", "update"])
def test_a_commit_the_memory_store_refuses_is_not_applied(write: str) -> None:
    store = MemoryStore()
    first = State(store=store)
    first.set("a", 1)
    State(store=store).set("a", 2)  # a second State now owns the store
    before, cursor = snap(first), first.journal.cursor
    refused: Callable[[], object] = (
        (lambda: first.set("b", 1)) if write == "set" else (lambda: first.update({"b": 1}))
    )
    with pytest.raises(StoreError):
        refused()
    assert first.get("b") is None
    assert first.journal.cursor == cursor
    assert snap(first) == before


# -- random histories, recovered and replayed -----------------------------------------------

KEYS = ["a", "b", "c", "d:e"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63, max_value=2**90)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([-0.0, 0.0, 1e300, -1e300, 5e-324, 1.0, 0.1 + 0.2])
    | st.text(max_size=8)
    | st.sampled_from(["\u2028", "\u2029", "\U0001f600", "a\x00b", '"\\/', "é"])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
provenances = st.fixed_dictionaries(
    {
        "source": st.sampled_from(["user", "llm", "tool", "syst\u00e8me \U0001f916"]),
        "writer": st.none() | st.text(min_size=1, max_size=6),
        "confidence": st.none() | st.floats(min_value=0, max_value=1) | st.just(1),
        "meta": st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=2),
    }
)
ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(KEYS), json_values, provenances),
    st.tuples(
        st.just("update"),
        st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3),
        st.lists(st.sampled_from(KEYS), max_size=2),
        provenances,
    ),
    st.tuples(st.just("remove"), st.sampled_from(KEYS)),
    st.tuples(st.just("rename"), st.sampled_from(KEYS), st.sampled_from(KEYS), st.booleans()),
)


def apply(state: State, op: tuple[Any, ...]) -> None:
    kind = op[0]
    with contextlib.suppress(MissingKeyError, KeyExistsError, StateValueError):
        if kind == "set":
            state.set(op[1], op[2], **op[3])
        elif kind == "update":
            state.update(op[1], remove=op[2], **op[3])
        elif kind == "remove":
            state.remove(op[1])
        else:
            state.rename(op[1], op[2], overwrite=op[3])


@settings(max_examples=40, deadline=None)
@given(history=st.lists(ops, max_size=25), durability=st.sampled_from(["batch", "sync"]))
def test_random_histories_recover_and_replay_exactly(
    history: list[tuple[Any, ...]], durability: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.db"
        state = State.open(path, durability=durability)  # type: ignore[arg-type]
        try:
            seen = {0: snap(state)}
            for op in history:
                apply(state, op)
                seen[state.journal.cursor] = snap(state)
            assert sorted(seen) == list(range(state.journal.cursor + 1))  # one snapshot per commit
            for seq, expected in seen.items():
                assert snap(state.journal.at(seq)) == expected
        finally:
            state.close()
        again = State.open(path, durability=durability)  # type: ignore[arg-type]
        try:
            assert again.journal.cursor == max(seen)
            assert snap(again) == seen[again.journal.cursor]
            for seq, expected in seen.items():
                assert snap(again.journal.at(seq)) == expected
        finally:
            again.close()


# -- at(seq) ---------------------------------------------------------------------------------


def test_at_refuses_seqs_it_cannot_reach(backend: Backend) -> None:
    state = backend.open()
    state.set("a", 1)
    state.set("a", 2)
    for bad in (3, 10**9, -1, "1", 1.0, True, None):
        with pytest.raises(HistoryError):
            state.journal.at(bad)  # type: ignore[arg-type]
    with pytest.raises(HistoryError, match="no history"):
        State().journal.at(0)
    with pytest.raises(LookupError):  # HistoryError is a LookupError too
        state.journal.at(3)


def test_at_zero_is_empty_and_at_head_is_now(backend: Backend) -> None:
    state = backend.open()
    state.set("a", {"x": 1}, source="llm", confidence=0.5, meta={"m": True})
    state.update({"b": [1], "c": "z"}, remove="a")
    state.rename("b", "d")
    past = state.journal.at(0)
    assert past.journal.cursor == 0
    assert past.snapshot()["entries"] == {}
    assert snap(state.journal.at(state.journal.cursor)) == snap(state)
    one = state.journal.at(1)
    assert one.journal.cursor == 1
    assert one.get("a") == {"x": 1}
    assert one.provenance("a") == state.journal.at(1).provenance("a")
    assert one.keys() == ["a"]


def test_at_returns_a_detached_state(backend: Backend) -> None:
    state = backend.open()
    state.set("a", 1)
    state.set("a", 2)
    state.sync()
    past = state.journal.at(1)
    assert past.store is None
    past.set("a", 100)
    past.set("new", 1)
    assert past.get("a") == 100
    assert state.get("a") == 2
    assert state.get("new") is None
    assert state.journal.cursor == 2
    assert state.journal.at(1).get("a") == 1
    if backend.kind != "memory":
        state.sync()
        assert max_seq(backend.path) == 2
    again = backend.reopen(state)
    assert again.get("a") == 2
    assert again.get("new") is None


def test_at_after_close_is_not_reported_as_damage(tmp_path: Path, opened: list[State]) -> None:
    state = open_file(tmp_path / "s.db", opened)
    state.set("a", 1)
    state.set("a", 2)
    state.close()
    with contextlib.suppress(StoreClosedError):  # refusing plainly would be fine too
        assert state.journal.at(1).get("a") == 1


# -- compaction ------------------------------------------------------------------------------


def test_compact_then_reopen_is_exact(backend: Backend) -> None:
    state = backend.open()
    for i in range(5):
        state.update({"a": i, f"k{i}": [i]}, writer="w", meta={"i": i})
    state.remove("k0")
    at_compaction = snap(state)
    seq = state.journal.compact()
    assert seq == state.journal.cursor == 6
    state.set("a", "later", source="llm")
    state.rename("k1", "k9")
    later = snap(state)
    if backend.kind != "memory":
        state.sync()
        with closing(sqlite3.connect(backend.path)) as conn:
            assert conn.execute("SELECT seq FROM base").fetchall() == [(6,)]
            assert conn.execute("SELECT seq FROM commits ORDER BY seq").fetchall() == [(7,), (8,)]

    again = backend.reopen(state)
    assert again.journal.cursor == 8
    assert snap(again) == later
    assert snap(again.journal.at(6)) == at_compaction
    assert snap(again.journal.at(8)) == later
    assert again.journal.at(7).get("a") == "later"
    with pytest.raises(HistoryError, match="compaction"):
        again.journal.at(5)
    with pytest.raises(HistoryError):
        again.journal.at(0)
    # The journal after the compaction point survives; before it, the cursor has expired.
    assert [m.seq for m in again.journal.since(6)] == [7, 8, 8]
    again.set("z", 1)
    assert backend.reopen(again).journal.cursor == 9


def test_compact_twice_and_compact_an_empty_state(backend: Backend) -> None:
    state = backend.open()
    assert state.journal.compact() == 0
    state.set("a", 1)
    assert state.journal.compact() == 1
    state.set("b", 2)
    assert state.journal.compact() == 2
    assert state.journal.compact() == 2
    again = backend.reopen(state)
    assert again.journal.cursor == 2
    assert again.pick("a", "b") == {"a": 1, "b": 2}
    assert again.entry("a") == state.entry("a")
    assert snap(again.journal.at(2)) == snap(state)
    with pytest.raises(HistoryError):
        again.journal.at(1)


# -- durability ------------------------------------------------------------------------------


def test_sync_durability_is_on_disk_when_set_returns(tmp_path: Path, opened: list[State]) -> None:
    path = tmp_path / "s.db"
    state = open_file(path, opened, "sync")
    for i in range(1, 6):
        state.set("a", i)
        assert max_seq(path) == i
    state.update({"b": 1, "c": 2})
    assert max_seq(path) == 6
    with state.transaction():
        state.set("d", 1)
    assert max_seq(path) == 7


def test_batch_durability_is_on_disk_after_flush(tmp_path: Path, opened: list[State]) -> None:
    path = tmp_path / "s.db"
    state = open_file(path, opened, "batch")
    for i in range(50):
        state.set("a", i)
    state.sync()
    assert max_seq(path) == 50
    state.sync()  # nothing queued: returns at once
    assert max_seq(path) == 50


def test_close_refuses_writes_and_keeps_reads(backend: Backend) -> None:
    state = backend.open()
    state.set("a", 1, writer="w")
    state.set("b", [1])
    cursor, before = state.journal.cursor, snap(state)
    state.close()
    state.close()  # idempotent
    for write in (
        lambda: state.set("a", 2),
        lambda: state.set("new", 2),
        lambda: state.update({"a": 3}),
        lambda: state.remove("b"),
        lambda: state.rename("a", "z"),
        lambda: state.modify("a", 0, lambda v: v + 1),
        lambda: state.clear_prefix(""),
    ):
        with pytest.raises(StoreClosedError):
            write()
    with pytest.raises(StoreClosedError), state.transaction():
        state.set("a", 5)
    assert state.get("a") == 1
    assert state.get("new") is None
    assert state.get("b") == [1]
    assert state.journal.cursor == cursor
    assert snap(state) == before
    assert state.keys() == ["a", "b"]
    assert state.provenance("a") is not None
    state.sync()  # nothing left to write: fine after close
    again = backend.reopen(state)
    assert snap(again) == before


def test_context_manager_closes(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with State.open(path, durability="batch") as state:
        state.set("a", 1)
    with pytest.raises(StoreClosedError):
        state.set("a", 2)
    assert max_seq(path) == 1
    with State.open(path) as again:
        assert again.get("a") == 1


def test_close_checkpoints_the_wal_so_the_main_file_alone_recovers(
    tmp_path: Path, durability: str
) -> None:
    path = tmp_path / "s.db"
    state = State.open(path, durability=durability)  # type: ignore[arg-type]
    for i in range(30):
        state.update({"a": i, f"k{i % 4}": {"i": [i, -0.0]}}, source="llm", confidence=0.5)
    expected = snap(state)
    state.close()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    moved = tmp_path / "moved" / "copy.db"
    moved.parent.mkdir()
    shutil.copyfile(path, moved)
    with State.open(moved) as again:
        assert again.journal.cursor == 30
        assert snap(again) == expected


def test_a_main_file_copied_while_open_is_a_consistent_prefix(
    tmp_path: Path, opened: list[State]
) -> None:
    path = tmp_path / "s.db"
    state = open_file(path, opened)
    seen = {0: snap(state)}
    for i in range(40):
        state.update({"a": i, "b": [i]})
        seen[state.journal.cursor] = snap(state)
    state.sync()  # in the WAL, maybe not yet in the main file
    copy = tmp_path / "copy.db"
    shutil.copyfile(path, copy)
    with State.open(copy) as again:
        assert again.journal.cursor <= 40
        assert snap(again) == seen[again.journal.cursor]


# -- a store that can no longer write --------------------------------------------------------


def intrude(conn: sqlite3.Connection) -> None:
    """Commit 2 as another slateflow writer would write it (chained to commit 1)."""
    (prev,) = conn.execute("SELECT digest FROM commits WHERE seq = 1").fetchone()
    changes = '[["x",1,1,"user",null,null,null]]'
    conn.execute(
        "INSERT INTO commits VALUES (2, 1, 'set', ?, ?)",
        (changes, commit_digest(prev, 2, 1, "set", changes)),
    )
    conn.commit()


def test_a_store_that_cannot_write_refuses_every_later_write(
    tmp_path: Path, opened: list[State]
) -> None:
    path = tmp_path / "s.db"
    first = open_file(path, opened)
    first.set("a", 1)
    first.sync()
    # Something else writes the file behind the store's back (a second writer on a system
    # without flock, a restored backup): the next commit collides on the writer thread.
    with closing(sqlite3.connect(path)) as intruder:
        intrude(intruder)
    first.set("b", 2)
    with pytest.raises(StoreError, match=r"s\.db") as info:
        first.sync()
    assert not isinstance(info.value, StoreClosedError)
    store = first.store
    assert store is not None
    assert isinstance(store.error, StoreError)
    cursor, before = first.journal.cursor, snap(first)
    with pytest.raises(StoreError, match=r"s\.db"):
        first.set("c", 3)
    with pytest.raises(StoreError, match=r"s\.db"):
        first.update({"c": 3, "b": 4})
    with pytest.raises(StoreError, match=r"s\.db"):
        first.remove("b")
    with pytest.raises(StoreError), first.transaction():
        first.set("c", 3)
    assert first.get("c") is None
    assert first.get("b") == 2
    assert first.journal.cursor == cursor
    assert snap(first) == before
    with pytest.raises(StoreError):
        first.close()
    # Reopening recovers what is on disk: the first commit and the intruder's.
    with State.open(path) as again:
        assert again.journal.cursor == 2
        assert again.keys() == ["a", "x"]


def test_a_second_writer_is_refused_at_open(tmp_path: Path, opened: list[State]) -> None:
    path = tmp_path / "s.db"
    first = open_file(path, opened)
    first.set("a", 1)
    with pytest.raises(StoreError, match=r"s\.db.* open for writing by another State") as info:
        State.open(path)
    assert str(os.getpid()) in str(info.value)
    first.set("a", 2)  # the first writer is unaffected
    first.close()
    with State.open(path) as again:  # closed: the file is free again
        assert again.get("a") == 2


def test_a_writer_in_another_process_holds_the_file_until_it_dies(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from slateflow import State; s = State.open(sys.argv[1]); "
            "s.set('a', 1); s.sync(); print('open', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "open\n"
            with pytest.raises(StoreError, match=f"process {holder.pid}"):
                State.open(path)
            assert replay(path)[-1] == "  a  (new) -> 1  v1  user"  # reading is fine
        finally:
            holder.kill()  # SIGKILL: no close, no cleanup
            holder.wait()
    # What the killed writer committed is read from the -wal it left.
    assert replay(path)[-1] == "  a  (new) -> 1  v1  user"
    with State.open(path) as again:  # the lock died with its process
        assert again.get("a") == 1


def test_a_read_only_store_refuses_writes_and_leaves_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with State.open(path) as state:
        state.set("a", 1)
    before = path.read_bytes()
    store = SQLiteStore(path, readonly=True)
    state = State(store=store)
    assert state.get("a") == 1
    with pytest.raises(StoreError, match="read-only"):
        state.set("a", 2)
    assert state.get("a") == 1
    assert state.journal.at(1).get("a") == 1
    state.close()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.db"]  # no -wal or -shm left beside it
    with pytest.raises(StoreError, match="no store at"):
        SQLiteStore(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()


def test_a_failed_sync_write_raises_and_refuses_the_next(
    tmp_path: Path, opened: list[State]
) -> None:
    path = tmp_path / "s.db"
    first = open_file(path, opened, "sync")
    first.set("a", 1)
    with closing(sqlite3.connect(path)) as intruder:
        intrude(intruder)
    # Under sync durability the failure is reported by the write that met it (already applied
    # in memory, as documented), and every later write is refused with nothing applied.
    with pytest.raises(StoreError, match=r"s\.db"):
        first.set("b", 2)
    cursor = first.journal.cursor
    with pytest.raises(StoreError, match=r"s\.db"):
        first.set("c", 3)
    assert first.get("c") is None
    assert first.journal.cursor == cursor
    with pytest.raises(StoreError):
        first.sync()
    with pytest.raises(StoreError):
        first.close()
    with State.open(path) as again:
        assert again.keys() == ["a", "x"]


@pytest.mark.parametrize("value", ["\ud800", 10**5000], ids=["lone-surrogate", "huge-int"])
def test_a_value_the_store_cannot_encode_is_refused_up_front(
    tmp_path: Path, opened: list[State], value: Any
) -> None:
    state = open_file(tmp_path / "s.db", opened, "sync")
    state.set("ok", 1)
    with contextlib.suppress(StateValueError):
        state.set("bad", value)
    state.set("ok", 2)  # the store must still work
    state.sync()
    assert state.get("ok") == 2


@pytest.mark.parametrize("write", ["set", "update"])
def test_an_int_too_long_for_json_is_refused_naming_the_key(
    tmp_path: Path, opened: list[State], write: str
) -> None:
    state = open_file(tmp_path / "s.db", opened)
    state.set("ok", 1)
    before, cursor = snap(state), state.journal.cursor
    refused: Callable[[], object] = (
        (lambda: state.set("huge", 10**5000))
        if write == "set"
        else (lambda: state.update({"ok": 2, "huge": 10**5000}))
    )
    # Refused before the store sees it: no State holds an integer Python cannot print.
    with pytest.raises(StateValueError, match=r"'huge'.*more than 4300 digits"):
        refused()
    assert snap(state) == before
    assert state.journal.cursor == cursor
    state.close()
    assert snap(State.open(tmp_path / "s.db")) == before


def test_a_lone_surrogate_round_trips(tmp_path: Path, opened: list[State]) -> None:
    state = open_file(tmp_path / "s.db", opened)
    state.set("odd", "caf\u00e9 \ud800 \U0001f600")
    state.close()
    assert open_file(tmp_path / "s.db", opened).get("odd") == "caf\u00e9 \ud800 \U0001f600"


# -- bad arguments and foreign files ---------------------------------------------------------


@pytest.mark.parametrize("bad", ["memory", "fast", None])
def test_sqlite_store_refuses_other_durabilities(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(StoreError, match="durability"):
        SQLiteStore(tmp_path / "s.db", durability=bad)
    with pytest.raises(StoreError, match="durability"):
        State.open(tmp_path / "s.db", durability=bad)
    assert not (tmp_path / "s.db").exists()


def test_state_refuses_a_store_that_is_not_one() -> None:
    with pytest.raises(TypeError, match="Store"):
        State(store=object())  # type: ignore[arg-type]


def test_a_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users VALUES (1, 'ann')")
        conn.commit()
    with pytest.raises(StoreCorruptError) as info:
        State.open(path)
    assert str(path) in str(info.value)
    with pytest.raises(StoreCorruptError):
        SQLiteStore(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT name FROM users").fetchall() == [("ann",)]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"users"}  # nothing was created in it


def test_a_foreign_sqlite_file_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
        conn.commit()
    with pytest.raises(StoreCorruptError):
        State.open(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)


def test_a_store_from_a_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with State.open(path) as state:
        state.set("a", 1)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "UPDATE meta SET value = ? WHERE name = 'version'", (str(STORE_FORMAT_VERSION + 1),)
        )
        conn.commit()
    with pytest.raises(StoreCorruptError, match="newer") as info:
        State.open(path)
    assert str(path) in str(info.value)


def test_a_directory_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as info:
        State.open(tmp_path)
    assert str(tmp_path) in str(info.value)


# -- workflow checkpoints --------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def checkpoints(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    store = SQLiteStore(tmp_path / "c.db")
    yield store
    store.close()


def test_checkpoints_round_trip(checkpoints: Any) -> None:
    assert isinstance(checkpoints, CheckpointStore)
    assert checkpoints.load_checkpoint("wf") is None
    checkpoints.save_checkpoint("wf", '{"step": 1, "text": "\u2028\U0001f600"}')
    checkpoints.save_checkpoint("other", "[]")
    assert checkpoints.load_checkpoint("wf") == '{"step": 1, "text": "\u2028\U0001f600"}'
    checkpoints.save_checkpoint("wf", '{"step": 2}')
    assert checkpoints.load_checkpoint("wf") == '{"step": 2}'
    checkpoints.delete_checkpoint("wf")
    assert checkpoints.load_checkpoint("wf") is None
    checkpoints.delete_checkpoint("wf")  # already gone: fine
    checkpoints.delete_checkpoint("never-saved")
    assert checkpoints.load_checkpoint("other") == "[]"


def test_sqlite_checkpoints_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with State.open(path) as state:
        state.set("a", 1)
        store = state.store
        assert isinstance(store, SQLiteStore)
        store.save_checkpoint("wf", '{"done": ["x"]}')
        store.save_checkpoint("gone", "{}")
        store.delete_checkpoint("gone")
    with pytest.raises(StoreClosedError):
        store.load_checkpoint("wf")
    with pytest.raises(StoreClosedError):
        store.save_checkpoint("wf", "{}")
    with State.open(path) as again:
        store = again.store
        assert isinstance(store, SQLiteStore)
        assert store.load_checkpoint("wf") == '{"done": ["x"]}'
        assert store.load_checkpoint("gone") is None
        assert again.get("a") == 1


def test_memory_store_copy_is_a_restart_point() -> None:
    store = MemoryStore()
    state = State(store=store)
    state.set("a", 1)
    store.save_checkpoint("wf", "{}")
    twin = store.copy()
    state.set("a", 2)
    restarted = State(store=twin)
    assert restarted.get("a") == 1
    assert twin.load_checkpoint("wf") == "{}"
    restarted.set("b", 1)
    assert state.get("b") is None


# -- layering (the rest is in test_structure.py) ----------------------------------------------


from test_structure import runtime_imports  # noqa: E402


def test_stores_import_only_errors_extras_and_themselves() -> None:
    for path in sorted((SRC / "stores").glob("*.py")):
        is_package = path.name == "__init__.py"
        module = "slateflow.stores" + ("" if is_package else f".{path.stem}")
        for target in runtime_imports(path.read_text("utf-8"), module, is_package):
            base = target in ("slateflow.errors", "slateflow.extras")  # extras: lazy imports
            assert base or target.startswith("slateflow.stores"), (
                f"{module} imports {target}"
            )
