"""One thing at a time in a conversation, and no wait on a lock across user code.

A user turn runs extractors and waits for its flows' call-mode actions: user code, which may
run a tool, and a tool's success runs the conversation's ``on_tool`` hooks, which must not run
while a turn is being handled. Waiting for the turn's lock there would wedge the call (the turn
waits for the action, the action for the turn), so such work never waits for the lock: when
someone holds it, it is left with the holder, who runs it before letting go.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager

import anyio

from ..resolve.sections import entered, inside

__all__ = ["Serial"]

Job = Callable[[], Awaitable[None]]


class Serial:
    """The lock of a conversation's turns and hooks, with the work left for its holder:
    ``async with serial:`` holds it for the block, then runs what was left with it.

    ``spawn`` starts a task (the session's): work left with a holder that was cancelled or
    failed is run in one.
    """

    __slots__ = ("_jobs", "_lock", "_section", "_spawn")

    def __init__(self, spawn: Callable[[Callable[[], Awaitable[None]]], None]) -> None:
        # No checkpoint when nobody holds it: a turn must not yield to the loop just to start.
        self._lock = anyio.Lock(fast_acquire=True)
        self._jobs: list[Job] = []
        self._spawn = spawn
        self._section: AbstractContextManager[None] | None = None  # the holder's

    def locked(self) -> bool:
        """Whether someone holds it (a turn is being built, or hooks run)."""
        return self._lock.locked()

    @property
    def left(self) -> bool:
        """Whether work was left with the holder, not run yet."""
        return bool(self._jobs)

    def held_here(self) -> bool:
        """Whether the running code runs inside the holder's section (its task, or a task
        it started)."""
        return inside(self)

    async def __aenter__(self) -> None:
        await self._lock.acquire()
        section = self._section = entered(self)
        section.__enter__()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None and self._jobs:
                await self.drain()
        finally:
            section, self._section = self._section, None
            if section is not None:
                section.__exit__(None, None, None)
            self._lock.release()
            if self._jobs:  # cancelled or failed before they ran: a task takes them
                self._spawn(self._later)

    async def run_or_leave(self, job: Job) -> None:
        """Run ``job`` holding the lock, or leave it with the holder when someone holds it
        (it then runs before the holder lets go): never waits for the lock."""
        if self._lock.locked():
            self._jobs.append(job)
            return
        async with self:
            await job()

    async def drain(self) -> None:
        """Run the work left with the holder so far (the holder calls it)."""
        while self._jobs:
            await self._jobs.pop(0)()

    async def _later(self) -> None:
        if self._jobs:
            async with self:
                pass
