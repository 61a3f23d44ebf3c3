"""The conversation layer: reading what the caller said (recognizers, extractors with promotion
rules) and keeping secrets out of the transcript (redaction). Turns, digressions and repair
build on these."""

from .extract import Extract, ExtractionResult, Extractor, Field
from .promotion import Decision, Rule, keep_known, non_empty, overwrite, true_only
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
    "Decision",
    "Extract",
    "ExtractionResult",
    "Extractor",
    "Field",
    "Recognition",
    "Recognizer",
    "Rule",
    "datetime",
    "fuzzy",
    "integer",
    "integer_near",
    "keep_known",
    "luhn_valid",
    "money",
    "non_empty",
    "one_of",
    "overwrite",
    "redact",
    "regex",
    "true_only",
    "yes_no",
]
