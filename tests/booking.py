"""The booking flow the tests share, and its variations.

A caller books a table: ``ask`` (the party size, ``b:size``) -> ``confirm`` (a yes, ``b:ok``) ->
``book`` -> ``bye``. Tests vary it by keyword (postures, tools, a terminal ``book``, no
``confirm``) instead of writing their own copy; :func:`voice_booking` is the demo's full flow
(slot, availability check in the background, offer or confirm, a once-only booking).
"""

from __future__ import annotations

from slateflow import Flow, ManualClock, Resolver, Step, captured, is_true
from slateflow.demo_flow import availability, booking_flow

ASK = "Ask how many people."
READ_BACK = "Read the booking back and ask for a yes."
BYE = "Thank them and say goodbye."


def booking(
    *,
    ask: str = ASK,
    confirm: str | None = READ_BACK,
    ask_tools: tuple[str, ...] = (),
    book_tools: tuple[str, ...] = ("book_table",),
    book_done: str = "b:booked",
    book_posture: str | None = None,
    terminal_book: bool = False,
    bye: str | None = BYE,
) -> Flow:
    """The shared booking flow: ``ask`` -> ``confirm`` (unless ``confirm=None``) -> ``book``
    (done when ``book_done`` is true, or terminal) -> ``bye`` (unless ``bye=None``)."""
    steps = [Step("ask", done=captured("b:size"), posture=ask, allow=list(ask_tools))]
    last = "ask"
    if confirm is not None:
        steps.append(Step("confirm", after=[last], done=is_true("b:ok"), posture=confirm))
        last = "confirm"
    if terminal_book:
        steps.append(Step("book", after=[last], terminal=True, posture=book_posture))
    else:
        steps.append(
            Step(
                "book",
                after=[last],
                done=is_true(book_done),
                allow=list(book_tools),
                posture=book_posture,
            )
        )
    if bye is not None and not terminal_book:
        steps.append(Step("bye", after=["book"], terminal=True, posture=bye))
    return Flow("booking", steps)


def voice_booking(lookup: Resolver | None = None, clock: ManualClock | None = None) -> Flow:
    """The demo's full booking flow (``slateflow.demo_flow.booking_flow``)."""
    return booking_flow(lookup if lookup is not None else availability(clock or ManualClock()))
