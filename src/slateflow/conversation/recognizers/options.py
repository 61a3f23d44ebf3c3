"""Patterns and options: a regex, one of a list of phrases, or the closest option (fuzzy)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ...errors import SlateError
from .base import Recognition, Recognizer

__all__ = ["fuzzy", "one_of", "regex"]


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
