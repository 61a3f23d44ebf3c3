"""Recognizers: small, deterministic readers of what a caller said.

``recognizer.recognize(text)`` returns a :class:`Recognition` (``value``, ``confidence``) or None
when nothing is recognised. They read spoken-style text the way callers talk: numbers as digits
or words ("four", "twenty one"), party sizes ("a table for four", "just me"), money ("$12.50",
"twelve dollars fifty"), yes/no with idioms, hedges and negation ("no problem" is yes, "yes...
no, sorry" is no, "hold on" is neither), dates and times relative to a clock ("half past seven
tomorrow", "next Friday at 8", "the 3rd"), with fillers and self-corrections ("uh, seven, no,
eight") and clauses ruled out ("not Monday, Tuesday"); dates of birth ("March 3rd, nineteen
eighty-five"); and a pick from the options offered ("the second one", "the 3:15", "neither").
"""

from .base import Recognition, Recognizer
from .birth import date_of_birth
from .choice import choice
from .dates import datetime
from .money import money
from .numbers import integer, integer_near, party_size
from .options import fuzzy, one_of, regex
from .yesno import yes_no

__all__ = [
    "Recognition",
    "Recognizer",
    "choice",
    "date_of_birth",
    "datetime",
    "fuzzy",
    "integer",
    "integer_near",
    "money",
    "one_of",
    "party_size",
    "regex",
    "yes_no",
]
