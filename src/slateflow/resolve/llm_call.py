"""What an ``llm`` resolver does at each attempt: build the request, call (or stream), check.

:class:`LLMCall` renders the prompt template from the State, adds the conversation
(``messages``, fixed or computed from the State), the tools and the response schema, then calls
``llm.generate`` or, when streaming, reads ``llm.stream``: partial text goes to ``on_partial``
and to ``<name>:partial`` while the run is in flight, and only the whole answer becomes the
result. An answer checked against an output model is validated locally, whatever the server
promised. The value and its provenance fields (model, usage or its estimate) go back to the
resolver, which writes them once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import LLMOutputError, LLMStreamError, ResolverDefinitionError
from ..state import State
from ..state.keys import partial_key
from .llm import (
    LLM,
    LLMDelta,
    LLMRequest,
    LLMResponse,
    Message,
    ToolSpec,
    call_model,
    stream_model,
    usage_meta,
)
from .template import Template

__all__ = ["LLMCall", "Messages", "Partial"]

Messages = Sequence[Message] | Callable[[State], Iterable[Message]]
"""A conversation for a request: fixed messages, or a function of the State returning them."""
Partial = Callable[[str], Any]
"""Told the text so far at each streamed piece (sync or async)."""


class LLMCall:
    """One ``llm`` resolver's request, made at each attempt (see the module docstring)."""

    __slots__ = (
        "base",
        "llm",
        "messages",
        "name",
        "on_partial",
        "output",
        "partial_key",
        "stream",
        "template",
    )

    def __init__(
        self,
        name: str,
        llm: LLM,
        template: Template | None,
        base: LLMRequest,
        *,
        messages: Messages = (),
        output: type[BaseModel] | None = None,
        on_partial: Partial | None = None,
        write_partial: bool = True,
    ) -> None:
        self.name = name
        self.llm = llm
        self.template = template
        self.output = output
        self.on_partial = on_partial
        self.stream = base.stream
        self.partial_key = partial_key(name) if base.stream and write_partial else None
        if callable(messages):
            self.messages: Messages = messages
        else:
            self.messages = tuple(messages)
            for m in self.messages:
                if not isinstance(m, Message):
                    raise ResolverDefinitionError(
                        f"resolver {name!r}: messages holds Message objects, got {m!r}"
                    )
        if base.stream and not callable(getattr(llm, "stream", None)):
            raise ResolverDefinitionError(
                f"resolver {name!r}: stream=True needs an LLM with a stream(request) method; "
                f"{type(llm).__name__} has none"
            )
        if not callable(messages) and self.messages:
            # Fixed messages are checked once, here (pairs, and a prompt after them).
            try:
                base = LLMRequest.model_validate(
                    {
                        **base.model_dump(),
                        "messages": self.messages,
                        "prompt": "…" if template is not None else "",
                    }
                ).model_copy(update={"prompt": ""})
            except ValidationError as exc:
                raise ResolverDefinitionError(f"resolver {name!r}: bad messages: {exc}") from None
        if output is not None:
            base = base.model_copy(
                update={
                    "response_schema": output.model_json_schema(),
                    "response_name": output.__name__,
                }
            )
        self.base = base

    def request(self, state: State) -> LLMRequest:
        """The request for this attempt, rendered from ``state``."""
        update: dict[str, Any] = {}
        if self.template is not None:
            update["prompt"] = self.template.render(state, owner=self.name)
        messages = self.messages
        if callable(messages):
            # Validated again: computed messages must pair tool calls with their results.
            update["messages"] = tuple(messages(state))
            return LLMRequest.model_validate({**self.base.model_dump(), **update})
        if not update:
            return self.base
        return self.base.model_copy(update=update)  # fixed messages were checked when built

    async def __call__(self, state: State) -> tuple[Any, dict[str, Any]]:
        request = self.request(state)
        if self.stream:
            response = await self._streamed(state, request)
        else:
            response = await call_model(self.llm, request)
        if not isinstance(response, LLMResponse):
            raise TypeError(
                f"resolver {self.name!r}: the LLM returned a {type(response).__name__}, not an "
                "LLMResponse"
            )
        return self._value(response), usage_meta(request, response)

    async def _streamed(self, state: State, request: LLMRequest) -> LLMResponse:
        stream = stream_model(self.llm, request)
        text = ""
        try:
            async for piece in stream:
                if isinstance(piece, LLMResponse):
                    return piece
                if not isinstance(piece, LLMDelta):
                    raise TypeError(
                        f"resolver {self.name!r}: the stream yielded a {type(piece).__name__}; "
                        "it yields LLMDelta pieces, then the LLMResponse"
                    )
                if piece.text:
                    text += piece.text
                    await self._partial(state, text)
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()  # a cancelled or failed run closes the stream (and its socket)
        raise LLMStreamError(
            f"resolver {self.name!r}: the stream ended after {len(text)} characters without "
            "the model finishing its answer; nothing was kept"
        )

    async def _partial(self, state: State, text: str) -> None:
        if self.partial_key is not None:
            state.set(self.partial_key, text)
        if self.on_partial is not None:
            told = self.on_partial(text)
            if inspect.isawaitable(told):
                await told

    def _value(self, response: LLMResponse) -> Any:
        output = self.output
        if output is not None:
            try:
                checked = output.model_validate_json(response.text)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'the answer'}: {e['msg']}"
                    for e in exc.errors(include_input=False)
                )
                raise LLMOutputError(
                    f"resolver {self.name!r}: the model's answer is not a valid "
                    f"{output.__name__} ({problems}); nothing was written"
                ) from None
            return checked.model_dump(mode="json")
        if self.base.tools:
            return {
                "text": response.text,
                "tool_calls": [c.model_dump() for c in response.tool_calls],
            }
        return response.text


def tool_specs(name: str, tools: Iterable[ToolSpec | dict[str, Any]]) -> tuple[ToolSpec, ...]:
    """``tools`` as :class:`ToolSpec` objects (dicts are validated), for resolver ``name``."""
    specs = []
    for tool in tools:
        try:
            specs.append(tool if isinstance(tool, ToolSpec) else ToolSpec.model_validate(tool))
        except ValidationError as exc:
            raise ResolverDefinitionError(f"resolver {name!r}: a bad tool: {exc}") from None
    return tuple(specs)
