"""The demo on a durable state: ``python -m slateflow demo --db call.db``.

The booking call of the demo's flow part runs on ``State.open(path)``. The first run drops the
call while the availability lookup is still in flight; running the same command again recovers
the file and picks the call up where it was: the flow resumes at its step without re-entering
the steps already done, the lookup that never finished runs again, the caller's turns already
heard are not replayed, and the booking tool runs once. A third run finds the call complete.

Where the conversation stands (how many of the scripted caller turns were heard) is the
application's own state, so it lives in the State too (``demo:beats``), next to the flow's
marking.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime

from .conversation import Conversation
from .demo_flow import TOOLS, Narrator, availability, booking_flow, extractors
from .resolve import ManualClock, Session
from .state import State

__all__ = ["DROP_AFTER", "run_durable_demo"]

Out = Callable[[str], object]

START = datetime(2025, 6, 13, 18, 0, 0, tzinfo=UTC)

# What happens in the call, in order: the caller speaks, the model calls a tool, or the demo
# waits for the booking system (on the session's manual clock) until a step is reached.
BEATS: list[tuple[str, str]] = [
    ("hear", "Hello, I'd like a table."),
    ("hear", "Saturday at 7 pm, for four people. My card is 4111 1111 1111 1111."),
    ("tool", "book_table"),
    ("wait", "offer"),
    ("hear", "Yes, 7:30 pm works for us."),
    ("hear", "Yes, that is right."),
    ("tool", "book_table"),
]
DROP_AFTER = 3
"""The first run drops the call after this many beats (the availability lookup in flight)."""

BEATS_KEY = "demo:beats"


async def run_durable_demo(path: str | os.PathLike[str], out: Out) -> State:
    """Run (or resume) the durable booking call in ``path``; returns the State (closed)."""
    state = State.open(path)
    try:
        await _call(state, str(path), out)
    finally:
        state.close()
    return state


async def _call(state: State, path: str, out: Out) -> None:
    out(f"slateflow demo --db {path}: a booking call that survives a restart")
    out("=" * 60)
    heard = state.get(BEATS_KEY, 0)
    if heard >= len(BEATS):
        booked = state.get("flow:booking:marking", {}).get("tools", {}).get("book_table", 0)
        out(f"The call in {path} is complete; nothing to resume.")
        out(
            f"  booking: {state.get('booking:date')} at {state.get('booking:time')} for "
            f"{state.get('booking:party_size')}; book_table ran {booked} time(s)"
        )
        out(f"  its timeline: slateflow replay {path}   (delete the file to start over)")
        return
    if state.journal.cursor:
        out(
            f"Recovered {path}: {state.journal.cursor} commits, {heard} of {len(BEATS)} beats of "
            f"the call heard; flow 'booking' done {state.get('flow:booking:done')}, active "
            f"{state.get('flow:booking:active')}"
        )
        status = state.entry("availability:status")
        if status is not None:
            reason = (status.provenance.meta or {}).get("reason")
            out(f"  availability:status = {status.value!r}" + (f" ({reason})" if reason else ""))
    else:
        out(f"A new call, recorded in {path} (durability='batch').")

    clock = ManualClock(start=START.timestamp())
    flow = booking_flow(availability(clock)).compile(tools=TOOLS)
    slots, answers = extractors(clock)
    say = Narrator(out, slots, answers, verbose=True)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, tools=TOOLS)
        conversation.add_extractor(slots)
        conversation.add_extractor(answers)
        say_steps = heard == 0
        runner = conversation.run_flow(flow)
        say.follow(runner)
        try:
            if not say_steps:
                out(f"  the flow resumed at {runner.active_steps}; done: {runner.done_steps}")
                if state.get("availability:status") == "running":
                    out("  the lookup that did not finish runs again (at-least-once)")
            for n in range(heard, len(BEATS)):
                if heard == 0 and n == DROP_AFTER:
                    state.sync()
                    out(
                        f"  ... the line drops here, with availability "
                        f"{state.get('availability:status')!r}. Run the same command again "
                        "to resume the call."
                    )
                    return
                kind, what = BEATS[n]
                if kind == "hear":
                    await say.hear(conversation, what)
                elif kind == "tool":
                    await say.run_tool(conversation, what)
                else:
                    out("  (the booking system answers, in the background)")
                    await clock.advance(0.4)
                    await runner.wait_for_step(what)
                    say.model_told(conversation.context_now())
                state.set(BEATS_KEY, n + 1, source="system", writer="demo")
            booked = runner.marking.tools_ok.get("book_table", 0)
            out(
                f"  complete: {runner.is_complete}; booked {state.get('booking:date')} at "
                f"{state.get('booking:time')}; book_table ran {booked} time(s)"
            )
            out(f"  its timeline: slateflow replay {path}")
        finally:
            say.unfollow(runner)
