"""Calendar dates as callers say them, and the normalising every date and time reader shares.

The text is normalised first (fillers dropped, numbers and ordinals said in words turned into
digits, prices masked); :func:`date_in` then reads a date from it: "the 3rd", "14 June", "March
3rd, 1985", "3/3/1985", "next week Tuesday", "the Monday after next", "a week from Friday",
"two weeks from today". A year said with a date makes it that year's (in the past, too); a
numeric date whose day and month could be swapped ("5/11") is read only when told which comes
first.
"""

from __future__ import annotations

import contextlib
import re
from datetime import date as _date
from datetime import timedelta
from typing import Literal, NamedTuple

from .words import ORDINALS, SCALES, TENS, UNITS, cached, number_words

__all__ = [
    "MONTHS",
    "WEEKDAYS",
    "Dated",
    "date_in",
    "full_year",
    "month_date",
    "normalise",
    "numeric_date",
    "year_tail",
]

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTHS = {
    "january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "mar": 3, "april": 4,
    "apr": 4, "may": 5, "june": 6, "jun": 6, "july": 7, "jul": 7, "august": 8, "aug": 8,
    "september": 9, "sept": 9, "sep": 9, "october": 10, "oct": 10, "november": 11, "nov": 11,
    "december": 12, "dec": 12,
}  # fmt: skip
_FILLERS = frozenset(["uh", "um", "umm", "er", "erm", "uhm", "hmm", "ah", "eh"])

# -- normalising ----------------------------------------------------------------------------

ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
# 14/6, 6/14/2025, 03.03.1985, 3-3-85: "." and "-" only with a year (7.30 is a time).
NUMERIC_DATE = re.compile(
    r"\b(\d{1,2})(?:/(\d{1,2})(?:/(\d{4}|\d{2}))?|([.-])(\d{1,2})\4(\d{4}|\d{2}))\b"
)
_PRICE = re.compile(
    r"[$€£]\s?\d(?:[\d,]*\d)?(?:\.\d+)?|\d(?:[\d,]*\d)?(?:\.\d+)?\s?(?:[$€£]|"
    r"(?:usd|eur|gbp|dollars?|euros?|pounds?|bucks?|quid|cents|pence)\b)"
)
_MONEY_HINT = re.compile(r"[$€£]|usd|eur|gbp|dollar|euro|pound|buck|quid|cent|pence")
_MERIDIEM = re.compile(r"(?<=[\d\s])([ap])\.?\s?m\b\.?")
_OCLOCK = re.compile(r"\bo'?\s?clock\b")
_ISH = re.compile(r"\b([a-z]+|\d+)ish\b")
_TOKEN = re.compile(r"\d{1,2}[:.h]\d{2}(?!\d)|\d+(?:st|nd|rd|th)?|[a-z]+|,")
_NUMBERISH = frozenset(UNITS) | frozenset(TENS) | frozenset(SCALES) | {"a"}
_PICK_AFTER = frozenset({"one", "ones"})


@cached
def normalise(segment: str) -> str:
    """The segment as space-separated tokens: numbers in digits, ordinals as "3th"."""
    s = ISO_DATE.sub(" ", segment) if "-" in segment else segment
    s = NUMERIC_DATE.sub(" ", s) if ("/" in s or "." in s or "-" in s) else s
    priced = _MONEY_HINT.search(s) is not None
    s = _PRICE.sub(" price ", s) if priced else s
    s = _MERIDIEM.sub(lambda m: f" {m.group(1)}m ", s)
    s = _OCLOCK.sub(" oclock ", s).replace("half a dozen", "6")
    if "@" in s:
        s = s.replace("@", " at ")  # chat: "tomorrow @ 8"
    if "tonite" in s:
        s = s.replace("tonite", "tonight")
    if "ish" in s:
        s = _ISH.sub(r"\1 ish", s)  # "eightish" as "eight ish"
    toks = _TOKEN.findall(s)
    out: list[str] = []
    i, n = 0, len(toks)
    while i < n:
        tok = toks[i]
        if tok in _FILLERS:
            i += 1
            continue
        nxt = toks[i + 1] if i + 1 < n else ""
        if tok in TENS and nxt in ORDINALS and ORDINALS[nxt] < 10:
            out.append(f"{TENS[tok] + ORDINALS[nxt]}th")  # "twenty first"
            i += 2
            continue
        if tok in ORDINALS or (tok[:1].isdigit() and tok[-2:] in ("st", "nd", "rd", "th")):
            out.append(f"{ORDINALS[tok]}th" if tok in ORDINALS else tok)
            if nxt in _PICK_AFTER:
                out.append(nxt)  # "the second one": a pick from a list, not the number one
                i += 1
            i += 1
            continue
        if tok in _NUMBERISH and not (tok == "a" and nxt == "quarter"):
            words = number_words(toks, i)
            if words is not None:
                out.append(str(words[0]))
                i += words[1]
                continue
        out.append(tok)
        i += 1
    # Prices said in words ("twenty dollars") are masked once the numbers are digits.
    joined = " ".join(out)
    return _PRICE.sub(" price ", joined) if priced else joined


# -- years ----------------------------------------------------------------------------------

# After a day and month: "1985", "19 85" (nineteen eighty-five), "19 oh 5", and with
# two-digit years allowed, "85", "'85" and "oh 3".
_YEAR_TAIL = re.compile(
    r"(?: ,)? (?:(\d{4})|(18|19|20) (\d{2})|(18|19|20) oh (\d)|(\d{2})|oh (\d))(?= |$)"
    r"(?! (?:am|pm|oclock|ish|hours?|minutes?)\b)"
)


def year_tail(s: str, at: int, today: _date, two_digit: bool) -> tuple[int, int] | None:
    """The year said right after position ``at`` of normalised text ``s``: (year, end), or
    None. A two-digit year (``two_digit``) is this century's unless that is in the future."""
    m = _YEAR_TAIL.match(s, at)
    if m is None:
        return None
    g = m.groups()
    if g[0] is not None:
        year = int(g[0])
        if not 1000 <= year <= 2999:
            return None
    elif g[1] is not None:
        year = int(g[1]) * 100 + int(g[2])
    elif g[3] is not None:
        year = int(g[3]) * 100 + int(g[4])
    elif not two_digit:
        return None
    else:
        yy = int(g[5] if g[5] is not None else g[6])
        year = 2000 + yy if 2000 + yy <= today.year else 1900 + yy
    return year, m.end()


def full_year(text: str, today: _date, two_digit: bool) -> int:
    """A numeric date's year as written: "85" is 1985 or 2085 as ``two_digit`` says (a date
    of birth: the last such year not in the future; else this century)."""
    y = int(text)
    if len(text) == 4:
        return y
    if two_digit:
        return 2000 + y if 2000 + y <= today.year else 1900 + y
    return 2000 + y


# -- dates ----------------------------------------------------------------------------------

_MONTH_WORDS = "|".join(sorted(MONTHS, key=len, reverse=True))
_DAY_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?(?: of)? ({_MONTH_WORDS})\b")
_MONTH_DAY = re.compile(rf"\b({_MONTH_WORDS})(?: the)? (\d{{1,2}})(?:st|nd|rd|th)?\b")
_THE_DAY = re.compile(
    r"\b(?:the|on)(?: ,)* (\d{1,2})(?:st|nd|rd|th)\b(?! (?:option|one|ones|choice|time|floor|"
    r"table|course|person|week|month|day|line|bottle|glass|seat|round|thing|item|dish|page|"
    r"place|slot|appointment|delivery)s?\b)"
)
_DAY_NAMES = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_WEEKDAY = re.compile(
    r"\b(?:(this coming|this|next|coming|on|a week on|a week from|a week next) )?"
    rf"({_DAY_NAMES})s?\b( week)?( after next)?"
)
# Which week a weekday is in: "next week Tuesday", "Tuesday next week", "the week after next".
_WHICH_WEEK = re.compile(r"\b(?:(?:the )?(week after next)|(next|this|the following) week)\b")
_WEEKS_FROM = re.compile(
    rf"\b(a|one|\d{{1,2}}) weeks? (?:from|on|after) (today|tomorrow|{_DAY_NAMES})\b"
)
_RELATIVE = re.compile(
    r"\b(?:(a|one) week (?:from )?(?=today|tomorrow))?(day after tomorrow|tomorrow|today|tonight|"
    r"tmrw|tomorow|tommorow|tommorrow|"
    r"yesterday|this (?:morning|afternoon|evening)|later today|in (\d{1,2}|a) (days?|weeks?))\b"
)
_TOMORROW = frozenset({"tomorrow", "tmrw", "tomorow", "tommorow", "tommorrow"})  # and chat's


def _next_date(today: _date, month: int, day: int) -> _date | None:
    """The next such date from today (a past one is next year's; 29 February the next leap
    year's: 8 years covers 2096 -> 2104)."""
    for year in range(today.year, today.year + 9):
        try:
            candidate = _date(year, month, day)
        except (ValueError, OverflowError):
            continue
        if candidate >= today:
            return candidate
    return None


def _day_of_month(today: _date, day: int) -> _date | None:
    """The next date with this day of the month (this month's if not past)."""
    year, month = today.year, today.month
    for _ in range(13):
        try:
            candidate = _date(year, month, day)
        except ValueError:
            candidate = None
        if candidate is not None and candidate >= today:
            return candidate
        month += 1
        if month > 12:
            year, month = year + 1, 1
    return None


class Dated(NamedTuple):
    """A date read: the date, where it was said, how sure ("exact", "month": the month was
    inferred; "conflict": what was said disagrees), and whether a year was said."""

    day: _date
    position: int
    how: str
    year_said: bool = False
    year_span: tuple[int, int] | None = None
    """Where the year was said in the normalised text (so it is not read as a time)."""


def numeric_date(
    raw: str, today: _date, day_first: bool | None, two_digit: bool
) -> Dated | Literal[False] | None:
    """A date written with digits; None when there is none, False when there is one that
    cannot be read (an impossible date, or one whose order is not known)."""
    m = ISO_DATE.search(raw) if "-" in raw else None
    if m:
        try:
            return Dated(
                _date(int(m.group(1)), int(m.group(2)), int(m.group(3))), -1, "exact", True
            )
        except ValueError:
            return False
    m = NUMERIC_DATE.search(raw) if ("/" in raw or "." in raw or "-" in raw) else None
    if m is None:
        return None
    a = int(m.group(1))
    b = int(m.group(2) if m.group(2) is not None else m.group(5))
    year = m.group(3) if m.group(2) is not None else m.group(6)
    if a == b or a > 12 >= b:
        day_month = (a, b)  # 3/3 either way; 14/6 is day first
    elif b > 12 >= a:
        day_month = (b, a)  # 6/14 month first
    elif day_first is not None and a <= 12 and b <= 12:
        day_month = (a, b) if day_first else (b, a)
    else:
        return False
    if year is None:
        found = _next_date(today, day_month[1], day_month[0])
        return Dated(found, -1, "exact") if found is not None else False
    try:
        found = _date(full_year(year, today, two_digit), day_month[1], day_month[0])
    except ValueError:
        return False
    return Dated(found, -1, "exact", True)


def month_date(s: str, today: _date, two_digit: bool) -> Dated | Literal[False] | None:
    """ "14 June", "June the 14th", with a year if one follows ("March 3rd, 1985")."""
    for pattern, day_group, month_group in ((_DAY_MONTH, 1, 2), (_MONTH_DAY, 2, 1)):
        m = pattern.search(s)
        if m is None:
            continue
        month, day = MONTHS[m.group(month_group)], int(m.group(day_group))
        year = year_tail(s, m.end(), today, two_digit)
        if year is not None:
            try:
                found = _date(year[0], month, day)
            except ValueError:
                return False  # "February 29th, 1991"
            return Dated(found, m.start(), "exact", True, (m.end(), year[1]))
        if pattern is _MONTH_DAY and s[m.end() : m.end() + 2][1:].isdigit():
            continue  # "may 4 7": not a date (a year would have been read above)
        upcoming = _next_date(today, month, day)
        return Dated(upcoming, m.start(), "exact") if upcoming is not None else False
    return None


def _weekday(s: str, today: _date, m: re.Match[str]) -> _date | None:
    """The date of a weekday said with what says which week."""
    which, name, week, after_next = m.group(1), m.group(2), m.group(3), m.group(4)
    index = WEEKDAYS.index(name)
    ahead = (index - today.weekday()) % 7
    week_m = _WHICH_WEEK.search(s)
    if week_m is not None and which not in ("a week on", "a week from", "a week next"):
        monday = today - timedelta(days=today.weekday())
        weeks = 2 if week_m.group(1) else 0 if week_m.group(2) == "this" else 1
        return monday + timedelta(days=7 * weeks + index)
    if ahead == 0 and which == "next":
        ahead = 7  # "Saturday" on a Saturday is today; "next Saturday" is not
    if after_next:
        ahead = (ahead or 7) + 7  # "Monday after next": the Monday after the next one
    if week or (which or "").startswith("a week"):
        ahead += 7  # "Friday week", "a week on Friday"
    return today + timedelta(days=ahead)


def _weeks_from(m: re.Match[str], today: _date) -> _date:
    n = 1 if m.group(1) in ("a", "one") else int(m.group(1))
    base = m.group(2)
    if base == "today":
        start = today
    elif base == "tomorrow":
        start = today + timedelta(days=1)
    else:
        start = today + timedelta(days=(WEEKDAYS.index(base) - today.weekday()) % 7)
    return start + timedelta(days=7 * n)


def date_in(
    raw: str,
    s: str,
    today: _date,
    *,
    day_first: bool | None = None,
    two_digit_years: bool = False,
) -> Dated | None:
    """The date said in ``raw`` (lower case) / ``s`` (its normalised form), or None."""
    numeric = numeric_date(raw, today, day_first, two_digit_years)
    if numeric is not None:
        return numeric or None
    words = set(s.split())
    if not words.isdisjoint(MONTHS):
        named = month_date(s, today, two_digit_years)
        if named is not None:
            return named or None
    candidates: list[tuple[int, _date, str]] = []
    m = _THE_DAY.search(s) if "the" in words or "on" in words else None
    if m:
        found = _day_of_month(today, int(m.group(1)))
        if found is not None:
            candidates.append((m.start(), found, "month"))
    m = _WEEKS_FROM.search(s) if "week" in s else None
    if m:
        with contextlib.suppress(OverflowError):
            return Dated(_weeks_from(m, today), m.start(), "exact")
    m = _RELATIVE.search(s)
    if m:
        word = m.group(2)
        delta = {"day after tomorrow": 2, "yesterday": -1}.get(word, 0)
        if word in _TOMORROW:
            delta = 1
        if m.group(3) is not None:
            n = 1 if m.group(3) == "a" else int(m.group(3))
            delta = n * (7 if m.group(4).startswith("week") else 1)
        if m.group(1) is not None:
            delta += 7  # "a week from today", "a week tomorrow"
        with contextlib.suppress(OverflowError):
            candidates.append((m.start(), today + timedelta(days=delta), "exact"))
    m = _WEEKDAY.search(s) if "day" in s else None
    if m:
        try:
            day = _weekday(s, today, m)
        except OverflowError:
            day = None
        if day is not None:
            index = WEEKDAYS.index(m.group(2))
            # "Saturday the 14th": the day of the month says which Saturday.
            ordinal = [c for c in candidates if c[2] == "month"]
            if ordinal:
                said = ordinal[0][1]
                if said.weekday() == index:
                    return Dated(said, min(m.start(), ordinal[0][0]), "exact")
                return Dated(day, min(m.start(), ordinal[0][0]), "conflict")
            how = "conflict" if day < today else "exact"  # "this week Monday" on a Wednesday
            candidates.append((m.start(), day, how))
    if not candidates:
        return None
    position, day, how = min(candidates, key=lambda c: c[0])
    return Dated(day, position, how)
