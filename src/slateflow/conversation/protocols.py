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
    def closed(self) -> bool: ...
    @property
    def is_over(self) -> bool: ...
    @property
    def ambient(self) -> frozenset[str]: ...
    def begin_turn(self) -> None: ...
    def abort_turn(self) -> None: ...
    async def on_turn(self) -> None: ...
    def on_tool_ok(self, tool: str) -> None: ...
    def admit(self, tool: str, *, record: bool = True) -> Admission: ...
    def brief(self, tools: Iterable[str] = ()) -> Brief: ...


@runtime_checkable
class TurnHook(Protocol):
    """An extractor as a conversation sees it (``conversation.add_extractor``).

    ``on_turn`` runs on every user turn (after the turn is recorded, before the flows
    advance), ``on_tool`` after a tool succeeded, and ``on_step_change`` when a flow enters a
    step whose posture was handed to the model after user turn ``since``: it may re-read
    only the turns said after that. Each decides for itself whether to act (its triggers).
    """

    name: str

    async def on_turn(self, conversation: Conversation, turn: Turn, /) -> None: ...
    async def on_tool(self, conversation: Conversation, tool: str, /) -> None: ...
    async def on_step_change(self, conversation: Conversation, since: int, /) -> None: ...
