"""The Session's former conversation methods, kept for one release: they forward to its Call.

Turns, contexts, tools, deliveries, interruptions and voice timing moved to
:class:`slateflow.conversation.Call` (``session.conversation`` is the session's). Each name
here warns with its new address and then does what it always did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..deprecation import deprecated
from .background import BackgroundResult, Deliver

__all__ = ["ConversationAliases"]

_CALL = "session.conversation.{} (a slateflow.conversation.Call)"


class ConversationAliases:
    """The deprecated conversation names of ``Session``."""

    # The Session's: its conversation (a slateflow.conversation.Call).
    conversation: Any

    @deprecated(_CALL.format("user_turn(text)"))
    async def user_turn(self, text: str) -> Any:
        """Handle a user turn (see ``Call.user_turn``)."""
        return await self.conversation.user_turn(text)

    @deprecated(_CALL.format("context_now()"))
    def context_now(self) -> Any:
        """The context between turns (see ``Call.context_now``)."""
        return self.conversation.context_now()

    @deprecated(_CALL.format("agent_said(text)"))
    def agent_said(self, text: str) -> Any:
        """Record what the agent said (see ``Call.agent_said``)."""
        return self.conversation.agent_said(text)

    @deprecated(_CALL.format("add_extractor(extractor)"))
    def add_extractor(self, extractor: Any) -> None:
        """Run an extractor on the turns (see ``Call.add_extractor``)."""
        self.conversation.add_extractor(extractor)

    @deprecated(_CALL.format("tool_ok(tool)"))
    async def tool_ok(self, tool: str) -> None:
        """Report a successful tool (see ``Call.tool_ok``)."""
        await self.conversation.tool_ok(tool)

    @deprecated(_CALL.format("admit(tool, record=False)"))
    def refusal(self, tool: str) -> str | None:
        """Why a flow refuses ``tool`` now, or None."""
        claim = self.conversation.admit(tool, record=False)
        return None if claim.allowed else str(claim.reason)

    @deprecated(_CALL.format("claim(tool)"))
    def claim(self, tool: str) -> AbstractAsyncContextManager[Any]:
        """Admit a call of ``tool`` atomically (see ``Call.claim``)."""
        return self.conversation.claim(tool)  # type: ignore[no-any-return]

    @deprecated(_CALL.format("call_tool(tool, fn, arguments)"))
    async def call_tool(
        self, tool: str, fn: Callable[..., Any], arguments: Mapping[str, Any] | None = None
    ) -> Any:
        """Run a tool under a claim (see ``Call.call_tool``)."""
        return await self.conversation.call_tool(tool, fn, arguments)

    @deprecated(_CALL.format("take_deliveries()"))
    def take_deliveries(self) -> list[BackgroundResult]:
        """The background results waiting for the model."""
        return self.conversation.take_deliveries()  # type: ignore[no-any-return]

    @deprecated(_CALL.format("redeliver(*results)"))
    def redeliver(self, *results: BackgroundResult) -> None:
        """Hand results to the model again (see ``Call.redeliver``)."""
        self.conversation.redeliver(*results)

    @deprecated(_CALL.format("wait_for_delivery(timeout)"))
    async def wait_for_delivery(self, timeout: float | None = None) -> list[BackgroundResult]:
        """Wait for a background result (see ``Call.wait_for_delivery``)."""
        return await self.conversation.wait_for_delivery(timeout)  # type: ignore[no-any-return]

    @deprecated(_CALL.format("begin_interruption()"))
    def begin_interruption(self) -> None:
        """The user started talking over the agent (see ``Call.begin_interruption``)."""
        self.conversation.begin_interruption()

    @deprecated(_CALL.format("end_interruption(turn_follows=...)"))
    def end_interruption(self, *, turn_follows: bool = True) -> None:
        """The user stopped talking (see ``Call.end_interruption``)."""
        self.conversation.end_interruption(turn_follows=turn_follows)

    @deprecated(_CALL.format("publish_timing()"))
    def publish_timing(self) -> None:
        """Publish the merged voice timing (see ``Call.publish_timing``)."""
        self.conversation.publish_timing()

    @property
    @deprecated(_CALL.format("interrupting"))
    def interrupting(self) -> bool:
        """Whether the user is interrupting."""
        return bool(self.conversation.interrupting)

    @property
    @deprecated(_CALL.format("transcript"))
    def transcript(self) -> list[Any]:
        """The conversation so far."""
        return self.conversation.transcript  # type: ignore[no-any-return]

    @property
    @deprecated(_CALL.format("cancelled_turns"))
    def cancelled_turns(self) -> list[Any]:
        """User turns that were not taken."""
        return self.conversation.cancelled_turns  # type: ignore[no-any-return]

    @property
    @deprecated(_CALL.format("inbox"))
    def inbox(self) -> Any:
        """Background results waiting for the model."""
        return self.conversation.inbox

    @property
    @deprecated(_CALL.format("redact"))
    def redact(self) -> Callable[[str], str] | None:
        """What cleans each user turn."""
        return self.conversation.redact  # type: ignore[no-any-return]

    @property
    @deprecated(_CALL.format("tools"))
    def tools(self) -> tuple[str, ...]:
        """The agent's tools."""
        return self.conversation.tools  # type: ignore[no-any-return]

    @property
    @deprecated(_CALL.format("on_delivery"))
    def on_delivery(self) -> Deliver | None:
        """Receives ``interrupt`` results as they land."""
        return self.conversation.on_delivery  # type: ignore[no-any-return]

    @on_delivery.setter
    @deprecated(_CALL.format("on_delivery"))
    def on_delivery(self, value: Deliver | None) -> None:
        self.conversation.on_delivery = value
