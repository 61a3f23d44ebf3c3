"""A session's conversation: the one object its turns go through, attached or made on demand.

A :class:`~slateflow.Session` runs resolvers; its conversation (a
:class:`slateflow.conversation.Call`, which attaches itself with ``session.attach``) owns the
turns. The session knows it only as the :class:`~slateflow.resolve.turns.Conversation`
protocol: it lets the conversation govern the flows it runs, sends it the background results
that go to the model, and tells it when a flow's active steps change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ..errors import SessionError
from .background import BackgroundResult
from .inbox import ToInbox
from .turns import Closable, Conversation, Governor

__all__ = ["Conversing"]


class Conversing:
    """The conversation plumbing of a :class:`~slateflow.Session` (see the module docstring)."""

    # The Session's, which this part works through.
    _conversation: Conversation | None
    _made_conversation: bool
    _conversation_options: dict[str, Any]
    _runners: list[Closable]

    conversation_factory: ClassVar[Callable[..., Conversation] | None] = None
    """What makes a session's conversation when nobody attached one: set to
    :class:`slateflow.conversation.Call` when that layer is imported (``import slateflow``
    does)."""

    @property
    def conversation(self) -> Conversation:
        """This session's conversation (a :class:`slateflow.conversation.Call`): the one
        attached, else one made with the conversation options given to the session."""
        if self._conversation is None:
            factory = type(self).conversation_factory
            if factory is None:
                raise SessionError(
                    "no conversation layer is loaded: import slateflow.conversation (or make a "
                    "slateflow.conversation.Call(session)) to have turns"
                )
            factory(self, **self._conversation_options)  # it attaches itself
            self._made_conversation = True
        assert self._conversation is not None
        return self._conversation

    def attach(self, conversation: Conversation) -> None:
        """Make ``conversation`` (a ``Call`` does this as it is made) the one this session's
        flows govern (those running already too) and its background results go to. A session
        has one; one it made itself (``session.conversation``) gives way while no turn was taken
        and nothing waits in its inbox."""
        current = self._conversation
        if current is conversation:
            return
        if current is not None and not (
            self._made_conversation and not current.transcript and not current.inbox.peek()
        ):
            raise SessionError(
                "this session already has a conversation (a Call); a session carries one "
                "call: make another Session for another call"
            )
        self._conversation = conversation
        self._made_conversation = False
        for runner in self._runners:
            if isinstance(runner, Governor) and not getattr(runner, "closed", False):
                conversation.govern(runner)

    def inbox_delivery(self, origin: object) -> ToInbox:
        """A ``deliver`` callback sending a result to the conversation's inbox (and
        ``interrupt`` ones on to its ``on_delivery``), tagged with ``origin``; the conversation
        is the one attached when the result lands."""
        return ToInbox(self._to_conversation, origin)

    def _to_conversation(self, result: BackgroundResult, origin: object) -> Any:
        return self.conversation.to_model(result, origin)

    def steps_changed(self, since: int | None, timed: bool) -> None:
        """A flow's active steps changed (any thread): its conversation, if it has one, is told
        (extractors that re-read on a step change, voice timing)."""
        if self._conversation is not None:
            self._conversation.steps_changed(since, timed)
