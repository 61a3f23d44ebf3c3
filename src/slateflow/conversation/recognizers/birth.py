"""Dates of birth as callers give them: "March 3rd, 1985", "the third of March nineteen
eighty-five", "3/3/85", "oh three, oh three, eighty-five", with self-corrections."""

from __future__ import annotations

import re
import time as _time
from collections.abc import Callable
from datetime import UTC
from datetime import date as _date
from datetime import datetime as _datetime
from datetime import tzinfo as _tzinfo

from .base import Recognition, Recognizer
from .calendar import month_date, normalise, numeric_date, year_tail
from .words import correction_segments

__all__ = ["date_of_birth"]

# Month, day and year said as numbers: "10 10 70" (ten ten seventy), "oh 3 , oh 3 , 85".
_SPOKEN_DIGITS = re.compile(
    r"(?:^| )(?:oh )?(\d{1,2}) (?:, )?(?:oh )?(\d{1,2}) (?:, )?"
    r"(\d{4}|(?:18|19|20) \d{2}|\d{2}|oh \d)(?= |$)"
)
_YEAR_ALONE = re.compile(r"(?:^|[ ,])(\d{4}|(?:18|19|20) \d{2}|(?:18|19|20) oh \d)(?= |$)")

# (year, month, day), any of them unknown, and how sure.
_Parts = tuple[int | None, int | None, int | None, float]


class _DateOfBirth(Recognizer):
    def __init__(
        self, now: Callable[[], float], tz: _tzinfo, day_first: bool | None, oldest: int
    ) -> None:
        self.now = now
        self.tz = tz
        self.day_first = day_first
        self.oldest = oldest

    def _parts(self, segment: str, today: _date) -> _Parts | None:
        raw = segment.lower().replace("\u2019", "'")
        numeric = numeric_date(raw, today, self.day_first, True)
        if numeric is False:
            return None
        if numeric is not None:
            if not numeric.year_said:
                return None  # "3/3" with no year: not a date of birth
            d = numeric.day
            return d.year, d.month, d.day, 0.9
        s = normalise(raw)
        named = month_date(s, today, True)
        if named is False:
            return None  # an impossible date ("February 29th, 1991")
        if named is not None:
            d = named.day
            if not named.year_said:
                return None, d.month, d.day, 0.9
            span = named.year_span or (0, 0)
            two_digit = len(s[span[0] : span[1]].replace(",", "").split()) == 1 and (
                len(s[span[0] : span[1]].replace(",", "").strip()) == 2
            )
            return d.year, d.month, d.day, 0.85 if two_digit else 0.9
        m = _SPOKEN_DIGITS.search(s)
        if m is not None:
            a, b = int(m.group(1)), int(m.group(2))
            year = year_tail(" " + m.group(3), 0, today, True)
            if year is None:
                return None
            if a == b or b > 12 >= a:
                month, day = a, b
            elif a > 12 >= b:
                month, day = b, a
            elif self.day_first is not None:
                month, day = (b, a) if self.day_first else (a, b)
            else:
                return None
            return year[0], month, day, 0.85
        m = _YEAR_ALONE.search(s)
        if m is not None:
            year = year_tail(" " + m.group(1), 0, today, False)
            if year is not None:
                return year[0], None, None, 0.9
        return None

    def recognize(self, text: str) -> Recognition | None:
        today = _datetime.fromtimestamp(self.now(), tz=self.tz).date()
        year: int | None = None
        month: int | None = None
        day: int | None = None
        confidence = 0.9
        segments = correction_segments(text)
        # Newest first: a correction ("no sorry, 1986") replaces only what it says again.
        for k, segment in enumerate(segments):
            parts = self._parts(segment, today)
            if parts is None:
                continue
            y, mo, d, sure = parts
            if year is None and y is not None:
                year = y
            if month is None and mo is not None:
                month, day = mo, d
            confidence = min(confidence, sure if k == 0 else min(sure, 0.85))
            if year is not None and month is not None:
                break
        if year is None or month is None or day is None:
            return None
        try:
            born = _date(year, month, day)
        except ValueError:
            return None
        if born > today or today.year - born.year > self.oldest:
            return None  # not born yet, or older than anyone living
        return Recognition(born.isoformat(), confidence)

    def describe(self) -> str:
        return "a date of birth"


def date_of_birth(
    now: Callable[[], float] | None = None,
    tz: _tzinfo = UTC,
    *,
    day_first: bool | None = None,
    oldest: int = 130,
) -> Recognizer:
    """A date of birth, as an ISO date string (``"1985-03-03"``).

    Reads what callers say: "March 3rd, 1985", "the third of March, nineteen eighty-five",
    "July fourth, seventy-six", "December twenty-fifth, two thousand one", "November 5th oh
    three", "3/3/1985", "03/03/85", "12/25/2001", "1985-03-03", and dates said as three numbers
    ("oh three, oh three, eighty-five", "ten ten seventy"). A correction replaces what it says
    again ("March 3rd, 1985, no sorry, 1986" is 3 March 1986).

    Unlike :func:`datetime`, a year is required, a two-digit year is the last such year not in
    the future ("85" is 1985, "03" 2003), and there is no reading of times or business hours.
    A date in the future, an impossible one ("February 29th, 1991") or one more than
    ``oldest`` years ago is not read. A numeric date whose day and month could be swapped
    ("05/11/2003") is read only with ``day_first`` (True: day first; False: US order).
    Confidence 0.9 with a four-digit year, 0.85 with two digits or numbers said alone, or
    when put together from a correction.
    """
    if day_first not in (None, True, False):
        raise ValueError(f"date_of_birth() day_first is True, False or None, got {day_first!r}")
    if type(oldest) is not int or oldest < 1:
        raise ValueError(f"date_of_birth() oldest is a number of years >= 1, got {oldest!r}")
    return _DateOfBirth(now if now is not None else _time.time, tz, day_first, oldest)
