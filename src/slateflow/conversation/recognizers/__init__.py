"""Recognizers: small, deterministic readers of what a caller said.

``recognizer.recognize(text)`` returns a :class:`Recognition` (``value``, ``confidence``) or None
when nothing is recognised. They read spoken-style text the way callers talk: numbers as digits
or words ("four", "twenty one"), party sizes ("a table for four", "just me"), money ("$12.50",
"twelve dollars fifty"), yes/no with idioms, hedges and negation ("no problem" is yes, "yes...
no, sorry" is no, "hold on" is neither), dates and times relative to a clock ("half past seven
tomorrow", "next Friday at 8", "the 3rd"), with fillers and self-corrections ("uh, seven, no,
eight").
"""

from .base import Recognition, Recognizer
from .dates import datetime
from .money import money
from .numbers import integer, integer_near, party_size
from .options import fuzzy, one_of, regex
from .yesno import yes_no

__all__ = [
    "Recognition",
    "Recognizer",
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
