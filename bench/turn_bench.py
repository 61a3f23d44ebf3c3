"""Benchmarks of a conversation turn; prints a table of medians.

Run: ``python bench/turn_bench.py`` (add ``--quick`` for a fast smoke run, as CI does).

- ``conversation.user_turn(text)`` with no extractor and no flow: the floor (redaction, the
  transcript, the turn keys, clearing them, an empty context).
- The same with a recognizer extractor of three fields and a 6-step flow with postures, grounds,
  a repair policy and voice timing: what a voice loop pays per turn between the caller stopping
  and the model's context being ready.
- ``conversation.context_now()`` on that flow (what a loop pays to ask between turns).
- Redaction alone on a 20-word turn with a card number.

The issue sets no target for turns; a voice loop's budget between end of speech and the model
call is tens of milliseconds, so anything under a millisecond is noise to it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import anyio

from slateflow import (
    Conversation,
    Flow,
    RepairPolicy,
    Session,
    State,
    Step,
    VoiceTiming,
    captured,
    is_true,
)
from slateflow.conversation import Extract, datetime, integer_near, redact, true_only, yes_no
from slateflow.resolve import SystemClock

TEXT = "Saturday at 7 pm for four people please, my card is 4111 1111 1111 1111, thanks a lot"


def plan() -> Flow:
    return Flow(
        "booking",
        [
            Step(
                "ask",
                done=captured("b:date", "b:size"),
                posture="Ask for the day and the party size.",
                ground="Known: {b:date?day:no day}, {b:size?size:no size}.",
                repair=RepairPolicy(reprompt_after=2, escalate_after=1000),
                timing=VoiceTiming(reprompt_after_ms=6000),
            ),
            Step("confirm", after=["ask"], done=is_true("b:ok"), posture="Confirm."),
            Step("a", after=["confirm"], done=is_true("x:a"), posture="A."),
            Step("b", after=["a"], done=is_true("x:b"), posture="B."),
            Step("c", after=["b"], done=is_true("x:c"), posture="C."),
            Step("end", after=["c"], terminal=True, posture="Bye."),
        ],
    )


async def bench_turns(loaded: bool, turns: int, state: State | None = None) -> float:
    """Median seconds of a turn (``state``: a State of the caller's, e.g. a shared one)."""
    # The real clock, as in production (a ManualClock would let work settle at each turn).
    clock = SystemClock()
    async with Session(state if state is not None else State(), clock=clock) as session:
        conversation = Conversation(session)
        if loaded:
            when = datetime(clock)
            conversation.add_extractor(
                Extract("b")
                .field("date", when.pick("weekday"))
                .field("size", integer_near(["people"]))
                .field("ok", yes_no(), true_only())
                .build()
            )
            conversation.run_flow(plan())
        await conversation.user_turn(TEXT)  # warm up
        samples = []
        for _ in range(turns):
            start = time.perf_counter()
            await conversation.user_turn(TEXT)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)


async def bench_manual_clock_turns(tasks: int, turns: int) -> float:
    """A turn under a ManualClock while ``tasks`` other tasks wait in the process (tests that
    run many calls at once): settling the clock must not cost O(tasks)."""
    from slateflow import ManualClock

    idle = anyio.Event()
    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(idle.wait)
        async with Session(State(), clock=ManualClock()) as session:
            conversation = Conversation(session)
            await conversation.user_turn(TEXT)
            samples = []
            for _ in range(turns):
                start = time.perf_counter()
                await conversation.user_turn(TEXT)
                samples.append(time.perf_counter() - start)
        idle.set()
    return statistics.median(samples)


async def bench_context_now(calls: int) -> float:
    async with Session(State()) as session:
        conversation = Conversation(session)
        conversation.run_flow(plan())
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            conversation.context_now()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)


def bench_redact(calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        redact(TEXT)
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    n = 200 if args.quick else 3000
    rows: list[tuple[str, Any]] = [
        ("user_turn, nothing attached", anyio.run(bench_turns, False, n)),
        ("user_turn, 3-field extractor + 6-step flow", anyio.run(bench_turns, True, n)),
        ("context_now, 6-step flow", anyio.run(bench_context_now, n)),
        (
            "user_turn, ManualClock, 1,000 other tasks waiting",
            anyio.run(bench_manual_clock_turns, 1000, n // 4),
        ),
        ("redact a 20-word turn", bench_redact(n * 5)),
    ]
    print(f"slateflow turn benchmarks (Python {sys.version.split()[0]}, medians)")
    print(f"{'measure':<48}{'value':>12}")
    print("-" * 60)
    for name, seconds in rows:
        print(f"{name:<48}{seconds * 1e6:>9.1f} us")


if __name__ == "__main__":
    main()
