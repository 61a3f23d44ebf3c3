"""Benchmarks of the recognizers over the labelled corpus of what callers say; prints a table.

Run: ``python bench/recognizer_bench.py`` (add ``--quick`` for a fast smoke run, as CI does).

For each part of the corpus (tuning, held-out: written before the fixes it measures, after:
written after them; see tests/conversation/spoken_corpus.py) and each recognizer (times,
dates, both, party sizes, yes/no, dates of birth, picks from a list) it prints how many
utterances were read right, how many wrong values came with confidence >= 0.9, and the cost
per utterance with every memoised reading forgotten first (a
recognizer reads a new turn once; the cache only helps the other fields of the same turn). The
redaction corpus (tests/conversation/data/redaction.jsonl) is timed the same way. When
dateparser is installed (``pip install dateparser``), its ``search_dates`` runs over the same
date and time utterances as a peer. Targets (issue): >= 97 % correct, no wrong value at
>= 0.9, <= 50 us per utterance.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC
from datetime import datetime as _dt
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "conversation"))

from slateflow.conversation.recognizers.words import clear_caches
from spoken_corpus import NOW, PART_FILES, Case, load, reader, score

CORPORA = Path(__file__).resolve().parents[1] / "tests" / "conversation" / "data"


def time_cases(cases: list[Case], passes: int) -> float:
    """Median seconds per utterance over ``passes`` runs of every case, uncached."""
    readers = [(reader(c), c.text) for c in cases]
    samples = []
    for _ in range(passes):
        total = 0.0
        for recognizer, text in readers:
            clear_caches()
            start = time.perf_counter()
            recognizer.recognize(text)
            total += time.perf_counter() - start
        samples.append(total / len(readers))
    return statistics.median(samples)


def time_dateparser(cases: list[Case], passes: int) -> float | None:
    try:
        from dateparser.search import search_dates
    except ImportError:
        return None
    settings = {"RELATIVE_BASE": _dt.fromtimestamp(NOW, tz=UTC).replace(tzinfo=None)}
    texts = [c.text for c in cases]
    search_dates(texts[0], languages=["en"], settings=settings)  # warm up its tables
    samples = []
    for _ in range(passes):
        start = time.perf_counter()
        for text in texts:
            search_dates(text, languages=["en"], settings=settings)
        samples.append((time.perf_counter() - start) / len(texts))
    return statistics.median(samples)


def time_redaction(passes: int) -> tuple[int, float] | None:
    path = CORPORA / "redaction.jsonl"
    if not path.exists():
        return None
    import json

    from slateflow.conversation import redact

    texts = [json.loads(line)["text"] for line in path.read_text().splitlines() if line]
    samples = []
    for _ in range(passes):
        start = time.perf_counter()
        for text in texts:
            redact(text)
        samples.append((time.perf_counter() - start) / len(texts))
    return len(texts), statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    passes = 3 if args.quick else 30
    cases = load()
    groups: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for case in cases:
        groups[(case.part, case.category)].append(case)
    print(f"slateflow recognizers over the corpus (Python {sys.version.split()[0]}, medians)")
    header = f"{'part':<10}{'recognizer':<15}{'utterances':>11}{'correct':>10}{'wrong@0.9':>11}"
    print(f"{header}{'us/utterance':>15}")
    print("-" * 72)
    for part in PART_FILES:
        right = wrong_sure = total = 0
        for (p, category), group in groups.items():
            if p != part:
                continue
            outcomes = [score(c) for c in group]
            ok = sum(o.correct for o in outcomes)
            sure = sum(not o.correct and (o.confidence or 0) >= 0.9 for o in outcomes)
            right, wrong_sure, total = right + ok, wrong_sure + sure, total + len(group)
            cost = time_cases(group, passes)
            print(
                f"{part:<10}{category:<15}{len(group):>11}{ok / len(group):>9.1%}{sure:>11}"
                f"{cost * 1e6:>12.1f} us"
            )
        if total:
            print(f"{part:<10}{'(all)':<15}{total:>11}{right / total:>9.1%}{wrong_sure:>11}")
    print("-" * 72)
    total_cost = time_cases(cases, passes)
    right = sum(score(c).correct for c in cases)
    wrong_sure = sum(
        not o.correct and (o.confidence or 0) >= 0.9 for o in (score(c) for c in cases)
    )
    print(
        f"{'all':<25}{len(cases):>11}{right / len(cases):>9.1%}{wrong_sure:>11}"
        f"{total_cost * 1e6:>12.1f} us"
    )
    timed = [c for c in cases if c.category in ("time", "date", "datetime")]
    peer = time_dateparser(timed, max(1, passes // 10))
    if peer is None:
        print(f"{'dateparser':<25}{'(peer not installed: pip install dateparser)':>47}")
    else:
        print(f"{'dateparser':<25}{len(timed):>11}{'':>10}{'':>11}{peer * 1e6:>12.1f} us  (peer)")
    red = time_redaction(passes)
    if red is not None:
        print(f"{'redact()':<25}{red[0]:>11}{'':>10}{'':>11}{red[1] * 1e6:>12.1f} us")


if __name__ == "__main__":
    main()
