"""User turns made idempotent by the framework's message id.

A voice framework may hand the same user message over twice (a retry after an interruption, a
second hook that sees the same turn). :class:`TurnIds` remembers the recent ids and what their
turn came to, so the second call returns the first one's context and handles nothing twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

import anyio

from .context import TurnContext

__all__ = ["TurnIds"]

KEEP = 256


class _Once:
    __slots__ = ("context", "done")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.context: TurnContext | None = None


class TurnIds:
    """The last :data:`KEEP` message ids and their turns' contexts."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, _Once] = OrderedDict()

    async def once(
        self, message_id: str, turn: Callable[[], Awaitable[TurnContext]]
    ) -> TurnContext:
        """``await turn()`` for a new ``message_id``; for one seen before, its context (waiting
        for it while it is still being handled). A turn that was not taken (it raised or was
        cancelled) forgets its id, so the message may be fed again."""
        if type(message_id) is not str or not message_id:
            raise TypeError(f"message_id must be a non-empty str, got {message_id!r}")
        while True:
            seen = self._seen.get(message_id)
            if seen is None:
                break
            await seen.done.wait()
            if seen.context is not None:
                return seen.context
            # That turn was not taken: it left, and this call handles the message.
        once = self._seen[message_id] = _Once()
        while len(self._seen) > KEEP:
            self._seen.popitem(last=False)
        try:
            once.context = await turn()
        finally:
            if once.context is None and self._seen.get(message_id) is once:
                del self._seen[message_id]
            once.done.set()
        return once.context
