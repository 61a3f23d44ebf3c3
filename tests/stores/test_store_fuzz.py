"""The store loader fails closed: a damaged, edited, truncated or foreign file raises a typed
:class:`StoreCorruptError` (never another exception, never a half-loaded state)."""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slateflow import State
from slateflow.errors import StoreCorruptError, StoreError
from slateflow.stores.records import (
    decode_changes,
    decode_entries,
    encode_changes,
    encode_entries,
)
from slateflow.stores.sqlite import STORE_FORMAT_VERSION

# Each example writes its own uniquely named file, so sharing tmp_path between examples is fine.
fuzz = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def as_json(value: Any) -> str:
    return json.dumps(value, allow_nan=False, sort_keys=True)


def snap(state: State) -> str:
    return as_json(state.snapshot())


# -- the original store ----------------------------------------------------------------------

HEAD = 10


def _write_history(state: State) -> dict[int, str]:
    seen = {0: snap(state)}

    def mark() -> None:
        seen[state.journal.cursor] = snap(state)

    state.set("a", 1)  # 1
    mark()
    state.set("a", 2, source="llm", confidence=0.5)  # 2
    mark()
    state.update({"b": [1, -0.0, 1e300], "c": "\u2028 \U0001f600"})  # 3
    mark()
    state.remove("b")  # 4
    mark()
    state.rename("c", "d", writer="mover")  # 5
    mark()
    state.set("e", {"x": None, "long": "y" * 300}, meta={"m": 1})  # 6
    mark()
    for i in range(7, HEAD + 1):  # 7..10: "a" at versions 3..6
        state.set("a", i, writer=f"w{i}")
        mark()
    assert state.journal.cursor == HEAD
    return seen


@functools.cache
def original(compacted: bool = False) -> tuple[bytes, dict[int, str]]:
    """A closed store file's bytes, and the snapshot right after each commit."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "orig.db"
        state = State.open(path)
        try:
            seen = _write_history(state)
            if compacted:
                state.journal.compact()
                state.set("f", "after")
                seen[state.journal.cursor] = snap(state)
            state.store.save_checkpoint("wf", '{"x": 1}')  # type: ignore[union-attr]
        finally:
            state.close()
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["orig.db"]  # no -wal/-shm
        return path.read_bytes(), seen


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    data, _ = original()
    path = tmp_path / "damaged.db"
    path.write_bytes(data)
    return path


@pytest.fixture
def compacted_file(tmp_path: Path) -> Path:
    data, _ = original(compacted=True)
    path = tmp_path / "damaged.db"
    path.write_bytes(data)
    return path


def fresh(directory: Path, data: bytes) -> Path:
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".db", delete=False) as f:
        f.write(data)
    return Path(f.name)


def opens_as_a_prefix_or_fails_closed(path: Path, seen: dict[int, str]) -> State | None:
    """Open ``path``: either a StoreError (a StoreCorruptError for a damaged file) or a state
    equal to the original as of some commit (never another exception)."""
    try:
        state = State.open(path)
    except StoreCorruptError:
        return None
    try:
        assert state.journal.cursor in seen
        assert snap(state) == seen[state.journal.cursor]
    finally:
        state.close()
    return state


def opens_consistently_or_fails_closed(path: Path) -> None:
    """For damage SQLite cannot detect (bytes changed inside a value), the file may load with
    other values; it must still be a working state or a StoreCorruptError."""
    try:
        state = State.open(path)
    except StoreCorruptError:
        return
    try:
        as_json(state.snapshot())
        assert state.journal.cursor >= 0
        state.journal.since(state.journal.cursor)
        state.keys()
    finally:
        state.close()


# -- the original itself ---------------------------------------------------------------------


def test_the_original_recovers(store_file: Path) -> None:
    _, seen = original()
    with State.open(store_file) as state:
        assert state.journal.cursor == HEAD
        assert snap(state) == seen[HEAD]
        for seq, expected in seen.items():
            assert snap(state.journal.at(seq)) == expected


def test_a_copied_main_file_alone_recovers_everything(tmp_path: Path) -> None:
    """After close() the WAL is checkpointed: the main file is the whole store (this is how a
    user moves one)."""
    source = tmp_path / "a" / "s.db"
    source.parent.mkdir()
    with State.open(source, durability="sync") as state:
        seen = _write_history(state)
    for sidecar in ("-wal", "-shm", "-journal"):
        Path(f"{source}{sidecar}").unlink(missing_ok=True)
    moved = tmp_path / "b" / "moved.db"
    moved.parent.mkdir()
    shutil.copyfile(source, moved)
    with State.open(moved) as again:
        assert again.journal.cursor == HEAD
        assert snap(again) == seen[HEAD]


# -- whole-file damage -----------------------------------------------------------------------


def test_an_empty_file_is_a_new_empty_store(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    with State.open(path) as state:
        assert state.journal.cursor == 0
        assert state.snapshot()["entries"] == {}
        state.set("a", 1)
    with State.open(path) as again:
        assert again.get("a") == 1
        assert again.journal.cursor == 1


@pytest.mark.parametrize(
    "offset", [1, 15, 16, 50, 99, 100, 101, 1024, 4095, 4096, 4097, 8191, 8192, 12288, 16384]
)
def test_truncated_at_known_offsets(tmp_path: Path, offset: int) -> None:
    data, seen = original()
    opens_as_a_prefix_or_fails_closed(fresh(tmp_path, data[:offset]), seen)


@fuzz
@given(cut=st.floats(min_value=0, max_value=1, exclude_max=True))
def test_truncated_anywhere(tmp_path: Path, cut: float) -> None:
    data, seen = original()
    opens_as_a_prefix_or_fails_closed(fresh(tmp_path, data[: int(cut * len(data))]), seen)


@fuzz
@given(cut=st.floats(min_value=0, max_value=1, exclude_max=True))
def test_truncated_compacted_store(tmp_path: Path, cut: float) -> None:
    data, seen = original(compacted=True)
    opens_as_a_prefix_or_fails_closed(fresh(tmp_path, data[: int(cut * len(data))]), seen)


@fuzz
@given(
    start=st.floats(min_value=0, max_value=1, exclude_max=True),
    garbage=st.binary(min_size=1, max_size=600),
)
def test_garbage_over_a_range(tmp_path: Path, start: float, garbage: bytes) -> None:
    data, _ = original()
    at = int(start * len(data))
    damaged = data[:at] + garbage + data[at + len(garbage) :]
    opens_consistently_or_fails_closed(fresh(tmp_path, damaged[: len(data)]))


@fuzz
@given(data=st.binary(min_size=2, max_size=10_000))
def test_a_random_bytes_file(tmp_path: Path, data: bytes) -> None:
    path = fresh(tmp_path, data)
    with pytest.raises(StoreError) as info:
        State.open(path)
    assert isinstance(info.value, StoreCorruptError)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", [b"x", b"\x00", b"\n"])
def test_a_one_byte_file_is_not_overwritten(tmp_path: Path, content: bytes) -> None:
    path = fresh(tmp_path, content)
    try:
        with pytest.raises(StoreCorruptError):
            State.open(path)
    finally:
        assert path.read_bytes() == content


@fuzz
@given(rest=st.binary(min_size=0, max_size=5000))
def test_a_sqlite_header_then_garbage(tmp_path: Path, rest: bytes) -> None:
    data, _ = original()
    opens_consistently_or_fails_closed(fresh(tmp_path, data[:100] + rest))


# -- records edited through sqlite3 ----------------------------------------------------------


def edit(path: Path, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    with closing(sqlite3.connect(path)) as conn:
        for statement in statements:
            if isinstance(statement, tuple):
                conn.execute(*statement)
            else:
                conn.executescript(statement)
        conn.commit()


def changes_of(seq: int, text: str) -> tuple[str, tuple[Any, ...]]:
    return ("UPDATE commits SET changes = ? WHERE seq = ?", (text, seq))


A7 = '[["a",7,3,"user","w7",null,null]]'  # the untouched changes of commit 7


def a7(**edits: Any) -> str:
    row: list[Any] = json.loads(A7)[0]
    for index, value in edits.items():
        row[int(index[1:])] = value
    return json.dumps([row])


# The SQL that damages a store file (statements, or (statement, args) pairs), by what it does.
CORRUPTIONS: dict[str, list[Any]] = {
    "garbage JSON": [changes_of(5, "not json at all")],
    "truncated JSON": [changes_of(7, A7[: len(A7) // 2])],
    "empty text": [changes_of(7, "")],
    "empty array": [changes_of(7, "[]")],
    "object": [changes_of(7, '{"a": 1}')],
    "null": [changes_of(7, "null")],
    "a number": [changes_of(7, "5")],
    "six items": [changes_of(7, '[["a",7,3,"user",null,null]]')],
    "eight items": [changes_of(7, '[["a",7,3,"user",null,null,null,1]]')],
    "a change that is an object": [changes_of(7, '[{"key": "a"}]')],
    "int key": [changes_of(7, a7(i0=1))],
    "empty key": [changes_of(7, a7(i0=""))],
    "str version": [changes_of(7, a7(i2="3"))],
    "negative version": [changes_of(7, a7(i2=-1))],
    "float version": [changes_of(7, a7(i2=3.0))],
    "bool version": [changes_of(7, a7(i2=True))],
    "empty source": [changes_of(7, a7(i3=""))],
    "null source": [changes_of(7, a7(i3=None))],
    "int source": [changes_of(7, a7(i3=5))],
    "empty writer": [changes_of(7, a7(i4=""))],
    "list writer": [changes_of(7, a7(i4=["w"]))],
    "confidence above 1": [changes_of(7, a7(i5=2))],
    "negative confidence": [changes_of(7, a7(i5=-0.1))],
    "bool confidence": [changes_of(7, a7(i5=True))],
    "str confidence": [changes_of(7, a7(i5="0.5"))],
    "list meta": [changes_of(7, a7(i6=[]))],
    "str meta": [changes_of(7, a7(i6="m"))],
    "NaN token": [changes_of(7, '[["a",NaN,3,"user",null,null,null]]')],
    "Infinity token": [changes_of(7, '[["a",Infinity,3,"user",null,null,null]]')],
    "-Infinity confidence": [changes_of(7, '[["a",1,3,"user",null,-Infinity,null]]')],
    "deep nesting": [changes_of(7, "[" * 100_000 + "]" * 100_000)],
    "changes as a blob": ["UPDATE commits SET changes = X'5b5d' WHERE seq = 7"],
    "at_ns as text": ["UPDATE commits SET at_ns = 'noon' WHERE seq = 7"],
    "at_ns as real": ["UPDATE commits SET at_ns = 1.5 WHERE seq = 7"],
    "origin as a blob": ["UPDATE commits SET origin = X'00' WHERE seq = 7"],
    "version jump": [changes_of(7, a7(i2=5))],
    "version restart": [changes_of(7, a7(i2=1))],
    "new key at version 2": [changes_of(6, '[["e",1,2,"user",null,null,null]]')],
    "removing a key never set": [changes_of(7, '[["zzz",null,0,"user",null,null,null]]')],
    "missing seq in the middle": ["DELETE FROM commits WHERE seq = 5"],
    "missing first seq": ["DELETE FROM commits WHERE seq = 1"],
    "a gap after the head": [
        (
            "INSERT INTO commits (seq, at_ns, origin, changes) VALUES (12, 1, 'set', ?)",
            (A7.replace(",3,", ",7,"),),
        )
    ],
    "no format row": ["DELETE FROM meta WHERE name = 'format'"],
    "no version row": ["DELETE FROM meta WHERE name = 'version'"],
    "no meta table": ["DROP TABLE meta"],
    "another format": ["UPDATE meta SET value = 'other.store' WHERE name = 'format'"],
    "future version": [
        ("UPDATE meta SET value = ? WHERE name = 'version'", (str(STORE_FORMAT_VERSION + 1),))
    ],
    "unreadable version": ["UPDATE meta SET value = 'one' WHERE name = 'version'"],
    "no commits table": ["DROP TABLE commits"],
    "no base table": ["DROP TABLE base"],
    "no checkpoints table": ["DROP TABLE checkpoints"],
    "commits without a changes column": [
        "DROP TABLE commits; CREATE TABLE commits (seq INTEGER PRIMARY KEY, at_ns INTEGER, "
        "origin TEXT); INSERT INTO commits VALUES (1, 1, 'set');"
    ],
    "base seq as text": ["INSERT INTO base (id, seq, entries) VALUES (1, 'x', '[]')"],
    "negative base seq": ["INSERT INTO base (id, seq, entries) VALUES (1, -1, '[]')"],
    "base entries garbage": ["INSERT INTO base (id, seq, entries) VALUES (1, 3, '[[')"],
    "base entries not an array": ["INSERT INTO base (id, seq, entries) VALUES (1, 3, '{}')"],
    "base entry after its base": [
        (
            "INSERT INTO base (id, seq, entries) VALUES (1, 3, ?)",
            ('[["a",2,2,9,1,"user",null,null,null]]',),
        )
    ],
    "base entry with version 0": [
        (
            "INSERT INTO base (id, seq, entries) VALUES (1, 3, ?)",
            ('[["a",2,0,2,1,"user",null,null,null]]',),
        )
    ],
    "base that disagrees with the commits": [
        "INSERT INTO base (id, seq, entries) VALUES (1, 3, '[]')"
    ],
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_an_edited_record_fails_closed(store_file: Path, name: str) -> None:
    edit(store_file, *CORRUPTIONS[name])
    with pytest.raises(StoreCorruptError):
        State.open(store_file)
    with pytest.raises(StoreCorruptError):
        State.open(store_file, durability="sync")


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_an_edited_record_error_names_the_file(store_file: Path, name: str) -> None:
    edit(store_file, *CORRUPTIONS[name])
    with pytest.raises(StoreCorruptError) as info:
        State.open(store_file)
    assert str(store_file) in str(info.value)


def test_a_null_version_fails_closed(store_file: Path) -> None:
    edit(
        store_file,
        "DROP TABLE meta; CREATE TABLE meta (name TEXT PRIMARY KEY, value);"
        "INSERT INTO meta VALUES ('format', 'slateflow.store'), ('version', NULL);",
    )
    with pytest.raises(StoreCorruptError):
        State.open(store_file)


@pytest.mark.parametrize("number", ["1e999", "-1e999"])
def test_an_infinite_number_fails_closed(store_file: Path, number: str) -> None:
    edit(store_file, changes_of(7, f'[["a",{number},3,"user","w7",null,null]]'))
    with pytest.raises(StoreCorruptError):
        State.open(store_file)


@pytest.mark.parametrize("key", ["a b", "a*", "a::b", "tab\there"])
def test_an_invalid_key_fails_closed(store_file: Path, key: str) -> None:
    rows = [*json.loads(A7), [key, 7, 1, "user", None, None, None]]
    edit(store_file, changes_of(7, json.dumps(rows)))
    with pytest.raises(StoreCorruptError):
        State.open(store_file)


def test_an_edited_compacted_store_fails_closed(compacted_file: Path) -> None:
    _, seen = original(compacted=True)
    with State.open(compacted_file) as state:
        assert snap(state) == seen[HEAD + 1]
        with pytest.raises(StoreError):
            state.journal.at(HEAD - 1)
    edit(compacted_file, "UPDATE base SET entries = '[[\"a\"]]'")
    with pytest.raises(StoreCorruptError):
        State.open(compacted_file)


def test_an_edit_that_keeps_the_records_valid_loads(store_file: Path) -> None:
    """A damaged file that is still a valid history (the newest commit deleted) loads as that
    shorter history: the check is not so strict that it refuses a store it can read."""
    _, seen = original()
    edit(store_file, "DELETE FROM commits WHERE seq = 10")
    with State.open(store_file) as state:
        assert state.journal.cursor == HEAD - 1
        assert snap(state) == seen[HEAD - 1]


@fuzz
@given(
    text=st.text(max_size=80)
    | st.sampled_from([A7, A7[:-1], A7 + "]", A7.replace("3", "4"), A7.replace('"a"', '"b"')])
)
def test_any_changes_text_loads_or_fails_closed(tmp_path: Path, text: str) -> None:
    data, _ = original()
    path = fresh(tmp_path, data)
    edit(path, changes_of(7, text))
    opens_consistently_or_fails_closed(path)


# -- the record decoders ---------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=12)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.sampled_from(["user", "a", ""])
)
json_data = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=10) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=20,
)
# Rows of about the right shape reach the deeper checks.
change_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b:c", "", 1]),
        json_data,
        st.sampled_from([0, 1, 2, -1, "1", 1.5, True]),
        st.sampled_from(["user", "", None, 3]),
        st.sampled_from([None, "w", "", 2]),
        st.sampled_from([None, 0, 1, 0.5, 1.5, -0.5, True, "x"]),
        st.sampled_from([None, {}, {"m": [1]}, [], "m"]),
    ).map(list),
    max_size=3,
)
entry_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b:c", "", None]),
        json_data,
        st.sampled_from([0, 1, 2, -1, "1", True]),
        st.sampled_from([0, 1, 5, 50, -1, 2.0]),
        st.sampled_from([0, 1, 10**18, -1, "t"]),
        st.sampled_from(["user", "", None]),
        st.sampled_from([None, "w", ""]),
        st.sampled_from([None, 0, 1, 0.5, 2, False]),
        st.sampled_from([None, {}, {"m": 1}, [1]]),
    ).map(list),
    max_size=3,
)
texts = (
    st.text(max_size=60)
    | json_data.map(json.dumps)
    | change_rows.map(json.dumps)
    | entry_rows.map(json.dumps)
    | change_rows.map(lambda r: json.dumps(r)[: len(json.dumps(r)) // 2])
)
anything = texts | st.binary(max_size=20) | json_data | st.builds(object)


@settings(max_examples=300, deadline=None)
@given(text=anything, seq=st.integers(min_value=0, max_value=20))
def test_decode_changes_raises_only_store_corrupt_error(text: Any, seq: int) -> None:
    try:
        rows = decode_changes(text, seq)
    except StoreCorruptError as exc:
        error = str(exc)
    else:
        error = ""
        assert type(rows) is tuple
        assert rows
        for row in rows:
            assert type(row) is tuple
            assert len(row) == 7
            assert type(row[0]) is str
            assert row[0]
            assert type(row[2]) is int
            assert row[2] >= 0
        assert decode_changes(encode_changes(rows), seq) == rows
    assert not error or f"commit {seq}" in error


@settings(max_examples=300, deadline=None)
@given(text=anything, seq=st.integers(min_value=0, max_value=20))
def test_decode_entries_raises_only_store_corrupt_error(text: Any, seq: int) -> None:
    try:
        rows = decode_entries(text, seq)
    except StoreCorruptError as exc:
        error = str(exc)
    else:
        error = ""
        assert type(rows) is list
        for row in rows:
            assert type(row) is tuple
            assert len(row) == 9
            assert type(row[0]) is str
            assert row[0]
            assert type(row[2]) is int
            assert row[2] >= 1
            assert type(row[3]) is int
            assert 1 <= row[3] <= seq
        assert decode_entries(encode_entries(rows), seq) == rows
    assert not error or f"seq {seq}" in error


def test_decoders_refuse_constants_and_deep_nesting() -> None:
    deep = "[" * 50_000
    for text in ("NaN", "[NaN]", "Infinity", "-Infinity", deep, deep + "]" * 50_000):
        with pytest.raises(StoreCorruptError):
            decode_changes(text, 1)
        with pytest.raises(StoreCorruptError):
            decode_entries(text, 1)
    with pytest.raises(StoreCorruptError):
        decode_changes(b'[["a",1,1,"user",null,null,null]]', 1)
    with pytest.raises(StoreCorruptError):
        decode_changes("1" * 5000, 1)  # over Python's int digit limit


@settings(max_examples=60, deadline=None)
@given(rows=change_rows.filter(bool))
def test_what_encode_changes_writes_decodes_back(rows: list[list[Any]]) -> None:
    text = json.dumps(rows)
    try:
        decoded = decode_changes(text, 1)
    except StoreCorruptError:
        return
    # ASCII JSON: a lone surrogate or a control character is written as its \\u escape.
    assert encode_changes(decoded) == json.dumps(rows, separators=(",", ":"))
