"""Building a conversation's turn contexts and handing them over, in two phases.

A context is built ``pending``: its deliveries have left the inbox, nothing counts as said yet.
The loop then says the model got it (``handed_over``: deliveries delivered, lines said, step
postures told) or that it did not (``dropped``: deliveries back in the inbox). Building the next
context concludes a pending one (``handover="auto"``: as handed over; ``"explicit"``: as
dropped; ``"manual"``: not at all, the loop concludes each itself, even late).
:class:`Contexts` is the part of a :class:`~slateflow.conversation.Conversation` that keeps
this account: the pending hand-over and the lines already said.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from .. import tracing
from ..errors import SessionError
from ..resolve import BackgroundResult
from .context import Handover, HandoverMode, Turn, TurnContext, build_context
from .inbox import Inbox, record_delivered
from .protocols import Governor

if TYPE_CHECKING:
    from ..resolve.runtime import Runtime
    from ..state import State

__all__ = ["Contexts"]


class Contexts:
    """One conversation's contexts: builds them from its flows' briefs and concludes their
    hand-over. ``number()`` is the last user turn's number (what a told marker records);
    ``publish(timing)`` publishes the voice timing a context carries."""

    def __init__(
        self,
        state: State,
        inbox: Inbox,
        runtime: Runtime,
        mode: HandoverMode,
        number: Callable[[], int],
        publish: Callable[[dict[str, Any] | None], None],
    ) -> None:
        self.state = state
        self.inbox = inbox
        self.runtime = runtime
        self.mode: HandoverMode = mode
        self.number = number
        self.publish = publish
        self.pending: Handover | None = None
        """The last context's hand-over while it is pending."""
        self.said: frozenset[str] = frozenset()
        """The lines of the newest context handed over (a line is told once)."""
        self._built = 0  # contexts built so far
        self._said_seq = 0  # the place of the context ``said`` came from

    def conclude_previous(self) -> None:
        """The loop moved on from the last context: in "auto" it used it, in "explicit" (not
        confirmed) it did not."""
        previous = self.pending
        if previous is not None and previous.status == "pending" and self.mode != "manual":
            self.conclude(previous, self.mode == "auto")

    def take(self, turn: Turn, flows: list[Governor], tools: tuple[str, ...]) -> TurnContext:
        """The context for ``turn``: it takes what waits in the inbox and is pending."""
        self.conclude_previous()
        context, closing = self._build(turn, flows, tools, tuple(self.inbox.take()), self.said)
        handover = context.handover
        assert handover is not None  # always built with one
        self._built += 1
        handover.seq = self._built
        handover.number = self.number()
        self.pending = handover
        if closing and self.mode == "auto":
            context.handover.final = True  # type: ignore[union-attr]  # always built with one
            context.handed_over()  # the goodbye: no next context will count it
        self.publish(context.voice_timing)
        return context

    def preview(self, turn: Turn, flows: list[Governor], tools: tuple[str, ...]) -> TurnContext:
        """The context :meth:`take` would build for ``turn`` now, without taking, concluding
        or recording anything (no hand-over: confirming or dropping it does nothing)."""
        pending = self.pending
        auto = pending is not None and pending.status == "pending" and self.mode == "auto"
        said = frozenset(pending.every) if auto and pending is not None else self.said
        context, _ = self._build(turn, flows, tools, tuple(self.inbox.peek()), said)
        return dataclasses.replace(context, handover=None)

    def _build(
        self,
        turn: Turn,
        flows: list[Governor],
        tools: tuple[str, ...],
        deliveries: tuple[BackgroundResult, ...],
        said: frozenset[str],
    ) -> tuple[TurnContext, bool]:
        briefs = [flow.brief(tools) for flow in flows]

        def ask(i: int, tool: str) -> str | None:
            admission = flows[i].admit(tool, record=False)
            return None if admission.allowed else admission.reason

        context = build_context(turn, briefs, tools, ask, deliveries, said, self.conclude)
        return context, bool(briefs) and any(b.closing for b in briefs)

    def conclude(self, handover: Handover, confirmed: bool) -> None:
        """Confirm (the model got it) or drop (it did not) a context's hand-over, once."""
        want: Literal["handed_over", "dropped"] = "handed_over" if confirmed else "dropped"
        if handover.status != "pending":
            if handover.status == want or handover.final:  # a goodbye counted when built
                return
            raise SessionError(
                f"this turn context was already {handover.status.replace('_', ' ')}; a context "
                "is handed over or dropped once (in handover='explicit', building the next "
                "context drops the last one)"
            )
        handover.status = want
        if self.pending is handover:
            self.pending = None
        if not confirmed:
            self.inbox.restore(handover.deliveries)
            return
        if handover.seq >= self._said_seq:  # confirmed late, an older one changes nothing
            self.said = frozenset(handover.every)
            self._said_seq = handover.seq
        for marker in handover.markers:
            try:
                marker(handover.number)
            except Exception as exc:
                self.runtime.report(marker, exc)
        record_delivered(self.state, handover.deliveries)
        if handover.deliveries and tracing.current is not None:
            tracing.current.delivered(self.state, handover.deliveries, handover.number)
