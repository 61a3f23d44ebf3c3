"""Keys and values: what the state accepts, what it refuses, and how values come back."""

from __future__ import annotations

import enum
import json
from collections import OrderedDict, defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from helpers import tagged
from slateflow import Key, State
from slateflow.errors import (
    InvalidKeyError,
    MissingKeyError,
    ReadOnlyError,
    SchemaError,
    StateValueError,
)
from slateflow.state import MAX_KEY_LENGTH, error_key, result_key, status_key


def assert_names(exc: BaseException, key: object) -> None:
    """The error message names the key (as written, or as its repr)."""
    message = str(exc)
    assert repr(key) in message or (isinstance(key, str) and key in message), message


# -- keys ------------------------------------------------------------------------------------

VALID_KEYS = [
    "a",
    "booking:date",
    "a:b:c:d:e",
    "x" * MAX_KEY_LENGTH,
    "a:" + "b" * (MAX_KEY_LENGTH - 2),
    "123",
    "UPPER:lower",
    "a-b_c.d/e@f#g$h%i",
    "ключ:значение",
    "emoji:🎉",
    "state_meta",  # only the "state_meta:" prefix is reserved
    "x:state_meta:y",
]

INVALID_KEYS = [
    "",
    " ",
    "a b",
    " a",
    "a ",
    "a\tb",
    "a\nb",
    "a\rb",
    "a\x00b",
    "a\x1bb",
    "a\x7fb",
    "a\x85b",
    "a\u00a0b",
    "a\u2003b",
    "a\u3000b",
    "a\u2028b",
    "a*b",
    "*",
    "a:*",
    ":",
    ":a",
    "a:",
    "a::b",
    "x" * (MAX_KEY_LENGTH + 1),
    "a:" + "b" * (MAX_KEY_LENGTH - 1),
]

NON_STR_KEYS = [1, 1.5, None, b"ab", ("a",), ["a"]]


def test_max_key_length_is_256() -> None:
    assert MAX_KEY_LENGTH == 256


@pytest.mark.parametrize("key", VALID_KEYS)
def test_valid_keys_can_be_written_and_read(key: str) -> None:
    state = State()
    assert state.set(key, "v") == 1
    assert state.get(key) == "v"
    assert state[key] == "v"
    assert key in state
    assert state.keys() == [key]


@pytest.mark.parametrize("key", INVALID_KEYS + NON_STR_KEYS, ids=repr)
def test_writing_an_invalid_key_raises_naming_it(key: Any) -> None:
    state = State()
    with pytest.raises(InvalidKeyError) as info:
        state.set(key, 1)
    assert_names(info.value, key)
    assert len(state) == 0
    assert state.journal.cursor == 0


def test_invalid_key_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'a b'"):
        State().set("a b", 1)


READS = {
    "get": lambda s, k: s.get(k),
    "get_with_default": lambda s, k: s.get(k, "default"),
    "require": lambda s, k: s[k],
    "contains": lambda s, k: k in s,
    "in": lambda s, k: k in s,
    "entry": lambda s, k: s.entry(k),
    "version": lambda s, k: s.version(k),
    "provenance": lambda s, k: s.provenance(k),
    "pick": lambda s, k: s.pick("a", k),
}


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_reading_an_invalid_key_raises_naming_it(read: Any) -> None:
    state = State()
    state.set("a", 1)
    for key in ["a b", "", "a*b", "a::b", 5]:
        with pytest.raises(InvalidKeyError) as info:
            read(state, key)
        assert_names(info.value, key)


@pytest.mark.parametrize("key", ["state_meta:a", "state_meta:a:b", "state_meta:new"])
def test_state_meta_keys_are_reserved(key: str) -> None:
    state = State()
    state.set("a", 1)
    state.set("a:b", 2)
    with pytest.raises(ReadOnlyError) as info:
        state.set(key, {"source": "forged"})
    assert_names(info.value, key)
    assert state.keys() == ["a", "a:b"]
    assert state.provenance("a").source == "user"


def test_state_meta_reserved_in_update_too() -> None:
    state = State()
    with pytest.raises(ReadOnlyError):
        state.update({"ok": 1, "state_meta:ok": {"source": "forged"}})
    assert len(state) == 0


@pytest.mark.parametrize(
    ("helper", "expected"),
    [(result_key, "verify:result"), (error_key, "verify:error"), (status_key, "verify:status")],
)
def test_resolver_key_conventions(helper: Any, expected: str) -> None:
    assert helper("verify") == expected
    state = State()
    state.set(helper("verify"), "x", writer="verify")
    assert state.get(expected) == "x"
    assert state.provenance(expected).writer == "verify"


def test_resolver_key_conventions_compose_with_namespaced_names() -> None:
    assert result_key("booking:verify") == "booking:verify:result"
    assert error_key("booking:verify") == "booking:verify:error"
    assert status_key("booking:verify") == "booking:verify:status"


# -- values ----------------------------------------------------------------------------------

ACCEPTED_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2**100,
    0.0,
    -0.0,
    1.5,
    1e308,
    5e-324,
    "",
    "text",
    "ünïcødé 🎉\n\t",
    [],
    {},
    [1, "a", None, [True, 1.0]],
    {"a": {"b": [1.0, {"c": None}]}, "": 0},
    {"nested": [[[[[[]]]]]]},
]


@pytest.mark.parametrize("value", ACCEPTED_VALUES, ids=repr)
def test_json_values_round_trip_exactly(value: Any) -> None:
    state = State()
    state.set("k", value)
    for read in (state.get("k"), state["k"], state.entry("k").value, state.pick("k")["k"]):
        assert tagged(read) == tagged(value)
    assert state.items() == [("k", value)]
    assert json.loads(json.dumps(state.get("k"))) == value


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (1, 1.0),
        (1, True),
        (1.0, True),
        (0, False),
        (0, None),
        ([1], [True]),
        ({"a": 1}, {"a": 1.0}),
    ],
    ids=repr,
)
def test_int_float_and_bool_are_different_values(first: Any, second: Any) -> None:
    state = State()
    assert state.set("k", first) == 1
    assert state.set("k", second) == 2
    assert tagged(state.get("k")) == tagged(second)
    assert state.set("k", first) == 3
    assert tagged(state.get("k")) == tagged(first)
    assert state.journal.cursor == 3


def test_true_over_one_is_a_recorded_change() -> None:
    state = State()
    state.set("flag", 1)
    seen: list[Any] = []
    state.subscribe(seen.append)
    assert state.set("flag", True) == 2
    assert state.get("flag") is True
    (change,) = state.journal.since(1)
    assert change.old == 1
    assert change.new is True
    assert len(seen) == 1


class Color(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (Color.RED, "red"),
        (Level.HIGH, 3),
        ({"c": Color.RED}, {"c": "red"}),
        (OrderedDict([("b", 1), ("a", 2)]), {"b": 1, "a": 2}),
        (defaultdict(list, {"x": [1]}), {"x": [1]}),
    ],
    ids=repr,
)
def test_subclasses_of_json_types_are_stored_as_plain_json(value: Any, stored: Any) -> None:
    state = State()
    state.set("k", value)
    got = state.get("k")
    assert tagged(got) == tagged(stored)
    assert type(got) is type(stored)


class Booking(BaseModel):
    name: str
    party_size: int = 2
    when: datetime | None = None
    tags: list[str] = []


class Measurement(BaseModel):
    value: float


def test_pydantic_model_is_stored_as_its_json_dump() -> None:
    state = State()
    when = datetime(2024, 5, 1, 19, 30, tzinfo=UTC)
    model = Booking(name="Ada", when=when, tags=["vip"])
    state.set("booking", model)
    assert state.get("booking") == model.model_dump(mode="json")
    assert state.get("booking")["when"] == "2024-05-01T19:30:00Z"
    model.tags.append("changed later")
    assert state.get("booking")["tags"] == ["vip"]


def test_pydantic_models_inside_containers_are_dumped() -> None:
    state = State()
    state.set("bookings", {"list": [Booking(name="a"), Booking(name="b", party_size=5)]})
    assert state.get("bookings") == {
        "list": [
            {"name": "a", "party_size": 2, "when": None, "tags": []},
            {"name": "b", "party_size": 5, "when": None, "tags": []},
        ]
    }


@pytest.mark.parametrize(
    "value",
    [Measurement(value=float("nan")), [Measurement(value=float("inf"))]],
    ids=["model", "model_in_list"],
)
def test_pydantic_model_holding_nan_or_inf_is_refused(value: Any) -> None:
    # A model is stored as JSON data; NaN and infinity have no JSON spelling.
    state = State()
    with pytest.raises(StateValueError) as info:
        state.set("reading", value)
    assert_names(info.value, "reading")
    assert "reading" not in state
    json.dumps(state.snapshot(), allow_nan=False)


def _self_containing_list() -> list[Any]:
    lst: list[Any] = []
    lst.append(lst)
    return lst


REFUSED_VALUES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    [1.0, float("nan")],
    {"a": {"b": float("inf")}},
    (1, 2),
    [(1,)],
    {1, 2},
    frozenset(),
    b"bytes",
    bytearray(b"x"),
    object(),
    {1: "a"},
    {None: 1},
    {("a",): 1},
    {"ok": {2: "nested int key"}},
    Decimal("1.5"),
    1 + 2j,
    datetime(2024, 1, 1, tzinfo=UTC),
    range(3),
    len,
    _self_containing_list(),
]


@pytest.mark.parametrize("value", REFUSED_VALUES, ids=lambda v: type(v).__name__)
def test_non_json_values_are_refused_naming_the_key(value: Any) -> None:
    state = State()
    with pytest.raises(StateValueError) as info:
        state.set("booking:notes", value)
    assert_names(info.value, "booking:notes")
    assert "booking:notes" not in state
    assert state.journal.cursor == 0


@pytest.mark.parametrize("value", REFUSED_VALUES, ids=lambda v: type(v).__name__)
def test_refused_value_leaves_the_existing_value(value: Any) -> None:
    state = State()
    state.set("k", [1, 2])
    with pytest.raises(StateValueError):
        state.set("k", value)
    assert state.get("k") == [1, 2]
    assert state.version("k") == 1


def test_value_error_message_points_at_the_nested_part() -> None:
    with pytest.raises(StateValueError) as info:
        State().set("k", {"outer": [1, {"inner": float("nan")}]})
    assert "'outer'" in str(info.value)
    assert "'inner'" in str(info.value)


def test_state_value_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'k'"):
        State().set("k", {1, 2})


# -- typed keys ------------------------------------------------------------------------------

BOOKING = Key("booking", Booking)
PARTY = Key("booking:party_size", int)
TAGS = Key("tags", list[str])


def test_key_validates_its_name() -> None:
    with pytest.raises(InvalidKeyError, match="'bad key'"):
        Key("bad key", int)
    assert BOOKING.name == "booking"
    assert BOOKING.type is Booking


def test_typed_key_returns_the_typed_value_and_plain_name_returns_json() -> None:
    state = State()
    model = Booking(name="Ada", party_size=3)
    assert state.set(BOOKING, model) == 1
    typed = state.get(BOOKING)
    assert isinstance(typed, Booking)
    assert typed == model
    assert state.get("booking") == {"name": "Ada", "party_size": 3, "when": None, "tags": []}
    assert state[BOOKING] == model


def test_typed_read_returns_a_private_copy() -> None:
    state = State()
    state.set(BOOKING, Booking(name="Ada", tags=["a"]))
    state.get(BOOKING).tags.append("mutated")
    assert state.get(BOOKING).tags == ["a"]


def test_typed_key_default_when_absent() -> None:
    state = State()
    assert state.get(BOOKING) is None
    fallback = Booking(name="nobody")
    assert state.get(BOOKING, fallback) is fallback
    with pytest.raises(MissingKeyError, match="'booking'"):
        state[BOOKING]


def test_typed_key_validates_writes() -> None:
    state = State()
    with pytest.raises(SchemaError) as info:
        state.set(BOOKING, "not a booking")
    assert_names(info.value, "booking")
    with pytest.raises(SchemaError):
        state.set(TAGS, ["ok", 3])
    assert len(state) == 0


def test_typed_key_accepts_data_that_validates() -> None:
    state = State()
    state.set(BOOKING, {"name": "Bo", "party_size": 4})
    assert state.get(BOOKING) == Booking(name="Bo", party_size=4)
    state.set(PARTY, 6)
    assert state.get(PARTY) == 6
    assert state.get("booking:party_size") == 6


def test_typed_read_of_a_mismatching_stored_value_raises_schema_error() -> None:
    state = State()
    state.set("booking", {"party_size": "many"})
    with pytest.raises(SchemaError) as info:
        state.get(BOOKING)
    assert_names(info.value, "booking")


def test_typed_keys_work_with_the_rest_of_the_api() -> None:
    state = State()
    state.set(PARTY, 2)
    assert PARTY in state
    assert PARTY in state
    assert state.version(PARTY) == 1
    assert state.entry(PARTY).value == 2
    assert state.pick(PARTY) == {"booking:party_size": 2}
    assert state.remove(PARTY) == 2
    assert PARTY not in state


def test_typed_key_in_update() -> None:
    state = State()
    state.update({BOOKING: Booking(name="x"), PARTY: 3})
    assert state.get(BOOKING) == Booking(name="x")
    assert state.get(PARTY) == 3
    with pytest.raises(SchemaError):
        state.update({"other": 1, PARTY: "lots"})
    assert "other" not in state
    assert state.get(PARTY) == 3


def test_str_enum_members_work_as_keys_and_are_stored_as_plain_str() -> None:
    from enum import StrEnum

    class Slot(StrEnum):
        DATE = "booking:date"

    state = State()
    assert state.set(Slot.DATE, "2025-06-14") == 1
    assert state.set(Slot.DATE, "2025-06-15") == 2
    state.update({Slot.DATE: "2025-06-16"})
    assert state.get(Slot.DATE) == state.get("booking:date") == "2025-06-16"
    stored = state.keys()
    assert all(type(k) is str for k in stored)
    assert all(type(c.key) is str for c in state.journal.since(0))


# -- keys that would print like other keys ---------------------------------------------------------

SPOOFING = [
    "user\u200bname",  # zero-width space
    "user:\u200dname",  # zero-width joiner
    "user:na\u202eme",  # right-to-left override
    "\u2066user:name\u2069",  # bidi isolates
    "\ufeffuser:name",  # byte order mark
    "user:name\u00ad",  # soft hyphen
    "user:\ud800",  # a lone surrogate
    "user:\U000e0041",  # a tag character
    "user:\u0890",  # a format character the pattern list does not name
]


@pytest.mark.parametrize("key", SPOOFING, ids=[repr(k) for k in SPOOFING])
def test_a_key_with_invisible_or_reordering_characters_is_refused(key: str) -> None:
    state = State()
    with pytest.raises(InvalidKeyError, match="invisible or text-reordering character"):
        state.set(key, 1)
    assert len(state) == 0
    with pytest.raises(InvalidKeyError):
        state.policy(key + ":*", secret=True)


def test_keys_in_other_scripts_are_still_keys() -> None:
    state = State()
    for key in ["café:menu", "日本:予約", "заказ:дата", "user:naïve"]:
        state.set(key, 1)
    assert len(state) == 4


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", ":", "*", "."]), min_size=1, max_size=6).map("".join),
    st.lists(st.sampled_from(["a", "b", ":", "."]), max_size=6).map("".join),
)
def test_a_key_pattern_matches_exactly_what_its_wildcards_say(pattern: str, key: str) -> None:
    """Prefix/suffix matching of one-star patterns and the lazily compiled regex of several
    agree with a plain regex translation of the pattern."""
    import re

    from slateflow.errors import InvalidKeyError
    from slateflow.state.keys import Pattern

    try:
        compiled = Pattern(pattern)
    except InvalidKeyError:
        return
    expected = re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), key, re.DOTALL)
    assert compiled.matches(key) is (expected is not None)
