"""Schemas: typed keys, declared key/pattern types, specificity, coercion and refusal."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from helpers import committed_view
from slateflow import Key, State
from slateflow.errors import InvalidKeyError, SchemaError
from slateflow.state import Transaction

# -- helpers -------------------------------------------------------------------------------------


def run_in(tx: Transaction, body: Callable[[Transaction], Any]) -> None:
    with tx:
        body(tx)


class Booking(BaseModel):
    name: str
    party: int
    day: date | None = None


BOOKING = Key("booking", Booking)
WHEN = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
WHEN_ISO = "2024-05-06T07:08:09Z"


# -- typed keys ----------------------------------------------------------------------------------


def test_typed_key_round_trips_a_model_and_stores_json() -> None:
    state = State()
    state.set(BOOKING, Booking(name="Ann", party=4, day=date(2024, 5, 6)))
    typed = state.get(BOOKING)
    assert isinstance(typed, Booking)
    assert typed == Booking(name="Ann", party=4, day=date(2024, 5, 6))
    raw = state.get("booking")
    assert raw == {"name": "Ann", "party": 4, "day": "2024-05-06"}
    assert type(raw) is dict
    assert state.snapshot()["entries"]["booking"]["value"] == raw
    # The typed value is a private copy.
    typed.party = 99
    assert state.get(BOOKING).party == 4
    assert state[BOOKING] == Booking(name="Ann", party=4, day=date(2024, 5, 6))


def test_typed_key_validates_and_coerces_dict_input() -> None:
    state = State()
    state.set(BOOKING, {"name": "Ann", "party": "4"})
    assert state.get("booking") == {"name": "Ann", "party": 4, "day": None}
    assert state.get(BOOKING) == Booking(name="Ann", party=4)


def test_typed_key_rejects_invalid_value_with_pydantic_explanation() -> None:
    state = State()
    state.set(BOOKING, {"name": "Ann", "party": 2})
    before = committed_view(state)
    with pytest.raises(SchemaError) as info:
        state.set(BOOKING, {"name": "Ann"})
    message = str(info.value)
    assert "'booking'" in message
    assert "party" in message
    assert "Field required" in message
    with pytest.raises(SchemaError, match="valid integer"):
        state.set(BOOKING, {"name": "Ann", "party": "lots"})
    assert committed_view(state) == before


def test_typed_datetime_key_stores_iso_string_and_reads_datetime() -> None:
    state = State()
    when = Key("meeting:at", datetime)
    state.set(when, WHEN)
    stored = state.get("meeting:at")
    assert isinstance(stored, str)
    assert datetime.fromisoformat(stored) == WHEN
    typed = state.get(when)
    assert isinstance(typed, datetime)
    assert typed == WHEN
    state.set(when, "2024-05-06T09:08:09+02:00")
    assert state.get(when) == WHEN


def test_typed_int_key_lax_coercion() -> None:
    state = State()
    count = Key("count", int)
    state.set(count, "5")
    assert state.get("count") == 5
    assert type(state.get("count")) is int
    state.set(count, 6.0)
    assert type(state.get("count")) is int
    with pytest.raises(SchemaError, match="'count'"):
        state.set(count, 6.5)
    with pytest.raises(SchemaError, match="'count'"):
        state.set(count, "five")
    assert state.get(count) == 6


def test_typed_key_get_default_and_bad_stored_value() -> None:
    state = State()
    count = Key("count", int)
    assert state.get(count) is None
    assert state.get(count, 3) == 3
    state.set("count", "not a number")  # written by name: no declaration, no check
    with pytest.raises(SchemaError, match="'count'"):
        state.get(count)
    assert state.get("count") == "not a number"


def test_typed_key_container_types() -> None:
    state = State()
    tags = Key("tags", list[str])
    mode = Key("mode", Literal["voice", "chat"])
    state.set(tags, ["a", "b"])
    state.set(mode, "voice")
    assert state.get(tags) == ["a", "b"]
    with pytest.raises(SchemaError, match="'tags'"):
        state.set(tags, ["a", 1])
    with pytest.raises(SchemaError, match="'mode'"):
        state.set(mode, "email")
    assert state.pick("tags", "mode") == {"tags": ["a", "b"], "mode": "voice"}


def test_key_name_must_be_valid() -> None:
    with pytest.raises(InvalidKeyError):
        Key("bad key", int)
    with pytest.raises(InvalidKeyError):
        Key("a*", int)
    assert repr(Key("n", int)) == "Key('n', int)"


# -- declarations --------------------------------------------------------------------------------


def test_declare_validates_later_writes_and_coerces() -> None:
    state = State()
    state.declare("booking:party_size", int)
    assert state.set("booking:party_size", "5") == 1
    assert state.get("booking:party_size") == 5
    assert type(state.get("booking:party_size")) is int
    # The same value in a different spelling is not a change.
    assert state.set("booking:party_size", 5) == 1
    before = committed_view(state)
    with pytest.raises(SchemaError) as info:
        state.set("booking:party_size", "five")
    message = str(info.value)
    assert "'booking:party_size'" in message
    assert "int" in message
    assert "Input should be a valid integer" in message
    assert committed_view(state) == before
    # Undeclared keys are untouched.
    state.set("booking:party", "five")
    assert state.get("booking:party") == "five"


def test_declare_strict_str_refuses_int() -> None:
    state = State()
    state.declare("name", str)
    with pytest.raises(SchemaError, match="'name'"):
        state.set("name", 5)
    assert "name" not in state


def test_declare_pattern_matches_any_run_of_characters() -> None:
    state = State()
    state.declare("*:result", str)
    state.set("verify:result", "ok")
    state.set("a:b:result", "ok")
    for key in ("verify:result", "a:b:result", "x:result"):
        with pytest.raises(SchemaError, match=f"'{key}'"):
            state.set(key, 42)
    # Keys that do not match the pattern are free.
    state.set("result", 1)
    state.set("verify:results", 2)
    state.set("verify:result:extra", 3)
    assert state.pick("verify:result", "a:b:result", "result") == {
        "verify:result": "ok",
        "a:b:result": "ok",
        "result": 1,
    }


def test_declared_model_type() -> None:
    state = State()
    state.declare("booking", Booking)
    state.set("booking", Booking(name="Bo", party=2))
    assert state.get("booking") == {"name": "Bo", "party": 2, "day": None}
    state.set("booking", {"name": "Bo", "party": "3", "day": "2024-01-02"})
    assert state.get("booking") == {"name": "Bo", "party": 3, "day": "2024-01-02"}
    assert state.get(BOOKING) == Booking(name="Bo", party=3, day=date(2024, 1, 2))
    with pytest.raises(SchemaError, match="'booking'"):
        state.set("booking", {"party": 3})
    assert state.get("booking")["party"] == 3


def test_declare_a_typed_key_governs_writes_by_name() -> None:
    state = State()
    state.declare(BOOKING)
    with pytest.raises(SchemaError, match="'booking'"):
        state.set("booking", {"name": "x"})
    state.set("booking", {"name": "x", "party": "1"})
    assert state.get("booking") == {"name": "x", "party": 1, "day": None}


def test_declared_datetime_key_stores_iso_string_from_string() -> None:
    state = State()
    state.declare("meeting:at", datetime)
    state.set("meeting:at", "2024-05-06T09:08:09+02:00")
    stored = state.get("meeting:at")
    assert isinstance(stored, str)
    assert datetime.fromisoformat(stored) == WHEN
    assert state.get(Key("meeting:at", datetime)) == WHEN
    with pytest.raises(SchemaError, match="'meeting:at'"):
        state.set("meeting:at", "next tuesday")


def test_declared_datetime_key_accepts_a_datetime_and_stores_iso_string() -> None:
    # BUG: the value is refused as "not JSON" (StateValueError) before the schema converts it.
    state = State()
    state.declare("meeting:at", datetime)
    state.set("meeting:at", WHEN)
    assert state.get("meeting:at") == WHEN_ISO
    assert state.get(Key("meeting:at", datetime)) == WHEN


def test_declare_validates_update_whole_batch() -> None:
    state = State()
    state.declare("n:*", int)
    state.set("n:a", 1)
    before = committed_view(state)
    with pytest.raises(SchemaError, match="'n:b'"):
        state.update({"n:a": 2, "free": "x", "n:b": "bee"})
    assert committed_view(state) == before
    state.update({"n:a": "2", "n:b": "3"})
    assert state.pick("n:a", "n:b") == {"n:a": 2, "n:b": 3}


def test_declare_validates_modify_and_rename() -> None:
    state = State()
    state.declare("n:*", int)
    state.set("n:a", 1)
    state.set("text", "hello")
    before = committed_view(state)
    with pytest.raises(SchemaError, match="'n:a'"):
        state.modify("n:a", 0, lambda v: "x")
    with pytest.raises(SchemaError, match="'n:moved'"):
        state.rename("text", "n:moved")
    assert committed_view(state) == before
    assert state.modify("n:a", 0, lambda v: str(v + 1)) == 2
    assert state.get("n:a") == 2


def test_declare_validates_writes_in_a_transaction_at_the_line() -> None:
    state = State()
    state.declare("n", int)
    with state.transaction() as tx:
        with pytest.raises(SchemaError, match="'n'"):
            state.set("n", "x")
        with pytest.raises(SchemaError, match="'n'"):
            tx.update({"n": [1]})
        tx.set("n", "7")
        assert state.get("n") == 7
        assert tx.get(Key("n", int)) == 7
        assert tx.status == "open"
    assert state.get("n") == 7
    assert type(state.get("n")) is int


def test_schema_error_in_transaction_rolls_back_when_uncaught() -> None:
    state = State()
    state.declare("n", int)
    state.set("n", 1)
    before = committed_view(state)

    def body(tx: Transaction) -> None:
        tx.set("other", 1)
        tx.set("n", "x")

    tx = state.transaction()
    with pytest.raises(SchemaError):
        run_in(tx, body)
    assert tx.status == "rolled_back"
    assert committed_view(state) == before


def test_typed_and_plain_reads_differ_only_in_form() -> None:
    state = State()
    state.declare("meeting:at", datetime)
    state.set("meeting:at", WHEN_ISO)
    assert state.get("meeting:at") == WHEN_ISO
    assert state.get(Key("meeting:at", datetime)) == WHEN
    assert dict(state.items()) == {"meeting:at": WHEN_ISO}


def test_declare_needs_a_type_for_a_name() -> None:
    state = State()
    with pytest.raises(TypeError, match="needs a type"):
        state.declare("n")
    state.set("n", "anything")
    assert state.get("n") == "anything"


@pytest.mark.parametrize("pattern", ["bad key", "", "a::b"])
def test_declare_rejects_invalid_patterns(pattern: str) -> None:
    state = State()
    with pytest.raises(InvalidKeyError):
        state.declare(pattern, int)


# -- specificity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("exact_first", [True, False])
def test_exact_key_beats_pattern(exact_first: bool) -> None:
    state = State()
    decls = [("verify:result", str), ("*:result", int)]
    for target, type_ in decls if exact_first else decls[::-1]:
        state.declare(target, type_)
    state.set("verify:result", "ok")
    with pytest.raises(SchemaError):
        state.set("verify:result", 5)
    state.set("other:result", 5)
    with pytest.raises(SchemaError):
        state.set("other:result", "ok")
    assert state.pick("verify:result", "other:result") == {
        "verify:result": "ok",
        "other:result": 5,
    }


@pytest.mark.parametrize("long_first", [True, False])
def test_longer_literal_pattern_beats_shorter(long_first: bool) -> None:
    state = State()
    decls = [("a:b:*", str), ("a:*", int)]
    for target, type_ in decls if long_first else decls[::-1]:
        state.declare(target, type_)
    state.set("a:b:c", "text")
    with pytest.raises(SchemaError, match="'a:b:c'"):
        state.set("a:b:c", 1)
    state.set("a:c", 1)
    with pytest.raises(SchemaError, match="'a:c'"):
        state.set("a:c", "text")


@pytest.mark.parametrize("long_first", [True, False])
def test_pattern_beats_catch_all(long_first: bool) -> None:
    state = State()
    decls = [("user:*", str), ("*", int)]
    for target, type_ in decls if long_first else decls[::-1]:
        state.declare(target, type_)
    state.set("user:name", "Ann")
    state.set("count", "3")
    assert state.get("count") == 3
    with pytest.raises(SchemaError):
        state.set("count", "three")
    with pytest.raises(SchemaError):
        state.set("user:name", 3)


@pytest.mark.parametrize(
    ("first", "second", "winner"),
    [
        pytest.param(("verify:*", int), ("*:result", str), str, id="str-later"),
        pytest.param(("*:result", str), ("verify:*", int), int, id="int-later"),
    ],
)
def test_tie_in_specificity_later_declaration_wins(
    first: tuple[str, type], second: tuple[str, type], winner: type
) -> None:
    state = State()
    state.declare(*first)
    state.declare(*second)
    good, bad = ("ok", 5) if winner is str else (5, "ok")
    state.set("verify:result", good)
    with pytest.raises(SchemaError, match="'verify:result'"):
        state.set("verify:result", bad)
    # Each declaration still governs its other keys.
    state.set("verify:x", 1)
    state.set("other:result", "ok")


def test_redeclaring_an_exact_key_later_wins() -> None:
    state = State()
    state.declare("n", int)
    state.declare("n", str)
    state.set("n", "text")
    with pytest.raises(SchemaError):
        state.set("n", 5)


# -- declaring over existing values --------------------------------------------------------------


def test_declare_over_non_matching_values_lists_them_and_declares_nothing() -> None:
    state = State()
    state.update({"a:result": "x", "b:result": "y", "c:result": 3, "d:other": "z"})
    before = committed_view(state)
    with pytest.raises(SchemaError) as info:
        state.declare("*:result", int)
    message = str(info.value)
    assert "'a:result'" in message
    assert "'b:result'" in message
    assert "'c:result'" not in message
    assert "'d:other'" not in message
    assert "2 stored value(s)" in message
    assert "valid integer" in message
    assert committed_view(state) == before
    # Nothing was declared: a non-int still goes in.
    state.set("e:result", "free")
    assert state.get("e:result") == "free"


def test_declare_over_matching_values_succeeds_and_governs_later_writes() -> None:
    state = State()
    state.update({"n:a": 1, "n:b": 2, "other": "x"})
    state.declare("n:*", int)
    with pytest.raises(SchemaError):
        state.set("n:a", "x")
    assert state.pick("n:a", "n:b") == {"n:a": 1, "n:b": 2}


def test_failed_declare_with_typed_key_declares_nothing() -> None:
    state = State()
    state.set("booking", {"name": "x"})
    with pytest.raises(SchemaError, match="'booking'"):
        state.declare(BOOKING)
    state.set("booking", {"still": "free"})
    assert state.get("booking") == {"still": "free"}


def test_schema_error_is_a_value_error() -> None:
    state = State()
    state.declare("n", int)
    with pytest.raises(ValueError, match="'n'"):
        state.set("n", "x")
