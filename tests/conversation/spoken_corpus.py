"""The labelled corpus of what callers say (tests/conversation/data/spoken*.jsonl) and how a
reading is scored.

The corpus has parts, one file each: ``tuning`` (spoken.jsonl: restaurant phrasings, the part
the recognizers were built against), ``held-out`` (spoken_heldout.jsonl: clinics, banks and
deliveries, written before the fixes of issue 28 and never edited to fit them) and ``after``
(spoken_after.jsonl: more of those domains, written after the fixes).

Each line is ``{"category", "text", "expect", "options"?, "domain"?}``, read against a fixed
moment (Wednesday 11 June 2025, 10:00 UTC); ``options.business_hours`` overrides the default
window (a restaurant's 11:00-23:00). Categories: ``time``, ``date`` and ``datetime`` (the parts
named by the category must match; ``null`` means that part must not be read), ``party_size``,
``yes_no`` and ``date_of_birth`` (the value, ``null`` meaning nothing) and ``choice`` (read
against ``options.offered``: the index of the option picked, ``"none"`` for "neither", ``null``
for no pick). Used by tests/conversation/test_spoken_corpus.py and bench/recognizer_bench.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC
from datetime import datetime as _dt
from pathlib import Path
from typing import Any

from slateflow.conversation import (
    Recognizer,
    choice,
    date_of_birth,
    datetime,
    party_size,
    yes_no,
)

DATA = Path(__file__).parent / "data"
PART_FILES = {
    "tuning": "spoken.jsonl",
    "held-out": "spoken_heldout.jsonl",
    "after": "spoken_after.jsonl",
}
NOW = _dt(2025, 6, 11, 10, 0, tzinfo=UTC).timestamp()  # Wednesday 11 June 2025, 10:00 UTC
PARTS = {"time": ("time",), "date": ("date",), "datetime": ("date", "time")}


@dataclass(frozen=True)
class Case:
    category: str
    text: str
    expect: Any
    options: dict[str, Any]
    part: str = "tuning"
    domain: str = "restaurant"


@dataclass(frozen=True)
class Outcome:
    case: Case
    got: Any
    confidence: float | None
    correct: bool


def load(*parts: str) -> list[Case]:
    """The cases of ``parts`` (every part when none is named), in file order."""
    cases = []
    for part in parts or tuple(PART_FILES):
        path = DATA / PART_FILES[part]
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                cases.append(
                    Case(
                        r["category"],
                        r["text"],
                        r["expect"],
                        r.get("options", {}),
                        part,
                        r.get("domain", "restaurant"),
                    )
                )
    return cases


def reader(case: Case) -> Recognizer:
    if case.category in PARTS:
        hours = case.options.get("business_hours", (11, 23))
        return datetime(
            lambda: NOW,
            hour_alone=bool(case.options.get("hour_alone")),
            business_hours=(hours[0], hours[1]),
        )
    if case.category == "party_size":
        return party_size()
    if case.category == "date_of_birth":
        return date_of_birth(lambda: NOW)
    if case.category == "choice":
        return choice(case.options["offered"], now=lambda: NOW)
    return yes_no()


def score(case: Case, recognizer: Recognizer | None = None) -> Outcome:
    found = (recognizer or reader(case)).recognize(case.text)
    value = None if found is None else found.value
    confidence = None if found is None else found.confidence
    if case.category == "choice":
        offered = case.options["offered"]
        want = case.expect if case.expect is None or case.expect == "none" else offered[case.expect]
        return Outcome(case, value, confidence, value == want)
    parts = PARTS.get(case.category)
    if parts is None:
        return Outcome(
            case, value, confidence, value == case.expect and type(value) is type(case.expect)
        )
    got = {p: value.get(p) for p in parts} if isinstance(value, dict) else dict.fromkeys(parts)
    want = {p: (case.expect or {}).get(p) for p in parts}
    return Outcome(case, got, confidence, got == want)
