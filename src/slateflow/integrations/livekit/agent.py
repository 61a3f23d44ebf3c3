"""The LiveKit ``Agent`` of a :class:`~slateflow.integrations.livekit.LiveKitCall`: it steers.

LiveKit reaches a reply two ways: a spoken turn goes through ``on_user_turn_completed`` and then
``llm_node``; typed text (``session.run(user_input=...)``, a text stream) goes to ``llm_node``
only. So the turn is fed where it is first seen, once (the message's id makes
``conversation.user_turn`` idempotent), and every reply is steered in ``llm_node``: the lines
that apply now go in as one system message on a copy of the chat context (LiveKit keeps no
injected context from one reply to the next, so every line is sent each time), and only the tools
the flows admit are offered.

With preemptive generation (LiveKit's default) ``llm_node`` runs on an unfinished transcript
before ``on_user_turn_completed``: it is steered from ``conversation.preview(text)``, which
writes nothing. The real turn then runs in ``on_user_turn_completed``; when what the model is to
be told differs from the preview, it marks the turn's chat context, so LiveKit drops the early
reply and generates again. When it is the same, the early reply is kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable
from typing import TYPE_CHECKING, Any

from livekit.agents import Agent, llm
from livekit.agents.voice.agent import ModelSettings

from ...conversation import TurnContext

if TYPE_CHECKING:
    from .call import LiveKitCall

__all__ = ["SlateflowAgent"]

PREVIEW_MARK = "[slateflow] the turn moved the plan: this reply was steered again"


class SlateflowAgent(Agent):  # type: ignore[misc]  # livekit is untyped for mypy here
    """An ``Agent`` steered by a :class:`~slateflow.integrations.livekit.LiveKitCall` (made
    by it: ``call.agent``). Subclass it for your own hooks; call ``super()`` in
    ``on_user_turn_completed`` and ``llm_node``."""

    def __init__(self, call: LiveKitCall, **options: Any) -> None:
        super().__init__(**options)
        self.call = call
        self._previews: dict[str, TurnContext] = {}  # the preview an early reply was steered by

    async def on_enter(self) -> None:
        await self.call.start()

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        text = new_message.text_content or ""
        told = await self.call.turn(text, new_message.id)
        preview = self._previews.pop(new_message.id, None)
        if preview is not None and not _same(preview, told):
            # The early reply was steered by a preview the turn proved wrong: changing the
            # turn's context makes LiveKit drop it and generate again (steered by the turn).
            turn_ctx.add_message(role="system", content=PREVIEW_MARK)

    async def llm_node(
        self,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool],
        model_settings: ModelSettings,
    ) -> AsyncIterable[llm.ChatChunk | str | Any]:
        told = await self._told(chat_ctx)
        steered = chat_ctx.copy()
        steered.items = [i for i in steered.items if _text(i) != PREVIEW_MARK]
        if told.full_prompt:
            steered.add_message(role="system", content=told.full_prompt)
        offered = self.call.offered(told)
        admitted = [t for t in tools if _tool_name(t) in offered or _tool_name(t) is None]
        async for chunk in Agent.default.llm_node(self, steered, admitted, model_settings):
            yield chunk

    async def _told(self, chat_ctx: llm.ChatContext) -> TurnContext:
        """What the model is told for the reply ``chat_ctx`` asks for."""
        call = self.call
        handle = call.speech_handle()
        message = next(
            (i for i in reversed(chat_ctx.items) if getattr(i, "role", None) == "user"), None
        )
        last = chat_ctx.items[-1] if chat_ctx.items else None
        answering_user = message is not None and last is message
        if not answering_user or message is None:
            told = await call.conversation.context_between_turns()
        elif call.was_fed(message.id):
            told = call.told_for(message.id)
        elif handle is not None and not handle.scheduled:
            # A preemptive reply: the turn is not final, and may not even be this text.
            preview = call.conversation.preview(message.text_content or "")
            self._previews[message.id] = preview
            return preview
        else:
            told = await call.turn(message.text_content or "", message.id)  # typed text
        call.track(told, handle)
        call.pace(handle)
        return told


def _same(a: TurnContext, b: TurnContext) -> bool:
    return (a.all_lines, a.tools) == (b.all_lines, b.tools)


def _text(item: Any) -> str | None:
    with contextlib.suppress(Exception):
        return str(item.text_content)
    return None


def _tool_name(tool: Any) -> str | None:
    info = getattr(tool, "info", None)
    name = getattr(info, "name", None) or getattr(tool, "id", None)
    return name if isinstance(name, str) else None
