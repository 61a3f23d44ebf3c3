"""Test a LiveKit call offline: :class:`ScriptedLLM`, a LiveKit ``LLM`` over any slateflow
:class:`~slateflow.LLM` (a :class:`~slateflow.testing.ScriptedLLM`, a function of the request,
a real :class:`~slateflow.integrations.openai.OpenAIModel`).

It reads the chat context in the OpenAI wire format (what a provider gets) into an
:class:`~slateflow.resolve.LLMRequest`, and streams the answer back as LiveKit chunks, so
LiveKit's own test kit drives the call in text mode::

    session = AgentSession(llm=ScriptedLLM(agent))
    call.attach(session)
    await session.start(call.agent)
    result = await session.run(user_input="A table for four on Saturday, please.")
    result.expect.next_event().is_message(role="assistant")
"""

from __future__ import annotations

import json
from typing import Any

from livekit.agents.llm import (
    LLM,
    ChatChunk,
    ChatContext,
    ChoiceDelta,
    FunctionToolCall,
    LLMStream,
    Tool,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions

from ...resolve.llm import LLM as SlateLLM
from ...resolve.llm import LLMRequest, Message, ToolCall, ToolSpec

__all__ = ["ScriptedLLM"]


class ScriptedLLM(LLM):  # type: ignore[misc]  # livekit is untyped for mypy here
    """A LiveKit LLM answering from a slateflow :class:`~slateflow.LLM`; ``requests`` holds
    every request it made."""

    def __init__(self, llm: SlateLLM) -> None:
        super().__init__()
        self.llm = llm
        self.requests: list[LLMRequest] = []

    def chat(
        self,
        *,
        chat_ctx: ChatContext,
        tools: list[Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: Any = NOT_GIVEN,
        tool_choice: Any = NOT_GIVEN,
        extra_kwargs: Any = NOT_GIVEN,
    ) -> LLMStream:
        return _Stream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _Stream(LLMStream):  # type: ignore[misc]
    def __init__(
        self,
        llm: ScriptedLLM,
        *,
        chat_ctx: ChatContext,
        tools: list[Tool],
        conn_options: APIConnectOptions,
    ) -> None:
        super().__init__(llm, chat_ctx=chat_ctx, tools=tools, conn_options=conn_options)
        self._scripted = llm

    async def _run(self) -> None:
        request = _request(self.chat_ctx, self.tools)
        self._scripted.requests.append(request)
        response = await self._scripted.llm.generate(request)
        calls = [
            FunctionToolCall(name=c.name, arguments=c.arguments, call_id=c.id)
            for c in response.tool_calls
        ]
        self._event_ch.send_nowait(
            ChatChunk(
                id=f"scripted-{len(self._scripted.requests)}",
                delta=ChoiceDelta(
                    role="assistant", content=response.text or None, tool_calls=calls
                ),
            )
        )


def _request(chat_ctx: ChatContext, tools: list[Tool]) -> LLMRequest:
    """The request a provider would get (the OpenAI format LiveKit sends)."""
    wire, _ = chat_ctx.to_provider_format("openai", inject_dummy_user_message=False)
    messages = [_message(m) for m in wire]
    system = [m.content for m in messages if m.role == "system"]
    specs = []
    for tool in tools:
        info = getattr(tool, "info", None)
        raw = getattr(info, "raw_schema", None)
        if isinstance(raw, dict):
            specs.append(
                ToolSpec(
                    name=raw["name"],
                    description=raw.get("description") or "",
                    parameters=raw.get("parameters") or {},
                )
            )
        elif info is not None:
            specs.append(ToolSpec(name=info.name, description=info.description or ""))
    return LLMRequest(
        system="\n\n".join(s for s in system if s) or None,
        messages=tuple(m for m in messages if m.role != "system"),
        tools=tuple(specs),
    )


def _message(m: dict[str, Any]) -> Message:
    content = m.get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = tuple(
        ToolCall(
            id=c["id"],
            name=c["function"]["name"],
            arguments=c["function"].get("arguments") or "{}",
        )
        for c in m.get("tool_calls") or ()
    )
    if m["role"] == "tool" and not isinstance(content, str):
        content = json.dumps(content)
    return Message(
        role=m["role"], content=content or "", tool_calls=calls, tool_call_id=m.get("tool_call_id")
    )
