"""ScriptedLLM: an LLM that answers from a script and records every request."""

from __future__ import annotations

import inspect
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..errors import FakeScriptError, LLMStreamError
from ..resolve.llm import LLMDelta, LLMRequest, LLMResponse

__all__ = ["CutOff", "Reply", "ScriptedLLM"]


@dataclass(frozen=True)
class CutOff:
    """A scripted reply that stops after ``text``, before the model finished: streamed, its
    pieces come and then the stream ends; asked for whole, the call raises
    :class:`~slateflow.errors.LLMStreamError`."""

    text: str = ""


Reply: TypeAlias = (
    str | LLMResponse | CutOff | BaseException | type[BaseException] | Callable[[LLMRequest], Any]
)
"""One scripted answer: text, a full response, a :class:`CutOff`, an exception to raise, or a
callable over the request (sync or async) returning text or a response."""

_PIECES = re.compile(r"\S+\s*|\s+")


class ScriptedLLM:
    """An :class:`~slateflow.LLM` for tests: each ``generate`` (or ``stream``) takes the next
    scripted reply.

    ``requests`` records every request (with its rendered prompt) in order; ``last_request`` is
    the newest. A call past the end of the script raises :class:`FakeScriptError` saying how
    many replies it had, so a resolver records that as its error and the test sees why. A text
    reply reports no token usage (``usage`` None), as some servers do. ``stream`` yields the
    reply a word at a time, then the whole response.
    """

    provider_name = "slateflow.scripted"
    """The provider traces name (``gen_ai.provider.name``)."""

    def __init__(self, replies: Iterable[Reply] = (), *, model: str = "scripted") -> None:
        self._replies: deque[Reply] = deque(replies)
        self._total = len(self._replies)
        self.model = model
        self.requests: list[LLMRequest] = []

    def add(self, *replies: Reply) -> ScriptedLLM:
        """Append replies to the script; returns the LLM."""
        self._replies.extend(replies)
        self._total += len(replies)
        return self

    @property
    def last_request(self) -> LLMRequest:
        """The newest request; raises :class:`FakeScriptError` if there was none."""
        if not self.requests:
            raise FakeScriptError("the ScriptedLLM has not been called yet")
        return self.requests[-1]

    @property
    def remaining(self) -> int:
        """Replies not used yet."""
        return len(self._replies)

    async def generate(self, request: LLMRequest, /) -> LLMResponse:
        """The next scripted reply to ``request`` (recorded in :attr:`requests`)."""
        reply = await self._next(request)
        if isinstance(reply, CutOff):
            raise LLMStreamError(f"ScriptedLLM: the answer was cut off after {reply.text!r}")
        return reply

    async def stream(self, request: LLMRequest, /) -> AsyncIterator[LLMDelta | LLMResponse]:
        """The next reply a word at a time, then the whole response (a :class:`CutOff`: its
        words, and no response)."""
        reply = await self._next(request)
        text = reply.text
        for piece in _PIECES.findall(text):
            yield LLMDelta(text=piece)
        if not isinstance(reply, CutOff):
            yield reply

    async def _next(self, request: LLMRequest) -> LLMResponse | CutOff:
        self.requests.append(request)
        if not self._replies:
            raise FakeScriptError(
                f"ScriptedLLM was called {len(self.requests)} times but its script has "
                f"{self._total} repl{'y' if self._total == 1 else 'ies'}; the unanswered "
                f"prompt was {request.prompt!r}"
            )
        reply: Any = self._replies.popleft()
        if isinstance(reply, BaseException) or (
            isinstance(reply, type) and issubclass(reply, BaseException)
        ):
            raise reply
        if callable(reply) and not isinstance(reply, LLMResponse):
            out = reply(request)
            reply = await out if inspect.isawaitable(out) else out
        if isinstance(reply, LLMResponse | CutOff):
            return reply
        if not isinstance(reply, str):
            raise FakeScriptError(
                f"ScriptedLLM reply {len(self.requests)} is a {type(reply).__name__}; a reply is "
                "text, an LLMResponse, a CutOff, an exception or a callable returning text"
            )
        return LLMResponse(text=reply, model=request.model or self.model)

    def __repr__(self) -> str:
        return f"<ScriptedLLM: {len(self.requests)} request(s), {self.remaining} repl(ies) left>"
