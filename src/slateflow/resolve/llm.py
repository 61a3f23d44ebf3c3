"""The LLM seam: a protocol any model client implements, and its request and response models."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = ["LLM", "LLMRequest", "LLMResponse", "Usage"]


class Usage(BaseModel):
    """Tokens an LLM call used. ``total_tokens`` is their sum."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


class LLMRequest(BaseModel):
    """One completion request: the rendered ``prompt`` and optional ``system`` instructions.

    ``model``, ``temperature``, ``max_tokens`` and ``stop`` are passed to the client when set;
    ``options`` carries anything client-specific (JSON-compatible).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str
    system: str | None = None
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: tuple[str, ...] = ()
    options: dict[str, JsonValue] = Field(default_factory=dict)


class LLMResponse(BaseModel):
    """A completion: its ``text``, the ``model`` that produced it and the token ``usage``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    model: str | None = None
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None


@runtime_checkable
class LLM(Protocol):
    """Anything that completes an :class:`LLMRequest`: ``async generate(request) -> LLMResponse``.

    Raise an exception for a failed call; a resolver records it as its error (and retries it when
    its ``Retry`` says so).
    """

    async def generate(self, request: LLMRequest, /) -> LLMResponse: ...


def usage_meta(response: LLMResponse) -> dict[str, Any]:
    """The provenance fields of an LLM result: model and token usage."""
    return {
        "model": response.model,
        "usage": {
            "input_tokens": response.usage.input_tokens,
            "output_tokens": response.usage.output_tokens,
        },
    }
