"""Recognizers hear what callers say: spoken times and dates, a business-hours window for an
ambiguous meridiem, party sizes in words, yes/no idioms, hedges and questions back, and
self-corrections. (The labelled corpus is in test_spoken_corpus.py.)"""

from __future__ import annotations

from datetime import UTC
from datetime import datetime as _dt
from datetime import time as _time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slateflow.conversation import Recognition, datetime, party_size, yes_no

quick = settings(deadline=None, max_examples=150)
WEDNESDAY_10AM = _dt(2025, 6, 11, 10, 0, tzinfo=UTC).timestamp()
HOURS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve"]  # fmt: skip


def now() -> float:
    return WEDNESDAY_10AM


def heard(text: str, **options: object) -> dict[str, object] | None:
    found = datetime(now, **options).recognize(text)  # type: ignore[arg-type]
    return None if found is None else found.value


# -- yes / no ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["no problem", "why not", "I don't mind", "sure thing", "go ahead", "that works",
     "not a problem", "no worries", "yes please", "mm-hmm", "uh-huh", "sounds good"],
)  # fmt: skip
def test_idioms_that_mean_yes_are_yes_even_with_a_negation_word(text: str) -> None:
    assert yes_no().recognize(text) == Recognition(True, 0.9)


@pytest.mark.parametrize(
    "text",
    ["not really", "I'd rather not", "actually no", "yes... no, sorry", "no thanks",
     "I'm afraid not", "that doesn't work", "yeah, no"],
)  # fmt: skip
def test_refusals_are_no(text: str) -> None:
    assert yes_no().recognize(text) == Recognition(False, 0.9)


@pytest.mark.parametrize(
    "text",
    ["please", "can you wait please", "hold on", "wait", "hang on a sec", "maybe",
     "let me think", "is that with the terrace?", "is it with the terrace", "sure, but is it "
     "outside?", "I'm not sure", "I don't know", "right?", "could you book it please"],
)  # fmt: skip
def test_a_hedge_a_question_or_a_bare_please_is_not_an_answer(text: str) -> None:
    assert yes_no().recognize(text) is None


def test_an_answer_followed_by_a_question_of_its_own_is_read_less_surely() -> None:
    assert yes_no().recognize("Yes. Is there parking too?") == Recognition(True, 0.8)


@quick
@given(
    st.sampled_from(["yes", "sure", "okay", "no problem", "go ahead", "that works"]),
    st.sampled_from(["no, sorry", "actually no", "not really", "no wait"]),
    st.sampled_from(["", "uh, ", "um "]),
)
def test_a_yes_taken_back_is_never_read_as_yes(yes: str, no: str, filler: str) -> None:
    assert yes_no().recognize(f"{filler}{yes}... {no}") == Recognition(False, 0.9)


# -- times ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "time"),
    [
        ("half past seven", "19:30"), ("at eight", "20:00"), ("eight o'clock", "20:00"),
        ("quarter to eight", "19:45"), ("seven thirty", "19:30"), ("ten past eight", "20:10"),
        ("half seven", "19:30"), ("twenty to nine", "20:40"), ("seven oh five", "19:05"),
        ("7:30", "19:30"), ("around eight-ish", "20:00"), ("quarter of eight", "19:45"),
    ],
)  # fmt: skip
def test_spoken_times_without_am_or_pm_are_read_inside_business_hours(text: str, time: str) -> None:
    assert datetime(now).recognize(text) == Recognition(
        {"time": time, "inferred": ["meridiem"]}, 0.85
    )


@pytest.mark.parametrize(
    ("text", "time"),
    [
        ("noon", "12:00"), ("midnight", "00:00"), ("twelve noon", "12:00"), ("7pm", "19:00"),
        ("7:30 a.m.", "07:30"), ("19:30", "19:30"), ("07:30", "07:30"),
        ("eight in the morning", "08:00"), ("seven in the evening", "19:00"),
        ("two in the afternoon", "14:00"), ("half past nine pm", "21:30"),
    ],
)  # fmt: skip
def test_times_said_exactly_are_not_inferred(text: str, time: str) -> None:
    found = datetime(now).recognize(text)
    assert found is not None
    assert found.confidence == 0.9
    assert found.value["time"] == time
    assert "inferred" not in found.value


@pytest.mark.parametrize(
    ("hours", "text", "time"),
    [
        ((17, 23), "7:30", "19:30"),  # a dinner booking: the evening
        (("08:00", "20:00"), "7:30", "19:30"),  # 07:30 is before opening
        ((_time(8), _time(18)), "9:15", "09:15"),  # a clinic: the morning
        ((8, 18), "at three", "15:00"),
        ((22, 4), "at one", "01:00"),  # a night club: across midnight
    ],
)
def test_the_business_hours_window_decides_an_ambiguous_meridiem(
    hours: tuple[object, object], text: str, time: str
) -> None:
    value = heard(text, business_hours=hours)
    assert value is not None
    assert value["time"] == time
    assert value["inferred"] == ["meridiem"]


def test_a_window_that_cannot_decide_reads_the_time_with_low_confidence() -> None:
    found = datetime(now, business_hours=(6, 23)).recognize("at eight")  # 08:00 or 20:00
    assert found is not None
    assert found.confidence < 0.9
    assert found.value["inferred"] == ["meridiem"]


@pytest.mark.parametrize("hours", [(1, 1), (5,), (25, 3), ("7pm", 9), (True, 9), "9-17"])
def test_a_bad_business_hours_window_is_refused_with_the_reason(hours: object) -> None:
    with pytest.raises(ValueError, match="business_hours"):
        datetime(now, business_hours=hours)  # type: ignore[arg-type]


@quick
@given(st.integers(1, 12), st.integers(0, 59), st.sampled_from(["am", "pm", "a.m.", "p.m."]))
def test_any_time_with_am_or_pm_is_exact(hour: int, minute: int, meridiem: str) -> None:
    want = hour % 12 + (12 if meridiem.startswith("p") else 0)
    assert datetime(now).recognize(f"at {hour}:{minute:02d} {meridiem}") == Recognition(
        {"time": f"{want:02d}:{minute:02d}"}, 0.9
    )


@quick
@given(st.integers(1, 12), st.sampled_from(["half past", "quarter past", "quarter to"]))
def test_any_spoken_clock_phrase_lands_in_business_hours(hour: int, phrase: str) -> None:
    value = heard(f"{phrase} {HOURS[hour - 1]}")
    assert value is not None
    hh, mm = map(int, str(value["time"]).split(":"))
    assert 11 * 60 <= hh * 60 + mm < 23 * 60
    assert mm == {"half past": 30, "quarter past": 15, "quarter to": 45}[phrase]


def test_a_price_is_not_a_time_even_in_words() -> None:
    assert heard("about twenty dollars") is None
    assert heard("it's 12.50 euros") is None


def test_a_number_alone_is_a_time_only_when_asked_for_or_correcting_one() -> None:
    assert heard("eight") is None  # it may as well be a party size
    assert heard("uh, seven, no, eight", hour_alone=True) == {
        "time": "20:00",
        "inferred": ["meridiem"],
    }
    assert heard("at seven, no, eight") == {"time": "20:00", "inferred": ["meridiem"]}


# -- dates ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "date"),
    [
        ("tomorrow night", "2025-06-12"), ("this Saturday", "2025-06-14"),
        ("next Friday", "2025-06-13"), ("Friday week", "2025-06-20"),
        ("a week on Saturday", "2025-06-21"), ("the day after tomorrow", "2025-06-13"),
        ("June the fourteenth", "2025-06-14"), ("the twenty first of June", "2025-06-21"),
        ("in two days", "2025-06-13"), ("a week today", "2025-06-18"),
        ("Thursday, no, Friday", "2025-06-13"), ("tomorrow, no, the day after", "2025-06-13"),
    ],
)  # fmt: skip
def test_spoken_dates(text: str, date: str) -> None:
    value = heard(text)
    assert value is not None
    assert value["date"] == date


def test_the_nth_alone_infers_the_month_and_says_so() -> None:
    found = datetime(now).recognize("the 3rd")  # 3 June has passed: 3 July
    assert found == Recognition(
        {"date": "2025-07-03", "weekday": "thursday", "inferred": ["month"]}, 0.85
    )
    assert heard("on the 14th") == {"date": "2025-06-14", "weekday": "saturday",
                                      "inferred": ["month"]}  # fmt: skip


def test_a_weekday_and_a_day_of_the_month_that_disagree_are_not_trusted() -> None:
    found = datetime(now).recognize("Saturday the 15th")  # the 15th is a Sunday
    assert found is not None
    assert found.confidence < 0.9
    agreed = datetime(now).recognize("Saturday the 14th")
    assert agreed == Recognition({"date": "2025-06-14", "weekday": "saturday"}, 0.9)


def test_next_friday_at_8_is_a_date_and_an_evening_time() -> None:
    assert heard("next Friday at 8") == {
        "date": "2025-06-13",
        "weekday": "friday",
        "time": "20:00",
        "inferred": ["meridiem"],
    }


def test_the_last_correction_wins_and_keeps_the_rest() -> None:
    assert heard("Saturday at seven, no, eight") == {
        "date": "2025-06-14",
        "weekday": "saturday",
        "time": "20:00",
        "inferred": ["meridiem"],
    }
    assert heard("uh, Saturday, um, sorry, Sunday at half past seven") == {
        "date": "2025-06-15",
        "weekday": "sunday",
        "time": "19:30",
        "inferred": ["meridiem"],
    }


# -- party size -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("a table for four", 4), ("twelve of us", 12), ("just me", 1), ("me and my wife", 2),
        ("party of six", 6), ("myself and three friends", 4), ("four adults and two kids", 6),
        ("four, no, five people", 5), ("a table for 4 at 7:30", 4), ("half a dozen of us", 6),
    ],
)  # fmt: skip
def test_party_sizes_as_callers_say_them(text: str, size: int) -> None:
    found = party_size().recognize(text)
    assert found is not None
    assert found.value == size
    assert found.confidence >= 0.85


@pytest.mark.parametrize("text", ["a couple", "uh, seven, no, eight", "three"])
def test_a_turn_that_is_only_a_number_is_a_party_size_read_less_surely(text: str) -> None:
    found = party_size().recognize(text)
    assert found is not None
    assert found.confidence < 0.9


@pytest.mark.parametrize("text", ["for 7 pm", "at 8", "for two hours", "half past seven"])
def test_times_and_durations_are_not_party_sizes(text: str) -> None:
    assert party_size().recognize(text) is None


def test_a_range_is_the_larger_end_and_a_guess() -> None:
    assert party_size().recognize("between 6 and 8 people") == Recognition(8, 0.6)


@quick
@given(st.integers(1, 99))
def test_a_table_for_any_number_in_words_or_digits(n: int) -> None:
    words = _words(n)
    assert party_size().recognize(f"a table for {words} please") == Recognition(n, 0.9)
    assert party_size().recognize(f"we are {n} people") == Recognition(n, 0.9)


def _words(n: int) -> str:
    units = ["", *HOURS[:9]]
    teens = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
             "seventeen", "eighteen", "nineteen"]  # fmt: skip
    tens = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    if n < 10:
        return units[n]
    if n < 20:
        return teens[n - 10]
    return f"{tens[n // 10]} {units[n % 10]}".strip()
