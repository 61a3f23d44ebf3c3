"""What the tests build again and again: the booking flow and its variants, a session on a
manual clock and a conversation on it.

A caller books a table: ``ask`` (the party size, ``b:size``) -> ``confirm`` (a yes, ``b:ok``) ->
``book`` -> ``bye``. Tests vary it by keyword (postures, tools, a terminal ``book``, no
``confirm``) instead of writing their own copy; :func:`voice_booking` is the demo's full flow
(slot, availability check in the background or another mode, offer or confirm, a once-only
booking). :func:`session_on` and :func:`conversation_on` open what a test talks to, on a
:class:`ManualClock` unless given another; :func:`example_module` imports a script of ``examples/``.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    captured,
    is_true,
)
from slateflow.demo_flow import availability, booking_flow
from slateflow.flow import Constraint, Guard
from slateflow.resolve import Mode

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

ASK = "Ask how many people."
READ_BACK = "Read the booking back and ask for a yes."
BYE = "Thank them and say goodbye."


def booking(
    *,
    ask: str = ASK,
    confirm: str | None = READ_BACK,
    ask_tools: tuple[str, ...] = (),
    book_tools: tuple[str, ...] = ("book_table",),
    book_done: str | Guard = "b:booked",
    book_posture: str | None = None,
    terminal_book: bool = False,
    bye: str | None = BYE,
    grounds: bool = False,
    constraints: Sequence[Constraint] = (),
    ambient: Sequence[str] = (),
) -> Flow:
    """The shared booking flow: ``ask`` -> ``confirm`` (unless ``confirm=None``) -> ``book``
    (done when ``book_done`` holds, a key that turns true or a guard; or terminal) -> ``bye``
    (unless ``bye=None``). ``grounds``: ``ask`` and ``confirm`` ground the party size;
    ``ambient``: tools admitted in every step."""
    steps = [
        Step(
            "ask",
            done=captured("b:size"),
            posture=ask,
            allow=list(ask_tools),
            ground="Party size: {b:size?not given}." if grounds else None,
        )
    ]
    last = "ask"
    if confirm is not None:
        steps.append(
            Step(
                "confirm",
                after=[last],
                done=is_true("b:ok"),
                posture=confirm,
                ground="Party of {b:size}." if grounds else None,
            )
        )
        last = "confirm"
    if terminal_book:
        steps.append(Step("book", after=[last], terminal=True, posture=book_posture))
    else:
        steps.append(
            Step(
                "book",
                after=[last],
                done=is_true(book_done) if isinstance(book_done, str) else book_done,
                allow=list(book_tools),
                posture=book_posture,
            )
        )
    if bye is not None and not terminal_book:
        steps.append(Step("bye", after=["book"], terminal=True, posture=bye))
    return Flow("booking", steps, list(constraints), ambient=list(ambient))


def voice_booking(
    lookup: Resolver | None = None, clock: ManualClock | None = None, *, mode: Mode = "background"
) -> Flow:
    """The demo's full booking flow (``slateflow.demo_flow.booking_flow``): ``slot`` ->
    ``check`` (runs ``lookup`` in ``mode``; default the demo's availability on ``clock``) ->
    ``offer`` or ``confirm`` -> ``book`` (``book_table``, once, after the yes) -> ``goodbye``;
    ``sorry`` (a transfer) when the lookup fails."""
    lookup = lookup if lookup is not None else availability(clock or ManualClock())
    return booking_flow(lookup, mode=mode)


@contextlib.asynccontextmanager
async def session_on(
    state: State | None = None, clock: ManualClock | None = None, **options: Any
) -> AsyncIterator[Session]:
    """A started Session on ``clock`` (a new ManualClock by default) over ``state`` (a new State
    on the same clock by default); ``options`` go to the Session. Closed when the block ends."""
    clock = clock if clock is not None else ManualClock()
    state = state if state is not None else State(clock=clock)
    async with Session(state, clock=clock, **options) as session:
        yield session


@contextlib.asynccontextmanager
async def conversation_on(
    state: State | None = None, clock: ManualClock | None = None, **options: Any
) -> AsyncIterator[Conversation]:
    """The conversation of a :func:`session_on` session; ``options`` go to the Conversation
    (``tools``, ``on_delivery``, ...). The session is ``conversation.session``."""
    async with session_on(state, clock) as session:
        yield Conversation(session, **options)


def example_module(name: str) -> ModuleType:
    """The module of ``examples/<name>.py``, imported as the examples' own tests do."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))
