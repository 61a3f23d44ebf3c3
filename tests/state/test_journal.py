"""The journal: the bounded ring of changes, cursors, sinks (memory and JSON lines) and the
masking of secret values wherever the state is shown."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slateflow import Change, SlateError, State
from slateflow.conversation import end_turn
from slateflow.errors import CursorExpiredError
from slateflow.state import SECRET_MASK, JournalSink, JsonlSink, MemorySink


class BatchSink:
    """A sink keeping each batch it is fed, as a list."""

    def __init__(self) -> None:
        self.batches: list[list[Change]] = []

    def record(self, changes: Sequence[Change]) -> None:
        self.batches.append(list(changes))


class FailingSink:
    def __init__(self) -> None:
        self.calls = 0

    def record(self, changes: Sequence[Change]) -> None:
        self.calls += 1
        raise OSError("disk full")


def seqs(changes: Sequence[Change]) -> list[int]:
    return [m.seq for m in changes]


# -- cursor and journal.since ------------------------------------------------------------------


def test_new_state_has_cursor_zero_and_an_empty_journal() -> None:
    state = State()
    assert state.journal.cursor == 0
    assert state.journal.since(0) == []


def test_cursor_counts_batches_not_changes() -> None:
    state = State()
    state.set("a", 1)
    assert state.journal.cursor == 1
    state.update({"b": 1, "c": 2, "d": 3})
    assert state.journal.cursor == 2
    state.set("a", 1)  # no change
    state.update({"b": 1})  # no change
    assert state.journal.cursor == 2
    assert seqs(state.journal.since(0)) == [1, 2, 2, 2]


def test_journal_since_returns_later_changes_oldest_first() -> None:
    state = State()
    state.set("a", 1)
    cursor = state.journal.cursor
    state.set("b", 2)
    state.update({"c": 3, "a": 4})
    got = state.journal.since(cursor)
    assert [(m.key, m.new, m.seq) for m in got] == [("b", 2, 2), ("c", 3, 3), ("a", 4, 3)]
    assert state.journal.since(state.journal.cursor) == []
    assert state.journal.since(state.journal.cursor + 10) == []


def test_changes_are_the_changes_that_were_delivered() -> None:
    state = State()
    delivered: list[Change] = []
    state.subscribe(delivered.extend)
    state.set("a", 1)
    state.update({"b": 2, "c": 3})
    journal = state.journal.since(0)
    assert len(journal) == len(delivered) == 3
    assert journal == delivered


def test_change_records_old_new_version_and_provenance() -> None:
    state = State(clock=lambda: 1000.0)
    state.set("a", [1], source="agent", writer="w", confidence=1, meta={"why": "test"})
    state.set("a", [1, 2])
    state.remove("a")
    first, second, third = state.journal.since(0)
    assert (first.old, first.new, first.version) == (None, [1], 1)
    assert (second.old, second.new, second.version) == ([1], [1, 2], 2)
    assert (third.old, third.new, third.version, third.removed) == ([1, 2], None, 0, True)
    assert first.provenance.source == "agent"
    assert first.provenance.writer == "w"
    assert first.provenance.confidence == 1.0
    assert first.provenance.meta == {"why": "test"}
    assert second.provenance.source == "user"
    assert first.at == second.at == first.provenance.at
    assert first.at.timestamp() == 1000.0


def test_change_values_are_copies() -> None:
    state = State()
    state.set("a", {"x": [1]})
    (m,) = state.journal.since(0)
    m.new["x"].append(2)
    assert state.journal.since(0)[0].new == {"x": [1]}
    assert state.get("a") == {"x": [1]}


def test_every_origin_is_recorded() -> None:
    state = State()
    state.set("a", 1)
    state.modify("a", 0, lambda v: v + 1)
    state.update({"b": 1, "turn:x": 1, "temp:y": 1, "p:1": 1, "p:2": 2})
    with state.transaction() as tx:
        tx.set("c", 1)
    state.rename("c", "d")
    state.remove("a")
    state.clear_prefix("p:")
    end_turn(state)
    got = [(m.origin, m.key) for m in state.journal.since(0)]
    assert got == [
        ("set", "a"),
        ("modify", "a"),
        ("update", "b"),
        ("update", "turn:x"),
        ("update", "temp:y"),
        ("update", "p:1"),
        ("update", "p:2"),
        ("commit", "c"),
        ("rename", "c"),
        ("rename", "d"),
        ("remove", "a"),
        ("clear_prefix", "p:1"),
        ("clear_prefix", "p:2"),
        ("clear_prefix", "turn:x"),
        ("clear_prefix", "temp:y"),
    ]
    rename_old, rename_new = state.journal.since(0)[8:10]
    assert rename_old.removed
    assert rename_old.seq == rename_new.seq
    assert rename_new.new == 1


def test_failed_write_leaves_no_record() -> None:
    state = State()
    state.set("a", 1)
    with pytest.raises(SlateError):
        state.set("a", 2, expected_version=5)
    with pytest.raises(SlateError):
        state.update({"b": 1, "c": float("nan")})
    assert state.journal.cursor == 1
    assert len(state.journal.since(0)) == 1


# -- the ring ------------------------------------------------------------------------------------


def test_default_ring_keeps_1024_records() -> None:
    state = State()
    for i in range(1024):
        state.set("k", i)
    assert len(state.journal.since(0)) == 1024
    state.set("k", "one more")
    with pytest.raises(CursorExpiredError):
        state.journal.since(0)
    got = state.journal.since(1)
    assert len(got) == 1024
    assert got[0].seq == 2
    assert got[-1].new == "one more"


def test_expired_cursor_raises_with_a_helpful_message() -> None:
    state = State(journal_size=3)
    for i in range(5):
        state.set("k", i)
    assert seqs(state.journal.since(2)) == [3, 4, 5]
    with pytest.raises(CursorExpiredError, match="cursor 1") as info:
        state.journal.since(1)
    assert "journal_size" in str(info.value)
    assert isinstance(info.value, SlateError)
    with pytest.raises(CursorExpiredError):
        state.journal.since(0)


def test_partly_overwritten_batch_expires_the_cursor_before_it() -> None:
    state = State(journal_size=3)
    state.set("a", 1)  # seq 1
    state.update({"b": 1, "c": 1})  # seq 2: two records
    assert seqs(state.journal.since(0)) == [1, 2, 2]
    state.update({"d": 1, "e": 1})  # seq 3 pushes out seq 1 and half of seq 2
    assert seqs(state.journal.since(2)) == [3, 3]
    with pytest.raises(CursorExpiredError):
        state.journal.since(1)  # would have to return all of seq 2, but 'b' is gone
    with pytest.raises(CursorExpiredError):
        state.journal.since(0)


def test_single_writes_partly_overwriting_a_batch_expire_the_cursor() -> None:
    state = State(journal_size=3)
    state.update({"a": 1, "b": 1})  # seq 1
    state.set("c", 1)  # seq 2
    assert seqs(state.journal.since(0)) == [1, 1, 2]
    state.set("d", 1)  # seq 3 drops seq 1's first record only
    with pytest.raises(CursorExpiredError):
        state.journal.since(0)
    assert [m.key for m in state.journal.since(1)] == ["c", "d"]


def test_batch_larger_than_the_ring() -> None:
    state = State(journal_size=2)
    state.set("a", 1)  # seq 1
    state.update({f"k{i}": i for i in range(5)})  # seq 2, five records
    with pytest.raises(CursorExpiredError):
        state.journal.since(1)
    assert state.journal.since(2) == []
    state.set("a", 2)
    assert [m.key for m in state.journal.since(2)] == ["a"]


def test_journal_size_zero_keeps_nothing() -> None:
    state = State(journal_size=0)
    assert state.journal.since(0) == []
    state.set("a", 1)
    state.update({"b": 1, "c": 1})
    assert state.journal.cursor == 2
    assert state.get("a") == 1
    with pytest.raises(CursorExpiredError):
        state.journal.since(0)
    with pytest.raises(CursorExpiredError):
        state.journal.since(1)
    assert state.journal.since(2) == []


def test_journal_size_zero_still_feeds_sinks_and_subscribers() -> None:
    sink = MemorySink()
    got: list[Change] = []
    state = State(journal_size=0, sinks=[sink])
    state.subscribe(got.extend)
    state.set("a", 1)
    state.update({"b": 1, "c": 1})
    assert [m.key for m in sink.changes] == ["a", "b", "c"]
    assert [c.key for c in got] == ["a", "b", "c"]


@pytest.mark.parametrize("size", [-1, 1.5, "10", None])
def test_bad_journal_size_is_refused(size: Any) -> None:
    with pytest.raises(ValueError, match="journal_size"):
        State(journal_size=size)


def test_reading_often_never_expires() -> None:
    state = State(journal_size=4)
    cursor = state.journal.cursor
    seen: list[int] = []
    for i in range(50):
        state.update({"a": i, "b": i})
        got = state.journal.since(cursor)
        seen.extend(m.new for m in got)
        cursor = got[-1].seq
    assert cursor == state.journal.cursor == 50
    assert seen == [i for i in range(50) for _ in range(2)]


# -- sinks ---------------------------------------------------------------------------------------


def test_sinks_are_journal_sinks() -> None:
    assert isinstance(MemorySink(), JournalSink)
    assert isinstance(BatchSink(), JournalSink)
    assert not isinstance(object(), JournalSink)


def test_sink_receives_each_batch_in_commit_order() -> None:
    sink = BatchSink()
    state = State(sinks=[sink])
    state.set("a", 1)
    state.set("a", 1)  # no change: nothing recorded
    state.update({"b": 1, "c": 2})
    state.remove("a")
    assert [[(m.key, m.seq) for m in batch] for batch in sink.batches] == [
        [("a", 1)],
        [("b", 2), ("c", 2)],
        [("a", 3)],
    ]


def test_sink_sees_the_same_records_as_the_ring() -> None:
    sink = MemorySink()
    state = State(sinks=[sink], journal_size=2)
    for i in range(10):
        state.set("k", i)
    assert [m.new for m in sink.changes] == list(range(10))
    assert sink.changes[-2:] == state.journal.since(8)


def test_add_sink_and_remove_sink() -> None:
    state = State()
    state.set("before", 1)
    sink = MemorySink()
    state.journal.add_sink(sink)
    state.set("during", 1)
    state.journal.remove_sink(sink)
    state.journal.remove_sink(sink)  # removing twice is harmless
    state.set("after", 1)
    assert [m.key for m in sink.changes] == ["during"]


def test_add_sink_refuses_non_sinks() -> None:
    state = State()
    with pytest.raises(TypeError, match="record"):
        state.journal.add_sink(object())  # type: ignore[arg-type]


def test_several_sinks_each_get_everything() -> None:
    first, second = MemorySink(), MemorySink()
    state = State(sinks=[first])
    state.journal.add_sink(second)
    state.update({"a": 1, "b": 2})
    assert [m.key for m in first.changes] == [m.key for m in second.changes] == ["a", "b"]


def test_failing_sink_never_fails_the_write(caplog: pytest.LogCaptureFixture) -> None:
    bad, good = FailingSink(), MemorySink()
    state = State(sinks=[bad, good])
    failures: list[dict[str, Any]] = []

    def on_failure(sender: Any, **kwargs: Any) -> None:
        failures.append({"sender": sender, **kwargs})

    state.receiver_failed.connect(on_failure)
    delivered: list[Change] = []
    state.subscribe(delivered.extend)

    with caplog.at_level(logging.ERROR, logger="slateflow.state"):
        assert state.set("a", 1) == 1
        state.update({"b": 1, "c": 1})

    assert state.pick("a", "b", "c") == {"a": 1, "b": 1, "c": 1}
    assert [m.key for m in good.changes] == ["a", "b", "c"]
    assert [c.key for c in delivered] == ["a", "b", "c"]
    assert len(state.journal.since(0)) == 3
    assert bad.calls == 2
    assert [f["receiver"] for f in failures] == [bad, bad]
    assert all(f["sender"] is state for f in failures)
    assert all(isinstance(f["error"], OSError) for f in failures)
    assert [[c.key for c in f["changes"]] for f in failures] == [["a"], ["b", "c"]]
    assert len([r for r in caplog.records if r.name == "slateflow.state"]) == 2


def test_failing_sink_on_every_write_path() -> None:
    bad = FailingSink()
    state = State(sinks=[bad])
    state.set("a", 1)
    state.modify("a", 0, lambda v: v + 1)
    state.rename("a", "b")
    state.remove("b")
    with state.transaction() as tx:
        tx.set("c", 1)
    state.clear_prefix("c")
    assert bad.calls == 6
    assert state.journal.cursor == 6
    assert len(state) == 0


# -- JsonlSink -----------------------------------------------------------------------------------


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_jsonl_sink_writes_one_line_per_change(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with JsonlSink(path) as sink:
        state = State(sinks=[sink], clock=lambda: 1000.0)
        state.set("a", {"x": [1, "é"]}, source="agent", writer="w")
        state.update({"b": 1, "c": None})
        state.remove("a")
    lines = read_lines(path)
    assert len(path.read_text(encoding="utf-8").splitlines()) == 4
    assert [(d["seq"], d["key"], d["origin"]) for d in lines] == [
        (1, "a", "set"),
        (2, "b", "update"),
        (2, "c", "update"),
        (3, "a", "remove"),
    ]
    first = lines[0]
    assert first["old"] is None
    assert first["new"] == {"x": [1, "é"]}
    assert first["version"] == 1
    assert first["removed"] is False
    assert first["provenance"]["source"] == "agent"
    assert first["provenance"]["writer"] == "w"
    assert first["provenance"]["at"].startswith("1970-01-01T00:16:40")
    assert lines[3]["removed"] is True
    assert lines[3]["old"] == {"x": [1, "é"]}
    assert lines[3]["new"] is None
    assert lines[3]["version"] == 0


def test_jsonl_sink_masks_secrets_by_default(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    state = State()
    state.policy("user:card", secret=True)
    with JsonlSink(path) as sink:
        state.journal.add_sink(sink)
        state.set("user:card", "4111111111111111")
        state.set("user:card", "5500000000000004")
        state.set("user:name", "Ada")
        state.remove("user:card")
    text = path.read_text(encoding="utf-8")
    # The whole numbers: a timestamp may hold "4111" (18:41:51.534111Z).
    assert "4111111111111111" not in text
    assert "5500000000000004" not in text
    lines = read_lines(path)
    assert [(d["old"], d["new"]) for d in lines] == [
        (None, SECRET_MASK),
        (SECRET_MASK, SECRET_MASK),
        (None, "Ada"),
        (SECRET_MASK, None),
    ]


def test_jsonl_sink_redact_false_keeps_secret_values(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    state = State()
    state.policy("user:*", secret=True)
    with JsonlSink(path, redact=False) as sink:
        state.journal.add_sink(sink)
        state.set("user:card", "4111111111111111")
    assert read_lines(path)[0]["new"] == "4111111111111111"


def test_jsonl_sink_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    state = State()
    with JsonlSink(path) as sink:
        state.journal.add_sink(sink)
        state.set("a", 1)
        state.journal.remove_sink(sink)
    with JsonlSink(path) as sink:
        state.journal.add_sink(sink)
        state.set("a", 2)
    assert [d["new"] for d in read_lines(path)] == [1, 2]


def test_jsonl_sink_lines_are_flushed_at_each_batch(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with JsonlSink(path) as sink:
        state = State(sinks=[sink])
        state.set("a", 1)
        assert [d["key"] for d in read_lines(path)] == ["a"]


def test_closed_jsonl_sink_fails_softly(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    sink = JsonlSink(path)
    state = State(sinks=[sink])
    failures: list[Any] = []

    def on_failure(sender: Any, **kwargs: Any) -> None:
        failures.append(kwargs["receiver"])

    state.receiver_failed.connect(on_failure)
    state.set("a", 1)
    sink.close()
    sink.close()  # idempotent
    assert state.set("a", 2) == 2
    assert state.get("a") == 2
    assert failures == [sink]
    assert [d["new"] for d in read_lines(path)] == [1]


def test_to_dict_masks_secrets_unless_asked() -> None:
    state = State()
    state.policy("pin", secret=True)
    state.set("pin", 1234)
    (m,) = state.journal.since(0)
    assert m.to_dict()["new"] == SECRET_MASK
    assert m.to_dict(redact=False)["new"] == 1234
    assert m.secret is True


# -- secret masking ------------------------------------------------------------------------------

SECRET = "4111111111111111"


@pytest.fixture
def secret_state() -> State:
    state = State()
    state.policy("user:card", secret=True)
    state.set("user:card", SECRET, source="user", writer="caller")
    state.set("user:name", "Ada")
    return state


def test_secret_value_is_still_readable(secret_state: State) -> None:
    assert secret_state.get("user:card") == SECRET
    assert secret_state.is_secret("user:card")
    assert not secret_state.is_secret("user:name")


def test_change_repr_masks_secrets(secret_state: State) -> None:
    delivered: list[Change] = []
    secret_state.subscribe(delivered.extend)
    secret_state.set("user:card", "5500000000000004")
    secret_state.remove("user:card")
    records = [*secret_state.journal.since(0), *delivered]
    text = repr(records) + str(records)
    assert SECRET not in text
    assert "5500000000000004" not in text
    assert SECRET_MASK in text
    assert "'user:card'" in text
    assert "'Ada'" in text  # other values are shown


def test_entry_repr_masks_secrets(secret_state: State) -> None:
    entry = secret_state.entry("user:card")
    assert entry is not None
    assert entry.value == SECRET  # the data itself is not masked
    assert entry.secret is True
    assert SECRET not in repr(entry)
    assert SECRET not in str(entry)
    assert SECRET_MASK in repr(entry)
    name = secret_state.entry("user:name")
    assert name is not None
    assert "'Ada'" in repr(name)


def test_describe_masks_secrets(secret_state: State) -> None:
    text = secret_state.describe()
    assert SECRET not in text
    assert f"user:card = {SECRET_MASK}" in text
    assert "user:name = 'Ada'" in text
    assert SECRET not in secret_state.describe("user:", provenance=False)


def test_secret_pattern_masks_nested_values() -> None:
    state = State()
    state.policy("payment:*", secret=True)
    state.set("payment:card", {"number": SECRET, "exp": "12/30"})
    text = state.describe() + repr(state.journal.since(0)) + repr(state.entry("payment:card"))
    assert SECRET not in text
    assert "12/30" not in text


def test_failing_receiver_log_does_not_show_secret(
    secret_state: State, caplog: pytest.LogCaptureFixture
) -> None:
    def bad(changes: tuple[Change, ...]) -> None:
        raise ValueError("receiver failed")

    secret_state.subscribe(bad)
    with caplog.at_level(logging.ERROR, logger="slateflow.state"):
        secret_state.set("user:card", "5500000000000004")
    assert caplog.records
    assert "5500000000000004" not in caplog.text
    assert "user:card" in caplog.text
