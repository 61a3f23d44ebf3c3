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
    from .scheduler import Scheduler

__all__ = ["WatchQueue", "Watcher"]


class Watcher:
    """A live ``session.watch``; ``close()`` stops it (actions already started finish)."""

    __slots__ = ("_closed", "_queue", "_work", "action", "blocking", "key", "sub", "when")

    def __init__(
        self,
        work: Scheduler,
        queue: WatchQueue | None,
        key: str,
        when: Transition | Callable[[Any, Any], bool],
        action: Callable[[Change], Any],
        closed: Callable[[Watcher], None],
    ) -> None:
        self._work = work  # counts the actions in flight, for wait_idle
        self._queue = queue  # blocking watchers' actions run in it, one at a time
        self._closed = closed
        self.key = key
        self.when = when
        self.action = action
        self.blocking = queue is not None
        self.sub = work.state.subscribe(self._changed, keys=[key])

    @property
    def active(self) -> bool:
        """Whether the watcher still reacts to changes."""
        return self.sub.active

    def close(self) -> None:
        """Stop watching."""
        self.sub.close()
        self._closed(self)

    def _changed(self, changes: tuple[Change, ...]) -> None:
        # In the writer's thread: the predicate sees each change as it was committed.
        try:
            matched = [c for c in changes if self.when(c.old, c.new)]
        except Exception as exc:
            runtime = self._work.runtime
            runtime.soon(runtime.report, self.when, exc)
            return
        if matched:
            self._work.runtime.soon(self._schedule, matched)

    def _schedule(self, changes: list[Change]) -> None:
        work = self._work
        if not self.sub.active or not work.runtime.running:
            return
        level = chain_depth()  # an action's writes are one more link of this chain
        for change in changes:
            work.action_started()
            if self._queue is not None:
                self._queue.put(self, change, level)
            else:
                work.runtime.spawn(self.run, change)

    async def run(self, change: Change) -> None:
        """Run the action on one change, reporting (not raising) its failure."""
        context = self._work.state.engine.context
        # The task may have copied a fenced resolver's context (the write that triggered it);
        # the action writes as itself.
        token = context.push_actor(None) if context.actor() is not None else None
        try:
            outcome = self.action(change)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:
            self._work.runtime.report(self.action, exc)
        finally:
            if token is not None:
                context.pop_actor(token)
            self._work.action_done()

    def __repr__(self) -> str:
        kind = "blocking" if self.blocking else "concurrent"
        return f"<Watcher {self.key!r} {kind}{'' if self.active else ' closed'}>"


class WatchQueue:
    """Runs the blocking watchers' actions one at a time, in commit order."""

    def __init__(self) -> None:
        send: MemoryObjectSendStream[tuple[Watcher, Change, int]]
        receive: MemoryObjectReceiveStream[tuple[Watcher, Change, int]]
        send, receive = anyio.create_memory_object_stream(math.inf)
        self._send = send
        self._receive = receive
        self._scope: anyio.CancelScope | None = None
        self._dropped = False

    def put(self, watcher: Watcher, change: Change, level: int = 0) -> None:
        """Queue an action (never blocks: the queue is unbounded); ``level`` is the delivery
        chain depth it reacts at."""
        self._send.send_nowait((watcher, change, level))

    async def consume(self) -> None:
        """The queue's task: run queued actions until the queue is closed."""
        with anyio.CancelScope() as self._scope:
            if self._dropped:
                self._scope.cancel()
            async with self._receive:
                async for watcher, change, level in self._receive:
                    with in_chain(level):
                        await watcher.run(change)

    def close(self, *, drain: bool) -> None:
        """No more actions; with ``drain`` the queued ones still run, else they are dropped."""
        self._send.close()
        if not drain:
            self._dropped = True
            if self._scope is not None:
                self._scope.cancel()
