"""What a conversation asks of the flows that govern it and of the extractors that read it.

Both are protocols with public method names, as lifecycle hooks are in the libraries people
know: anything that has these methods plugs in. A ``FlowRunner`` and a ``StackRunner`` are
:class:`Governor` s; the extractors of :mod:`slateflow.conversation.extract` and the
:class:`~slateflow.conversation.LLMExtractor` are :class:`TurnHook` s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..flow import Admission, Brief
from .context import Turn

if TYPE_CHECKING:
    from .conversation import Conversation

__all__ = ["Governor", "TurnHook"]


@runtime_checkable
class Governor(Protocol):
    """A running flow as a conversation sees it: it advances on turns and tool successes,
    answers tool admission and says, in one :class:`~slateflow.flow.Brief`, what the model
    should be told.

    ``begin_turn`` runs before a turn's extractors, ``on_turn`` after them (it may wait for
    the flow's call-mode actions); ``abort_turn`` undoes ``begin_turn`` for a turn that was
    cancelled or failed before it was counted. ``admit(tool, record=...)`` is the one way to
    ask whether a tool may run (``record=False``: a question, not a call). A closed governor
    is left out.
    """

    @property
    def closed(self) -> bool:
        """Whether the flow has stopped governing (its session closed)."""

    @property
    def is_over(self) -> bool:
        """Whether the flow is over: complete, its closing words handed to the model."""

    @property
    def ambient(self) -> frozenset[str]:
        """The tools admitted whatever step is active (a transfer, say)."""

    def begin_turn(self) -> None:
        """A user turn starts: count it, and note what the model was told before it."""

    def abort_turn(self) -> None:
        """The turn begun last was not taken (cancelled or failed): forget it."""

    async def on_turn(self) -> None:
        """The turn's words are in the State: advance, waiting for call-mode actions."""

    def on_tool_ok(self, tool: str) -> None:
        """``tool`` ran successfully: count it for the guards that wait on it."""

    def admit(self, tool: str, *, record: bool = True) -> Admission:
        """May the model call ``tool`` now (``record=False``: a question, not a call)?"""

    def brief(self, tools: Iterable[str] = ()) -> Brief:
        """What the model is told now: active steps, postures, grounds, the tools of ``tools``
        available."""


@runtime_checkable
class TurnHook(Protocol):
    """An extractor as a conversation sees it (``conversation.add_extractor``).

    ``on_turn`` runs on every user turn (after the turn is recorded, before the flows
    advance), ``on_tool`` after a tool succeeded, and ``on_step_change`` when a flow enters a
    step whose posture was handed to the model after user turn ``since``: it may re-read
    only the turns said after that. Each decides for itself whether to act (its triggers).
    """

    name: str

    async def on_turn(self, conversation: Conversation, turn: Turn, /) -> None:
        """Called with each user turn the conversation takes, before the flows advance."""

    async def on_tool(self, conversation: Conversation, tool: str, /) -> None:
        """Called after each tool that ran successfully."""

    async def on_step_change(self, conversation: Conversation, since: int, /) -> None:
        """Called when the active steps changed since user turn ``since``."""
