"""Session watchers: async actions run on the session's loop when a key changes a certain way."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..state import Change
from ..state.chains import depth as chain_depth
from ..state.chains import in_chain
from ..state.when import Transition

if TYPE_CHECKING:
    from .session import Session

__all__ = ["WatchQueue", "Watcher"]


class Watcher:
    """A live ``session.watch``; ``close()`` stops it (actions already started finish)."""

    __slots__ = ("action", "blocking", "key", "session", "sub", "when")

    def __init__(
        self,
        session: Session,
        key: str,
        when: Transition | Callable[[Any, Any], bool],
        action: Callable[[Change], Any],
        blocking: bool,
    ) -> None:
        self.session = session
        self.key = key
        self.when = when
        self.action = action
        self.blocking = blocking
        self.sub = session.state.subscribe(self._changed, keys=[key])

    @property
    def active(self) -> bool:
        """Whether the watcher still reacts to changes."""
        return self.sub.active

    def close(self) -> None:
        """Stop watching."""
        self.sub.close()
        self.session._watchers.discard(self)

    def _changed(self, changes: tuple[Change, ...]) -> None:
        # In the writer's thread: the predicate sees each change as it was committed.
        try:
            matched = [c for c in changes if self.when(c.old, c.new)]
        except Exception as exc:
            self.session._soon(self.session._report, self.when, exc)
            return
        if matched:
            self.session._soon(self._schedule, matched)

    def _schedule(self, changes: list[Change]) -> None:
        session = self.session
        if not self.sub.active or not session._open:
            return
        level = chain_depth()  # an action's writes are one more link of this chain
        for change in changes:
            session._actions += 1
            if self.blocking:
                assert session._queue is not None
                session._queue.put(self, change, level)
            else:
                session._spawn(self.run, change)

    async def run(self, change: Change) -> None:
        """Run the action on one change, reporting (not raising) its failure."""
        state = self.session.state
        # The task may have copied a fenced resolver's context (the write that triggered it);
        # the action writes as itself.
        token = state.engine.push_actor(None) if state.engine.actor() is not None else None
        try:
            outcome = self.action(change)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:
            self.session._report(self.action, exc)
        finally:
            if token is not None:
                state.engine.pop_actor(token)
            self.session._actions -= 1
            self.session._check_idle()

    def __repr__(self) -> str:
        kind = "blocking" if self.blocking else "concurrent"
        return f"<Watcher {self.key!r} {kind}{'' if self.active else ' closed'}>"


class WatchQueue:
    """Runs the blocking watchers' actions one at a time, in commit order."""

    def __init__(self, session: Session) -> None:
        self.session = session
        send: MemoryObjectSendStream[tuple[Watcher, Change, int]]
        receive: MemoryObjectReceiveStream[tuple[Watcher, Change, int]]
        send, receive = anyio.create_memory_object_stream(math.inf)
        self._send = send
        self._receive = receive
        self._scope = anyio.CancelScope()

    def put(self, watcher: Watcher, change: Change, level: int = 0) -> None:
        """Queue an action (never blocks: the queue is unbounded); ``level`` is the delivery
        chain depth it reacts at."""
        self._send.send_nowait((watcher, change, level))

    async def consume(self) -> None:
        """The queue's task: run queued actions until the queue is closed."""
        with self._scope:
            async with self._receive:
                async for watcher, change, level in self._receive:
                    with in_chain(level):
                        await watcher.run(change)

    def close(self, *, drain: bool) -> None:
        """No more actions; with ``drain`` the queued ones still run, else they are dropped."""
        self._send.close()
        if not drain:
            self._scope.cancel()
