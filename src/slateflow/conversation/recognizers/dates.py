"""Dates and times as callers say them: "half past seven", "next Friday at 8", "the 3rd".

The text is normalised first (fillers dropped, numbers and ordinals said in words turned into
digits, prices masked), then read by a few small patterns. A clock time said without am/pm
("7:30", "at eight") is ambiguous: a part of the day said with it decides ("eight tonight"),
else the business-hours window does, and the value says so (``"inferred": ["meridiem"]``).
"""

from __future__ import annotations

import re
import time as _time
from collections.abc import Callable
from datetime import UTC, timedelta
from datetime import date as _date
from datetime import datetime as _datetime
from datetime import time as _clock_time
from datetime import tzinfo as _tzinfo
from typing import Any

from .base import Recognition, Recognizer
from .calendar import WEEKDAYS, date_in, normalise
from .words import correction_segments

__all__ = ["datetime"]

_PARTS = ("morning", "lunchtime", "afternoon", "evening", "tonight", "night")

# -- times ----------------------------------------------------------------------------------

_NOT_TIME_AFTER = (
    r"(?! (?:people|persons|person|guests|of|adults|kids|children|minutes?|mins?|hours?|days?|"
    r"weeks?|nights?|months?|years?|percent|times|price|more|others|friends|th)\b)"
)
_MIN = r"(?:[:.h](\d{2})| ([0-5]\d)\b| oh (\d)\b)?"
_REL = re.compile(
    r"\b(?:a )?(quarter|half|\d{1,2})(?: minutes?)? (past|after|to|before|til|till|of) "
    r"(\d{1,2}|noon|midnight)\b"
)
_HALF = re.compile(r"\bhalf (\d{1,2})\b(?! (?:past|hours?|an|a|of|price|people|th)\b)")
_HM = re.compile(r"\b(\d{1,2})[:.h](\d{2})\b")
_SUFFIXED = re.compile(r"\b(\d{1,2})" + _MIN + r" (am|pm|oclock|ish)\b")
_CUE = re.compile(
    r"\b(?:at|around|about|by|after|before|till|until|from|say|approximately|roughly|say)"
    r"(?: (?:about|around|like|maybe|approximately|roughly|say))? (\d{1,2})"
    + _MIN
    + r"\b"
    + _NOT_TIME_AFTER
)
_SPOKEN = re.compile(r"\b(\d{1,2})(?: ([0-5]\d)| oh (\d))\b" + _NOT_TIME_AFTER)
# "at 1930", "1930 hours": a 24-hour time said as one number ("at 2025" is more likely a year:
# after a cue only on the quarter hours).
_MILITARY = re.compile(
    r"\b(?:(?:at|around|about|by|from) ([01]\d|2[0-3])(00|15|30|45)\b(?! \d)"
    r"|([01]\d|2[0-3])([0-5]\d) hours\b)"
)
_NAMED = re.compile(r"\b(?:12 )?(noon|midday|midnight)\b")
_WITH_PART = re.compile(
    r"\b(\d{1,2})" + _MIN + r" (?=(?:in the |at |this )?(?:morning|afternoon|evening|night)\b"
    r"|tonight\b|tomorrow (?:morning|afternoon|evening|night)\b)"
)
_AMPM_AFTER = re.compile(r" (am|pm)\b")
_PART = re.compile(
    r"\b(?:in the |this |tomorrow |at )?(morning|lunchtime|lunch|afternoon|evening|tonight|night)"
    r"\b"
)


def _zero(m: re.Match[str]) -> bool:
    """Whether the hour was said with a leading zero ("07:30": a 24-hour time)."""
    hour = m.group(1)
    return len(hour) == 2 and hour.startswith("0")


def _minutes(m: re.Match[str], first: int) -> int:
    for g in range(first, min(first + 3, m.re.groups + 1)):
        if m.group(g) is not None:
            return int(m.group(g))
    return 0


class _Clock:
    """A time as heard: hour 0-23 or 1-12 (``ambiguous``), minute, how it was said."""

    __slots__ = ("ambiguous", "end", "hour", "minute", "start")

    def __init__(self, hour: int, minute: int, ambiguous: bool, span: tuple[int, int]) -> None:
        self.hour = hour
        self.minute = minute
        self.ambiguous = ambiguous
        self.start, self.end = span


_REL_WORDS = frozenset(["past", "after", "to", "before", "til", "till", "of"])
_SUFFIX_WORDS = frozenset(["am", "pm", "oclock", "ish"])
_NAMED_WORDS = frozenset(["noon", "midday", "midnight"])


def _clock(s: str) -> _Clock | None:
    """The leftmost time said in normalised text ``s``."""
    found: list[tuple[int, int, _Clock]] = []

    def add(
        m: re.Match[str], hour: int, minute: int, meridiem: str | None, zero: bool = False
    ) -> None:
        if not (0 <= minute <= 59):
            return
        if meridiem is None:
            after = _AMPM_AFTER.match(s, m.end())
            meridiem = after.group(1) if after else None
        if meridiem in ("am", "pm"):
            if not 1 <= hour <= 12:
                return
            hour = hour % 12 + (12 if meridiem == "pm" else 0)
            found.append((m.start(), -len(m.group()), _Clock(hour, minute, False, m.span())))
            return
        if not 0 <= hour <= 23:
            return
        # "07:30" and "19:30" say which; "7:30" and "at 8" do not.
        ambiguous = 1 <= hour <= 12 and not zero
        found.append((m.start(), -len(m.group()), _Clock(hour, minute, ambiguous, m.span())))

    words = set(s.split())
    digits = any(w[0].isdigit() for w in words)
    m = _REL.search(s) if digits and not words.isdisjoint(_REL_WORDS) else None
    if m:
        q, direction, target = m.group(1), m.group(2), m.group(3)
        mins = 15 if q == "quarter" else 30 if q == "half" else int(q)
        hour = 12 if target == "noon" else 0 if target == "midnight" else int(target)
        if direction in ("to", "before", "til", "till", "of") and mins < 60 and q != "half":
            hour, mins = (hour - 1) % 24 if hour else 23, 60 - mins
            if hour == 0 and target != "midnight":
                hour = 12
            add(m, hour, mins, "pm" if target == "noon" else None)
        elif direction in ("past", "after") and mins < 60:
            add(m, hour, mins, "pm" if target == "noon" else None)
    if not digits:
        m = _NAMED.search(s) if not words.isdisjoint(_NAMED_WORDS) else None
        if m is None:
            return None
        return _Clock(0 if m.group(1) == "midnight" else 12, 0, False, m.span())
    m = _HALF.search(s) if "half" in words else None
    if m:
        add(m, int(m.group(1)), 30, None)
    m = _SUFFIXED.search(s) if not words.isdisjoint(_SUFFIX_WORDS) else None
    if m:
        suffix = m.group(5)
        meridiem = suffix if suffix in ("am", "pm") else None
        add(m, int(m.group(1)), _minutes(m, 2), meridiem, _zero(m))
    for pattern in (_HM, _CUE, _SPOKEN, _WITH_PART):
        m = pattern.search(s)
        if m:
            add(m, int(m.group(1)), _minutes(m, 2), None, _zero(m))
    m = _MILITARY.search(s)
    if m:
        hh, mm = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        add(m, int(hh), int(mm), None, zero=True)  # said as 24-hour: never ambiguous
    m = _NAMED.search(s) if not words.isdisjoint(_NAMED_WORDS) else None
    if m:
        hour = 0 if m.group(1) == "midnight" else 12
        found.append((m.start(), -len(m.group()), _Clock(hour, 0, False, m.span())))
    if not found:
        return None
    return min(found, key=lambda f: (f[0], f[1]))[2]


_DAY_AFTER = re.compile(r"\bthe day (after|before)\b(?! tomorrow| yesterday)")


# -- the recognizer -------------------------------------------------------------------------


_BARE = re.compile(r"(?:at |around |about |say )?(\d{1,2})(?:[:.h](\d{2})| ([0-5]\d)| oh (\d))?")
_BARE_REST = frozenset({
    "then", "please", "instead", "i", "mean", "sorry", "no", "actually", "make", "it", "that",
    "rather",
})  # fmt: skip


def _bare_hour(segment: str) -> tuple[_Clock, float] | None:
    """A segment that is only a clock number ("eight", "uh, 7:30 then"), as a time."""
    s = normalise(segment.lower()).replace(",", " ")
    words = s.split()
    for i, word in enumerate(words):
        if word[0].isdigit():
            rest = " ".join(words[i:])
            m = _BARE.match(rest)
            if m is None:
                return None
            tail = rest[m.end() :].split()
            if any(w not in _BARE_REST for w in [*words[:i], *tail]) or words[:i].count("at") > 1:
                return None
            hour, minute = int(m.group(1)), _minutes(m, 2)
            if not (1 <= hour <= 12 and minute < 60):
                return None
            return _Clock(hour, minute, True, (0, 0)), 0.7
    return None


def _minute_of_day(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"datetime() business_hours {what} must be an hour or a time")
    if isinstance(value, int) and 0 <= value <= 24:
        return value * 60
    if isinstance(value, _clock_time):
        return value.hour * 60 + value.minute
    if isinstance(value, str):
        m = re.fullmatch(r"(\d{1,2}):(\d{2})", value.strip())
        if m and int(m.group(1)) <= 24 and int(m.group(2)) < 60:
            return int(m.group(1)) * 60 + int(m.group(2))
    raise ValueError(
        f"datetime() business_hours {what} must be an hour 0-24, a 'HH:MM' string or a "
        f"datetime.time, got {value!r}"
    )


def _fresh(found: Recognition | None) -> Recognition | None:
    """A copy of a reading whose value a caller may change (its lists too)."""
    if found is None:
        return None
    value = {k: list(v) if isinstance(v, list) else v for k, v in found.value.items()}
    return Recognition(value, found.confidence)


class _DateTime(Recognizer):
    def __init__(
        self,
        now: Callable[[], float],
        tz: _tzinfo,
        hours: tuple[int, int],
        alone: bool,
        day_first: bool | None,
    ) -> None:
        self.now = now
        self.tz = tz
        self.hours = hours
        self.alone = alone
        self.day_first = day_first
        # The last reading: the fields of one extractor (a date, a time) read the same turn
        # through this one recognizer, so it is read once.
        self._last: tuple[str, float, Recognition | None] | None = None

    def _inside(self, minute: int) -> bool:
        start, end = self.hours
        return start <= minute < end if start <= end else minute >= start or minute < end

    def _resolve(
        self, clock: _Clock, part: str | None, day: _date | None, now: _datetime
    ) -> tuple[int, bool, float]:
        """The 24-hour hour of a heard time, whether the meridiem was inferred, confidence."""
        hour = clock.hour
        if not clock.ambiguous:
            return hour, False, 0.9
        if part is not None:
            if part == "morning":
                return hour % 12, False, 0.9
            if part in ("lunchtime", "lunch"):
                return (hour + 12 if hour < 6 else hour), False, 0.9
            if part == "night" and hour < 5:
                return hour, False, 0.9  # "two at night"
            return hour % 12 + 12, False, 0.9
        am, pm = hour % 12, hour % 12 + 12
        inside = [h for h in (am, pm) if self._inside(h * 60 + clock.minute)]
        if len(inside) == 1:
            return inside[0], True, 0.85
        if len(inside) == 2 and (day is None or day == now.date()):
            later = [h for h in (am, pm) if h * 60 + clock.minute > now.hour * 60 + now.minute]
            if len(later) == 1:
                return later[0], True, 0.7
        return pm if inside else am, True, 0.6

    def _read(self, segment: str, today: _date, now: _datetime) -> dict[str, Any]:
        raw = segment.lower().replace("\u2019", "'")
        s = normalise(raw)
        found: dict[str, Any] = {}
        try:
            dated = date_in(raw, s, today, day_first=self.day_first)
        except OverflowError:  # "tomorrow" on 31 December 9999: a date cannot hold it
            dated = None
        day = dated.day if dated is not None else None
        if dated is not None and dated.year_span is not None:
            a, b = dated.year_span  # "March 3rd, 1985": the year is not a time
            s = s[:a] + " " * (b - a) + s[b:]
        part_m = _PART.search(s)
        part = part_m.group(1) if part_m is not None else None
        if part == "lunch":
            part = "lunchtime"
        clock = _clock(s)
        if dated is not None:
            found["date"] = dated.day.isoformat()
            found["weekday"] = WEEKDAYS[dated.day.weekday()]
            how = dated.how
            found["_confidence"] = {"exact": 0.9, "month": 0.85}.get(how, 0.6)
            if how != "exact":
                found["_inferred"] = ["month" if how == "month" else "date"]
        if clock is not None:
            hour, inferred, confidence = self._resolve(clock, part, day, now)
            found["time"] = f"{hour:02d}:{clock.minute:02d}"
            found["_time_confidence"] = confidence
            if inferred:
                found.setdefault("_inferred", []).append("meridiem")
        if part is not None:
            found["part_of_day"] = part
            if part == "tonight" and "date" not in found:
                found["date"] = today.isoformat()
                found["weekday"] = WEEKDAYS[today.weekday()]
        return found

    def recognize(self, text: str) -> Recognition | None:
        stamp = self.now()
        last = self._last
        if last is not None and last[0] == text and last[1] == stamp:
            found = last[2]
            # A copy: what a field picks out of the value must not change the next reading.
            return _fresh(found)
        found = self._recognize(text, stamp)
        self._last = (text, stamp, found)
        return _fresh(found)

    def _recognize(self, text: str, stamp: float) -> Recognition | None:
        now = _datetime.fromtimestamp(stamp, tz=self.tz)
        today = now.date()
        segments = correction_segments(text)
        merged: dict[str, Any] = {}
        # Oldest segment first, so what the caller corrected to wins.
        for segment in reversed(segments):
            found = self._read(segment, today, now)
            if "time" not in found and ("time" in merged or self.alone):
                # "at seven, no, eight": a bare number corrects the time said before it.
                bare = _bare_hour(segment)
                if bare is not None:
                    clock, confidence = bare
                    hour, inferred, sure = self._resolve(clock, found.get("part_of_day"), None, now)
                    found["time"] = f"{hour:02d}:{clock.minute:02d}"
                    before = merged.get("_time_confidence", 0.9) if "time" in merged else None
                    found["_time_confidence"] = min(sure, confidence if before is None else before)
                    if inferred:
                        found.setdefault("_inferred", []).append("meridiem")
            if "time" in found:
                merged.pop("_time_confidence", None)
                if "_inferred" in merged:
                    merged["_inferred"] = [x for x in merged["_inferred"] if x != "meridiem"]
            if "date" in found:
                merged.pop("_confidence", None)
                if "_inferred" in merged:
                    merged["_inferred"] = [x for x in merged["_inferred"] if x != "month"]
            if "date" not in found and "date" in merged:
                # "tomorrow, no, the day after": relative to the day just said.
                shift = _DAY_AFTER.search(segment.lower())
                if shift is not None:
                    moved = _date.fromisoformat(merged["date"]) + timedelta(
                        days=1 if shift.group(1) == "after" else -1
                    )
                    found["date"] = moved.isoformat()
                    found["weekday"] = WEEKDAYS[moved.weekday()]
            inferred = merged.get("_inferred", []) + found.pop("_inferred", [])
            merged.update(found)
            if inferred:
                merged["_inferred"] = inferred
            elif "_inferred" in merged:
                del merged["_inferred"]
        if not merged:
            return None
        confidence = min(merged.pop("_confidence", 0.9), merged.pop("_time_confidence", 0.9))
        inferred = merged.pop("_inferred", None)
        if not merged:
            return None
        if "time" not in merged and "part_of_day" in merged:
            confidence = min(confidence, 0.75)  # a part of the day is vaguer than "15:00"
        value: dict[str, Any] = {
            k: merged[k] for k in ("date", "weekday", "time", "part_of_day") if k in merged
        }
        if inferred:
            value["inferred"] = sorted(set(inferred))
        return Recognition(value, confidence)

    def describe(self) -> str:
        return "a date and/or time"


def datetime(
    now: Callable[[], float] | None = None,
    tz: _tzinfo = UTC,
    *,
    business_hours: tuple[int | str | _clock_time, int | str | _clock_time] = (11, 23),
    hour_alone: bool = False,
    day_first: bool | None = None,
) -> Recognizer:
    """A date and/or time: ``{"date": "2026-01-03", "weekday": "saturday", "time": "19:30",
    "part_of_day": "evening"}`` (the keys that were said).

    Reads what callers say: times ("19:30", "7pm", "half past seven", "quarter to eight",
    "ten past eight", "half seven" (UK), "seven thirty", "eight o'clock", "at eight", "noon",
    "midnight"), dates ("today", "tonight", "tomorrow night", "this Saturday", "next Friday",
    "Friday week", "the 3rd", "14 June", "June the 14th", "in two days", ISO dates) and parts
    of the day, with fillers and self-corrections ("Saturday at seven, no, eight" is Saturday
    at 20:00). A price ("$12.50", "12.50 euros") is not a time.

    A time said without am/pm is read with a part of the day said with it ("eight tonight"),
    else as the reading inside ``business_hours`` (default 11:00-23:00, a restaurant's day:
    "7:30" is 19:30, "11:30" is 11:30); the value then has ``"inferred": ["meridiem"]`` and
    confidence 0.85 (0.6-0.7 when the window cannot decide). "The 3rd" infers the month (the
    next 3rd: ``"inferred": ["month"]``, 0.85). Said exactly: 0.9; only a part of the day: 0.75.

    A number said alone ("eight") is a time only as a correction of one ("at seven, no,
    eight") or with ``hour_alone=True`` (0.7: for an extractor that runs while the time is
    asked, since "eight" may as well be a party size).

    Relative words count from ``now`` (seconds since the epoch) in time zone ``tz`` (the
    caller's or the business's; UTC by default): pass the session's clock, so tests control
    "today". A "next" weekday skips a week only when it is today ("next Saturday" on a
    Saturday); "next week Tuesday" (or "Tuesday next week") is the Tuesday of the next calendar
    week (weeks start on Monday), "the Monday after next" the Monday after the next one, "a
    week from Friday" and "two weeks from today" count from the day named.

    A year said with a date makes it that year's ("March 3rd, 1985", "June 14th, twenty
    twenty-six", "3/3/1985"), in the past too. A numeric date is read when its order is plain
    (14/6 is day first, 6/14 month first, 3/3 either way); one that could be either ("5/11")
    is read only with ``day_first`` (True: 5 November; False: US, 11 May), else not at all.
    A clause the caller rules out is not read: "not Monday, Tuesday" is Tuesday.
    """
    if not isinstance(business_hours, tuple) or len(business_hours) != 2:
        raise ValueError(f"datetime() business_hours is (opening, closing), got {business_hours!r}")
    window = (
        _minute_of_day(business_hours[0], "opening"),
        _minute_of_day(business_hours[1], "closing"),
    )
    if window[0] == window[1]:
        raise ValueError(f"datetime() business_hours is an empty window: {business_hours!r}")
    if day_first not in (None, True, False):
        raise ValueError(f"datetime() day_first is True, False or None, got {day_first!r}")
    return _DateTime(
        now if now is not None else _time.time, tz, window, bool(hour_alone), day_first
    )
