"""The LLM seam: a protocol any model client implements, and its request and response models.

A request is either the one-prompt form (``prompt`` and an optional ``system``) or a message
list (``messages``: system / developer / user / assistant / tool turns, each assistant tool call
answered by its tool result), or both: :meth:`LLMRequest.to_messages` gives the list a client
sends. It may carry tool definitions (:class:`ToolSpec`), a response schema (the JSON schema of
a pydantic model: the resolver validates the answer locally before writing it) and ``stream``.

A response carries text, tool calls and token usage. Usage is ``None`` when the server did not
say: :func:`estimate_usage` then estimates it (flagged ``estimated``), so a budget never counts
an unknown call as free.

A client that can stream also implements ``stream(request)``, an async iterator of
:class:`LLMDelta` pieces whose last item is the whole :class:`LLMResponse`; an iterator that
ends without one was cut off, and the run fails rather than keep a truncated answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from .. import tracing

__all__ = [
    "LLM",
    "LLMDelta",
    "LLMRequest",
    "LLMResponse",
    "Message",
    "StreamingLLM",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "call_model",
    "estimate_usage",
    "stream_model",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]

# A rough token: about four characters of English text (the estimate is for budgets only).
_CHARS_PER_TOKEN = 4


class Usage(BaseModel):
    """Tokens an LLM call used. ``total_tokens`` is their sum. ``estimated`` is true when the
    server did not report them and they were estimated from the text (:func:`estimate_usage`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


class ToolCall(BaseModel):
    """A call of a tool the model asked for: its ``id`` (which the tool result answers), the
    tool's ``name`` and its ``arguments`` as the JSON text the model wrote (it may not parse:
    :meth:`parsed` says)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = "{}"

    def parsed(self) -> dict[str, Any]:
        """The arguments as a dict; raises ``ValueError`` naming the tool when they are not a
        JSON object."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError as exc:
            raise ValueError(
                f"tool call {self.id!r} of {self.name!r}: its arguments are not JSON ({exc})"
            ) from None
        if not isinstance(value, dict):
            raise ValueError(
                f"tool call {self.id!r} of {self.name!r}: its arguments are not a JSON object"
            )
        return value


class Message(BaseModel):
    """One turn of a conversation sent to a model.

    ``role`` is ``system``, ``developer``, ``user``, ``assistant`` or ``tool``. An assistant
    turn may carry ``tool_calls`` (and no text); a ``tool`` turn is the result of one of them,
    naming it by ``tool_call_id``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot carry tool calls (only assistant)")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError(
                "a tool message answers one tool call: give it the call's tool_call_id (and "
                "only tool messages take one)"
            )
        return self


def _no_parameters() -> dict[str, JsonValue]:
    return {"type": "object", "properties": {}}


class ToolSpec(BaseModel):
    """A tool the model may call: ``name``, ``description`` and the JSON schema of its
    ``parameters``; ``strict`` asks servers that support it to hold the model to the schema."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, JsonValue] = Field(default_factory=_no_parameters)
    strict: bool | None = None


class LLMRequest(BaseModel):
    """One completion request (see the module docstring).

    ``prompt`` and ``system``: the one-prompt form; ``messages``: a conversation (both may be
    given: the prompt is then the last user turn). ``tools`` the model may call, and
    ``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or a tool's name).
    ``response_schema``: the JSON schema the answer must follow, named ``response_name``.
    ``stream``: the resolver reads it through ``stream(request)``. ``model``, ``temperature``,
    ``max_tokens`` and ``stop`` are passed to the client when set; ``options`` carries anything
    client-specific (JSON-compatible).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str = ""
    system: str | None = None
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    response_schema: dict[str, JsonValue] | None = None
    response_name: str = "response"
    stream: bool = False
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: tuple[str, ...] = ()
    options: dict[str, JsonValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _pairs(self) -> LLMRequest:
        """Every tool message answers an earlier assistant tool call, and every tool call is
        answered before the next user or assistant turn: servers refuse a request otherwise."""
        open_calls: dict[str, str] = {}
        for i, message in enumerate(self.messages):
            if message.role == "tool":
                if message.tool_call_id not in open_calls:
                    raise ValueError(
                        f"messages[{i}] answers tool call {message.tool_call_id!r}, which no "
                        "earlier assistant message made (or it was answered already)"
                    )
                del open_calls[message.tool_call_id]
                continue
            if open_calls and message.role in ("user", "assistant"):
                raise ValueError(_unanswered(open_calls, i))
            for call in message.tool_calls:
                open_calls[call.id] = call.name
        if open_calls and self.prompt:
            raise ValueError(_unanswered(open_calls, len(self.messages)))
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tools holds a name twice: {names}")
        return self

    def to_messages(self) -> tuple[Message, ...]:
        """The whole conversation to send: ``system`` first, then ``messages``, then the
        ``prompt`` as the last user turn."""
        head = (Message(role="system", content=self.system),) if self.system else ()
        tail = (Message(role="user", content=self.prompt),) if self.prompt else ()
        return (*head, *self.messages, *tail)


def _unanswered(open_calls: dict[str, str], i: int) -> str:
    calls = ", ".join(f"{cid!r} ({name})" for cid, name in open_calls.items())
    return (
        f"tool call(s) {calls} have no tool result before messages[{i}]: keep each assistant "
        "tool call and its tool result together (trim history in pairs)"
    )


class LLMResponse(BaseModel):
    """A completion: its ``text``, the ``tool_calls`` the model asked for, the ``model`` that
    produced it, and the token ``usage`` (None: the server did not report it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    model: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None


class LLMDelta(BaseModel):
    """A piece of a streamed answer: ``text`` to append (tool calls come whole, in the final
    :class:`LLMResponse`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = ""


@runtime_checkable
class LLM(Protocol):
    """Anything that completes an :class:`LLMRequest`: ``async generate(request) -> LLMResponse``.

    Raise an exception for a failed call; a resolver records it as its error (and retries it when
    its ``Retry`` says so).
    """

    async def generate(self, request: LLMRequest, /) -> LLMResponse:
        """Complete ``request``; raise for a failed call."""


@runtime_checkable
class StreamingLLM(LLM, Protocol):
    """An :class:`LLM` that can also stream: ``stream(request)`` yields :class:`LLMDelta`
    pieces, then the whole :class:`LLMResponse` as its last item. Closing the iterator early (the
    run was cancelled) must close the stream."""

    def stream(self, request: LLMRequest, /) -> AsyncIterator[LLMDelta | LLMResponse]:
        """Yield the answer's pieces, then the whole :class:`LLMResponse` last."""


async def call_model(llm: LLM, request: LLMRequest) -> LLMResponse:
    """``await llm.generate(request)``, traced as a model call when tracing is on (slateflow
    calls every model through this)."""
    tracer = tracing.current
    if tracer is None:
        return await llm.generate(request)
    with tracer.model_call(llm, request) as call:
        response = await llm.generate(request)
        call.answered(response)
        return response


async def stream_model(llm: Any, request: LLMRequest) -> AsyncIterator[LLMDelta | LLMResponse]:
    """``llm.stream(request)``'s pieces, traced as one model call when tracing is on; closing
    this iterator closes the model's stream."""
    pieces: AsyncIterator[LLMDelta | LLMResponse] = llm.stream(request)
    tracer = tracing.current
    try:
        if tracer is None:
            async for piece in pieces:
                yield piece
            return
        with tracer.model_call(llm, request) as call:
            async for piece in pieces:
                if isinstance(piece, LLMResponse):
                    call.answered(piece)
                yield piece
    finally:
        close = getattr(pieces, "aclose", None)
        if close is not None:
            await close()


def estimate_usage(request: LLMRequest, response: LLMResponse) -> Usage:
    """A rough count for a call whose server reported no usage: about one token per four
    characters of what was sent and received, at least one each way; ``estimated`` is set."""
    sent = sum(
        len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in request.to_messages()
    )
    sent += sum(len(json.dumps(t.parameters)) + len(t.description) for t in request.tools)
    received = len(response.text)
    received += sum(len(c.name) + len(c.arguments) for c in response.tool_calls)
    return Usage(
        input_tokens=max(1, -(-sent // _CHARS_PER_TOKEN)),
        output_tokens=max(1, -(-received // _CHARS_PER_TOKEN)),
        estimated=True,
    )


def usage_meta(request: LLMRequest, response: LLMResponse) -> dict[str, Any]:
    """The provenance fields of an LLM result: model and token usage (``usage`` None when the
    server did not report it, with ``usage_estimate`` for budgets)."""
    meta: dict[str, Any] = {"model": response.model}
    usage = response.usage
    if usage is None:
        estimate = estimate_usage(request, response)
        meta["usage"] = None
        meta["usage_estimate"] = {
            "input_tokens": estimate.input_tokens,
            "output_tokens": estimate.output_tokens,
        }
    else:
        meta["usage"] = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        }
    return meta
