"""Bad input: every refused write raises its typed error naming the key, and changes nothing.

"Nothing" is checked with a full fingerprint of the state (snapshot, cursor, journal) taken
before and after, and with subscribers and ``changed`` receivers that must not be called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from helpers import fingerprint
from slateflow import Key, State
from slateflow.conversation import end_turn
from slateflow.errors import (
    InvalidKeyError,
    KeyExistsError,
    MissingKeyError,
    PolicyViolation,
    ReadOnlyError,
    SchemaError,
    StateValueError,
    VersionConflictError,
)
from slateflow.state import ReadOnlyView, ScopedView

Op = Callable[[State], object]


@contextmanager
def untouched(state: State) -> Iterator[None]:
    """Assert that the block changes nothing and notifies nobody."""
    before = fingerprint(state)
    calls: list[object] = []

    def on_changed(sender: object, **kwargs: object) -> None:
        calls.append(kwargs)

    sub = state.subscribe(calls.append)
    state.changed.connect(on_changed, weak=False)
    try:
        yield
    finally:
        sub.close()
        state.changed.disconnect(on_changed)
    assert calls == [], "a subscriber was notified of a refused write"
    assert fingerprint(state) == before


@contextmanager
def refused(state: State, error: type[Exception], key: object) -> Iterator[None]:
    """The block raises exactly ``error``, whose message names ``key``, and changes nothing."""
    with untouched(state), pytest.raises(error) as info:
        yield
    assert type(info.value) is error, f"expected {error.__name__}, got {info.value!r}"
    message = str(info.value)
    assert repr(key) in message or (isinstance(key, str) and key in message), message


def populated() -> State:
    """A state with history: several sources, versions above 1, a removed key, scopes."""
    state = State()
    state.set("booking:date", "2024-05-01", source="llm", writer="extract", confidence=0.8)
    state.set("booking:party_size", 2)
    state.set("booking:party_size", 4, source="user", confidence=1.0)
    state.set("user:name", "Ada", confidence=1.0)
    state.set("user:score", 0, confidence=0.0)
    state.update({"turn:intent": "book", "temp:scratch": [1, {"x": None}]}, source="agent")
    state.set("gone", 1)
    state.remove("gone")
    state.set("derived:total", 12.5, meta={"formula": "sum"})
    return state


@dataclass(frozen=True)
class Case:
    id: str
    op: Op
    error: type[Exception]
    key: object
    setup: Op | None = None


def run(case: Case) -> None:
    state = populated()
    if case.setup is not None:
        case.setup(state)
    with refused(state, case.error, case.key):
        case.op(state)


def cases(*items: Case) -> Any:
    return pytest.mark.parametrize("case", items, ids=[c.id for c in items])


# -- keys ------------------------------------------------------------------------------------

BAD_KEYS = [
    "",
    "a b",
    "a\tb",
    "a\nb",
    "a\x00b",
    "a\x7fb",
    "a\u00a0b",
    "a*b",
    "*",
    ":a",
    "a:",
    "a::b",
    "x" * 257,
    1,
    None,
    b"bytes",
    ("a",),
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_set_with_bad_key(key: Any) -> None:
    state = populated()
    with refused(state, InvalidKeyError, key):
        state.set(key, 1)


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_update_with_one_bad_key(key: Any) -> None:
    state = populated()
    with refused(state, InvalidKeyError, key):
        state.update({"booking:party_size": 5, "new:key": 1, key: 2, "later:key": 3})


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_modify_with_bad_key(key: Any) -> None:
    state = populated()
    with refused(state, InvalidKeyError, key):
        state.modify(key, 0, lambda v: v + 1)


@pytest.mark.parametrize("key", ["a b", "", "a*b", "a::b", 7])
def test_remove_of_bad_key(key: Any) -> None:
    state = populated()
    with refused(state, InvalidKeyError, key):
        state.remove(key)


@pytest.mark.parametrize("key", ["a b", "", "a*b", "a::b", 7])
def test_remove_of_bad_key_with_a_default(key: Any) -> None:
    # A default only stands in for a missing key; an invalid key is still an error.
    state = populated()
    with refused(state, InvalidKeyError, key):
        state.remove(key, None)


@pytest.mark.parametrize("key", ["a b", "", "a*b", "a::b", 7])
def test_update_removing_a_bad_key(key: Any) -> None:
    state = populated()
    with refused(state, InvalidKeyError, key):
        state.update({"booking:party_size": 5}, remove=["user:name", key])


@cases(
    Case("set_existing", lambda s: s.set("state_meta:booking:date", {}), ReadOnlyError,
         "state_meta:booking:date"),
    Case("set_new", lambda s: s.set("state_meta:new", 1), ReadOnlyError, "state_meta:new"),
    Case("update", lambda s: s.update({"new:key": 1, "state_meta:user:name": {"source": "x"}}),
         ReadOnlyError, "state_meta:user:name"),
    Case("modify", lambda s: s.modify("state_meta:user:name", {}, lambda v: v), ReadOnlyError,
         "state_meta:user:name"),
    Case("rename_onto", lambda s: s.rename("user:name", "state_meta:user:name"), ReadOnlyError,
         "state_meta:user:name"),
)  # fmt: skip
def test_state_meta_keys_cannot_be_written(case: Case) -> None:
    run(case)


# -- values ----------------------------------------------------------------------------------


class Reading(BaseModel):
    value: float


BAD_VALUES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    [1, float("nan")],
    {"deep": {"er": float("-inf")}},
    (1, 2),
    {1, 2},
    frozenset({1}),
    b"bytes",
    bytearray(b"b"),
    object(),
    {1: "int key"},
    {"ok": {None: "none key"}},
    Decimal("1.0"),
    2j,
    print,
    Reading(value=float("nan")),
    {"wrapped": [Reading(value=float("inf"))]},
]


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("key", ["booking:date", "new:key"])
def test_set_with_bad_value(key: str, value: Any) -> None:
    state = populated()
    with refused(state, StateValueError, key):
        state.set(key, value)


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_update_with_one_bad_value(value: Any) -> None:
    state = populated()
    batch = {"booking:party_size": 6, "new:a": [1], "temp:bad": value, "new:b": {"x": 1}}
    with refused(state, StateValueError, "temp:bad"):
        state.update(batch, source="llm")


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_modify_returning_a_bad_value(value: Any) -> None:
    state = populated()
    with refused(state, StateValueError, "booking:party_size"):
        state.modify("booking:party_size", 0, lambda v: value)


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_modify_with_a_bad_default(value: Any) -> None:
    state = populated()
    with refused(state, StateValueError, "new:counter"):
        state.modify("new:counter", value, lambda v: 1)


def test_modify_whose_fn_raises_changes_nothing() -> None:
    state = populated()

    def mutate_then_fail(value: list[Any]) -> list[Any]:
        value.append("leak")
        value[1]["x"] = "leak"
        raise LookupError("boom")

    with untouched(state), pytest.raises(LookupError, match="boom"):
        state.modify("temp:scratch", [], mutate_then_fail)


def test_update_writing_and_removing_the_same_key() -> None:
    state = populated()
    with refused(state, StateValueError, "user:name"):
        state.update({"booking:party_size": 8, "user:name": "Bo"}, remove=["user:name"])


# -- provenance arguments --------------------------------------------------------------------

BAD_PROVENANCE = [
    {"source": ""},
    {"source": None},
    {"source": 5},
    {"source": ["llm"]},
    {"writer": ""},
    {"writer": 5},
    {"writer": ["w"]},
    {"confidence": -0.01},
    {"confidence": 1.01},
    {"confidence": float("nan")},
    {"confidence": float("inf")},
    {"confidence": "0.5"},
    {"confidence": True},
    {"confidence": False},
    {"confidence": [0.5]},
    {"meta": "not a dict"},
    {"meta": [("a", 1)]},
    {"meta": {"x": float("nan")}},
    {"meta": {1: "int key"}},
    {"meta": {"x": (1, 2)}},
]


@pytest.mark.parametrize("kwargs", BAD_PROVENANCE, ids=repr)
@pytest.mark.parametrize("key", ["booking:date", "new:key"])
def test_set_with_bad_provenance(key: str, kwargs: dict[str, Any]) -> None:
    state = populated()
    with refused(state, StateValueError, key):
        state.set(key, "2024-06-01", **kwargs)


@pytest.mark.parametrize("kwargs", BAD_PROVENANCE, ids=repr)
def test_update_with_bad_provenance(kwargs: dict[str, Any]) -> None:
    state = populated()
    with refused(state, StateValueError, "booking:date"):
        state.update({"booking:date": "2024-06-01", "new:key": 1}, **kwargs)


@pytest.mark.parametrize("kwargs", BAD_PROVENANCE, ids=repr)
def test_modify_with_bad_provenance(kwargs: dict[str, Any]) -> None:
    state = populated()
    with refused(state, StateValueError, "booking:party_size"):
        state.modify("booking:party_size", 0, lambda v: v + 1, **kwargs)


@pytest.mark.parametrize(
    "kwargs", [k for k in BAD_PROVENANCE if set(k) <= {"source", "writer"}], ids=repr
)
def test_remove_with_bad_provenance(kwargs: dict[str, Any]) -> None:
    state = populated()
    with refused(state, StateValueError, "user:name"):
        state.remove("user:name", **kwargs)


@pytest.mark.parametrize("flag", [True, False])
def test_bool_confidence_is_refused_even_after_a_valid_numeric_one(flag: bool) -> None:
    # 1.0 and 0.0 are valid confidences; True and False are not numbers, and must be refused
    # whatever was written before.
    state = State()
    with pytest.raises(StateValueError):
        state.set("fresh", 1, confidence=flag)
    state.set("a", 1, confidence=1.0)
    state.set("b", 1, confidence=0.0)
    with refused(state, StateValueError, "c"):
        state.set("c", 1, confidence=flag)


# -- versions --------------------------------------------------------------------------------


@cases(
    Case("stale", lambda s: s.set("booking:party_size", 5, expected_version=1),
         VersionConflictError, "booking:party_size"),
    Case("ahead", lambda s: s.set("booking:party_size", 5, expected_version=3),
         VersionConflictError, "booking:party_size"),
    Case("exists", lambda s: s.set("user:name", "Bo", expected_version=0),
         VersionConflictError, "user:name"),
    Case("absent", lambda s: s.set("new:key", 1, expected_version=1),
         VersionConflictError, "new:key"),
    Case("removed", lambda s: s.set("gone", 1, expected_version=1), VersionConflictError, "gone"),
    Case("equal_value", lambda s: s.set("user:name", "Ada", expected_version=2),
         VersionConflictError, "user:name"),
    Case("negative", lambda s: s.set("user:name", "Bo", expected_version=-1), StateValueError,
         "user:name"),
    Case("str", lambda s: s.set("user:name", "Bo", expected_version="1"), StateValueError,
         "user:name"),
    Case("float", lambda s: s.set("user:name", "Bo", expected_version=1.0), StateValueError,
         "user:name"),
    Case("bool", lambda s: s.set("user:name", "Bo", expected_version=True), StateValueError,
         "user:name"),
    Case("typed_key", lambda s: s.set(Key("booking:party_size", int), 5, expected_version=1),
         VersionConflictError, "booking:party_size"),
)  # fmt: skip
def test_set_with_wrong_expected_version(case: Case) -> None:
    run(case)


@cases(
    Case("stale", lambda s: s.update({"new:key": 1, "booking:party_size": 5},
                                     expected_versions={"booking:party_size": 1}),
         VersionConflictError, "booking:party_size"),
    Case("must_not_exist", lambda s: s.update({"new:key": 1, "user:name": "Bo"},
                                              expected_versions={"user:name": 0}),
         VersionConflictError, "user:name"),
    Case("unwritten_key", lambda s: s.update({"new:key": 1},
                                             expected_versions={"booking:date": 7}),
         VersionConflictError, "booking:date"),
    Case("bool", lambda s: s.update({"new:key": 1, "user:name": "Bo"},
                                    expected_versions={"user:name": True}),
         StateValueError, "user:name"),
    Case("float", lambda s: s.update({"new:key": 1, "user:name": "Bo"},
                                     expected_versions={"user:name": 1.0}),
         StateValueError, "user:name"),
    Case("str", lambda s: s.update({"new:key": 1, "user:name": "Bo"},
                                   expected_versions={"user:name": "1"}),
         StateValueError, "user:name"),
    Case("bad_key", lambda s: s.update({"new:key": 1}, expected_versions={"not a key": 0}),
         InvalidKeyError, "not a key"),
)  # fmt: skip
def test_update_with_wrong_expected_versions(case: Case) -> None:
    run(case)


# -- remove and rename -----------------------------------------------------------------------


@cases(
    Case("remove_missing", lambda s: s.remove("missing:key"), MissingKeyError, "missing:key"),
    Case("remove_removed", lambda s: s.remove("gone"), MissingKeyError, "gone"),
    Case("rename_missing", lambda s: s.rename("missing:key", "x"), MissingKeyError,
         "missing:key"),
    Case("rename_onto_existing", lambda s: s.rename("booking:date", "user:name"),
         KeyExistsError, "user:name"),
    Case("rename_bad_old", lambda s: s.rename("bad key", "x"), InvalidKeyError, "bad key"),
    Case("rename_bad_new", lambda s: s.rename("booking:date", "bad key"), InvalidKeyError,
         "bad key"),
    Case("rename_empty_segment", lambda s: s.rename("booking:date", "booking::date"),
         InvalidKeyError, "booking::date"),
    Case("rename_bad_source", lambda s: s.rename("booking:date", "x", source=""),
         StateValueError, "booking:date"),
)  # fmt: skip
def test_bad_remove_and_rename(case: Case) -> None:
    run(case)


# -- schemas ---------------------------------------------------------------------------------


class Booking(BaseModel):
    name: str
    party_size: int


BOOKING = Key("booking:model", Booking)


def declare(pattern: str, type_: Any) -> Op:
    return lambda s: s.declare(pattern, type_)


@cases(
    Case("set", lambda s: s.set("booking:party_size", "many"), SchemaError,
         "booking:party_size", setup=declare("booking:party_size", int)),
    Case("set_new_key", lambda s: s.set("verify:result", 3), SchemaError, "verify:result",
         setup=declare("*:result", str)),
    Case("update_one_bad", lambda s: s.update({"a:result": "ok", "b:result": 3, "c": 1}),
         SchemaError, "b:result", setup=declare("*:result", str)),
    Case("modify", lambda s: s.modify("booking:party_size", 0, lambda v: [v]), SchemaError,
         "booking:party_size", setup=declare("booking:party_size", int)),
    Case("rename_into_declared", lambda s: s.rename("booking:date", "count:date"),
         SchemaError, "count:date", setup=declare("count:*", int)),
    Case("typed_key", lambda s: s.set(BOOKING, {"name": "Ada"}), SchemaError,
         "booking:model"),
    Case("typed_key_wrong_type", lambda s: s.set(BOOKING, "Ada"), SchemaError,
         "booking:model"),
    Case("typed_key_in_update", lambda s: s.update({"new:key": 1, BOOKING: 5}), SchemaError,
         "booking:model"),
    Case("typed_list", lambda s: s.set(Key("tags", list[int]), [1, "x"]), SchemaError,
         "tags"),
)  # fmt: skip
def test_schema_errors(case: Case) -> None:
    run(case)


def test_declare_refuses_a_type_the_stored_values_do_not_match() -> None:
    state = populated()
    with refused(state, SchemaError, "booking:date"):
        state.declare("booking:*", int)
    # Nothing was declared: the refused type does not govern later writes.
    state.set("booking:date", "still a string")
    assert state.get("booking:date") == "still a string"


# -- policies --------------------------------------------------------------------------------


def policy(pattern: str | None = None, **kwargs: Any) -> Op:
    return lambda s: s.policy(pattern, **kwargs)


READ_ONLY_BOOKING = policy("booking:*", read_only=True)


@cases(
    Case("set", lambda s: s.set("booking:date", "x"), ReadOnlyError, "booking:date",
         setup=READ_ONLY_BOOKING),
    Case("set_new", lambda s: s.set("booking:time", "x"), ReadOnlyError, "booking:time",
         setup=READ_ONLY_BOOKING),
    Case("update", lambda s: s.update({"new:key": 1, "booking:date": "x"}), ReadOnlyError,
         "booking:date", setup=READ_ONLY_BOOKING),
    Case("update_remove", lambda s: s.update({"new:key": 1}, remove=["booking:date"]),
         ReadOnlyError, "booking:date", setup=READ_ONLY_BOOKING),
    Case("remove", lambda s: s.remove("booking:date"), ReadOnlyError, "booking:date",
         setup=READ_ONLY_BOOKING),
    Case("modify", lambda s: s.modify("booking:party_size", 0, lambda v: v + 1),
         ReadOnlyError, "booking:party_size", setup=READ_ONLY_BOOKING),
    Case("rename_from", lambda s: s.rename("booking:date", "new:date"), ReadOnlyError,
         "booking:date", setup=READ_ONLY_BOOKING),
    Case("rename_to", lambda s: s.rename("user:name", "booking:name"), ReadOnlyError,
         "booking:name", setup=READ_ONLY_BOOKING),
    Case("clear_prefix", lambda s: s.clear_prefix(""), ReadOnlyError, "booking:date",
         setup=READ_ONLY_BOOKING),
    Case("end_turn", lambda s: end_turn(s), ReadOnlyError, "turn:intent",
         setup=policy("turn:intent", read_only=True)),
    Case("writers", lambda s: s.set("verify:result", 1, writer="other"), PolicyViolation,
         "verify:result", setup=policy("verify:*", writers=["verify"])),
    Case("writers_none", lambda s: s.update({"new:key": 1, "verify:result": 1}),
         PolicyViolation, "verify:result", setup=policy("verify:*", writers=["verify"])),
    Case("sources", lambda s: s.set("user:name", "Bo", source="llm"), PolicyViolation,
         "user:name", setup=policy("user:*", sources=["user"])),
    Case("sources_remove", lambda s: s.remove("user:name", source="llm"), PolicyViolation,
         "user:name", setup=policy("user:*", sources=["user"])),
    Case("max_bytes", lambda s: s.set("temp:blob", "x" * 100), PolicyViolation, "temp:blob",
         setup=policy("temp:*", max_bytes=16)),
    Case("max_bytes_in_update", lambda s: s.update({"temp:a": 1, "temp:blob": ["x"] * 50}),
         PolicyViolation, "temp:blob", setup=policy("temp:*", max_bytes=16)),
    Case("max_keys", lambda s: s.set("new:key", 1), PolicyViolation, "new:key",
         setup=policy(max_keys=7)),
    Case("max_keys_batch", lambda s: s.update({"new:a": 1}), PolicyViolation, "new:a",
         setup=policy(max_keys=7)),
    Case("max_keys_net_growth",
         lambda s: s.update({"new:a": 1, "new:b": 2}, remove=["user:name"]),
         PolicyViolation, "new:", setup=policy(max_keys=7)),
)  # fmt: skip
def test_policy_violations(case: Case) -> None:
    run(case)


# -- scoped views ----------------------------------------------------------------------------


def Sv(state: State, scope: str) -> ScopedView:
    return ScopedView(state, scope)


def Ro(state: State) -> ReadOnlyView:
    return ReadOnlyView(state, "derived")


@cases(
    Case("bad_key", lambda s: Sv(s, "user").set("bad key", 1), InvalidKeyError, "user:bad key"),
    Case("empty_key", lambda s: Sv(s, "session").set("", 1), InvalidKeyError, "session:"),
    Case("bad_value", lambda s: Sv(s, "user").set("tags", {"a", "b"}), StateValueError,
         "user:tags"),
    Case("update_bad_value", lambda s: Sv(s, "turn").update({"ok": 1, "bad": (1,)}),
         StateValueError, "turn:bad"),
    Case("remove_missing", lambda s: Sv(s, "app").remove("missing"), MissingKeyError,
         "app:missing"),
    Case("version", lambda s: Sv(s, "user").set("name", "Bo", expected_version=3),
         VersionConflictError, "user:name"),
    Case("derived_set", lambda s: Ro(s).set("total", 13), ReadOnlyError, "total"),
    Case("derived_set_new", lambda s: Ro(s).set("average", 1), ReadOnlyError, "average"),
    Case("derived_update", lambda s: Ro(s).update({"total": 13}), ReadOnlyError, "total"),
    Case("derived_modify", lambda s: Ro(s).modify("total", 0, lambda v: v),
         ReadOnlyError, "total"),
    Case("derived_remove", lambda s: Ro(s).remove("total"), ReadOnlyError, "total"),
)  # fmt: skip
def test_scoped_view_errors(case: Case) -> None:
    run(case)


def test_derived_clear_is_refused() -> None:
    state = populated()
    with untouched(state), pytest.raises(ReadOnlyError):
        ReadOnlyView(state, "derived").clear()


# -- the checker itself --------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        lambda s: s.set("user:name", "Bo"),
        lambda s: s.set("user:score", 0.0),  # 0 -> 0.0 is a change
        lambda s: s.remove("user:name"),
        lambda s: s.update({"new:key": None}),
        lambda s: end_turn(s),
    ],
    ids=["set", "int_to_float", "remove", "update", "end_turn"],
)
def test_untouched_detects_a_change(op: Op) -> None:
    state = populated()
    with pytest.raises(AssertionError), untouched(state):
        op(state)


def test_untouched_accepts_an_equal_value_write() -> None:
    state = populated()
    with untouched(state):
        state.set("user:name", "Ada", source="llm")
        state.update({"booking:party_size": 4, "temp:scratch": [1, {"x": None}]})
