"""What callers say, read right: the labelled corpus (tests/conversation/data/spoken.jsonl) of
times, dates, party sizes and yes/no answers, in US and UK phrasings, with fillers and
self-corrections.

The accuracy per category is shown in the run's summary ("corpus reports").
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from conftest import report
from spoken_corpus import Outcome, load, score

pytestmark = pytest.mark.corpus

CASES = load()


def outcomes() -> dict[str, list[Outcome]]:
    found: dict[str, list[Outcome]] = defaultdict(list)
    for case in CASES:
        found[case.category].append(score(case))
    return found


def test_the_corpus_is_large_and_covers_every_category() -> None:
    categories = {c.category for c in CASES}
    assert len(CASES) >= 300
    assert categories == {"time", "date", "datetime", "party_size", "yes_no"}
    assert len({(c.category, c.text, str(c.options)) for c in CASES}) == len(CASES)


def test_recognizers_read_at_least_97_percent_of_the_corpus_right_per_category() -> None:
    lines = []
    failed = []
    for category, results in sorted(outcomes().items()):
        right = sum(o.correct for o in results)
        lines.append(f"{category:<11} {right}/{len(results)} = {right / len(results):.1%}")
        failed += [o for o in results if not o.correct]
        assert right / len(results) >= 0.97, "\n".join(
            f"{o.case.text!r}: got {o.got!r}, want {o.case.expect!r}" for o in failed
        )
    total = sum(len(r) for r in outcomes().values())
    lines.append(f"{'all':<11} {total - len(failed)}/{total}")
    for line in lines:
        report(f"spoken corpus: {line}")


def test_no_wrong_value_is_read_with_confidence_0_9_or_more() -> None:
    sure_and_wrong = [
        o
        for results in outcomes().values()
        for o in results
        if not o.correct and o.confidence is not None and o.confidence >= 0.9
    ]
    report(f"spoken corpus: wrong values at confidence >= 0.9: {len(sure_and_wrong)}")
    assert sure_and_wrong == []


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.expect is None], ids=lambda c: f"{c.category}:{c.text}"
)
def test_what_is_not_said_is_not_read(case: object) -> None:
    outcome = score(case)  # type: ignore[arg-type]
    assert outcome.correct, f"read {outcome.got!r} from {outcome.case.text!r}"
