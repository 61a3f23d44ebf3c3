"""Identity checks and picks from an offered list: the secret path of extraction, dates of birth,
choice() against the State, identity values masked however they are said, and the retry shapes
(a reset that clears the answers, failure and entry counts, the active step) a phone agent
needs."""

from __future__ import annotations

from datetime import UTC
from datetime import datetime as _dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builders import conversation_on
from slateflow import (
    Flow,
    State,
    Step,
    active,
    captured,
    entered,
    failed,
    is_set,
    is_true,
    reset,
)
from slateflow.conversation import (
    BIRTH_DATE,
    CARD_DIGITS,
    MEMBER_ID,
    Extract,
    choice,
    date_of_birth,
    keep_known,
    redact,
    regex,
)
from slateflow.errors import ExtractDefinitionError, FlowDefinitionError, UsageError
from slateflow.flow import FlowRunner

pytestmark = pytest.mark.anyio

NOW = _dt(2025, 6, 11, 10, 0, tzinfo=UTC).timestamp()  # Wednesday 11 June 2025
SLOTS = [
    {"date": "2025-06-17", "time": "09:00"},
    {"date": "2025-06-17", "time": "15:15"},
    {"date": "2025-06-19", "time": "11:30"},
]


def identity() -> Any:
    return (
        Extract("patient")
        .field("dob", date_of_birth(lambda: NOW), secret=True)
        .field("phone", regex(r"\b\d{3}[ -]?\d{3}[ -]?\d{4}\b"), secret=True)
        .build()
    )


# -- the secret path -------------------------------------------------------------------------


async def test_a_secret_field_reads_the_words_as_said_and_masks_them_everywhere() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        extractor = identity()
        conversation.add_extractor(extractor)
        await conversation.user_turn(
            "It's Ann Lee, born March third nineteen eighty-five, call me on 555 123 4567"
        )
        said = conversation.transcript[-1].text
        assert "1985" not in said
        assert "eighty-five" not in said
        assert "4567" not in said
        assert "[redacted dob]" in said
        assert "Ann Lee" in said  # only what the fields read is masked
        # The lookup can use the values: the default redactor masked the phone number first,
        # but the secret path read the turn as said.
        assert state.get("patient:dob") == "1985-03-03"
        assert state.get("patient:phone") == "555 123 4567"
        assert state.provenance("patient:dob").source == "extraction"
        assert state.is_secret("patient:dob")
        assert "1985" not in repr(state.snapshot(redact=True))
        assert all("1985" not in str(r) for r in extractor.history)


async def test_a_secret_field_follows_its_promotion_rule() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        asked = is_true("asked")
        conversation.add_extractor(
            Extract("p")
            .field("dob", date_of_birth(lambda: NOW), keep_known().accept_when(asked), secret=True)
            .build()
        )
        await conversation.user_turn("I was born on July 4th, 1976")
        assert "p:dob" not in state  # not accepted yet: still masked in the transcript
        assert "1976" not in conversation.transcript[-1].text
        state.set("asked", True)
        await conversation.user_turn("July 4th, 1976")
        assert state.get("p:dob") == "1976-07-04"


async def test_a_cancelled_turn_writes_no_secret() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        conversation.add_extractor(identity())

        def boom(text: str) -> str:
            raise RuntimeError("the redactor broke")

        conversation.redact = boom
        with pytest.raises(RuntimeError):
            await conversation.user_turn("born March 3rd, 1985")
        assert "patient:dob" not in state


def test_secret_must_be_a_bool() -> None:
    with pytest.raises(ExtractDefinitionError, match="secret is True or False"):
        Extract("p").field("dob", date_of_birth(), secret="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "mask"),
    [
        ("My date of birth is March 3rd, 1985", BIRTH_DATE),
        ("born on the third of March nineteen eighty five", BIRTH_DATE),
        ("it's 03/03/1985", BIRTH_DATE),
        ("DOB oh three oh three eighty five", BIRTH_DATE),
        ("my member ID is X Y Z one two three four five", MEMBER_ID),
        ("policy number AB12345678", MEMBER_ID),
        ("the last four digits are four four two one", CARD_DIGITS),
        ("card ending in 4421", CARD_DIGITS),
    ],
)
def test_identity_values_are_masked_when_spoken(text: str, mask: str) -> None:
    assert mask in redact(text)


@pytest.mark.parametrize(
    "text",
    [
        "can I come in on March 3rd, 2025",
        "a table for 4 at 7:30 on June 14th",
        "I was born in 1985",
        "my ID is on the card",
    ],
)
def test_appointments_and_plain_talk_stay(text: str) -> None:
    assert redact(text) == text


# -- dates of birth --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "born"),
    [
        ("March 3rd, 1985", "1985-03-03"),
        ("nineteen eighty-five, March the third", None),  # a year first is not read
        ("3/3/85", "1985-03-03"),
        ("the fifth of November, two thousand and three", "2003-11-05"),
        ("January 1st 2030", None),  # in the future
        ("February 29th, 1991", None),  # no such day
        ("05/11/2003", None),  # day and month could be swapped
        ("at 3 pm tomorrow", None),
    ],
)
def test_date_of_birth_reads_years_however_said_and_never_a_future_day(
    text: str, born: str | None
) -> None:
    found = date_of_birth(lambda: NOW).recognize(text)
    assert (found.value if found else None) == born


def test_a_date_of_birth_order_is_read_when_told() -> None:
    assert date_of_birth(lambda: NOW, day_first=True).recognize("05/11/2003").value == "2003-11-05"
    assert date_of_birth(lambda: NOW, day_first=False).recognize("05/11/2003").value == "2003-05-11"


@given(st.dates(min_value=_dt(1900, 1, 1).date(), max_value=_dt(2025, 6, 11).date()))
def test_any_past_date_of_birth_said_with_its_month_name_is_read_back(day: Any) -> None:
    said = f"{day.strftime('%B')} {day.day}, {day.year}"
    found = date_of_birth(lambda: NOW).recognize(said)
    assert found is not None
    assert found.value == day.isoformat()


# -- choice ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "picked"),
    [
        ("the second one", 1),
        ("the last one", 2),
        ("the first one, no wait, the second", 1),
        ("not the first one, the third", 2),
        ("the 3:15", 1),
        ("Thursday's fine", 2),
        ("Tuesday's fine", None),  # two Tuesday slots: ask which
        ("the earlier one on Tuesday", 0),
        ("neither", "none"),
        ("do you have anything on Friday?", None),
    ],
)
def test_choice_reads_a_pick_against_the_options_in_the_state(
    text: str, picked: int | str | None
) -> None:
    state = State()
    state.set("slots:result", SLOTS)
    found = choice("slots:result", now=lambda: NOW).recognize_in(text, state)
    want = SLOTS[picked] if isinstance(picked, int) else picked
    assert (found.value if found else None) == want


def test_choice_with_nothing_offered_picks_nothing() -> None:
    assert choice("slots:result").recognize_in("the second one", State()) is None


def test_choice_over_a_key_needs_the_state() -> None:
    with pytest.raises(UsageError, match="recognize_in"):
        choice("slots:result").recognize("the second one")


async def test_an_extractor_picks_from_what_the_state_offers() -> None:
    state = State()
    async with conversation_on(state) as conversation:
        conversation.add_extractor(
            Extract("pick").field("slot", choice("slots:result", now=lambda: NOW)).build()
        )
        state.set("slots:result", SLOTS)
        await conversation.user_turn("uh, the 11:30 on Thursday please")
        assert state.get("pick:slot") == SLOTS[2]


# -- retry shapes ----------------------------------------------------------------------------


def identify_flow() -> Flow:
    return Flow(
        "identify",
        [
            Step("ask", done=captured("p:name", "p:dob"), summary="confirm who is calling"),
            Step("lookup", after=["ask"], done=is_set("find:result")),
            Step("handoff", gate=failed("find", times=2), ends=True, done=is_true("moved")),
        ],
        constraints=[reset("ask", clear=["p:*"]).when(failed("find"))],
    )


def test_a_reset_clears_the_answers_so_the_step_asks_again() -> None:
    state = State()
    runner = FlowRunner(identify_flow(), state)
    state.update({"p:name": "Ann", "p:dob": "1985-03-03"})
    assert runner.active_steps == ["lookup"]
    state.update({"find:status": "error", "find:failures": 1})
    assert runner.active_steps == ["ask"]  # not passed straight through on the old answers
    assert state.keys("p:") == []
    state.update({"p:name": "Ann", "p:dob": "1985-03-04"})
    state.set("find:status", "running")
    state.update({"find:status": "error", "find:failures": 2})
    assert runner.active_steps == ["handoff"]


def test_retry_shapes_round_trip_as_json() -> None:
    flow = identify_flow()
    assert Flow.from_json(flow.to_json()) == flow
    data = flow.to_json()["flow"]
    assert data["constraints"][0]["clear"] == ["p:*"]
    assert data["steps"][2]["gate"] == {"op": "failed", "name": "find", "times": 2}
    for guard in (entered("ask", times=3), active("ask", "identify"), failed("find", 2)):
        again = Flow.from_json(Flow("g", [Step("s", done=guard)]).to_json()).steps[0].done
        assert again == guard


def test_entered_counts_each_time_a_step_is_entered() -> None:
    flow = Flow(
        "retry",
        [
            Step("ask", done=is_set("answer")),
            Step("escalate", gate=entered("ask", times=2), ends=True, done=is_true("moved")),
        ],
        constraints=[reset("ask", clear=["answer"]).when(is_true("wrong"))],
    )
    state = State()
    runner = FlowRunner(flow, state)
    state.set("answer", "x")
    state.set("wrong", True)  # re-opened, entered a second time
    assert runner.active_steps == ["escalate"]


def test_active_is_read_from_the_state_for_promotion_rules() -> None:
    state = State()
    FlowRunner(identify_flow(), state)
    assert active("ask").evaluate(state)
    assert active("ask", flow="identify").evaluate(state)
    assert not active("lookup").evaluate(state)


@pytest.mark.parametrize("bad", ["", "*", "a*b", 3])
def test_reset_clear_takes_keys_or_prefixes(bad: Any) -> None:
    with pytest.raises(FlowDefinitionError, match="clear"):
        reset("ask", clear=[bad])


def test_an_entered_guard_naming_no_step_is_reported() -> None:
    flow = Flow("f", [Step("a", done=entered("nowhere", times=2))])
    with pytest.raises(FlowDefinitionError, match=r"reads entered\('nowhere'\)"):
        flow.build()
