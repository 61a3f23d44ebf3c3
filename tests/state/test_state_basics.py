"""The core State API: reads, writes, versions, batches, scopes, provenance and concurrency."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import slateflow
import slateflow.state
from helpers import run_threads
from slateflow import Change, State
from slateflow.conversation import end_turn
from slateflow.errors import KeyExistsError, MissingKeyError, ReadOnlyError, VersionConflictError
from slateflow.state import SCOPES, Entry, Provenance, ReadOnlyView, ScopedView

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
T0_DT = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


class Recorder:
    """A subscriber that keeps every batch it receives."""

    def __init__(self, state: State, **kwargs: Any) -> None:
        self.batches: list[tuple[Change, ...]] = []
        state.subscribe(self.batches.append, **kwargs)

    @property
    def keys(self) -> list[list[str]]:
        return [[c.key for c in batch] for batch in self.batches]


@pytest.fixture
def state() -> State:
    return State()


# -- reads -----------------------------------------------------------------------------------


def test_new_state_is_empty(state: State) -> None:
    assert len(state) == 0
    assert state.keys() == []
    assert state.items() == []
    assert state.journal.cursor == 0
    assert state.journal.since(0) == []


def test_get_returns_default_for_absent_keys(state: State) -> None:
    assert state.get("a") is None
    assert state.get("a", 7) == 7
    state.set("a", None)
    assert state.get("a", 7) is None  # a stored None is a value, not "absent"


def test_require_returns_the_value_or_raises_missing_key(state: State) -> None:
    state.set("a", 0)
    assert state["a"] == 0
    with pytest.raises(MissingKeyError) as info:
        state["booking:date"]
    assert "'booking:date'" in str(info.value)
    assert isinstance(info.value, KeyError)


def test_contains_len_and_in(state: State) -> None:
    assert "a" not in state
    assert "a" not in state
    state.set("a", 1)
    state.set("b", None)
    assert "a" in state
    assert "b" in state
    assert len(state) == 2
    state.remove("a")
    assert "a" not in state
    assert len(state) == 1


# -- private copies ----------------------------------------------------------------------


def test_mutating_what_you_wrote_does_not_change_the_state(state: State) -> None:
    value = {"list": [1, 2], "dict": {"x": 1}}
    state.set("k", value)
    value["list"].append(3)
    value["dict"]["y"] = 2
    value["new"] = True
    assert state.get("k") == {"list": [1, 2], "dict": {"x": 1}}


def test_mutating_what_you_read_does_not_change_the_state(state: State) -> None:
    state.set("k", {"list": [1, 2]})
    state.get("k")["list"].append(3)
    state["k"]["list"].append(4)
    state.items()[0][1]["list"].append(5)
    state.pick("k")["k"]["list"].append(6)
    state.entry("k").value["list"].append(7)
    state.snapshot()["entries"]["k"]["value"]["list"].append(8)
    assert state.get("k") == {"list": [1, 2]}


def test_mutating_what_update_and_modify_took_or_returned(state: State) -> None:
    batch = {"a": [1], "b": {"c": [2]}}
    state.update(batch)
    batch["a"].append(9)
    batch["b"]["c"].append(9)
    returned = state.modify("m", [], lambda v: [*v, 1])
    returned.append(9)
    assert state.pick("a", "b", "m") == {"a": [1], "b": {"c": [2]}, "m": [1]}


def test_mutating_a_removed_value_does_not_leak(state: State) -> None:
    state.set("k", [1])
    old = state.remove("k")
    old.append(2)
    state.set("k", [1])
    assert state.get("k") == [1]


# -- set, versions and seq ---------------------------------------------------------------


def test_set_returns_the_new_version(state: State) -> None:
    assert state.set("a", 1) == 1
    assert state.set("a", 2) == 2
    assert state.set("a", 3) == 3
    assert state.version("a") == 3
    assert state.set("b", 1) == 1


def test_version_is_zero_for_absent_keys(state: State) -> None:
    assert state.version("nope") == 0


def test_version_restarts_after_removal(state: State) -> None:
    state.set("a", 1)
    state.set("a", 2)
    state.remove("a")
    assert state.version("a") == 0
    assert state.set("a", 3) == 1
    assert state.entry("a").version == 1


def test_seq_is_global_and_grows_with_every_commit(state: State) -> None:
    state.set("a", 1)
    state.set("b", 1)
    state.set("a", 2)
    assert state.journal.cursor == 3
    assert state.entry("a").seq == 3
    assert state.entry("b").seq == 2
    state.remove("b")
    assert state.journal.cursor == 4
    state.set("b", 5)
    assert state.entry("b").seq == 5
    assert [m.seq for m in state.journal.since(0)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("first", "again"),
    [
        (1, 1),
        ("x", "x"),
        (None, None),
        (1.5, 1.5),
        ([1, [2]], [1, [2]]),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    ],
    ids=repr,
)
def test_writing_an_equal_value_is_a_noop(state: State, first: Any, again: Any) -> None:
    state.set("k", first, source="llm", writer="w1")
    recorder = Recorder(state)
    journal = state.journal.since(0)
    entry = state.entry("k")
    assert state.set("k", again, source="user", writer="w2") == 1
    assert state.update({"k": again}) == state.journal.cursor == 1
    assert state.modify("k", None, lambda v: again) == again
    assert state.entry("k") == entry  # same version, seq, provenance and time
    assert state.journal.since(0) == journal
    assert recorder.batches == []


def test_entry_has_value_version_seq_provenance_and_time() -> None:
    state = State(clock=lambda: T0)
    state.set("other", 0)
    state.set("k", [1], source="fetch", writer="geo", confidence=0.75, meta={"url": "u"})
    state.set("k", [2], source="fetch", writer="geo", confidence=0.75, meta={"url": "u"})
    entry = state.entry("k")
    assert isinstance(entry, Entry)
    assert entry.key == "k"
    assert entry.value == [2]
    assert entry.version == 2
    assert entry.seq == 3
    assert entry.updated_at == T0_DT
    assert entry.provenance == Provenance(
        source="fetch", writer="geo", confidence=0.75, at=T0_DT, meta={"url": "u"}
    )
    assert state.entry("absent") is None


# -- provenance --------------------------------------------------------------------------


def test_default_provenance_is_user() -> None:
    state = State(clock=lambda: T0)
    state.set("k", 1)
    prov = state.provenance("k")
    assert isinstance(prov, Provenance)
    assert (prov.source, prov.writer, prov.confidence, prov.meta) == ("user", None, None, {})
    assert prov.at == T0_DT
    assert prov.at.tzinfo is not None
    assert prov.at.utcoffset().total_seconds() == 0


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75, 0.125])
def test_injected_clock_time_is_kept_to_the_microsecond(fraction: float) -> None:
    # The clock returns seconds as a float; x.25 s is exactly representable, so the commit
    # time (microsecond precision) must be exactly x.250000, not rounded down to x.249999.
    state = State(clock=lambda: T0 + fraction)
    state.set("k", 1)
    expected = datetime.fromtimestamp(T0 + fraction, tz=UTC)
    assert expected.microsecond == round(fraction * 1_000_000)
    assert state.entry("k").updated_at == expected
    assert state.provenance("k").at == expected


def test_provenance_records_the_latest_write(state: State) -> None:
    state.set("k", 1, source="llm", writer="extract", confidence=0.4, meta={"turn": 2})
    state.set("k", 2, source="agent", writer="verify", confidence=1)
    prov = state.provenance("k")
    assert prov.source == "agent"
    assert prov.writer == "verify"
    assert prov.confidence == 1.0
    assert prov.meta == {}
    assert state.provenance("absent") is None


def test_state_meta_read_returns_provenance_as_a_dict() -> None:
    state = State(clock=lambda: T0)
    state.set("k", 1, source="llm", writer="extract", confidence=0.5, meta={"model": "m"})
    meta = state.get("state_meta:k")
    assert meta["source"] == "llm"
    assert meta["resolver"] == "extract"
    assert meta["writer"] == "extract"
    assert meta["confidence"] == 0.5
    assert meta["meta"] == {"model": "m"}
    assert meta["at"] == "2023-11-14T22:13:20Z"
    assert state.get("state_meta:absent") is None
    assert state.get("state_meta:absent", "d") == "d"


def test_module_level_provenance_returns_the_source(state: State) -> None:
    state.set("k", 1, source="fetch")
    assert slateflow.state.source_of(state, "k") == "fetch"
    assert slateflow.state.source_of(state, "absent") is None


def test_provenance_meta_is_a_private_copy(state: State) -> None:
    meta = {"tags": ["a"]}
    state.set("k", 1, meta=meta)
    meta["tags"].append("b")
    state.provenance("k").meta["tags"].append("c")
    state.get("state_meta:k")["meta"]["tags"].append("d")
    assert state.provenance("k").meta == {"tags": ["a"]}


def test_provenance_model_validates() -> None:
    with pytest.raises(ValidationError):
        Provenance(source="", at=T0_DT)
    with pytest.raises(ValidationError):
        Provenance(source="user", confidence=1.5, at=T0_DT)
    with pytest.raises(ValidationError):
        Provenance(source="user", at=T0_DT, surprise=1)
    prov = Provenance(source="user", at=T0_DT)
    with pytest.raises(ValidationError):
        prov.source = "other"  # type: ignore[misc]


# -- remove --------------------------------------------------------------------------------


def test_remove_returns_the_old_value(state: State) -> None:
    state.set("k", {"a": 1})
    assert state.remove("k") == {"a": 1}
    assert "k" not in state
    (change,) = state.journal.since(1)
    assert change.removed
    assert change.old == {"a": 1}


def test_remove_absent_raises_unless_default_given(state: State) -> None:
    with pytest.raises(MissingKeyError, match="'k'"):
        state.remove("k")
    assert state.remove("k", None) is None
    assert state.remove("k", "fallback") == "fallback"
    assert state.journal.cursor == 0


def test_remove_records_who_removed(state: State) -> None:
    state.set("k", 1)
    state.remove("k", source="system", writer="janitor")
    (change,) = state.journal.since(1)
    assert (change.provenance.source, change.provenance.writer) == ("system", "janitor")


# -- modify --------------------------------------------------------------------------------


def test_modify_uses_default_when_absent_and_current_value_otherwise(state: State) -> None:
    assert state.modify("count", 0, lambda v: v + 1) == 1
    assert state.modify("count", 0, lambda v: v + 1) == 2
    assert state.get("count") == 2
    assert state.version("count") == 2


def test_modify_records_provenance(state: State) -> None:
    state.modify("k", [], lambda v: [*v, "x"], source="tool", writer="adder", confidence=0.9)
    prov = state.provenance("k")
    assert (prov.source, prov.writer, prov.confidence) == ("tool", "adder", 0.9)


def test_modify_fn_gets_a_private_copy(state: State) -> None:
    state.set("k", [1])

    def mutate_then_fail(value: list[int]) -> list[int]:
        value.append(2)
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        state.modify("k", [], mutate_then_fail)
    assert state.get("k") == [1]
    assert state.version("k") == 1


def test_concurrent_modify_never_loses_an_update(state: State) -> None:
    threads, rounds = 8, 200

    def work() -> None:
        for _ in range(rounds):
            state.modify("count", 0, lambda v: v + 1)

    run_threads(lambda _i: work(), threads)
    assert state.get("count") == threads * rounds
    assert state.version("count") == threads * rounds
    assert state.journal.cursor == threads * rounds


# -- update --------------------------------------------------------------------------------


def test_update_commits_one_batch_with_one_seq(state: State) -> None:
    state.set("a", 1)
    recorder = Recorder(state)
    seq = state.update({"a": 2, "b": 1, "c": [1]}, source="llm", writer="x")
    assert seq == 2 == state.journal.cursor
    changes = state.journal.since(1)
    assert [c.key for c in changes] == ["a", "b", "c"]
    assert {c.seq for c in changes} == {2}
    assert recorder.keys == [["a", "b", "c"]]
    assert state.version("a") == 2
    assert state.version("b") == 1
    for key in "abc":
        assert state.entry(key).seq == 2
        assert state.provenance(key).source == "llm"
        assert state.provenance(key).writer == "x"


def test_update_can_remove_keys(state: State) -> None:
    state.update({"a": 1, "b": 2, "c": 3})
    seq = state.update({"d": 4}, remove=["a", "b", "never-existed"])
    assert state.keys() == ["c", "d"]
    changes = state.journal.since(1)
    assert {c.seq for c in changes} == {seq}
    assert [(c.key, c.removed) for c in changes] == [("d", False), ("a", True), ("b", True)]


def test_update_skips_equal_values(state: State) -> None:
    state.update({"a": 1, "b": 2})
    state.update({"a": 1, "b": 3})
    assert [c.key for c in state.journal.since(1)] == ["b"]
    assert state.version("a") == 1
    assert state.version("b") == 2


def test_update_with_nothing_to_change_commits_nothing(state: State) -> None:
    state.update({"a": 1})
    recorder = Recorder(state)
    assert state.update({"a": 1}) == 1
    assert state.update({}) == 1
    assert state.update({}, remove=["absent"]) == 1
    assert state.journal.cursor == 1
    assert recorder.batches == []


def test_update_with_expected_versions(state: State) -> None:
    state.update({"a": 1, "b": 1})
    state.update({"a": 2, "c": 1}, expected_versions={"a": 1, "b": 1, "c": 0})
    assert state.pick("a", "c") == {"a": 2, "c": 1}
    with pytest.raises(VersionConflictError, match="'a'"):
        state.update({"a": 3, "b": 2}, expected_versions={"a": 1})
    assert state.pick("a", "b") == {"a": 2, "b": 1}


# -- keys, items, pick ---------------------------------------------------------------------


def test_keys_and_items_filter_by_prefix_in_creation_order(state: State) -> None:
    for key in ["user:name", "booking:date", "user:age", "booking", "bookings:x"]:
        state.set(key, key.upper())
    state.set("user:name", "changed")  # keeps its place
    assert state.keys() == ["user:name", "booking:date", "user:age", "booking", "bookings:x"]
    assert state.keys("user:") == ["user:name", "user:age"]
    assert state.keys("booking:") == ["booking:date"]
    assert state.keys("booking") == ["booking:date", "booking", "bookings:x"]
    assert state.keys("nothing") == []
    assert state.items("user:") == [("user:name", "changed"), ("user:age", "USER:AGE")]
    state.remove("user:name")
    state.set("user:name", "back")
    assert state.keys("user:") == ["user:age", "user:name"]


def test_pick_returns_only_keys_that_are_set(state: State) -> None:
    state.update({"a": 1, "b": None, "c": 3})
    assert state.pick("a", "b", "missing") == {"a": 1, "b": None}
    assert state.pick() == {}


# -- rename --------------------------------------------------------------------------------


def test_rename_moves_the_value_and_keeps_provenance() -> None:
    state = State(clock=lambda: T0)
    state.set("draft:date", "2024-05-01", source="llm", writer="ex", confidence=0.6, meta={"t": 1})
    state.set("draft:date", "2024-05-02", source="llm", writer="ex", confidence=0.6, meta={"t": 1})
    recorder = Recorder(state)
    assert state.rename("draft:date", "booking:date") == 1
    assert "draft:date" not in state
    assert state.get("booking:date") == "2024-05-02"
    prov = state.provenance("booking:date")
    assert (prov.source, prov.writer, prov.confidence, prov.meta) == ("llm", "ex", 0.6, {"t": 1})
    changes = state.journal.since(2)
    assert [(c.key, c.removed) for c in changes] == [("draft:date", True), ("booking:date", False)]
    assert {c.seq for c in changes} == {3}
    assert len(recorder.batches) == 1


def test_rename_refuses_to_overwrite_unless_asked(state: State) -> None:
    state.set("a", "from a", source="llm")
    state.set("b", "from b")
    state.set("b", "from b, v2")
    with pytest.raises(KeyExistsError) as info:
        state.rename("a", "b")
    assert "'b'" in str(info.value)
    assert state.pick("a", "b") == {"a": "from a", "b": "from b, v2"}
    assert state.rename("a", "b", overwrite=True) == 3
    assert state.pick("a", "b") == {"b": "from a"}
    assert slateflow.state.source_of(state, "b") == "llm"


def test_rename_of_a_missing_key_raises(state: State) -> None:
    with pytest.raises(MissingKeyError, match="'a'"):
        state.rename("a", "b")
    assert "b" not in state


def test_rename_onto_itself_changes_nothing(state: State) -> None:
    state.set("a", 1)
    assert state.rename("a", "a") == 1
    assert state.get("a") == 1
    assert state.journal.cursor == 1


# -- clear_prefix and end_turn -------------------------------------------------------------


def test_clear_prefix_removes_matching_keys_in_one_batch(state: State) -> None:
    state.update({"booking:date": 1, "booking:time": 2, "user:name": 3})
    recorder = Recorder(state)
    assert state.clear_prefix("booking:") == 2
    assert state.keys() == ["user:name"]
    assert recorder.keys == [["booking:date", "booking:time"]]
    assert state.journal.cursor == 2
    assert state.clear_prefix("booking:") == 0
    assert state.journal.cursor == 2


def test_clear_prefix_empty_string_empties_the_state(state: State) -> None:
    state.update({"a": 1, "b:c": 2})
    assert state.clear_prefix("") == 2
    assert len(state) == 0
    assert state.set("a", 1) == 1


def test_end_turn_clears_turn_and_temp_in_one_batch(state: State) -> None:
    state.update(
        {
            "turn:intent": "book",
            "temp:scratch": [1],
            "user:name": "Ada",
            "session:id": "s",
            "turnover:x": 1,
            "turn": "not a scope key",
            "temp": 0,
        }
    )
    recorder = Recorder(state)
    assert end_turn(state) == 2
    assert state.keys() == ["user:name", "session:id", "turnover:x", "turn", "temp"]
    assert recorder.keys == [["turn:intent", "temp:scratch"]]
    assert {c.seq for c in recorder.batches[0]} == {2}
    assert end_turn(state) == 0
    assert state.journal.cursor == 2


# -- optimistic concurrency ----------------------------------------------------------------


def test_expected_version_makes_the_write_conditional(state: State) -> None:
    assert state.set("k", "a", expected_version=0) == 1
    assert state.set("k", "b", expected_version=1) == 2
    with pytest.raises(VersionConflictError) as info:
        state.set("k", "c", expected_version=1)
    assert "'k'" in str(info.value)
    assert state.get("k") == "b"
    assert state.version("k") == 2


def test_expected_version_zero_means_must_not_exist(state: State) -> None:
    state.set("k", 1)
    with pytest.raises(VersionConflictError):
        state.set("k", 2, expected_version=0)
    with pytest.raises(VersionConflictError):
        state.set("new", 2, expected_version=1)
    assert "new" not in state
    assert state.get("k") == 1


def test_compare_and_set_loop_never_loses_an_update(state: State) -> None:
    threads, rounds = 4, 100

    def work() -> None:
        done = 0
        while done < rounds:
            # Version first: a value read after a concurrent write comes with a stale version.
            version = state.version("n")
            try:
                state.set("n", state.get("n", 0) + 1, expected_version=version)
            except VersionConflictError:
                continue
            done += 1

    run_threads(lambda _i: work(), threads)
    assert state.get("n") == threads * rounds
    assert state.version("n") == threads * rounds


# -- scopes --------------------------------------------------------------------------------

WRITABLE_SCOPES = ["app", "user", "session", "temp", "turn", "bg"]


def test_scope_names() -> None:
    assert set(SCOPES) == {*WRITABLE_SCOPES, "derived"}


@pytest.mark.parametrize("scope", WRITABLE_SCOPES)
def test_scoped_view_reads_and_writes_its_prefix(state: State, scope: str) -> None:
    view = ScopedView(state, scope)
    state.set("other:name", "outside")
    assert view.set("name", "Ada", source="llm") == 1
    assert view.set("prefs:lang", "en") == 1
    assert state.get(f"{scope}:name") == "Ada"
    assert view.get("name") == "Ada"
    assert view.get("missing", "d") == "d"
    assert "name" in view
    assert "prefs:lang" in view
    assert "other" not in view
    assert view.keys() == ["name", "prefs:lang"]
    assert view.items() == [("name", "Ada"), ("prefs:lang", "en")]
    assert slateflow.state.source_of(state, f"{scope}:name") == "llm"
    assert view.remove("name") == "Ada"
    assert f"{scope}:name" not in state
    assert view.remove("name", None) is None
    with pytest.raises(MissingKeyError, match=f"'{scope}:name'"):
        view.remove("name")
    assert view.keys() == ["prefs:lang"]
    assert state.get("other:name") == "outside"


def test_scoped_view_items_are_private_copies(state: State) -> None:
    ScopedView(state, "user").set("prefs", {"lang": ["en"]})
    ScopedView(state, "user").get("prefs")["lang"].append("fr")
    ScopedView(state, "user").items()[0][1]["lang"].append("de")
    assert ScopedView(state, "user").get("prefs") == {"lang": ["en"]}


def test_derived_view_is_read_only(state: State) -> None:
    state.set("derived:total", 12)
    view = ReadOnlyView(state, "derived")
    assert view.get("total") == 12
    assert "total" in view
    assert view.keys() == ["total"]
    assert view.items() == [("total", 12)]
    writes = [
        lambda: view.set("total", 13),
        lambda: view.set("new", 1),
        lambda: view.update({"total": 13}),
        lambda: view.modify("total", 0, lambda v: v + 1),
        lambda: view.remove("total"),
        lambda: view.clear(),
    ]
    for write in writes:
        with pytest.raises(ReadOnlyError):
            write()
    assert state.get("derived:total") == 12
    assert state.keys() == ["derived:total"]
    assert state.journal.cursor == 1


# -- models on plain keys --------------------------------------------------------------------


class Slot(BaseModel):
    name: str
    filled: bool = False


def test_model_values_compare_by_their_json(state: State) -> None:
    state.set("slot", Slot(name="date"))
    assert state.set("slot", Slot(name="date")) == 1
    assert state.set("slot", {"name": "date", "filled": False}) == 1
    assert state.set("slot", Slot(name="date", filled=True)) == 2
