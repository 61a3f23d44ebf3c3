"""Spoken words as the recognizers read them: tokens, numbers said in words, fillers and
self-corrections ("uh, seven, no, eight").

Every recognizer of a turn reads the same text, so the tokens of the last few texts are cached.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

__all__ = [
    "ORDINALS",
    "PRONOUN_ONE",
    "cached",
    "clear_caches",
    "correction_segments",
    "drop_negated",
    "integers",
    "number_words",
    "tokens",
    "trailing_number",
]

UNITS = {
    "zero": 0, "oh": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "a couple": 2, "couple": 2, "a dozen": 12, "dozen": 12,
}  # fmt: skip
TENS = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90,
}  # fmt: skip
SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}

ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13,
    "fourteenth": 14, "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18,
    "nineteenth": 19, "twentieth": 20, "thirtieth": 30,
}  # fmt: skip
"""Ordinal words (a day of the month: "the third"); "twenty first" is read as 20 + 1."""

PRONOUN_ONE = frozenset({
    "the", "this", "that", "which", "other", "another", "last", "next", "each", "any", "every",
    "earlier", "later", "early", "late", "morning", "afternoon", "evening", "same", "cheaper",
    "cheapest", "first", "second", "third", "fourth", "fifth", "sixth", "middle", "final",
    "latter", "former", "new", "old", "right", "wrong", "little", "big", "only",
})  # fmt: skip
"""Words after which "one" is a pronoun ("the second one", "the earlier one"), not a number."""

_WORD = re.compile(r"[a-z]+|\d+(?:[.,]\d+)*")
_F = TypeVar("_F", bound=Callable[..., Any])
_CACHES: list[Any] = []


def cached(fn: _F) -> _F:
    """Memoise a reading of a text: every recognizer of a turn reads the same few texts."""
    wrapped = lru_cache(maxsize=128)(fn)
    _CACHES.append(wrapped)
    return wrapped  # type: ignore[return-value]


def clear_caches() -> None:
    """Forget every memoised reading (benchmarks measure the uncached cost)."""
    for cache in _CACHES:
        cache.cache_clear()


@cached
def _cached_tokens(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower().replace("-", " ")))


def tokens(text: str) -> tuple[str, ...]:
    """The words and digit groups of ``text``, lower case ("1,200" and "7.30" stay whole)."""
    return _cached_tokens(text)


def number_words(tokens: Sequence[str], start: int) -> tuple[int, int] | None:
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
    n = len(tokens)
    while i < n:
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < n else ""
        pair = f"{tok} {nxt}" if nxt and (tok == "a" or nxt in ("couple", "dozen")) else ""
        if pair in UNITS or (tok in UNITS and tok != "oh") or (tok == "oh" and used):
            value = UNITS[pair] if pair in UNITS else UNITS[tok]
            kind = "unit" if value < 10 else "teen"
            if last in ("unit", "teen") or (kind == "teen" and last == "tens"):
                break
            current += value
            i += 2 if pair in UNITS else 1
            last = kind
        elif tok in TENS:
            if last in ("unit", "teen", "tens"):
                break
            current += TENS[tok]
            i += 1
            last = "tens"
        elif tok == "a" and not used and nxt in SCALES:
            current = 1  # "a hundred", "a thousand"
            i += 1
            last = "unit"
        elif tok in SCALES and used:
            scale = SCALES[tok]
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
        elif tok == "and" and used and last == "scale" and (nxt in UNITS or nxt in TENS):
            i += 1
            continue
        else:
            break
        used = i - start
    if not used or last == "" or (used == 1 and tokens[start] == "a"):
        return None
    return total + current, used


def _is_digits(tok: str) -> bool:
    return tok.replace(",", "").isdigit()


def _pronoun(toks: Sequence[str], i: int) -> bool:
    """Whether ``toks[i]`` is "one" used as a pronoun ("the second one", "the 3rd one")."""
    if toks[i] not in ("one", "ones") or not i:
        return False
    before = toks[i - 1]
    return before in PRONOUN_ONE or before in ORDINALS or before[-2:] in ("st", "nd", "rd", "th")


_CENTURIES = frozenset({"eighteen", "nineteen", "twenty"})


def _spoken_year(toks: Sequence[str], i: int) -> tuple[int, int] | None:
    """A year said as two numbers from ``toks[i]`` ("nineteen eighty five", "nineteen oh
    five"): (year, tokens used). Only decades from the forties up, so "twenty thirty" (a time,
    20:30) and "nineteen fifteen" stay two numbers."""
    if toks[i] not in _CENTURIES or i + 1 >= len(toks):
        return None
    century = UNITS.get(toks[i], 20) if toks[i] != "twenty" else 20
    nxt = toks[i + 1]
    if nxt == "oh" and i + 2 < len(toks) and toks[i + 2] in UNITS and UNITS[toks[i + 2]] < 10:
        return century * 100 + UNITS[toks[i + 2]], 3
    if nxt in TENS and TENS[nxt] >= 40 and century < 20:
        tail = toks[i + 2] if i + 2 < len(toks) else ""
        if tail in UNITS and 0 < UNITS[tail] < 10 and tail != "oh":
            return century * 100 + TENS[nxt] + UNITS[tail], 3
        return century * 100 + TENS[nxt], 2
    return None


@cached
def _cached_integers(text: str) -> tuple[tuple[int, int, float, int], ...]:
    toks = tokens(text)
    found: list[tuple[int, int, float, int]] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if _is_digits(tok):
            found.append((int(tok.replace(",", "")), i, 0.95, 1))
            i += 1
            continue
        if _pronoun(toks, i):
            i += 1
            continue
        year = _spoken_year(toks, i)
        if year is not None:
            # "nineteen eighty five" is one number (a year), not nineteen then eighty-five;
            # "nineteen thirty" may as well be a time, so only the unambiguous forms.
            found.append((year[0], i, 0.8, year[1]))
            i += year[1]
            continue
        words = number_words(toks, i)
        if words is not None:
            found.append((words[0], i, 0.85, words[1]))
            i += words[1]
            continue
        i += 1
    return tuple(found)


def integers(text: str) -> tuple[tuple[int, int, float, int], ...]:
    """Every integer in ``text``: (value, token index, confidence, tokens used)."""
    return _cached_integers(text)


def trailing_number(toks: Sequence[str]) -> int | None:
    """The number that ends ``toks`` (digits or words), or None."""
    if not toks:
        return None
    if _is_digits(toks[-1]):
        return int(toks[-1].replace(",", ""))
    for start in range(max(len(toks) - 6, 0), len(toks)):
        words = number_words(toks, start)
        if words is not None and start + words[1] == len(toks):
            return words[0]
    return None


# -- self-corrections -----------------------------------------------------------------------

# What a caller says to take back what they just said: "seven, no, eight", "Saturday... sorry,
# Sunday", "four people, actually make it five", "at 7, I mean 8". A bare "no" counts only
# between two values (a recognizer reads the segments after it first); "no" ending a turn is
# an answer, not a correction.
_CORRECTION = re.compile(
    r"(?:[,.;!?]|\.\.\.|\s)\s*(?:"
    r"no\s*,?\s*sorry|sorry\s*,?\s*no|no\s+wait|no\s*,\s*|sorry|i\s+mean|i\s+meant|"
    r"actually(?:\s*,?\s*make\s+(?:it|that))?|make\s+(?:it|that)|or\s+rather|rather|"
    r"scratch\s+that|correction|let\s+me\s+correct\s+that|change\s+(?:it|that)\s+to|"
    r"wait\s*,?\s*(?:no\s*,?\s*)?"
    r")\b",
    re.IGNORECASE,
)


# What a caller rules out: "not Monday, Tuesday", "Tuesday, not Monday", "I can't do Friday,
# but Thursday works", "not the first one, the second". The clause runs to the next comma,
# "but", "instead" or "rather"; "why not Tuesday" and "if not" suggest rather than rule out.
_NEGATED = re.compile(
    r"(?<![a-z'])(?<!why )(?<!if )(?<!or )(?:not|can'?t (?:do|make|manage)|cannot (?:do|make)|"
    r"couldn'?t (?:do|make)|won'?t be able to do|isn'?t good|doesn'?t work for me on)"
    r"(?![a-z'])(?! sure\b)[^,;.!?]*?(?=\s*(?:[,;.!?]|\bbut\b|\binstead\b|\brather\b|$))",
    re.IGNORECASE,
)


@cached
def drop_negated(text: str) -> str:
    """``text`` without the clauses the caller ruled out ("not Monday, Tuesday" keeps
    ", Tuesday"); a turn that only rules something out keeps nothing to read."""
    if "n" not in text.lower():
        return text
    return _NEGATED.sub(" ", text)


@cached
def correction_segments(text: str, keep_negated: bool = False) -> tuple[str, ...]:
    """``text`` cut where the caller corrects themselves, last said first: "uh, seven, no,
    eight" gives ("eight", "uh, seven"). A recognizer takes a value from the first segment
    that has one, so the correction wins. Clauses the caller ruled out ("not Monday") are
    left out first (:func:`drop_negated`) unless ``keep_negated``."""
    if not keep_negated:
        text = drop_negated(text)
    cuts = [m.end() for m in _CORRECTION.finditer(" " + text)]
    if not cuts:
        return (text,)
    parts: list[str] = []
    start = 0
    for cut in cuts:
        parts.append(text[start : max(cut - 1, 0)])
        start = max(cut - 1, 0)
    parts.append(text[start:])
    return tuple(p for p in reversed(parts) if p.strip())
