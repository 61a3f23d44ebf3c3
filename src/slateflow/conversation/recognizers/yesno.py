"""Yes or no, as callers answer: idioms, hedges, questions back and self-corrections.

A wrong "yes" books what the caller never agreed to, so the reader is careful in that
direction: any negation wins ("yes... no, sorry" is no), a hedge or a question back is not an
answer ("hold on", "is that with the terrace?" give nothing), and a bare "please" is not a yes.
Idioms that carry a negation word but mean yes ("no problem", "why not", "I don't mind") are
read first.
"""

from __future__ import annotations

import re

from .base import Recognition, Recognizer
from .words import cached

__all__ = ["yes_no"]

# Phrases are matched on the words joined by single spaces, at word boundaries.
_YES_IDIOMS = (
    "no problem", "not a problem", "no problemo", "no worries", "why not", "i don't mind",
    "i do not mind", "don't mind", "i don't see why not", "no objection", "no objections",
    "can't complain", "couldn't be better", "no doubt", "i don't see a problem",
    "don't see why not", "that's not a problem", "not an issue", "no issue", "no issues",
    "wouldn't miss it", "can't go wrong", "nothing wrong with that",
)  # fmt: skip
_HEDGES_NEGATED = (
    "not sure", "i'm not sure", "im not sure", "i don't know", "i dont know", "dunno",
    "don't know", "not certain", "can't say", "not yet sure", "i'm not certain",
)  # fmt: skip
_NO_PHRASES = (
    "not really", "i'd rather not", "rather not", "i don't think so", "don't think so",
    "dont think so", "no thanks", "no thank you", "not quite", "not right", "that's wrong",
    "not correct", "doesn't work", "does not work", "won't work", "wouldn't work",
    "don't want", "not interested", "no way", "never mind", "nevermind", "not now",
    "actually no", "uh uh", "i'm afraid not", "afraid not", "definitely not",
    "of course not", "absolutely not", "not at all sure", "not exactly", "not that",
    "i'd prefer not", "prefer not", "let's not", "better not", "not for me",
)  # fmt: skip
_NO_WORDS = frozenset({
    "no", "nope", "nah", "nay", "not", "don't", "dont", "never", "wrong", "cancel", "negative",
    "incorrect", "didn't", "doesn't", "isn't", "wasn't", "won't", "wouldn't", "can't", "cannot",
    "shouldn't", "aren't",
})  # fmt: skip
_YES_PHRASES = (
    "go ahead", "go for it", "do it", "please do", "yes please", "sounds good", "sounds great",
    "sounds perfect", "sounds right", "sounds fine", "sounds lovely", "that works",
    "works for me", "that's it", "that's correct", "that's right", "you got it", "book it",
    "let's do it", "let's do that", "go on then", "spot on", "bang on", "uh huh", "mm hmm",
    "by all means", "i'd like that", "that would be great", "that'd be great",
    "would be great", "would be lovely", "sure thing", "you bet", "for sure", "all right",
    "of course", "that's fine", "that's good", "that's great", "that's perfect", "it is",
    "yes it is", "i do", "that's the one", "right on", "sounds like a plan", "can do",
    "will do", "would love to", "i would", "i'd love that", "that'll do", "that will do",
    "please go ahead", "confirm it", "i confirm", "that's ok", "that's okay", "fine by me",
    "ok by me", "okay by me", "good to go", "all good", "too right", "dead right",
)  # fmt: skip
_YES_WORDS = frozenset({
    "yes", "yeah", "yep", "yup", "yah", "yea", "ya", "yas", "aye", "sure", "correct", "right",
    "ok", "okay", "okey", "alright", "absolutely", "definitely", "certainly", "affirmative",
    "fine", "great", "perfect", "exactly", "indeed", "precisely", "lovely", "brilliant", "grand",
    "cool", "awesome", "excellent", "wonderful", "confirmed", "agreed", "deal", "yessir", "righto",
    "bingo", "mhm", "totally", "gladly", "splendid", "superb", "fab", "fantastic", "super",
})  # fmt: skip
_WEAK_YES = frozenset(["cool", "good"])
_HEDGES = (
    "maybe", "perhaps", "possibly", "probably", "i guess", "i suppose", "let me think",
    "let me check", "hold on", "hang on", "wait", "one moment", "one sec", "one second",
    "just a sec", "just a second", "just a moment", "give me a sec", "give me a second",
    "let me see", "not sure", "depends", "it depends", "kind of", "sort of",
    "hard to say", "we'll see", "could be", "if",
)  # fmt: skip
_QUESTION_START = frozenset({
    "is", "are", "was", "were", "do", "does", "did", "can", "could", "would", "will", "should",
    "shall", "what", "when", "where", "which", "who", "whom", "whose", "why", "how", "may",
    "might", "have", "has", "isn't", "aren't", "won't", "wouldn't", "doesn't", "didn't",
    "couldn't", "shouldn't", "am",
})  # fmt: skip
# Clauses that start like a question but answer.
_NOT_QUESTIONS = (
    "do it", "can do", "will do", "would love", "would be great", "would be lovely",
    "would be perfect", "would be fine", "would be good", "why not", "is fine", "is good",
    "is great", "is perfect", "does the job", "would do", "will be fine", "could be worse",
    "might as well", "do go ahead", "do please", "is it", "it is",
)  # fmt: skip
_FILLERS = frozenset({
    "uh", "um", "er", "erm", "hmm", "oh", "well", "so", "and", "but", "like", "ah", "eh", "mm",
    "hm",
})  # fmt: skip
_GUESS_SO = re.compile(
    r"(?:(?:uh|um|er|well|hmm|yeah|yes) )*i (?:guess|suppose|think|believe|reckon) so\b"
)
_CLAUSE = re.compile(r"[.,!?;:]+|\s-\s|\.\.\.")
_WORDS = re.compile(r"[a-z']+")


def _phrase(pattern: tuple[str, ...]) -> re.Pattern[str]:
    alts = sorted(pattern, key=len, reverse=True)
    return re.compile(r"(?<![a-z'])(?:" + "|".join(map(re.escape, alts)) + r")(?![a-z'])")


_YES_IDIOM_RE = _phrase(_YES_IDIOMS)
_HEDGE_NEG_RE = _phrase(_HEDGES_NEGATED)
_NO_PHRASE_RE = _phrase(_NO_PHRASES)
_YES_PHRASE_RE = _phrase(_YES_PHRASES)
_HEDGE_RE = _phrase(_HEDGES)


_NOISES = re.compile(r"\b(?:mm+[ -]?hm+|uh[ -]huh|mhm+|mm+)\b")

# US discourse markers: "yeah, no" and "no, yeah" lead into the real answer ("yeah, no,
# that's fine" is a yes; "yeah, no" alone is a no, "no, yeah" alone a yes).
_LEAD_FILLERS = r"(?:(?:uh|um|oh|well|so|i mean)[,.]? )*"
_YEAH_NO = re.compile(
    rf"^{_LEAD_FILLERS}(?:yeah|yes|yep|yea|ya)[,.]?(?: |\.\.\.)*no+[,.!]*(?:\s+(.*))?$"
)
_NO_YEAH = re.compile(
    rf"^{_LEAD_FILLERS}(?:no|nah)[,.]?(?: |\.\.\.)*(?:yeah|yes)[,.!]*(?:\s+(.*))?$"
)
# "go ahead and cancel it" agrees to what was asked, whatever the verb.
_GO_AHEAD = re.compile(
    r"\b(?:go ahead and|please go ahead and|yes,? please) (?!not\b|don'?t\b)[a-z']+"
)
# "I'm good" / "I'm all set" decline an offer ("I'm good with that" agrees).
_DECLINE = re.compile(
    r"(?<![a-z'])(?:i'?m|i am) (?:good|all set|ok|okay|fine)(?: thanks| thank you)?"
    r"(?! with| to| for)(?![a-z'])"
)


def _words(text: str) -> list[str]:
    # "mm-hmm" and "uh-huh" are a yes; "hmm" alone is thinking.
    text = _NOISES.sub(lambda m: "yes" if m.group() not in ("mm", "mmm") else " ", text)
    return _WORDS.findall(text.replace("\u2019", "'").replace("-", " "))


def _is_question(clause: list[str]) -> bool:
    content = [w for w in clause if w not in _FILLERS]
    if not content or content[0] not in _QUESTION_START:
        return False
    joined = " ".join(content)
    return not any(joined.startswith(p) for p in _NOT_QUESTIONS)


def _answer_only(clause: list[str]) -> bool:
    return bool(clause) and all(
        w in _YES_WORDS or w in _NO_WORDS or w in _FILLERS or w in ("please", "sir", "madam")
        for w in clause
    )


@cached
def _read(text: str) -> Recognition | None:
    lowered = text.lower().replace("\u2019", "'").strip()
    marker = _YEAH_NO.match(lowered) or _NO_YEAH.match(lowered)
    if marker is not None:
        rest = (marker.group(1) or "").strip(" ,.!")
        idiom = marker.re is _YEAH_NO and _YES_IDIOM_RE.match(f"no {rest}")
        found = _read(rest) if rest and not idiom else None
        if found is not None:
            # The marker says the caller heard the question; the rest is the answer.
            return Recognition(found.value, min(found.confidence, 0.85))
        if marker.re is _YEAH_NO and not idiom:
            return Recognition(False, 0.9)  # "yeah, no", "yes... no, sorry": a yes taken back
    # "no... yes" with nothing after is read as usual: negation wins.
    if _DECLINE.search(lowered) and not _YES_PHRASE_RE.search(lowered):
        return Recognition(False, 0.8)
    lowered = _GO_AHEAD.sub("go ahead", lowered)
    clauses = [_words(c) for c in _CLAUSE.split(lowered)]
    clauses = [c for c in clauses if c]
    if not clauses:
        return None
    questioned = "?" in lowered or any(_is_question(c) for c in clauses)
    if questioned:
        # An answer then a question of its own ("Yes. Is there parking?") is still the answer;
        # anything else with a question in it ("sure, but is it outside?") is not one.
        if not _answer_only(clauses[0]) or "but" in lowered.split() or len(clauses) == 1:
            return None
        confidence = 0.8
    else:
        confidence = 0.9
    said = " ".join(w for c in clauses for w in c)
    said, idioms = _YES_IDIOM_RE.subn(" ", said)
    said, unsure = _HEDGE_NEG_RE.subn(" ", said)
    if _NO_PHRASE_RE.search(said) or any(w in _NO_WORDS for w in said.split()):
        return Recognition(False, confidence)  # negation wins: "yes... no, sorry" is a no
    if _GUESS_SO.match(said):
        return Recognition(True, 0.7)  # "I guess so": a yes, if a reluctant one
    if unsure or _HEDGE_RE.search(said) or " but " in f" {said} ":
        return None  # "hold on", "maybe", "yes but make it 8": not an answer to the question
    yes = idioms > 0 or bool(_YES_PHRASE_RE.search(said))
    words = said.split()
    strong = yes or any(w in _YES_WORDS and w not in _WEAK_YES for w in words)
    if strong:
        return Recognition(True, confidence)
    if any(w in _WEAK_YES for w in words):
        return Recognition(True, min(confidence, 0.8))
    return None


class _YesNo(Recognizer):
    def recognize(self, text: str) -> Recognition | None:
        return _read(text)

    def describe(self) -> str:
        return "yes or no"


def yes_no() -> Recognizer:
    """True for yes, False for no, None for neither.

    Reads idioms ("no problem", "why not", "I don't mind", "sure thing", "that works" are yes;
    "not really", "I'd rather not", "actually no" are no); any negation wins ("yes... no,
    sorry" is no); a hedge ("hold on", "maybe", "let me think") or a question back ("is that
    with the terrace?") is not an answer, and a bare "please" is not a yes. A clear answer is
    read at 0.9, a mild one ("cool") or an answer followed by a question of its own at 0.8, "I
    guess so" at 0.7; a yes with a "but" ("yes but make it 8") is not an answer.

    US discourse markers are read as such: "yeah, no, that's fine" and "no, yeah, go ahead"
    answer with what follows the marker (at most 0.85); "yeah, no" alone is a no, and "no...
    yes" alone still a no (negation wins). "Go ahead and cancel it" agrees to what was
    asked; "I'm good" / "I'm all set" decline an offer (0.8).
    """
    return _YesNo()
