"""Recognizers, redaction, extractors and promotion rules: table-driven cases a voice agent
relies on (negation, money formats, relative dates, card numbers, corrections)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slateflow import Flow, ManualClock, State, Step, captured
from slateflow.conversation import (
    Extract,
    datetime,
    fuzzy,
    integer,
    integer_near,
    keep_known,
    luhn_valid,
    money,
    non_empty,
    one_of,
    overwrite,
    redact,
    regex,
    true_only,
    yes_no,
)
from slateflow.errors import ExtractDefinitionError
from slateflow.flow import FlowRunner

THURSDAY = ManualClock()  # 2026-01-01 00:00 UTC, a Thursday


@pytest.mark.parametrize(
    ("text", "value", "confidence"),
    [
        ("a table for 4", 4, 0.95),
        ("1,200 please", 1200, 0.95),
        ("a table for four", 4, 0.85),
        ("twenty one of us", 21, 0.85),
        ("a dozen", 12, 0.85),
        ("one hundred and five", 105, 0.85),
        ("two thousand", 2000, 0.85),
        ("three then 7", 3, 0.85),
    ],
)
def test_integer(text: str, value: int, confidence: float) -> None:
    assert integer().recognize(text) == (value, confidence)


@pytest.mark.parametrize("text", ["hello there", "", "a table please"])
def test_integer_hears_nothing(text: str) -> None:
    assert integer().recognize(text) is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a party of four", 4),
        ("four people at 7", 4),
        ("at 7, six people", 6),
        ("at 7 for twenty one guests", 21),
        ("at 7 please", None),
        ("four of them came back yesterday and then much later people", None),
    ],
)
def test_integer_near(text: str, value: int | None) -> None:
    found = integer_near(["people", "party", "guest"]).recognize(text)
    assert (found.value if found else None) == value


def test_integer_near_needs_words() -> None:
    with pytest.raises(ValueError, match="at least one word"):
        integer_near([])


@pytest.mark.parametrize(
    ("text", "amount", "currency"),
    [
        ("$12.50", "12.50", "USD"),
        ("it is €30", "30.00", "EUR"),
        ("£5", "5.00", "GBP"),
        ("1,200 dollars", "1200.00", "USD"),
        ("30 EUR", "30.00", "EUR"),
        ("twelve dollars fifty", "12.50", "USD"),
        ("fifty cents", "0.50", "USD"),
        ("five pounds", "5.00", "GBP"),
    ],
)
def test_money(text: str, amount: str, currency: str) -> None:
    found = money().recognize(text)
    assert found is not None
    assert found.value == {
        "amount": amount,
        "currency": currency,
        "minor": int(amount.replace(".", "")),
    }


def test_money_default_currency_reads_bare_numbers_only_when_asked() -> None:
    assert money().recognize("it came to 12.5") is None
    found = money("USD").recognize("it came to 12.5")
    assert found == ({"amount": "12.50", "currency": "USD", "minor": 1250}, 0.7)


@given(st.integers(0, 10**6), st.integers(0, 99))
def test_money_round_trips_dollars_and_cents(dollars: int, cents: int) -> None:
    found = money().recognize(f"that is ${dollars}.{cents:02d} in total")
    assert found is not None
    assert found.value["minor"] == dollars * 100 + cents
    assert found.value["amount"] == f"{dollars}.{cents:02d}"


def test_regex_one_of_and_fuzzy() -> None:
    assert regex(r"[A-Z]{2}\d{4}").recognize("ref ab1234 ok").value == "ab1234"  # ignore case
    assert regex(r"ref (\d+)", group=1).recognize("ref 42").value == "42"
    seats = one_of({"terrace": ["outside", "patio"], "window": ["by the window"]})
    assert seats.recognize("we'd like to sit by the window").value == "window"
    assert seats.recognize("The PATIO please").value == "terrace"
    assert one_of(["cat"]).recognize("the catalog") is None  # whole words only
    sizes = one_of(["large", "extra large"])
    assert sizes.recognize("an extra large one").value == "extra large"  # longest wins
    coffee = fuzzy(["cappuccino", "espresso"])
    assert coffee.recognize("a cappucino please").value == "cappuccino"
    assert coffee.recognize("a glass of water") is None
    with pytest.raises(ValueError, match="threshold"):
        fuzzy(["a"], threshold=0)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("yes please", True),
        ("yeah sure", True),
        ("that's correct", True),
        ("go ahead", True),
        ("no", False),
        ("nope", False),
        ("yes, no wait", False),
        ("sure... actually no", False),
        ("not really", False),
        ("I don't think so", False),
        ("I don\u2019t think so", False),
        ("hmm, let me see", None),
    ],
)
def test_yes_no_with_negation_winning(text: str, value: bool | None) -> None:
    found = yes_no().recognize(text)
    assert (found.value if found else None) is value


@pytest.mark.parametrize(
    ("text", "expected", "confidence"),
    [
        ("today", {"date": "2026-01-01", "weekday": "thursday"}, 0.9),
        (
            "tonight",
            {"date": "2026-01-01", "weekday": "thursday", "part_of_day": "tonight"},
            0.75,
        ),
        ("tomorrow", {"date": "2026-01-02", "weekday": "friday"}, 0.9),
        ("the day after tomorrow", {"date": "2026-01-03", "weekday": "saturday"}, 0.9),
        (
            "tomorrow afternoon",
            {"date": "2026-01-02", "weekday": "friday", "part_of_day": "afternoon"},
            0.75,
        ),
        ("Saturday at 19:30", {"date": "2026-01-03", "weekday": "saturday", "time": "19:30"}, 0.9),
        ("thursday", {"date": "2026-01-01", "weekday": "thursday"}, 0.9),  # today
        ("next thursday", {"date": "2026-01-08", "weekday": "thursday"}, 0.9),
        ("14 June at 7pm", {"date": "2026-06-14", "weekday": "sunday", "time": "19:00"}, 0.9),
        ("June 14th", {"date": "2026-06-14", "weekday": "sunday"}, 0.9),
        ("2026-03-02", {"date": "2026-03-02", "weekday": "monday"}, 0.9),
        ("at 7.30", {"time": "19:30", "inferred": ["meridiem"]}, 0.85),  # business hours
        ("7:30 am", {"time": "07:30"}, 0.9),
        ("12am", {"time": "00:00"}, 0.9),
        ("12pm", {"time": "12:00"}, 0.9),
        ("in the evening", {"part_of_day": "evening"}, 0.75),
    ],
)
def test_datetime_relative_to_the_clock(
    text: str, expected: dict[str, Any], confidence: float
) -> None:
    assert datetime(THURSDAY).recognize(text) == (expected, confidence)


def test_datetime_edge_cases() -> None:
    assert datetime(THURSDAY).recognize("2026-02-30") is None  # no such date
    assert datetime(THURSDAY).recognize("nothing about time") is None
    later = ManualClock(start=THURSDAY.time() + 200 * 86400)  # 2026-07-20
    assert datetime(later).recognize("14 June").value["date"] == "2027-06-14"  # rolls on
    assert datetime(THURSDAY).pick("time").recognize("Saturday") is None
    assert datetime(THURSDAY).pick("weekday").map(str.upper).recognize("friday").value == "FRIDAY"


@pytest.mark.parametrize(
    ("text", "out"),
    [
        ("card 4111 1111 1111 1111 thanks", "card [card ending 1111] thanks"),
        ("5555-5555-5555-4444", "[card ending 4444]"),
        ("card 4111 1111 1111 1112", "card [redacted number]"),  # fails Luhn
        ("call 020 7946 0018", "call [redacted number]"),
        (
            "on 2026-01-03 at 19:30 for 4, pin 1234",
            "on 2026-01-03 at 19:30 for 4, pin [redacted security code]",
        ),
    ],
)
def test_redact(text: str, out: str) -> None:
    assert redact(text) == out


def test_redact_custom_patterns_first_and_bad_input() -> None:
    assert redact("ref AB-1234567", [r"AB-\d+"]) == "ref [redacted]"
    assert redact("ref AB-1234567", [re.compile(r"AB-\d+")]) == "ref [redacted]"
    with pytest.raises(TypeError):
        redact(None)  # type: ignore[arg-type]
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")
    assert not luhn_valid("41a1")


@given(st.text(alphabet="0123456789 -abc", max_size=60))
def test_redact_leaves_no_card_and_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once
    for run in re.findall(r"\d(?:[ -]?\d)*", once):
        digits = re.sub(r"\D", "", run)
        assert not (13 <= len(digits) <= 19 and luhn_valid(digits))


def booking() -> Any:
    return (
        Extract("booking")
        .field("when", datetime(THURSDAY).pick("weekday"))
        .field("party_size", integer_near(["people", "us"]), overwrite())
        .field_to("confirmed", "booking:confirmed", yes_no(), true_only())
        .validate(lambda v: (v["party_size"] or 0) <= 12, "at most 12 people")
        .build()
    )


def test_a_voice_style_sequence_of_turns() -> None:
    state = State()
    extractor = booking()
    first = extractor.extract(state, "Saturday at 7pm for four people")
    assert first.written == {"booking:when": "saturday", "booking:party_size": 4}
    assert len({m.seq for m in state.journal.since(0)}) == 1  # one batch
    prov = state.provenance("booking:party_size")
    assert prov is not None
    assert (prov.source, prov.writer, prov.confidence) == ("extraction", "booking", 0.85)

    cursor = state.journal.cursor
    too_many = extractor.extract(state, "actually twenty people")
    assert [d.reason for d in too_many.decisions] == ["validation: at most 12 people"]
    assert state.journal.cursor == cursor  # nothing written

    extractor.extract(state, "make it five of us")
    assert state.get("booking:party_size") == 5
    again = extractor.extract(state, "Sunday then")  # keep_known: the first day stays
    assert again.decisions[0].reason == "keep_known: 'booking:when' is already known ('saturday')"
    extractor.extract(state, "yes, that's right")
    extractor.extract(state, "no wait")  # a confirmation is never undone
    assert state.get("booking:confirmed") is True
    assert len(extractor.history) == 6
    assert extractor.history[-1].complete


def test_promotion_rules() -> None:
    state = State()
    state.set("k", "old")
    assert keep_known().decide(state, "k", "new") == (
        False,
        "keep_known: 'k' is already known ('old')",
    )
    assert overwrite().decide(state, "k", "new") == (True, "overwrite: overwrites")
    assert overwrite().decide(state, "k", "old") == (False, "already known with this value")
    assert non_empty().decide(state, "k", "") == (False, "non_empty: '' is empty")
    assert true_only().decide(state, "k", False) == (False, "true_only: False is not true")
    rule = overwrite().accept_when(lambda v, s: v != "bad", "not bad").to("other")
    assert rule.target == "other"
    assert rule.decide(state, "k", "bad") == (False, "not accepted: not bad does not hold")


def test_window_and_definition_errors() -> None:
    state = State()
    extractor = (
        Extract("slot")
        .field("day", datetime(THURSDAY).pick("weekday"))
        .field("size", integer_near(["people"]))
        .window(2)
        .build()
    )
    extractor.extract(state, "Friday")
    result = extractor.extract(state, "for six people")
    assert state.pick("slot:day", "slot:size") == {"slot:day": "friday", "slot:size": 6}
    assert result.complete
    with pytest.raises(ExtractDefinitionError, match="no field"):
        Extract("x").build()
    with pytest.raises(ExtractDefinitionError, match="'x' field 'a': defined twice"):
        Extract("x").field("a", integer()).field("a", integer())
    with pytest.raises(ExtractDefinitionError, match="window"):
        Extract("x").window(0)
    with pytest.raises(ExtractDefinitionError, match="recognizer"):
        Extract("x").field("a", "int")  # type: ignore[arg-type]


def test_a_flow_advances_when_the_extractor_fills_its_slots() -> None:
    state = State()
    runner = FlowRunner(
        Flow("b", [Step("slot", done=captured("booking:when", "booking:party_size"))]), state
    )
    booking().extract(state, "Saturday for four people")
    assert runner.is_complete


def test_a_validation_that_raises_refuses_the_turn_and_says_why() -> None:
    state = State()
    extractor = (
        Extract("b")
        .field("size", integer_near(["people"]))
        .field("day", one_of(["monday", "friday"]))
        .validate(lambda v: v["size"] <= 12, "at most 12")  # None <= 12 raises
        .build()
    )
    result = extractor.extract(state, "on friday")
    assert [d.written for d in result.decisions] == [False]
    assert result.decisions[0].reason.startswith("validation: at most 12 (it raised TypeError")
    assert state.keys("b:") == []


def test_two_fields_cannot_write_one_key() -> None:
    with pytest.raises(ExtractDefinitionError, match="writes 'b:size' like field 'size'"):
        Extract("b").field("size", integer()).field_to("count", "b:size", integer())
