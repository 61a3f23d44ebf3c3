"""The labelled corpus of what callers say (tests/conversation/data/spoken.jsonl) and how a
reading is scored.

Each line is ``{"category", "text", "expect", "options"?}``, read against a fixed moment
(Wednesday 11 June 2025, 10:00 UTC) by a restaurant open 11:00-23:00 (the default business
hours). Categories: ``time``, ``date`` and ``datetime`` (the parts named by the category must
match; ``null`` means that part must not be read), ``party_size`` and ``yes_no`` (the value,
``null`` meaning nothing). Used by tests/conversation/test_spoken_corpus.py and
bench/recognizer_bench.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC
from datetime import datetime as _dt
from pathlib import Path
from typing import Any

from slateflow.conversation import Recognizer, datetime, party_size, yes_no

CORPUS = Path(__file__).parent / "data" / "spoken.jsonl"
NOW = _dt(2025, 6, 11, 10, 0, tzinfo=UTC).timestamp()  # Wednesday 11 June 2025, 10:00 UTC
PARTS = {"time": ("time",), "date": ("date",), "datetime": ("date", "time")}


@dataclass(frozen=True)
class Case:
    category: str
    text: str
    expect: Any
    options: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    case: Case
    got: Any
    confidence: float | None
    correct: bool


def load() -> list[Case]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [
        Case(r["category"], r["text"], r["expect"], r.get("options", {}))
        for r in map(json.loads, lines)
        if r
    ]


def reader(case: Case) -> Recognizer:
    if case.category in PARTS:
        return datetime(lambda: NOW, hour_alone=bool(case.options.get("hour_alone")))
    if case.category == "party_size":
        return party_size()
    return yes_no()


def score(case: Case, recognizer: Recognizer | None = None) -> Outcome:
    found = (recognizer or reader(case)).recognize(case.text)
    value = None if found is None else found.value
    confidence = None if found is None else found.confidence
    parts = PARTS.get(case.category)
    if parts is None:
        return Outcome(
            case, value, confidence, value == case.expect and type(value) is type(case.expect)
        )
    got = {p: value.get(p) for p in parts} if isinstance(value, dict) else dict.fromkeys(parts)
    want = {p: (case.expect or {}).get(p) for p in parts}
    return Outcome(case, got, confidence, got == want)
