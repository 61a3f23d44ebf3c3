"""A pick from the options offered: "the second one", "the 3:15", "Thursday's fine", "neither"."""

from __future__ import annotations

import re
import time as _time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from datetime import date as _date
from datetime import time as _clock_time
from datetime import tzinfo as _tzinfo
from typing import TYPE_CHECKING, Any

from ...errors import ExtractDefinitionError, UsageError
from ...state.keys import check_key
from .base import Recognition, Recognizer
from .calendar import WEEKDAYS
from .dates import datetime
from .words import ORDINALS, correction_segments, drop_negated, number_words, tokens

if TYPE_CHECKING:
    from ...state import State

__all__ = ["choice"]

_NEITHER = re.compile(
    r"\b(?:neither|none|nothing (?:there |of (?:that|those) )?(?:works|suits)|not any of "
    r"(?:them|those|these)|no(?:ne)? of (?:them|those|these)|(?:those|they) (?:all )?(?:don't|"
    r"do not|won't) work)\b",
    re.IGNORECASE,
)
_ORDINAL_WORDS = {
    **{k: v for k, v in ORDINALS.items() if v <= 10},
    "1st": 1, "2nd": 2, "3rd": 3, "4th": 4, "5th": 5, "6th": 6, "7th": 7, "8th": 8, "9th": 9,
    "10th": 10, "last": -1, "final": -1, "latter": -1, "former": 1, "middle": 0,
}  # fmt: skip
_ORDINAL = re.compile(
    r"(?<![a-z0-9'])(?:(the|that|this) )?("
    + "|".join(sorted(_ORDINAL_WORDS, key=len, reverse=True))
    + r")(?![a-z0-9'])( (?:one|option|slot|choice|time|appointment|day|of (?:them|those|these)))?",
    re.IGNORECASE,
)
# "a second", "one second", "first thing", "at first": not picks.
_NOT_PICK = re.compile(r"\b(?:a|one|just a) second\b|\bfirst thing\b|\bat first\b|\bfirst of all\b")
_NUMBERED = re.compile(
    r"\b(?:option|number|choice|slot|no\.?|#) ?([a-z]+|\d{1,2})\b", re.IGNORECASE
)
_QUESTION = re.compile(
    r"\?|^\s*(?:do|does|did|is|are|can|could|would|will|what|when|where|which|how|have|has)\b"
    r"(?! (?:i|we) (?:do|have|get|take|go|book|pick|grab)\b)",
    re.IGNORECASE,
)
_EARLY = frozenset({"earlier", "earliest", "early", "sooner", "soonest"})
_LATE = frozenset({"later", "latest", "late"})
_PARTS = {"morning": (0, 720), "afternoon": (720, 1020), "evening": (1020, 1440)}
_STOP = frozenset({
    "the", "a", "an", "one", "at", "on", "in", "with", "and", "or", "of", "for", "to", "please",
    "dr", "mr", "mrs", "ms", "is", "it", "that", "this", "fine", "good", "ok", "okay", "i", "ll",
    "take", "do", "let", "s", "me", "am", "pm", "oclock",
})  # fmt: skip


class _Option:
    """What can be matched of one option: its date, weekday, time (minutes) and words."""

    __slots__ = ("date", "minute", "value", "weekday", "words")

    def __init__(self, value: Any, reader: Recognizer) -> None:
        self.value = value
        self.date: str | None = None
        self.weekday: str | None = None
        self.minute: int | None = None
        text = ""
        if isinstance(value, Mapping):
            date, clock = value.get("date"), value.get("time")
            if isinstance(date, str):
                self.date = date[:10]
            if isinstance(clock, str) and re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", clock):
                h, m = clock.split(":")[:2]
                self.minute = int(h) * 60 + int(m)
            text = " ".join(str(v) for k, v in value.items() if k not in ("date", "time"))
            if isinstance(value.get("weekday"), str):
                self.weekday = str(value["weekday"]).lower()
        else:
            text = str(value)
            found = reader.recognize(text)
            if found is not None and isinstance(found.value, dict):
                self.date = found.value.get("date")
                clock = found.value.get("time")
                if clock is not None:
                    self.minute = int(clock[:2]) * 60 + int(clock[3:5])
        if self.date is not None and self.weekday is None:
            try:
                self.weekday = WEEKDAYS[_date.fromisoformat(self.date).weekday()]
            except ValueError:
                self.date = None
        # Words, and numbers long enough to name an option ("ending 4417"), not a time or day.
        self.words = frozenset(
            w for w in tokens(text) if w not in _STOP and (not w.isdigit() or len(w) >= 3)
        )


def _ordinal_index(word: str, n: int) -> int | None:
    k = _ORDINAL_WORDS.get(word.lower())
    if k is None:
        return None
    if k == -1:
        return n - 1
    if k == 0:
        return n // 2 if n % 2 == 1 and n > 1 else None  # "the middle one" of three
    return k - 1 if k <= n else None


class _Choice(Recognizer):
    def __init__(
        self,
        offered: str | tuple[Any, ...],
        neither: Any,
        now: Callable[[], float],
        tz: _tzinfo,
        hours: tuple[int | str | _clock_time, int | str | _clock_time],
    ) -> None:
        self.offered = offered
        self.neither = neither
        self.reader = datetime(now, tz, business_hours=hours)
        self._last: tuple[str, list[_Option]] | None = None  # the options read last time

    def _options(self, offered: tuple[Any, ...]) -> list[_Option]:
        """The options as matched; read again only when what is offered changes."""
        seen = repr(offered)
        if self._last is not None and self._last[0] == seen:
            return self._last[1]
        options = [_Option(v, self.reader) for v in offered]
        if len(options) > 1:
            common = frozenset.intersection(*(o.words for o in options))
            for o in options:
                o.words = o.words - common  # "delivery" in every option picks none
        self._last = (seen, options)
        return options

    def recognize(self, text: str) -> Recognition | None:
        if isinstance(self.offered, str):
            raise UsageError(
                f"choice({self.offered!r}) reads the options offered from the State: call "
                "recognize_in(text, state), or use it in an extractor (which does)"
            )
        return self._pick(text, self.offered)

    def recognize_in(self, text: str, state: State) -> Recognition | None:
        if not isinstance(self.offered, str):
            return self._pick(text, self.offered)
        options = state.get(self.offered)
        if isinstance(options, Mapping):
            options = options.get("options", options.get("slots"))
        if not isinstance(options, Sequence) or isinstance(options, str | bytes) or not options:
            return None  # nothing offered (yet): no pick
        return self._pick(text, tuple(options))

    def _pick(self, text: str, offered: tuple[Any, ...]) -> Recognition | None:
        options = self._options(offered)
        for segment in correction_segments(text, keep_negated=True):
            if _QUESTION.search(segment):
                return None  # "do you have anything on Friday?": a question, not a pick
            if _NEITHER.search(segment):
                return Recognition(self.neither, 0.9)
            found = self._read(drop_negated(segment), options)
            if found is not None:
                return found
        return None

    def _read(self, segment: str, options: list[_Option]) -> Recognition | None:
        said = segment.lower().replace("\u2019", "'")
        n = len(options)
        if not _NOT_PICK.search(said):
            for m in _ORDINAL.finditer(said):
                word = m.group(2)
                if word[0].isdigit() and any(o.date for o in options) and not m.group(3):
                    continue  # "the 17th" with dated options: a day of the month
                index = _ordinal_index(word, n)
                if index is not None:
                    sure = 0.9 if m.group(1) or m.group(3) else 0.85
                    return Recognition(options[index].value, sure)
        numbered = _NUMBERED.search(said)
        if numbered is not None:
            word = numbered.group(1)
            k = int(word) if word.isdigit() else (number_words((word,), 0) or (0, 0))[0]
            if 1 <= k <= n:
                return Recognition(options[k - 1].value, 0.9)
        return self._match(said, options)

    def _match(self, said: str, options: list[_Option]) -> Recognition | None:
        words = set(tokens(said))
        candidates = options
        constrained = False
        weekdays = [d for d in WEEKDAYS if d in words or f"{d}s" in words or f"{d}'s" in said]
        heard = self.reader.recognize(said)
        value = heard.value if heard is not None else {}
        if weekdays:
            constrained = True
            candidates = [o for o in candidates if o.weekday in weekdays]
        elif "date" in value and value.get("part_of_day") != "tonight":
            constrained = True
            candidates = [o for o in candidates if o.date == value["date"]]
        if "time" in value:
            constrained = True
            minute = int(value["time"][:2]) * 60 + int(value["time"][3:5])
            flexible = "meridiem" in value.get("inferred", ())
            candidates = [
                o
                for o in candidates
                if o.minute is not None
                and (o.minute == minute or (flexible and o.minute % 720 == minute % 720))
            ]
        for part, (low, high) in _PARTS.items():
            if part in words:
                constrained = True
                candidates = [
                    o for o in candidates if o.minute is not None and low <= o.minute < high
                ]
        named = [o for o in candidates if o.words & words]
        if any(o.words & words for o in options):
            constrained = True
            candidates = named
        if not constrained or not candidates:
            return None
        if len(candidates) > 1 and all(o.minute is not None for o in candidates):
            timed = sorted(candidates, key=lambda o: (o.date or "", o.minute or 0))
            if not words.isdisjoint(_EARLY):
                return Recognition(timed[0].value, 0.85)
            if not words.isdisjoint(_LATE):
                return Recognition(timed[-1].value, 0.85)
        if len(candidates) != 1:
            return None  # "Tuesday's fine" with two Tuesdays: ask which
        return Recognition(candidates[0].value, 0.9)

    def describe(self) -> str:
        if isinstance(self.offered, str):
            return f"a pick from the options at {self.offered!r}"
        return f"a pick from {len(self.offered)} options"


def choice(
    offered: str | Sequence[Any],
    *,
    neither: Any = "none",
    now: Callable[[], float] | None = None,
    tz: _tzinfo = UTC,
    business_hours: tuple[int | str | _clock_time, int | str | _clock_time] = (0, 24),
) -> Recognizer:
    """The option the caller picks from a list offered: the option itself (as offered).

    ``offered`` is a State key holding the list (the usual case: the slots a lookup found,
    read when the turn is read, so the pick is matched against what was offered then) or the
    list itself. Options may be strings ("express delivery", "Tuesday at 3:15 pm") or dicts
    (``{"date": "2025-06-17", "time": "15:15", "doctor": "Dr. Patel"}``: ``date`` and
    ``time`` are matched as such, the other string values as words). A dict key holding
    ``{"options": [...]}`` works too.

    Reads ordinals ("the second one", "the last one", "option two", "number 3", "the first
    one, no wait, the second"), a time, day or date that matches one option ("the 3:15",
    "Tuesday's fine", "tomorrow"), a part of the day ("the afternoon one"), "the earlier /
    later one" among the matches, and words of an option ("the express one", "Dr. Nguyen").
    "Neither" / "none of those work" reads ``neither`` (default ``"none"``). Something that
    matches several options ("Tuesday" with two Tuesday slots), a question ("do you have
    Friday?") or nothing offered gives no pick, so the agent asks again.

    A time said without am/pm matches an option at either ("the 3:15" matches 15:15);
    ``now`` and ``tz`` say what "tomorrow" is (pass the session's clock). Confidence 0.9 for
    a unique match or an ordinal said with "the" / "one", 0.85 for a bare ordinal or an
    "earlier" / "later" pick.
    """
    if isinstance(offered, str):
        try:
            check_key(offered)
        except Exception as exc:
            raise ExtractDefinitionError(f"choice({offered!r}): {exc}") from None
        held: str | tuple[Any, ...] = offered
    elif isinstance(offered, Sequence) and not isinstance(offered, bytes) and offered:
        held = tuple(offered)
    else:
        raise ExtractDefinitionError(
            f"choice() takes a State key or a non-empty list of options, got {offered!r}"
        )
    return _Choice(held, neither, now if now is not None else _time.time, tz, business_hours)
