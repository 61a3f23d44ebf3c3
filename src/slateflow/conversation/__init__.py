"""The conversation layer: reading what the caller said (recognizers), and keeping secrets out
of the transcript (redaction). Extraction records, turns, digressions and repair build on these."""

from .recognizers import (
    Recognition,
    Recognizer,
    datetime,
    fuzzy,
    integer,
    integer_near,
    money,
    one_of,
    regex,
    yes_no,
)
from .redaction import CARD, LONG_NUMBER, luhn_valid, redact

__all__ = [
    "CARD",
    "LONG_NUMBER",
    "Recognition",
    "Recognizer",
    "datetime",
    "fuzzy",
    "integer",
    "integer_near",
    "luhn_valid",
    "money",
    "one_of",
    "redact",
    "regex",
    "yes_no",
]
