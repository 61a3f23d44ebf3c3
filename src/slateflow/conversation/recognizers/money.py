"""Money said or written: "$12.50", "twelve dollars fifty", "fifty pence"."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from .base import Recognition, Recognizer
from .words import number_words, trailing_number
from .words import tokens as _tokens

__all__ = ["money"]

_WORD = re.compile(r"[a-z]+|\d+(?:[.,]\d+)*")

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
            before = trailing_number(tokens[:i])
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
        words = number_words(tokens, 0)
        if words is None:
            return 0
        cents, used = words
    if named and (used >= len(tokens) or tokens[used] not in _MINOR):
        return 0
    return cents if cents < 100 else 0


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
