"""``OpenAIModel``: an :class:`~slateflow.resolve.LLM` over the official ``openai`` SDK's chat
completions (``pip install 'slateflow[openai]'``), which every OpenAI-compatible server speaks
(vLLM, llama.cpp's server, Ollama, LM Studio, Gemini's OpenAI endpoint, ...).

The SDK's own retries are off (``max_retries=0``): its defaults (2 retries, Retry-After waits
of up to 120 s) would stack under a resolver's ``Retry`` and a voice deadline. A failure is a
:class:`~slateflow.errors.ModelCallError` naming the server and the status, and saying whether
to retry it (429 and 5xx: yes, honouring ``Retry-After``, ``retry-after-ms`` and
``x-should-retry``; 400, 401, 404: no), which ``Retry`` takes at its word. ``stream`` asks for
usage in the last chunk and ends with the whole answer; a stream that stops before the model
finished raises :class:`~slateflow.errors.LLMStreamError`, and closing it early closes the
HTTP response. The SDK is imported when an ``OpenAIModel`` is made, never by ``import
slateflow``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from ..errors import LLMStreamError, ModelCallError, UsageError
from ..extras import require
from ..resolve.clock import real_work
from ..resolve.http import HTTPPool, current_pool
from ..resolve.llm import (
    LLMDelta,
    LLMRequest,
    LLMResponse,
    Message,
    ToolCall,
    ToolSpec,
    Usage,
)
from ..resolve.retry import server_retry

__all__ = ["OpenAIModel", "strict_schema"]

Strict = Literal["auto"] | bool


class OpenAIModel:
    """Chat completions of ``model`` through ``openai.AsyncOpenAI`` (see the module docs).

    ``base_url`` points it at any OpenAI-compatible server; ``api_key`` defaults to
    ``OPENAI_API_KEY`` (a server of your own may need none). ``client`` is an ``AsyncOpenAI`` of
    yours (its retries and connections are then yours too); without one, a call made by a
    Session's run goes through the session's pooled HTTP client (``session.http``, shared with
    its HTTP resolvers: openai 3 is built on ``httpx2``, as they are), and any other call
    through a client of the model's own. ``timeout`` is seconds per call; ``extra_body`` is sent
    with every request (server-specific fields), and a request's ``options`` with it.
    ``strict``: hold the model to a response schema or tool schema (``True``), never
    (``False``), or ``"auto"``: on api.openai.com, whose strict mode needs every property
    required and no extra ones (:func:`strict_schema` makes a schema so); elsewhere not, since
    many compatible servers refuse it. The answer is validated locally by the resolver in every
    case.

    A model that made its own client holds its connection pool: close it with ``await
    model.aclose()``, or use it as ``async with OpenAIModel(...) as model:`` (a client you
    passed is yours to close).
    """

    provider_name = "openai"
    """The provider traces name (``gen_ai.provider.name``)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: Any = None,
        timeout: float = 60.0,
        extra_body: Mapping[str, Any] | None = None,
        strict: Strict = "auto",
    ) -> None:
        sdk = require("openai", "openai", "slateflow.integrations.openai.OpenAIModel")
        if not isinstance(model, str) or not model:
            raise UsageError(f"OpenAIModel: model must be a model name, got {model!r}")
        self._owns = client is None
        if client is None:
            key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
            if key is None and base_url is None:
                raise UsageError(
                    "OpenAIModel: no API key: pass api_key=..., set OPENAI_API_KEY, or give the "
                    "base_url of a server that needs none"
                )
            client = sdk.AsyncOpenAI(
                base_url=base_url, api_key=key or "unused", timeout=timeout, max_retries=0
            )
        self.client = client
        self.model = model
        self.server = str(client.base_url)
        self.extra_body = dict(extra_body or {})
        if strict not in ("auto", True, False):
            raise UsageError(f"OpenAIModel: strict must be 'auto', True or False, got {strict!r}")
        self.strict = ("api.openai.com" in self.server) if strict == "auto" else bool(strict)
        self._sdk = sdk
        # The session pool's twin of an own client, per pool (one pool for the whole session).
        self._shared: weakref.WeakKeyDictionary[HTTPPool, Any] = weakref.WeakKeyDictionary()

    # -- calls ---------------------------------------------------------------------------------

    async def generate(self, request: LLMRequest, /) -> LLMResponse:
        """One completion of ``request``."""
        params = self.params(request)
        try:
            with real_work():
                completion = await self._client().chat.completions.create(**params)
        except self._sdk.APIError as exc:
            raise self._failure(exc, params["model"]) from exc
        if not completion.choices:
            raise ModelCallError(
                f"{self.server} answered model {params['model']!r} with no choices",
                server=self.server,
                status=200,
                retryable=False,
            )
        choice = completion.choices[0]
        message = choice.message
        return LLMResponse(
            text=message.content or "",
            tool_calls=tuple(
                ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
                for c in message.tool_calls or ()
                if getattr(c, "function", None) is not None
            ),
            model=completion.model or params["model"],
            usage=_usage(completion.usage),
            finish_reason=choice.finish_reason,
        )

    async def stream(self, request: LLMRequest, /) -> AsyncIterator[LLMDelta | LLMResponse]:
        """``request`` streamed: text pieces as they come, then the whole response (tool calls
        assembled from their pieces, the usage of the last chunk)."""
        params = self.params(request)
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}
        try:
            with real_work():
                stream = await self._client().chat.completions.create(**params)
        except self._sdk.APIError as exc:
            raise self._failure(exc, params["model"]) from exc
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        usage: Usage | None = None
        finish: str | None = None
        model = params["model"]
        try:
            async for chunk in stream:
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    delta = choice.delta
                    for piece in delta.tool_calls or ():
                        call = calls.setdefault(piece.index, {"id": "", "name": "", "args": ""})
                        call["id"] = piece.id or call["id"]
                        if piece.function is not None:
                            call["name"] += piece.function.name or ""
                            call["args"] += piece.function.arguments or ""
                    if choice.finish_reason:
                        finish = choice.finish_reason
                    if delta.content:
                        text.append(delta.content)
                        yield LLMDelta(text=delta.content)
        except self._sdk.APIError as exc:
            raise self._failure(exc, model) from exc
        finally:
            await stream.close()  # a cancelled run, or an early exit: the socket goes too
        if finish is None:
            raise LLMStreamError(
                f"the stream from {self.server} (model {model!r}) ended before the model "
                f"finished, after {sum(map(len, text))} characters; nothing was kept"
            )
        yield LLMResponse(
            text="".join(text),
            tool_calls=tuple(
                ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["args"] or "{}")
                for i, c in sorted(calls.items())
            ),
            model=model,
            usage=usage,
            finish_reason=finish,
        )

    def _client(self) -> Any:
        """The client for a call now: inside a Session's run, its pool's twin of ours."""
        if not self._owns:
            return self.client
        pool = current_pool()
        if pool is None:
            return self.client
        client = self._shared.get(pool)
        if client is None:
            client = self._shared[pool] = self.client.with_options(http_client=pool.client())
        return client

    # -- the wire format -----------------------------------------------------------------------

    def params(self, request: LLMRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``."""
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": [_message(m) for m in request.to_messages()],
        }
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.max_tokens is not None:
            params["max_tokens"] = request.max_tokens
        if request.stop:
            params["stop"] = list(request.stop)
        if request.tools:
            params["tools"] = [self._tool(t) for t in request.tools]
        if request.tool_choice is not None:
            choice = request.tool_choice
            params["tool_choice"] = (
                choice
                if choice in ("auto", "none", "required")
                else {"type": "function", "function": {"name": choice}}
            )
        if request.response_schema is not None:
            schema = dict(request.response_schema)
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.response_name,
                    "schema": strict_schema(schema) if self.strict else schema,
                    "strict": self.strict,
                },
            }
        extra = {**self.extra_body, **request.options}
        if extra:
            params["extra_body"] = extra
        return params

    def _tool(self, tool: ToolSpec) -> dict[str, Any]:
        strict = self.strict if tool.strict is None else tool.strict
        function: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description,
            "parameters": strict_schema(dict(tool.parameters)) if strict else tool.parameters,
        }
        if strict:
            function["strict"] = True
        return {"type": "function", "function": function}

    def _failure(self, exc: Exception, model: str) -> ModelCallError:
        sdk = self._sdk
        if isinstance(exc, sdk.APIStatusError):
            status = int(exc.status_code)
            retryable, retry_after = server_retry(status, exc.response.headers)
            detail = _detail(exc)
            return ModelCallError(
                f"{self.server} answered HTTP {status} for model {model!r}"
                + (f": {detail}" if detail else ""),
                server=self.server,
                status=status,
                retryable=retryable,
                retry_after=retry_after,
            )
        kind = "timed out" if isinstance(exc, sdk.APITimeoutError) else "could not be reached"
        if not isinstance(exc, sdk.APIConnectionError):
            kind = f"failed ({exc})"
        return ModelCallError(
            f"{self.server} {kind} for model {model!r}",
            server=self.server,
            status=None,
            retryable=isinstance(exc, sdk.APIConnectionError),
        )

    async def aclose(self) -> None:
        """Close the client's connections (only a client this model made)."""
        if self._owns:
            await self.client.close()

    async def __aenter__(self) -> OpenAIModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={self.server!r})"


# Keywords whose value maps names to schemas (a property called "default" is not a default).
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions"})


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as OpenAI's strict mode takes it: every object closed
    (``additionalProperties: false``) with every property required, and no ``default``
    (an optional field stays nullable, so the model may still leave it empty)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "default":
            continue
        if isinstance(value, dict) and key in _SCHEMA_MAPS:
            out[key] = {name: strict_schema(sub) for name, sub in value.items()}
        elif isinstance(value, dict):
            out[key] = strict_schema(value)
        elif isinstance(value, list):
            out[key] = [strict_schema(v) if isinstance(v, dict) else v for v in value]
        else:
            out[key] = value
    if out.get("type") == "object" or "properties" in out:
        out["additionalProperties"] = False
        out["required"] = list(out.get("properties", {}))
    return out


def _message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in message.tool_calls
        ]
        if not message.content:
            out["content"] = None
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    return Usage(
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
    return str(getattr(exc, "message", "") or "")[:300]
