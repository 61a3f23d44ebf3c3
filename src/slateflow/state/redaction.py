"""Transcript redaction: card numbers and long digit runs never reach the State or a model.

The Session applies :func:`redact` to every user turn; ``slateflow.conversation`` re-exports it.

``redact(text)`` replaces a Luhn-valid card number (13 to 19 digits, spaces or dashes allowed
between them) with ``[card ending 1234]``, any other run of 7 or more digits with
``[redacted number]`` (dates such as ``2025-06-14`` are kept), and each custom pattern's
matches with ``[redacted]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["CARD", "LONG_NUMBER", "luhn_valid", "redact"]

# Digits, optionally separated by single spaces or dashes; bounded so years and times stay.
# Bounded by digits, not word characters, so a number glued to a word ("card4111...") is caught.
_DIGIT_RUN = re.compile(r"(?<!\d)\d(?:[ -]?\d){6,}(?!\d)")
CARD = "[card ending {last4}]"
"""What a card number becomes."""
LONG_NUMBER = "[redacted number]"
"""What any other long digit run becomes."""


def luhn_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn checksum (card numbers do)."""
    if not (digits.isascii() and digits.isdigit()):
        return False  # "²" is a digit to str.isdigit(), not to a card
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


_GLUE = re.compile(r"[^\W\d]")  # a letter or underscore
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}-\d{1,2}-\d{4}")


def _number(match: re.Match[str]) -> str:
    if _DATE.fullmatch(match.group()):
        return match.group()  # a date is not a secret number
    digits = re.sub(r"\D", "", match.group())
    if 13 <= len(digits) <= 19 and luhn_valid(digits):
        return CARD.format(last4=digits[-4:])
    text, start, end = match.string, match.start(), match.end()
    if (start and _GLUE.match(text[start - 1])) or (end < len(text) and _GLUE.match(text[end])):
        return match.group()  # part of a word ("AB1234567"): a reference, not a secret number
    return LONG_NUMBER


def redact(
    text: str, patterns: str | re.Pattern[str] | Iterable[str | re.Pattern[str]] = ()
) -> str:
    """``text`` with card numbers, long digit runs and ``patterns`` masked.

    Custom patterns (regex strings or compiled patterns; one, or several) are applied first, so
    one can mask a structure that contains digits (an account reference) before the digit rules
    see it.
    """
    if not isinstance(text, str):
        raise TypeError(f"redact() takes the transcript text, got {type(text).__name__}")
    if isinstance(patterns, str | re.Pattern):
        patterns = [patterns]
    for pattern in patterns:
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        text = compiled.sub("[redacted]", text)
    return _DIGIT_RUN.sub(_number, text)
