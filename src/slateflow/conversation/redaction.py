"""Transcript redaction: what must never reach the State, a log or a model is masked first.

A :class:`~slateflow.conversation.Conversation` applies a :class:`Redactor` (by default
:func:`redact`) to every user turn before anything reads it. It masks card numbers (written or
spoken digit by digit: "four one one one, one one one one, ..."), security codes and expiry
dates said after their keyword ("the CVV is one two three", "expires oh nine twenty six"),
e-mail addresses (written, or spoken: "john dot smith at gmail dot com"), IBANs, sort codes
and any other run of 7 or more digits, written or spoken (phone numbers: "oh seven seven zero
zero, nine double oh..."), and identity values however said: dates of birth ("March 3rd,
nineteen eighty-five", "3/3/85", a date with a year after "born" or "date of birth"), member,
policy, patient and account ids after their keyword ("member ID X Y Z one two three four"), and
card digits ("the last four digits are four four two one"). Dates of this decade, times,
prices, party sizes and references glued to letters stay.

Each rule finds spans in the original text; a span that overlaps one found before it is
dropped, and a span inside a ``keep`` pattern's match is never masked (a policy number the
extractor needs: ``Redactor(keep=[r"PN-\\d+"])``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from .recognizers import date_of_birth

__all__ = [
    "BIRTH_DATE",
    "CARD",
    "CARD_DIGITS",
    "EMAIL",
    "EXPIRY",
    "IBAN",
    "LONG_NUMBER",
    "MEMBER_ID",
    "REDACTED",
    "SECURITY_CODE",
    "Redactor",
    "luhn_valid",
    "mask_spans",
    "redact",
]

CARD = "[card ending {last4}]"
"""What a card number becomes."""
LONG_NUMBER = "[redacted number]"
"""What any other run of 7 or more digits becomes (a phone number, an account)."""
SECURITY_CODE = "[redacted security code]"
"""What a CVV, PIN or sort code said after its keyword becomes."""
EXPIRY = "[redacted expiry]"
"""What a card's expiry date said after its keyword becomes."""
EMAIL = "[redacted email]"
"""What an e-mail address, written or spoken, becomes."""
IBAN = "[redacted iban]"
"""What an IBAN (checksum-valid) becomes."""
REDACTED = "[redacted]"
"""What a match of a custom pattern becomes."""
BIRTH_DATE = "[redacted date of birth]"
"""What a date of birth (a date with a year long past, or after "born") becomes."""
MEMBER_ID = "[redacted id]"
"""What a member, policy, patient or account id said after its keyword becomes."""
CARD_DIGITS = "[redacted card digits]"
"""What the last digits of a card, said after "last four" or "card ending", become."""

Patterns = str | re.Pattern[str] | Iterable[str | re.Pattern[str]]
_MARKER = re.compile(r"\[(?:card ending \d{4}|redacted[a-z ]*)\]")


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


def _iban_valid(text: str) -> bool:
    code = re.sub(r"\s", "", text).upper()
    if not 15 <= len(code) <= 34 or not code[:2].isalpha() or not code[2:4].isdigit():
        return False
    moved = code[4:] + code[:4]
    digits = "".join(str(int(ch, 36)) for ch in moved)
    return digits.isdigit() and int(digits) % 97 == 1


# -- written digits ---------------------------------------------------------------------------

# Digits, optionally separated by single spaces or dashes; bounded so years and times stay.
# Bounded by digits, not word characters, so a number glued to a word ("card4111...") is caught.
_DIGIT_RUN = re.compile(r"(?<!\d)\d(?:[ -]?\d){6,}(?!\d)")
_GLUE = re.compile(r"[^\W\d]")  # a letter or underscore
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}-\d{1,2}-\d{4}")


def _digits_mask(digits: str) -> str:
    if 13 <= len(digits) <= 19 and luhn_valid(digits):
        return CARD.format(last4=digits[-4:])
    return LONG_NUMBER


# -- spoken digits ----------------------------------------------------------------------------

_DIGIT_WORDS = {
    "zero": "0", "oh": "0", "o": "0", "nought": "0", "naught": "0", "nil": "0", "one": "1",
    "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8",
    "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13",
    "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18",
    "nineteen": "19",
}  # fmt: skip
_TENS = {
    "twenty": "2", "thirty": "3", "forty": "4", "fifty": "5", "sixty": "6", "seventy": "7",
    "eighty": "8", "ninety": "9",
}  # fmt: skip
_REPEAT = {"double": 2, "triple": 3}
_SKIP = frozenset({"uh", "um", "er", "erm", "umm", "uhm"})
_WORDS = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+")
_GAP = " \t\n,.-/()+:;"  # what may stand between the digits of one number


@dataclass(frozen=True, slots=True)
class _Run:
    start: int
    end: int
    digits: str
    spoken: bool  # has at least one digit said as a word
    head_end: int  # where the first group ends (before the first comma, dash, ...)
    head: str  # the first group's digits ("123" of "CVV one two three, four people")


def _numberish(tok: str) -> bool:
    return tok.isdigit() or tok in _DIGIT_WORDS or tok in _TENS or tok in _REPEAT


def _digit_runs(text: str) -> list[_Run]:
    """Runs of digits, said or written, with separators (``,`` ``.`` ``-`` ``/`` ...) and
    fillers between them. A turn is read word by word once; most words are skipped at once."""
    runs: list[_Run] = []
    toks = [(m.start(), m.end(), m.group()) for m in _WORDS.finditer(text.lower())]
    i, n = 0, len(toks)
    while i < n:
        if not _numberish(toks[i][2]):
            i += 1
            continue
        start = i
        digits: list[str] = []
        spoken = False
        last = -1  # index of the last token that said digits
        head = -1  # the last token of the first group
        head_digits = ""
        prev = -1  # the end of the last token taken (digits or a filler)
        while i < n:
            at, end, tok = toks[i]
            if prev >= 0:
                gap = text[prev:at]
                if gap.strip(_GAP):
                    break  # something else than a separator between them: the run ends
                if head < 0 and gap not in ("", " "):
                    head, head_digits = last, "".join(digits)  # "100, 2000000"; a pause
            nxt = toks[i + 1][2] if i + 1 < n else ""
            if tok.isdigit():
                digits.append(tok)
            elif tok in _TENS:
                unit = _DIGIT_WORDS.get(nxt)
                if unit is not None and len(unit) == 1 and nxt not in ("oh", "o", "zero"):
                    digits.append(_TENS[tok] + unit)  # "forty one"
                    i += 1
                else:
                    digits.append(_TENS[tok] + "0")
                spoken = True
            elif tok in _REPEAT and nxt in _DIGIT_WORDS and len(_DIGIT_WORDS[nxt]) == 1:
                digits.append(_DIGIT_WORDS[nxt] * _REPEAT[tok])  # "double oh"
                spoken = True
                i += 1
            elif tok in _DIGIT_WORDS and (tok not in ("oh", "o") or digits or _starts(toks, i)):
                digits.append(_DIGIT_WORDS[tok])
                spoken = True
            elif digits and tok in _SKIP:
                prev = end
                i += 1
                continue
            else:
                break
            last = i
            prev = toks[i][1]
            i += 1
        if last >= 0:
            said = "".join(digits)
            if head < 0 or head == last:
                head, head_digits = last, said
            runs.append(
                _Run(toks[start][0], toks[last][1], said, spoken, toks[head][1], head_digits)
            )
            i = last + 1
        else:
            i = start + 1
    return runs


def _starts(toks: list[tuple[int, int, str]], i: int) -> bool:
    """Whether "oh" at ``i`` starts a number ("oh seven seven ..."), not an exclamation."""
    following = [t for _, _, t in toks[i + 1 : i + 3]]
    return len(following) >= 2 and all(
        t in _DIGIT_WORDS or t in _TENS or t in _REPEAT or t.isdigit() for t in following[:2]
    )


# -- keyword-led secrets -----------------------------------------------------------------------

_CODE_KEY = re.compile(
    r"\b(?:cvv2?|cvc2?|cv2|csc|cid|security (?:code|number|digits)|verification (?:code|number)|"
    r"(?:three|four|3|4)[- ]digit (?:code|number)|card code|code on the back|numbers on the back|"
    r"pin(?: number| code)?|passcode|sort code)\b",
    re.IGNORECASE,
)
# Substrings every keyword contains: most turns have none, and skip the keyword searches.
_CODE_HINTS = ("cv", "cs", "cid", "code", "number", "digit", "pin")
_EXPIRY_HINTS = ("exp", "valid", "thru", "through", "end date")
_EXPIRY_KEY = re.compile(
    r"\b(?:expiry(?: date)?|expiration(?: date)?|expires?|expiring|exp\.?|valid (?:thru|through|"
    r"until|till)|good (?:thru|through)|end date)\b",
    re.IGNORECASE,
)
_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec"
)
_WRITTEN_EXPIRY = re.compile(
    rf"\d{{1,2}}\s*[/.-]\s*\d{{2,4}}"
    rf"|(?:{_MONTHS})\.?,?\s+(?:of\s+)?(?:\d{{2,4}}|[a-z]+(?:[ -][a-z]+)?)",
    re.IGNORECASE,
)
# What may come between a keyword and its value: "expiry date is", "expires on the".
_LEAD = re.compile(
    r"(?:\s*(?:is|are|was|it's|its|it|the|date|number|code|on|in|of)\b|\s*[:=,-])*\s*",
    re.IGNORECASE,
)


def _first_run_after(text: str, at: int, runs: list[_Run], sizes: range) -> tuple[int, int] | None:
    """The span of the first digit run within a few words after ``at``, if its length fits."""
    for run in runs:
        if run.start >= at:
            gap = text[at : run.start]
            # A masked value between them means this keyword's value was already taken.
            if "[" in gap or len(gap) > 30 or len(gap.split()) > 5:
                return None
            if len(run.head) in sizes:
                return run.start, run.head_end  # "CVV one two three, four people"
            if len(run.digits) in sizes:
                return run.start, run.end
            return None
    return None


def _keys(key: re.Pattern[str], text: str) -> list[re.Match[str]]:
    """The keyword's matches, except inside a marker an earlier pass left ("[redacted
    security code]" says "security code")."""
    found = list(key.finditer(text))
    if found and "[" in text:
        markers = [(m.start(), m.end()) for m in _MARKER.finditer(text)]
        found = [m for m in found if not any(a <= m.start() < b for a, b in markers)]
    return found


def _codes(text: str, runs: list[_Run]) -> list[tuple[int, int]]:
    """Security codes, PINs and sort codes said after their keyword."""
    found = (_first_run_after(text, m.end(), runs, range(3, 7)) for m in _keys(_CODE_KEY, text))
    return [span for span in found if span is not None]


def _expiries(text: str, runs: list[_Run]) -> list[tuple[int, int]]:
    spans = []
    for m in _keys(_EXPIRY_KEY, text):
        lead = _LEAD.match(text, m.end())
        at = lead.end() if lead else m.end()
        written = _WRITTEN_EXPIRY.match(text, at)
        if written is not None:
            spans.append((written.start(), written.end()))
            continue
        span = _first_run_after(text, m.end(), runs, range(3, 7))
        if span is not None:
            spans.append(span)
    return spans


# -- e-mail and IBAN ---------------------------------------------------------------------------

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.IGNORECASE)
_TLD = (
    r"com|net|org|co|uk|io|ai|de|fr|es|it|nl|be|ie|us|ca|au|nz|edu|gov|info|biz|me|app|dev|"
    r"email|mail"
)
_SPOKEN_EMAIL = re.compile(
    r"\b(?:[a-z0-9]\s+){2,}(?:[a-z0-9]\s+)?(?:(?:dot|underscore|dash|hyphen)\s+\w+\s+)*at\s+\w+"
    rf"(?:\s+dot\s+\w+)*\s+dot\s+(?:{_TLD})\b"
    r"|\b\w+(?:\s+(?:dot|underscore|dash|hyphen)\s+\w+)*\s+at\s+\w+(?:\s+(?:dot|dash)\s+\w+)*"
    rf"\s+dot\s+(?:{_TLD})\b(?:\s+dot\s+(?:{_TLD})\b)?",
    re.IGNORECASE,
)
# Words before "at" that make "X at Y dot com" a place, not an address ("I'm at booking dot com").
_NOT_A_NAME = frozenset({
    "am", "m", "s", "re", "i'm", "im", "we", "we're", "were", "arrive", "arrived", "be", "is",
    "are", "was", "me", "us", "you", "it", "them", "here", "there", "booked", "book", "booking",
    "look", "looked", "find", "found", "saw", "seen", "see", "stay", "staying", "stayed", "meet",
    "eat", "work", "works", "live", "lives", "online", "website", "site", "page", "check", "that",
    "this",
})  # fmt: skip
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]){11,30}\b", re.IGNORECASE)


# -- identity values ---------------------------------------------------------------------------

_M = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec"
)
_ORD = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    "thirtieth"
)
_U = "one|two|three|four|five|six|seven|eight|nine"
_T = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_DAY = rf"(?:\d{{1,2}}(?:st|nd|rd|th)?|(?:twenty|thirty)[- ](?:{_ORD})|{_ORD})"
_YEAR = (
    rf"(?:\d{{4}}|'\d{{2}}|\d{{2}}|(?:eighteen|nineteen|twenty)[- ](?:hundred|oh[- ](?:{_U})|"
    rf"ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|"
    rf"(?:{_T})(?:[- ](?:{_U}))?)|two thousand(?: and)?(?:[- ](?:(?:{_T})(?:[- ](?:{_U}))?|"
    rf"ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|{_U}))?|"
    rf"(?:{_T})(?:[- ](?:{_U}))?|oh[- ](?:{_U}))"
)
_SPOKEN_DATE = re.compile(
    rf"\b(?:(?:{_M})\.?(?: the)? {_DAY},?(?: of)? {_YEAR}"
    rf"|(?:the )?{_DAY}(?: of)? (?:{_M})\.?,? {_YEAR})(?![\w'])",
    re.IGNORECASE,
)
_NUMERIC_DATE = re.compile(r"(?<![\d/.-])\d{1,2}([/.-])\d{1,2}\1(?:\d{4}|\d{2})(?![\d/.-])")
_BIRTH_KEY = re.compile(r"\b(?:born|birth ?(?:date|day)|date of birth|d\.?o\.?b\.?|dob)\b", re.I)
_DOB = date_of_birth()
_NUMBER_WORDS = re.compile(
    rf"(?:\s*,?\s*(?:\d+|oh|zero|{_U}|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
    rf"seventeen|eighteen|nineteen|(?:{_T})(?:[- ](?:{_U}))?)\b){{3,8}}",
    re.IGNORECASE,
)
_ID_KEY = re.compile(
    r"\b(?:member(?:ship)?|policy|patient|insurance|subscriber|account|customer|medicare|"
    r"medicaid|social security|national insurance|nhs|health card|id)(?: (?:id|number|no\.?|#|"
    r"code))?(?:\s*(?:is|it's|its|:|=|,))*\s*",
    re.IGNORECASE,
)
_ID_TOKEN = re.compile(
    rf"(?:[a-z](?=[\s,.-]|$)|[a-z]*\d[a-z\d-]*|oh|zero|double|triple|{_U}|ten|(?:{_T}))"
    r"(?:[\s,.-]+|$)",
    re.IGNORECASE,
)
_CARD_KEY = re.compile(
    r"\b(?:(?:last|final) (?:four|4)(?: digits)?(?: of (?:my|the) card)?|card ending(?: in)?|"
    r"ending in)(?:\s*(?:are|is|:|,))*\s*",
    re.IGNORECASE,
)


def _old_enough(found: str, led: bool) -> bool:
    """Whether a date with a year is a date of birth: said after "born" / "date of birth", or
    read as a date of birth at least 13 years ago."""
    value = _DOB.recognize(found)
    if value is None:
        return False
    return led or int(value.value[:4]) <= time.gmtime().tm_year - 13


# One search says which identity rules a turn needs at all (most need none).
_HINTS = re.compile(
    rf"\b(?:(?P<month>{_M})\b|(?P<birth>born|birth|d\.?o\.?b)|(?P<id>member|policy|patient|"
    r"insur|subscriber|account|customer|medic|social security|national insurance|nhs|"
    r"health card|id\b)|(?P<card>last (?:four|4)|card ending|ending in))",
    re.IGNORECASE,
)


def _identities(text: str) -> list[tuple[int, int, str]]:
    """Dates of birth, ids after their keyword and card digits, however said."""
    spans: list[tuple[int, int, str]] = []
    hints = {k for m in _HINTS.finditer(text) for k, v in m.groupdict().items() if v}
    numeric = "/" in text or "." in text or "-" in text
    if not hints and not numeric:
        return spans
    keys = [m.end() for m in _BIRTH_KEY.finditer(text)] if "birth" in hints else []

    def led(at: int) -> bool:
        return any(0 <= at - k <= 40 for k in keys)

    patterns = []
    if "month" in hints:
        patterns.append(_SPOKEN_DATE)
    if numeric:
        patterns.append(_NUMERIC_DATE)
    for pattern in patterns:
        for m in pattern.finditer(text):
            if _old_enough(m.group(), led(m.start())):
                spans.append((m.start(), m.end(), BIRTH_DATE))
    for k in keys:
        said = _NUMBER_WORDS.match(text, k)  # "date of birth is oh three oh three eighty five"
        if said is not None and not any(a <= k + 3 < b for a, b, _ in spans):
            lead = len(said.group()) - len(said.group().lstrip(" ,"))
            spans.append((said.start() + lead, said.end(), BIRTH_DATE))
    ids = _ID_KEY.finditer(text) if "id" in hints else ()
    for m in ids:
        end, symbols, digits = m.end(), 0, 0
        for t in _ID_TOKEN.finditer(text, m.end()):
            if t.start() != end:
                break
            word = t.group().strip(" ,.-").lower()
            symbols += len(word) if any(ch.isdigit() for ch in word) or len(word) == 1 else 1
            digits += sum(ch.isdigit() for ch in word) + (not word[:1].isdigit() and len(word) > 1)
            end = t.end()
        if symbols >= 4 and digits >= 2:
            spans.append((m.end(), len(text[:end].rstrip(" ,.-")), MEMBER_ID))
    cards = _CARD_KEY.finditer(text) if "card" in hints else ()
    for m in cards:
        n = _NUMBER_WORDS.match(text, m.end())
        span = (m.end(), n.end()) if n is not None else None
        if span is None:
            d = re.match(r"\d{4}\b", text[m.end() :])
            span = (m.end(), m.end() + 4) if d else None
        if span is not None:
            spans.append((span[0], span[1], CARD_DIGITS))
    return spans


def mask_spans(text: str, spans: Iterable[tuple[int, int, str]]) -> str:
    """``text`` with each ``(start, end, mask)`` span replaced by its mask; a span that
    overlaps one before it (by start) is dropped."""
    out, at = [], 0
    for start, end, mask in sorted(spans):
        if start < at or end <= start:
            continue
        out.append(text[at:start])
        out.append(mask)
        at = end
    out.append(text[at:])
    return "".join(out)


def _as_patterns(patterns: Patterns, what: str) -> tuple[re.Pattern[str], ...]:
    if isinstance(patterns, str | re.Pattern):
        patterns = [patterns]
    compiled = []
    for pattern in patterns:
        if isinstance(pattern, re.Pattern):
            compiled.append(pattern)
        elif isinstance(pattern, str):
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise ValueError(
                    f"redaction {what} pattern {pattern!r} is not a regex: {exc}"
                ) from None
        else:
            raise TypeError(
                f"redaction {what} patterns are regex strings or compiled patterns, got {pattern!r}"
            )
    return tuple(compiled)


class Redactor:
    """A transcript redactor, configured once per call: ``Session(state,
    redact=Redactor(patterns=[...], keep=[...]))``.

    ``patterns`` are masked as ``[redacted]`` before any built-in rule (an account reference
    of yours); ``keep`` patterns' matches are never masked, by any rule (a policy number
    ``PN-48213377`` the extractor must read). Calling it redacts: ``redactor(text)``.
    """

    __slots__ = ("keep", "patterns")

    def __init__(self, patterns: Patterns = (), *, keep: Patterns = ()) -> None:
        self.patterns = _as_patterns(patterns, "mask")
        self.keep = _as_patterns(keep, "keep")

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"redact() takes the transcript text, got {type(text).__name__}")
        # A pass can uncover what the next one would mask ("pin 0, 10, 0000000": the long
        # number masked, "0, 10" reads as a code after "pin"): repeat to a fixed point, so
        # redacting twice changes nothing. A pass that masks nothing ends it at once.
        for _ in range(8):
            done = self._once(text)
            if done == text:
                break
            text = done
        return text

    def _once(self, text: str) -> str:
        if not text:
            return text
        spans: list[tuple[int, int, str]] = []
        kept = [(m.start(), m.end()) for p in self.keep for m in p.finditer(text)]
        if "[" in text:  # what an earlier pass masked is left as it is
            kept += [(m.start(), m.end()) for m in _MARKER.finditer(text)]

        def add(start: int, end: int, mask: str) -> None:
            if end <= start:
                return
            for a, b in kept:
                if start < b and a < end:
                    return  # a kept pattern wins
            for a, b, _ in spans:
                if start < b and a < end:
                    return  # an earlier rule took it
            spans.append((start, end, mask))

        for pattern in self.patterns:
            for m in pattern.finditer(text):
                add(m.start(), m.end(), REDACTED)
        for m in _EMAIL.finditer(text):
            add(m.start(), m.end(), EMAIL)
        if " at " in text.lower():  # a spoken address has one
            for m in _SPOKEN_EMAIL.finditer(text):
                if m.group().split(None, 1)[0].lower() not in _NOT_A_NAME:
                    add(m.start(), m.end(), EMAIL)
        for m in _IBAN.finditer(text):
            if _iban_valid(m.group()):
                add(m.start(), m.end(), IBAN)
        runs = _digit_runs(text)
        # Long numbers first: a code's keyword must not split one ("pin 100-2000000").
        for m in _DIGIT_RUN.finditer(text):
            mask = _written(m)
            if mask is not None:
                add(m.start(), m.end(), mask)
        for run in runs:
            if run.spoken and len(run.digits) >= 7:
                add(run.start, run.end, _digits_mask(run.digits))
        for start, end, mask in _identities(text):
            add(start, end, mask)
        lowered = text.lower()
        if runs and any(hint in lowered for hint in _CODE_HINTS):
            for start, end in _codes(text, runs):
                add(start, end, SECURITY_CODE)
        if any(hint in lowered for hint in _EXPIRY_HINTS):
            for start, end in _expiries(text, runs):
                add(start, end, EXPIRY)
        return mask_spans(text, spans) if spans else text

    def __repr__(self) -> str:
        masked = [p.pattern for p in self.patterns]
        return f"Redactor(patterns={masked}, keep={[p.pattern for p in self.keep]})"


def _written(match: re.Match[str]) -> str | None:
    found = match.group()
    if _DATE.fullmatch(found):
        return None  # a date is not a secret number
    digits = re.sub(r"\D", "", found)
    mask = _digits_mask(digits)
    if mask is not LONG_NUMBER:
        return mask  # a card, even glued to a word
    text, start, end = match.string, match.start(), match.end()
    glued = (start and _GLUE.match(text[start - 1])) or (end < len(text) and _GLUE.match(text[end]))
    if glued and found.isdigit():
        return None  # part of a word ("AB1234567"): a reference, not a secret number
    return LONG_NUMBER


_DEFAULT = Redactor()


def redact(text: str, patterns: Patterns = (), *, keep: Patterns = ()) -> str:
    """``text`` with card numbers, security codes, expiry dates, e-mails, IBANs, long digit
    runs (written or spoken) and ``patterns`` masked; matches of ``keep`` are left as said.

    Custom patterns (regex strings or compiled patterns; one, or several) are applied first, so
    one can mask a structure that contains digits (an account reference) before the digit rules
    see it. For a call, build a :class:`Redactor` once and give it to the Session.
    """
    if not patterns and not keep:
        return _DEFAULT(text)
    return Redactor(patterns, keep=keep)(text)
