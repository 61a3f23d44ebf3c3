"""What the model and the logs are told stays masked: the labelled redaction corpus
(tests/conversation/data/redaction.jsonl) of planted secrets (cards, security codes, expiry
dates, e-mails, IBANs, phone numbers, written or spoken) and ordinary booking talk that must
pass unchanged.

Both rates are shown in the run's summary ("corpus reports").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import session_on
from conftest import report
from slateflow import Conversation
from slateflow.conversation import (
    CARD,
    EMAIL,
    EXPIRY,
    IBAN,
    LONG_NUMBER,
    REDACTED,
    SECURITY_CODE,
    Redactor,
    luhn_valid,
    redact,
)

pytestmark = pytest.mark.corpus

ENDING_1111 = CARD.format(last4="1111")
ROWS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "redaction.jsonl").read_text().splitlines()
    if line
]
PLANTED = [r for r in ROWS if r["secrets"]]
ORDINARY = [r for r in ROWS if not r["secrets"]]


def test_the_corpus_has_over_a_hundred_utterances_of_both_kinds() -> None:
    assert len(ROWS) >= 100
    assert len(PLANTED) >= 50
    assert len(ORDINARY) >= 50


def test_every_planted_secret_is_masked() -> None:
    leaks = []
    secrets = 0
    for row in PLANTED:
        out = redact(row["text"])
        for secret in row["secrets"]:
            secrets += 1
            if secret.lower() in out.lower():
                leaks.append(f"{row['text']!r} -> {out!r} keeps {secret!r}")
    report(f"redaction corpus: {secrets - len(leaks)}/{secrets} planted secrets masked")
    assert leaks == []


def test_ordinary_booking_talk_is_left_as_said() -> None:
    changed = [(r["text"], redact(r["text"])) for r in ORDINARY]
    changed = [(text, out) for text, out in changed if out != text]
    lost = [
        (r["text"], keep) for r in PLANTED for keep in r["keep"] if keep not in redact(r["text"])
    ]
    rate = (len(changed) + len(lost)) / (len(ORDINARY) + sum(len(r["keep"]) for r in PLANTED))
    report(f"redaction corpus: false positives {rate:.1%} ({len(changed)} of {len(ORDINARY)} "
           f"ordinary turns changed, {len(lost)} kept phrases lost)")  # fmt: skip
    assert rate < 0.02, changed + lost


@pytest.mark.parametrize(
    ("said", "masked"),
    [
        ("four one one one, one one one one, one one one one, one one one one", ENDING_1111),
        ("the CVV is one two three", f"the CVV is {SECURITY_CODE}"),
        ("it expires oh nine twenty six", f"it expires {EXPIRY}"),
        ("john dot smith at gmail dot com", EMAIL),
        ("IBAN DE89370400440532013000", f"IBAN {IBAN}"),
        ("call five five five, one two three four", f"call {LONG_NUMBER}"),
        ("oh seven seven double oh, nine one two three four five", LONG_NUMBER),
    ],
)  # fmt: skip
def test_secrets_said_in_words_are_masked_with_what_they_were(said: str, masked: str) -> None:
    assert redact(said) == masked


def test_an_iban_with_a_wrong_checksum_is_only_a_long_number() -> None:
    assert redact("IBAN DE89370400440532013001") == "IBAN DE89370400440532013001"
    assert redact("IBAN DE89 3704 0044 0532 0130 01") == f"IBAN DE{LONG_NUMBER}"


def test_a_kept_pattern_is_never_masked_by_any_rule() -> None:
    said = "policy PN-48213377, card 4111 1111 1111 1111"
    assert redact(said) == f"policy PN-{LONG_NUMBER}, card {CARD.format(last4='1111')}"
    keeper = Redactor(keep=[r"PN-\d+"])
    assert keeper(said) == f"policy PN-48213377, card {CARD.format(last4='1111')}"
    assert redact(said, keep=re.compile(r"pn-\d+", re.I)).startswith("policy PN-48213377")


def test_added_patterns_mask_first_and_keep_still_wins() -> None:
    redactor = Redactor([r"\bclaim \w+"], keep=[r"claim ok"])
    assert redactor("claim X12 and claim ok") == f"{REDACTED} and claim ok"


@pytest.mark.parametrize(
    ("patterns", "keep", "error"),
    [("(", (), ValueError), ((), "[", ValueError), ([3], (), TypeError), ((), [None], TypeError)],
    ids=["bad mask regex", "bad keep regex", "mask not a pattern", "keep not a pattern"],
)
def test_a_bad_pattern_is_refused_when_the_redactor_is_built(
    patterns: object, keep: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="redaction"):
        Redactor(patterns, keep=keep)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_session_redacts_each_turn_with_its_own_redactor() -> None:
    async with session_on() as s:
        conversation = Conversation(s, redact=Redactor(keep=[r"PN-\d+"]))
        turn = await conversation.user_turn("my policy is PN-48213377, card 4111111111111111")
    assert turn.turn.text == "my policy is PN-48213377, card [card ending 1111]"
    assert conversation.transcript[0].text == turn.turn.text


DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@st.composite
def spoken_cards(draw: st.DrawFn) -> tuple[str, str]:
    """A Luhn-valid 16-digit card, and how a caller reads it out: digit by digit in groups of
    four, "oh" for zero now and then, with commas, pauses and fillers between the groups."""
    body = draw(st.text(alphabet="0123456789", min_size=15, max_size=15))
    card = next(body + c for c in "0123456789" if luhn_valid(body + c))
    groups = []
    for k in range(0, 16, 4):
        words = [
            draw(st.sampled_from(["oh", "zero"])) if d == "0" else DIGIT_WORDS[int(d)]
            for d in card[k : k + 4]
        ]
        groups.append(" ".join(words))
    joins = st.sampled_from([", ", " ", "... ", ", uh, ", " um "])
    said = groups[0] + "".join(draw(joins) + g for g in groups[1:])
    return card, said


@settings(deadline=None, max_examples=150)
@given(spoken_cards(), st.sampled_from(["my card is ", "it's ", "", "number "]))
def test_any_card_read_out_digit_by_digit_is_masked(card: tuple[str, str], lead: str) -> None:
    digits, said = card
    out = redact(f"{lead}{said}, thanks")
    assert out == f"{lead}{CARD.format(last4=digits[-4:])}, thanks"
    assert redact(out) == out


SIZES = ["two", "four", "six", "twelve", "twenty"]
TIMES = ["seven", "half past seven", "seven thirty", "quarter to eight", "eight o'clock", "noon"]
DAYS = ["Saturday", "the twenty first", "tomorrow", "the 3rd of June", "next Friday"]


@settings(deadline=None, max_examples=150)
@given(st.sampled_from(SIZES), st.sampled_from(TIMES), st.sampled_from(DAYS), st.booleans())
def test_booking_talk_with_numbers_in_words_is_never_masked(
    size: str, time: str, day: str, people_first: bool
) -> None:
    said = (
        f"a table for {size} people at {time} on {day}"
        if people_first
        else f"{day} at {time}, for {size}, thanks"
    )
    assert redact(said) == said
