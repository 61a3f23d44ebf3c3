"""Recognizers: small, deterministic readers of what a caller said.

``recognizer.recognize(text)`` returns a :class:`Recognition` (``value``, ``confidence``) or None
when nothing is recognised. They read spoken-style text: numbers as digits or words ("four",
"twenty one"), money as "$12.50" or "twelve dollars fifty", yes/no with negation winning
("yes, no wait" is no), dates and times relative to a clock ("tomorrow afternoon").
"""

from __future__ import annotations

import re
import time as _time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, timedelta
from datetime import date as _date
from datetime import datetime as _datetime
from datetime import tzinfo as _tzinfo
from decimal import Decimal
from typing import Any, NamedTuple

from ..errors import SlateError

__all__ = [
    "Recognition",
    "Recognizer",
    "datetime",
    "fuzzy",
    "integer",
    "integer_near",
    "money",
    "one_of",
    "regex",
    "yes_no",
]


class Recognition(NamedTuple):
    """What a recognizer read: the ``value`` (JSON data) and its ``confidence`` (0 to 1)."""

    value: Any
    confidence: float


class Recognizer(ABC):
    """Reads one kind of value from a transcript; build one with the functions of this module."""

    @abstractmethod
    def recognize(self, text: str) -> Recognition | None:
        """The value found in ``text``, or None."""

    @abstractmethod
    def describe(self) -> str:
        """What it reads, in a few words."""

    def map(self, fn: Callable[[Any], Any], describe: str = "") -> Recognizer:
        """This recognizer with ``fn`` applied to its value; a value ``fn`` maps to None counts
        as not recognised (``datetime().map(lambda v: v.get("time"))`` reads only times)."""
        return _Mapped(self, fn, describe or f"{self.describe()}, mapped")

    def pick(self, part: str) -> Recognizer:
        """This recognizer keeping one part of a dict value, when it was heard:
        ``datetime().pick("time")`` reads "19:30" from "at half past seven... 19:30"."""
        return _Mapped(
            self,
            lambda v: v.get(part) if isinstance(v, dict) else None,
            f"{self.describe()}: {part}",
        )

    def __repr__(self) -> str:
        return f"<recognizer: {self.describe()}>"


class _Mapped(Recognizer):
    def __init__(self, inner: Recognizer, fn: Callable[[Any], Any], text: str) -> None:
        self.inner = inner
        self.fn = fn
        self.text = text

    def recognize(self, text: str) -> Recognition | None:
        found = self.inner.recognize(text)
        if found is None:
            return None
        value = self.fn(found.value)
        return None if value is None else Recognition(value, found.confidence)

    def describe(self) -> str:
        return self.text


# -- numbers -------------------------------------------------------------------------------

_UNITS = {
    "zero": 0, "oh": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "a couple": 2, "couple": 2, "a dozen": 12, "dozen": 12,
}  # fmt: skip
_TENS = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90,
}  # fmt: skip
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_WORD = re.compile(r"[a-z]+|\d+(?:[.,]\d+)*")


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("-", " "))


def _number_words(tokens: Sequence[str], start: int) -> tuple[int, int] | None:
    """An integer spelled in words from ``tokens[start]``: (value, tokens used), or None.

    A word that cannot follow the one before it ends the number, so "five, six" is five (then
    six), not eleven: a unit or teen after a unit or teen, or a tens word after anything but a
    scale ("twenty twenty six" is twenty, then twenty six). A scale needs a number before it
    and a bigger scale before that, so "two hundred hundred" is two hundred and "two million
    million" two million.
    """
    total, current, i, used = 0, 0, start, 0
    last = ""  # the kind of the previous word: unit (1-9), teen (10-19), tens, scale
    big = 0  # the last thousand or million said (0: none yet); a later one must be smaller
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        pair = f"{tok} {nxt}" if nxt else ""
        if pair in _UNITS or (tok in _UNITS and tok != "oh") or (tok == "oh" and used):
            value = _UNITS[pair] if pair in _UNITS else _UNITS[tok]
            kind = "unit" if value < 10 else "teen"
            if last in ("unit", "teen") or (kind == "teen" and last == "tens"):
                break
            current += value
            i += 2 if pair in _UNITS else 1
            last = kind
        elif tok in _TENS:
            if last in ("unit", "teen", "tens"):
                break
            current += _TENS[tok]
            i += 1
            last = "tens"
        elif tok == "a" and not used and nxt in _SCALES:
            current = 1  # "a hundred", "a thousand"
            i += 1
            last = "unit"
        elif tok in _SCALES and used:
            scale = _SCALES[tok]
            if scale == 100:
                if not 0 < current < 100:
                    break
                current *= 100
            else:
                if not current or (big and scale >= big):
                    break
                total += current * scale
                current, big = 0, scale
            i += 1
            last = "scale"
        elif tok == "and" and used and last == "scale" and (nxt in _UNITS or nxt in _TENS):
            i += 1
            continue
        else:
            break
        used = i - start
    if not used or last == "" or (used == 1 and tokens[start] == "a"):
        return None
    return total + current, used


def _integers(text: str) -> list[tuple[int, int, float]]:
    """Every integer in ``text``: (value, token index, confidence)."""
    tokens = _tokens(text)
    found: list[tuple[int, int, float]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.replace(",", "").isdigit():
            found.append((int(tok.replace(",", "")), i, 0.95))
            i += 1
            continue
        words = _number_words(tokens, i)
        if words is not None:
            found.append((words[0], i, 0.85))
            i += words[1]
            continue
        i += 1
    return found


class _Integer(Recognizer):
    def recognize(self, text: str) -> Recognition | None:
        found = _integers(text)
        return Recognition(found[0][0], found[0][2]) if found else None

    def describe(self) -> str:
        return "a whole number"


def integer() -> Recognizer:
    """The first whole number, in digits ("4", "1,200") or words ("four", "twenty one",
    "a hundred").

    Numbers said one after another are not added: "five, six" is 5, "twenty twenty six" 20.
    """
    return _Integer()


class _IntegerNear(Recognizer):
    def __init__(self, words: frozenset[str], distance: int) -> None:
        self.words = words
        self.distance = distance

    def recognize(self, text: str) -> Recognition | None:
        tokens = _tokens(text)
        anchors = [
            i for i, t in enumerate(tokens) if t in self.words or t.rstrip("s") in self.words
        ]
        best: tuple[int, int, float] | None = None
        for value, at, confidence in _integers(text):
            gap = min((abs(at - a) for a in anchors), default=None)
            if gap is not None and gap <= self.distance and (best is None or gap < best[1]):
                best = (value, gap, confidence)
        return Recognition(best[0], best[2]) if best is not None else None

    def describe(self) -> str:
        return f"a whole number near {', '.join(sorted(self.words))}"


def integer_near(words: Iterable[str], distance: int = 3) -> Recognizer:
    """A whole number within ``distance`` words of one of ``words`` ("a party of four",
    "four people"), the closest one when there are several.

    Each of ``words`` is one word (the text is read word by word, so "per person" or "it's"
    would never be found: give "person"); a plural "s" on the anchor is ignored.
    """
    given = [words] if isinstance(words, str) else list(words)
    if not given:
        raise ValueError("integer_near() needs at least one word")
    for word in given:
        if not isinstance(word, str) or _tokens(word) != [word.strip().lower()]:
            raise ValueError(
                f"integer_near() words must each be a single word (letters, no spaces, "
                f"hyphens or apostrophes), got {word!r}: give the word said next to the number"
            )
    if type(distance) is not int or distance < 0:
        raise ValueError(f"integer_near() distance must be a whole number >= 0, got {distance!r}")
    return _IntegerNear(frozenset(w.strip().lower() for w in given), distance)


# -- money ---------------------------------------------------------------------------------

_CURRENCIES = {
    "$": "USD", "usd": "USD", "dollar": "USD", "dollars": "USD", "buck": "USD", "bucks": "USD",
    "€": "EUR", "eur": "EUR", "euro": "EUR", "euros": "EUR",
    "£": "GBP", "gbp": "GBP", "pound": "GBP", "pounds": "GBP", "quid": "GBP",
}  # fmt: skip
_MINOR = {"cent": "USD", "cents": "USD", "pence": "GBP"}
_ONE = {"dollar", "buck", "euro", "pound", "quid", "cent"}  # "a dollar fifty" is 1.50
_SYMBOL_AMOUNT = re.compile(r"([$€£])\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?")
_AMOUNT_WORD = re.compile(
    r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?\s?(usd|eur|gbp|dollars?|euros?|pounds?|bucks?|quid)\b"
)
_BARE_AMOUNT = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?\b")
_CENTS_LEAD = re.compile(r"\s+(?:and\s+)?")


def _money(amount: Decimal, currency: str) -> dict[str, Any]:
    amount = amount.quantize(Decimal("0.01"))
    return {"amount": str(amount), "currency": currency, "minor": int(amount * 100)}


class _Money(Recognizer):
    def __init__(self, default: str | None) -> None:
        self.default = default

    def recognize(self, text: str) -> Recognition | None:
        lowered = text.lower().replace("-", " ")
        m = _SYMBOL_AMOUNT.search(lowered)
        if m:
            whole = Decimal(m.group(2).replace(",", ""))
            if m.group(3) is not None:
                amount = whole + Decimal(m.group(3).ljust(2, "0")) / 100
            else:
                amount = whole + Decimal(_cents_after(lowered[m.end() :], named=True)) / 100
            return Recognition(_money(amount, _CURRENCIES[m.group(1)]), 0.95)
        m = _AMOUNT_WORD.search(lowered)
        if m:
            whole = Decimal(m.group(1).replace(",", ""))
            currency = _CURRENCIES[m.group(3)]
            if m.group(2) is not None:
                amount = whole + Decimal(m.group(2).ljust(2, "0")) / 100
            else:
                amount = whole + Decimal(_cents_after(lowered[m.end() :])) / 100
            return Recognition(_money(amount, currency), 0.9)
        return self._words(lowered)

    def _words(self, lowered: str) -> Recognition | None:
        # "twelve dollars fifty", "twenty euros", "fifty cents", "a dollar"
        spans = list(_WORD.finditer(lowered))
        tokens = [span.group() for span in spans]
        for i, tok in enumerate(tokens):
            currency = _CURRENCIES.get(tok)
            minor_currency = _MINOR.get(tok)
            if currency is None and minor_currency is None:
                continue
            before = _trailing_number(tokens[:i])
            said_a = tokens[i - 1 : i] == ["a"] and tokens[i - 2 : i - 1] != ["half"]
            if before is None and said_a and tok in _ONE:
                before = 1  # "a dollar fifty"; "half a dollar" is not read
            if before is None:
                continue
            if minor_currency is not None:
                return Recognition(_money(Decimal(before) / 100, minor_currency), 0.8)
            assert currency is not None
            cents = _cents_after(lowered[spans[i].end() :])
            return Recognition(_money(Decimal(before) + Decimal(cents) / 100, currency), 0.8)
        if self.default is not None:
            m = _BARE_AMOUNT.search(lowered)
            if m:
                whole = m.group(1).replace(",", "")
                cents_text = (m.group(2) or "0").ljust(2, "0")
                return Recognition(_money(Decimal(f"{whole}.{cents_text}"), self.default), 0.7)
        return None

    def describe(self) -> str:
        return "an amount of money"


def _cents_after(rest: str, *, named: bool = False) -> int:
    """The cents said right after an amount ("fifty", "and fifty cents", "50"), else 0.

    Only spaces and "and" may come between: after a comma ("one dollar, two people") the number
    counts something else. With ``named`` the cents must be called so ("$12 and 50 cents"): a
    bare number after "$12" is rarely cents ("$12 for 2").
    """
    lead = _CENTS_LEAD.match(rest)
    tokens = _tokens(rest[lead.end() :]) if lead else []
    if not tokens:
        return 0
    if tokens[0].isdigit():
        cents, used = int(tokens[0]), 1
    else:
        words = _number_words(tokens, 0)
        if words is None:
            return 0
        cents, used = words
    if named and (used >= len(tokens) or tokens[used] not in _MINOR):
        return 0
    return cents if cents < 100 else 0


def _trailing_number(tokens: Sequence[str]) -> int | None:
    """The number that ends ``tokens`` (digits or words), or None."""
    if not tokens:
        return None
    if tokens[-1].replace(",", "").isdigit():
        return int(tokens[-1].replace(",", ""))
    for start in range(max(len(tokens) - 6, 0), len(tokens)):
        words = _number_words(tokens, start)
        if words is not None and start + words[1] == len(tokens):
            return words[0]
    return None


def money(default_currency: str | None = None) -> Recognizer:
    """An amount of money: ``{"amount": "12.50", "currency": "USD", "minor": 1250}``.

    Reads "$12.50", "€30", "1,200 dollars", "30 EUR", "twelve dollars and fifty cents",
    "12 dollars 50", "a dollar fifty", "fifty cents"; cents are read only right after the amount
    ("one dollar, two people" is 1.00), and after a symbol only when called so ("$12 and 50
    cents"). The amount is a decimal string (never a float) and ``minor`` the amount in cents.
    With ``default_currency`` ("USD"), a bare number ("12.50") is read as that currency, with a
    lower confidence.
    """
    return _Money(default_currency)


# -- patterns and options ------------------------------------------------------------------


class _Regex(Recognizer):
    def __init__(self, pattern: re.Pattern[str], group: int | str, confidence: float) -> None:
        self.pattern = pattern
        self.group = group
        self.confidence = confidence

    def recognize(self, text: str) -> Recognition | None:
        m = self.pattern.search(text)
        return Recognition(m.group(self.group), self.confidence) if m else None

    def describe(self) -> str:
        return f"text matching {self.pattern.pattern!r}"


def regex(
    pattern: str | re.Pattern[str], *, group: int | str = 0, confidence: float = 0.9
) -> Recognizer:
    """The text of the first match of ``pattern`` (or of one of its groups)."""
    compiled = re.compile(pattern, re.IGNORECASE) if isinstance(pattern, str) else pattern
    return _Regex(compiled, group, confidence)


def _options(options: Iterable[str] | Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Spoken form (lower case) -> value; a mapping gives each value its synonyms."""
    table: dict[str, str] = {}
    if isinstance(options, Mapping):
        for value, synonyms in options.items():
            table[value.lower()] = value
            for s in [synonyms] if isinstance(synonyms, str) else synonyms:
                table[s.lower()] = value
    else:
        for value in options:
            table[value.lower()] = value
    if not table:
        raise ValueError("give at least one option")
    if "" in {s.strip() for s in table}:
        # A blank option would match anywhere: one_of() at every word, fuzzy() at nothing.
        raise ValueError(f"options must not be blank, got {list(table)!r}")
    return table


class _OneOf(Recognizer):
    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        # Longest first, so "extra large" wins over "large".
        spoken = sorted(table, key=len, reverse=True)
        self.pattern = re.compile(r"\b(" + "|".join(map(re.escape, spoken)) + r")\b", re.I)

    def recognize(self, text: str) -> Recognition | None:
        m = self.pattern.search(text)
        return Recognition(self.table[m.group(1).lower()], 0.95) if m else None

    def describe(self) -> str:
        return "one of " + ", ".join(sorted(set(self.table.values())))


def one_of(options: Iterable[str] | Mapping[str, Iterable[str]]) -> Recognizer:
    """One of ``options`` said as a whole word or phrase (any case); a mapping gives synonyms:
    ``one_of({"window": ["by the window"], "terrace": ["outside", "patio"]})``."""
    return _OneOf(_options(options))


_FUZZY_WORD = re.compile(r"[^\W_]+")  # letters and digits: punctuation never counts


def _fuzzy_words(text: str) -> list[str]:
    return _FUZZY_WORD.findall(text.lower())


class _Fuzzy(Recognizer):
    def __init__(self, table: dict[str, str], threshold: float) -> None:
        self.table = table
        self.threshold = threshold
        # Each spoken form as the words it is compared with, and how many there are.
        self.spoken = [(s, " ".join(_fuzzy_words(s)), len(_fuzzy_words(s))) for s in table]

    def recognize(self, text: str) -> Recognition | None:
        try:
            from rapidfuzz import fuzz, process
        except ImportError:  # pragma: no cover - the extra is part of the dev install
            raise SlateError(
                "fuzzy() needs rapidfuzz: pip install 'slateflow[conversation]'"
            ) from None
        words = _fuzzy_words(text)
        runs: dict[int, list[str]] = {}  # runs of n consecutive words, by n
        best: tuple[float, str] | None = None
        for spoken, joined, n in self.spoken:
            # Whole words only, so a fragment is not read as an option ("no" in "cappuccino")
            # nor an option out of another word ("cap" in "escape"); a word more or fewer, so
            # an option the transcriber split or merged ("cappu chino") still comes close.
            for size in range(max(n - 1, 1), n + 2):
                if size not in runs:
                    runs[size] = [
                        " ".join(words[i : i + size]) for i in range(len(words) - size + 1)
                    ]
                found = process.extractOne(joined, runs[size], scorer=fuzz.ratio)
                if found is not None and (best is None or found[1] > best[0]):
                    best = (found[1], spoken)
        if best is None or best[0] / 100 < self.threshold:
            return None
        return Recognition(self.table[best[1]], round(best[0] / 100, 4))

    def describe(self) -> str:
        return "roughly one of " + ", ".join(sorted(set(self.table.values())))


def fuzzy(
    options: Iterable[str] | Mapping[str, Iterable[str]], threshold: float = 0.85
) -> Recognizer:
    """The option the text comes closest to, if at least ``threshold`` similar.

    The confidence is that similarity (rapidfuzz's ratio) between the option and the run of
    whole words in the text that best matches it, so the option may be said inside a sentence
    ("a cappuccino please") but a fragment ("no") is never read as "cappuccino". Tolerates
    ASR slips ("cappucino", 0.95, "late" for latte, 0.89); a bigger slip ("expreso" for
    espresso, 0.8) needs a lower threshold. On a tie the first option wins.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    return _Fuzzy(_options(options), threshold)


# -- yes / no ------------------------------------------------------------------------------

_YES = {
    "yes", "yeah", "yep", "yup", "sure", "correct", "right", "ok", "okay", "absolutely",
    "definitely", "certainly", "please", "affirmative", "fine", "great", "perfect",
}  # fmt: skip
_NO = {"no", "nope", "nah", "not", "don't", "dont", "never", "wrong", "cancel", "negative"}
_NO_PHRASES = ("no wait", "not really", "i don't think so", "rather not", "don't think")


class _YesNo(Recognizer):
    def recognize(self, text: str) -> Recognition | None:
        lowered = text.lower().replace("\u2019", "'")  # a typographic apostrophe
        words = re.findall(r"[a-z']+", lowered)
        if any(p in lowered for p in _NO_PHRASES) or any(w in _NO for w in words):
            return Recognition(False, 0.9)  # negation wins: "yes, no wait" is a no
        if any(w in _YES for w in words) or "go ahead" in lowered:
            return Recognition(True, 0.9)
        return None

    def describe(self) -> str:
        return "yes or no"


def yes_no() -> Recognizer:
    """True for yes, False for no; any negation wins ("yes... actually no", "not really")."""
    return _YesNo()


# -- dates and times -----------------------------------------------------------------------

_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_MONTHS = [
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december",
]  # fmt: skip
_PARTS = ("morning", "noon", "lunchtime", "afternoon", "evening", "tonight", "night")
# Compiled once: a turn is read by several recognizers, each turn.
_PART_WORDS = [(p, re.compile(rf"\b{p}\b")) for p in _PARTS]
_WEEKDAY_WORDS = [(d, re.compile(rf"\b{d}\b")) for d in _WEEKDAYS]
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_DAY_MONTH = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?(?: of)? (" + "|".join(_MONTHS) + r")\b")
_MONTH_DAY = re.compile(r"\b(" + "|".join(_MONTHS) + r") (\d{1,2})(?:st|nd|rd|th)?\b")
# Not a price: no currency symbol before, no currency symbol or word after ("$12.50",
# "12.50€", "12.50 euros").
_TIME_24 = re.compile(
    r"(?<![$€£\d])(?<![$€£]\s)\b([01]?\d|2[0-3])[:.h]([0-5]\d)\b"
    r"(?!\s?(?:[$€£]|(?:usd|eur|gbp|dollars?|euros?|pounds?|bucks?|quid)\b))"
)
_TIME_AMPM = re.compile(r"\b(1[0-2]|0?[1-9])(?:[:.]([0-5]\d))?\s?(am|pm|a\.m\.|p\.m\.)")


class _DateTime(Recognizer):
    def __init__(self, now: Callable[[], float], tz: _tzinfo) -> None:
        self.now = now
        self.tz = tz

    def recognize(self, text: str) -> Recognition | None:
        lowered = text.lower()
        today = _datetime.fromtimestamp(self.now(), tz=self.tz).date()
        found: dict[str, Any] = {}
        try:
            day = self._date(lowered, today)
        except OverflowError:  # "tomorrow" on 31 December 9999: a date cannot hold it
            day = None
        if day is not None:
            found["date"] = day.isoformat()
            found["weekday"] = _WEEKDAYS[day.weekday()]
        clock = self._time(lowered)
        part = next((p for p, word in _PART_WORDS if word.search(lowered)), None)
        if clock is not None:
            found["time"] = clock
        if part is not None:
            found["part_of_day"] = part
            if part == "tonight" and "date" not in found:
                found["date"] = today.isoformat()
                found["weekday"] = _WEEKDAYS[today.weekday()]
        if not found:
            return None
        exact = "time" in found or ("date" in found and part is None)
        return Recognition(found, 0.9 if exact else 0.75)

    @staticmethod
    def _date(lowered: str, today: _date) -> _date | None:
        m = _ISO_DATE.search(lowered)
        if m:
            try:
                return _date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            except ValueError:
                return None
        for pattern, day_group, month_group in ((_DAY_MONTH, 1, 2), (_MONTH_DAY, 2, 1)):
            m = pattern.search(lowered)
            if m:
                month = _MONTHS.index(m.group(month_group)) + 1
                day = int(m.group(day_group))
                # The next such date from today: a date already past this year means next
                # year's, and 29 February the next leap year's (8 years covers 2096 -> 2104).
                for year in range(today.year, today.year + 9):
                    try:
                        candidate = _date(year, month, day)
                    except ValueError:
                        continue
                    if candidate >= today:
                        return candidate
                return None  # no such day ("February 30")
        if "day after tomorrow" in lowered:
            return today + timedelta(days=2)
        if re.search(r"\btomorrow\b", lowered):
            return today + timedelta(days=1)
        if re.search(r"\b(today|tonight)\b", lowered):
            return today
        for i, (name, word) in enumerate(_WEEKDAY_WORDS):
            if word.search(lowered):
                ahead = (i - today.weekday()) % 7
                if ahead == 0 and re.search(rf"\bnext {name}\b", lowered):
                    ahead = 7  # "Saturday" on a Saturday is today; "next Saturday" is not
                return today + timedelta(days=ahead)
        return None

    @staticmethod
    def _time(lowered: str) -> str | None:
        m = _TIME_AMPM.search(lowered)
        if m:
            hour = int(m.group(1)) % 12 + (12 if m.group(3).startswith("p") else 0)
            return f"{hour:02d}:{int(m.group(2) or 0):02d}"
        m = _TIME_24.search(lowered)
        if m:
            return f"{int(m.group(1)):02d}:{m.group(2)}"
        return None

    def describe(self) -> str:
        return "a date and/or time"


def datetime(now: Callable[[], float] | None = None, tz: _tzinfo = UTC) -> Recognizer:
    """A date and/or time: ``{"date": "2026-01-03", "weekday": "saturday", "time": "19:30",
    "part_of_day": "evening"}`` (the keys that were said).

    Reads ISO dates, "14 June", "June 14th" (the next such day: "29 February" is the next leap
    day), weekdays (the next one; "next Saturday" skips a week when it is today), "today",
    "tonight", "tomorrow", "the day after tomorrow", 24-hour times ("19:30", "7.30"; a price
    such as "$12.50" or "12.50 euros" is not a time), "7pm", and parts of the day. Relative
    words count from ``now`` (seconds since the epoch) in time zone ``tz`` (the caller's or the
    business's; UTC by default): pass the session's clock, so tests control "today".
    """
    return _DateTime(now if now is not None else _time.time, tz)
