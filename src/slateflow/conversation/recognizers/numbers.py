"""Numbers: any whole number, the one next to a word, and how many people are coming."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .base import Recognition, Recognizer
from .words import correction_segments, integers, number_words, tokens

__all__ = ["integer", "integer_near", "party_size"]


class _Integer(Recognizer):
    def recognize(self, text: str) -> Recognition | None:
        found = integers(text)
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
        toks = tokens(text)
        anchors = [i for i, t in enumerate(toks) if t in self.words or t.rstrip("s") in self.words]
        if not anchors:
            return None
        best: tuple[int, int, float] | None = None
        for value, at, confidence, _ in integers(text):
            gap = min(abs(at - a) for a in anchors)
            if gap <= self.distance and (best is None or gap < best[1]):
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
        if not isinstance(word, str) or list(tokens(word)) != [word.strip().lower()]:
            raise ValueError(
                f"integer_near() words must each be a single word (letters, no spaces, "
                f"hyphens or apostrophes), got {word!r}: give the word said next to the number"
            )
    if type(distance) is not int or distance < 0:
        raise ValueError(f"integer_near() distance must be a whole number >= 0, got {distance!r}")
    return _IntegerNear(frozenset(w.strip().lower() for w in given), distance)


# -- party size ------------------------------------------------------------------------------

# Times and prices are numbers that count nothing: masked before counting ("for 7 pm", "8:30").
_NOT_A_COUNT = re.compile(
    r"\d{1,2}[:.h]\d{2}\s*(?:[ap]\.?\s?m\b\.?)?|\b\d{1,2}\s*[ap]\.?\s?m\b\.?|[$€£]\s?\d[\d,.]*|"
    r"\b(?:o'?clock|oclock|am|pm|a\.m\.|p\.m\.)\b",
    re.IGNORECASE,
)
_PLURAL = frozenset({
    "people", "persons", "person", "guests", "guest", "adults", "adult", "of", "diners", "pax",
    "covers", "heads", "kids", "children", "friends", "others", "colleagues", "babies", "toddlers",
    "teenagers", "grownups", "seats", "places", "ladies", "gentlemen", "men", "women", "girls",
    "boys",
})  # fmt: skip
_SINGLE = frozenset({
    "wife", "husband", "partner", "friend", "son", "daughter", "boyfriend", "girlfriend", "mum",
    "mom", "mother", "dad", "father", "colleague", "boss", "sister", "brother", "kid", "child",
    "baby", "grandma", "grandmother", "grandpa", "grandfather", "fiance", "fiancee", "aunt",
    "uncle", "cousin", "niece", "nephew", "neighbour", "neighbor", "guest", "date", "plus",
    "other",
})  # fmt: skip
_LEAD = {
    ("for",): 0.9, ("party", "of"): 0.9, ("table", "of"): 0.9, ("group", "of"): 0.9,
    ("we", "are"): 0.85, ("we", "re"): 0.85, ("there", "are"): 0.85, ("there", "s"): 0.85,
    ("there", "will", "be"): 0.85, ("there", "ll", "be"): 0.85, ("family", "of"): 0.9,
    ("booking", "for"): 0.9, ("reservation", "for"): 0.9, ("table", "for"): 0.9,
    ("we", "ll", "be"): 0.85, ("we", "will", "be"): 0.85, ("me", "plus"): 0.85,
}  # fmt: skip
# A number after "for" followed by one of these is a duration or a time, not people.
_TIME_AFTER = frozenset({
    "thirty", "fifteen", "forty", "oclock", "clock", "hours", "hour", "minutes", "mins", "days",
    "day", "nights", "night", "weeks", "week", "months", "years", "pm", "am",
})  # fmt: skip
_ALONE = frozenset({
    "just", "only", "me", "myself", "by", "my", "own", "solo", "single", "one", "its", "it", "s",
    "that", "and", "a", "couple", "of",
})  # fmt: skip
_FILLER = frozenset({
    "uh", "um", "er", "erm", "hmm", "well", "so", "please", "oh", "okay", "ok", "yeah", "yes",
    "right", "like",
})  # fmt: skip
_SELF_ONLY = (
    ("just", "me"), ("only", "me"), ("just", "myself"), ("by", "myself"), ("on", "my", "own"),
    ("just", "the", "one"), ("just", "one"), ("table", "for", "one"), ("party", "of", "one"),
    ("just", "for", "me"), ("only", "for", "me"), ("for", "one"), ("solo",),
)  # fmt: skip
_SELF = frozenset({"me", "myself", "i"})
_JOIN = frozenset({"and", "plus", "with"})


def _number_at(toks: tuple[str, ...], i: int) -> tuple[int, int] | None:
    tok = toks[i]
    if tok.isdigit():
        return int(tok), 1
    if tok == "couple" or (tok == "a" and i + 1 < len(toks) and toks[i + 1] == "couple"):
        used = 2 if tok == "a" else 1
        if i + used < len(toks) and toks[i + used] == "of":
            used += 1  # "a couple of friends"
        return 2, used
    return number_words(toks, i)


def _people_list(toks: tuple[str, ...]) -> int | None:
    """The caller listing who comes: "me and my wife" (2), "myself and three friends" (4),
    "four adults and two kids" (6), "my wife and I" (2); None when nothing like a list."""
    total = 0
    parts = 0
    has_self = False
    i = 0
    n = len(toks)
    while i < n:
        tok = toks[i]
        before = toks[i - 1] if i else ""
        if tok in _SELF and (tok != "i" or before in _JOIN):
            has_self = True
            parts += 1
            i += 1
            continue
        if tok in _SINGLE and (
            before in ("my", "the", "our", "a", "an", "his", "her") or before in _JOIN
        ):
            total += 1
            parts += 1
            i += 1
            continue
        num = _number_at(toks, i)
        if num is not None:
            value, used = num
            after = toks[i + used] if i + used < n else ""
            if after == "more":
                after = toks[i + used + 1] if i + used + 1 < n else ""
            if after in _PLURAL or after in _SINGLE or (has_self and before in _JOIN and not after):
                total += value
                parts += 1
                i += used + 1
                continue
        i += 1
    if has_self and parts >= 2:
        return total + 1
    if not has_self and parts >= 2 and total:
        return total  # "four adults and two kids"
    return None


def _count(segment: str) -> tuple[int, float] | None:
    masked = _NOT_A_COUNT.sub(" ", segment.lower().replace("half a dozen", "6"))
    toks = tokens(masked)
    if not toks:
        return None
    for phrase in _SELF_ONLY:
        k = len(phrase)
        for i in range(len(toks) - k + 1):
            if toks[i : i + k] == phrase and not (i + k < len(toks) and toks[i + k] == "and"):
                return 1, 0.9
    listed = _people_list(toks)
    if listed is not None:
        return listed, 0.9
    best: tuple[int, float] | None = None
    n = len(toks)
    i = 0
    while i < n:
        num = _number_at(toks, i)
        if num is None:
            i += 1
            continue
        value, used = num
        after = toks[i + used] if i + used < n else ""
        after2 = toks[i + used + 1] if i + used + 1 < n else ""
        confidence = 0.0
        if (after in _PLURAL and after != "of") or (
            after == "of" and after2 in ("us", "them", "you", "people", "guests", "adults")
        ):
            confidence = 0.9
        else:
            for lead, conf in _LEAD.items():
                k = len(lead)
                if i >= k and toks[i - k : i] == lead:
                    if (
                        lead == ("for",)
                        and (
                            after in _TIME_AFTER
                            or value > 100
                            # "book for 7 tonight" is a time; "a table for 7 tonight", people
                            or (after == "tonight" and toks[i - 2 : i - 1] != ("table",))
                        )
                    ):
                        break
                    confidence = conf
                    break
        if confidence and (best is None or confidence > best[1]):
            best = (value, confidence)
        i += used
    if best is not None:
        return best
    # A turn that is only a number (an answer to "how many?"), fillers aside.
    nums = integers(masked)
    if not 1 <= len(nums) <= 2:
        return None
    said = {j for _, at, _, used in nums for j in range(at, at + used)}
    rest = [t for j, t in enumerate(toks) if j not in said]
    if not all(t in _ALONE or t in _FILLER or t in _RANGE_WORDS for t in rest):
        return None
    if len(nums) == 1:
        return nums[0][0], 0.7
    span = _range(masked)
    return (span, 0.6) if span is not None else None


_RANGE_WORDS = frozenset({"or", "to", "between", "maybe", "perhaps", "possibly"})
_RANGE = re.compile(
    r"\b(?:between )?(\d+|[a-z]+),? (?:or|to|and|maybe|perhaps|possibly|or maybe) (\d+|[a-z]+)\b"
    r"(?! (?:o'?clock|pm|am)\b)"
)


def _range(segment: str) -> int | None:
    """The larger end of a range ("three or four", "between 6 and 8 people"): the seats needed."""
    m = _RANGE.search(segment.lower())
    if m is None:
        return None
    ends = []
    for word in (m.group(1), m.group(2)):
        if word.isdigit():
            ends.append(int(word))
        else:
            found = number_words((word,), 0)
            if found is None:
                return None
            ends.append(found[0])
    low, high = ends
    return high if 0 < low < high <= low + 10 else None


class _PartySize(Recognizer):
    def recognize(self, text: str) -> Recognition | None:
        segments = correction_segments(text)
        for k, segment in enumerate(segments):
            found = _count(segment)
            if found is None or not 0 < found[0] <= 1000:
                continue
            value, confidence = found
            span = _range(segment)
            if span is not None:
                return Recognition(span, 0.6)  # "2 or 3 people": a guess at the seats
            if confidence < 0.9:
                # "for 4, no, 6": a bare number corrects the count said before it.
                earlier = [_count(s) for s in segments[k + 1 :]]
                if any(e is not None and e[1] >= 0.85 for e in earlier):
                    confidence = 0.85
            return Recognition(value, confidence)
        return None

    def describe(self) -> str:
        return "how many people"


def party_size() -> Recognizer:
    """How many people are coming, as callers say it: "a table for four", "twelve of us",
    "party of 6", "a couple", "just me", "me and my wife", "myself and three friends",
    "four adults and two kids"; the last correction wins ("four, no, five people").

    A number anchored to people ("for", "of us", "people", "party of") is read at 0.9, a turn
    that is only a number ("uh, six") at 0.7. Times and prices ("for 7 pm", "8:30") are never
    counted.
    """
    return _PartySize()
