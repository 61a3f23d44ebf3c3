"""Knowing, cheaply, that the running code is inside a section: what may not wait for itself;
and :class:`Serial`, a lock that work which must not wait for it leaves its work with.

User code runs inside slateflow's own work (a flow action inside a turn, a tool's function
inside its claim), and may call back in. Waiting there for the very thing that runs it would
wedge the call forever, so the waits that could be re-entered first ask :func:`inside`, and
refuse (or go ahead) instead. A section is marked with :func:`entered` around the code that runs
in it; a task started inside a section inherits the mark (it runs on the section's behalf), and
once the section ends the mark no longer counts, even in a task that outlives it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token

import anyio

__all__ = ["Serial", "entered", "inside", "open_sections"]

Job = Callable[[], Awaitable[None]]

_open: ContextVar[tuple[_Section, ...]] = ContextVar("slateflow_sections", default=())
open_sections = _open.get
"""The sections the running code is inside (empty, and so false, almost always: a cheap first
test before :func:`inside`)."""


class _Section:
    __slots__ = ("open", "owner")

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.open = True


def inside(owner: object) -> bool:
    """Whether the running code is inside a section of ``owner`` that is still open."""
    sections = _open.get()
    return bool(sections) and any(s.owner is owner and s.open for s in sections)


class entered:  # lower case: it reads as a function, ``with entered(owner):``
    """Mark the code run in this block (and the tasks it starts) as inside ``owner``."""

    __slots__ = ("_section", "_token")

    def __init__(self, owner: object) -> None:
        self._section = _Section(owner)
        self._token: Token[tuple[_Section, ...]] | None = None

    def __enter__(self) -> None:
        self._token = _open.set((*_open.get(), self._section))

    def __exit__(self, *exc: object) -> None:
        self._section.open = False
        if self._token is not None:
            _open.reset(self._token)
            self._token = None


# A conversation's turn lock: a user turn runs extractors and waits for its flows' call-mode
# actions, user code that may run a tool, whose success runs ``on_tool`` hooks that must not
# run while a turn is handled. Waiting for the turn's lock there would wedge the call (the turn
# waits for the action, the action for the turn), so such work never waits: when someone holds
# the lock, it is left with the holder, who runs it before letting go.


class Serial:
    """The lock of a conversation's turns and hooks, with the work left for its holder:
    ``async with serial:`` holds it for the block, then runs what was left with it.

    ``spawn`` starts a task (the session's): work left with a holder that was cancelled or
    failed is run in one.
    """

    __slots__ = ("_section", "_spawn", "left", "lock")

    def __init__(self, spawn: Callable[[Callable[[], Awaitable[None]]], None]) -> None:
        # No checkpoint when nobody holds it: a turn must not yield to the loop just to start.
        self.lock = anyio.Lock(fast_acquire=True)
        """The lock itself: ``serial.lock.locked()`` says whether someone holds it."""
        self.left: list[Job] = []
        """The work left with the holder, not run yet (a list, read without a call)."""
        self._spawn = spawn
        self._section: AbstractContextManager[None] | None = None  # the holder's

    def held_here(self) -> bool:
        """Whether the running code runs inside the holder's section (its task, or a task
        it started)."""
        return inside(self)

    async def __aenter__(self) -> None:
        await self.lock.acquire()
        section = self._section = entered(self)
        section.__enter__()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None and self.left:
                await self.drain()
        finally:
            section, self._section = self._section, None
            if section is not None:
                section.__exit__(None, None, None)
            self.lock.release()
            if self.left:  # cancelled or failed before they ran: a task takes them
                self._spawn(self._later)

    async def run_or_leave(self, job: Job) -> None:
        """Run ``job`` holding the lock, or leave it with the holder when someone holds it
        (it then runs before the holder lets go): never waits for the lock."""
        if self.lock.locked():
            self.left.append(job)
            return
        async with self:
            await job()

    async def drain(self) -> None:
        """Run the work left with the holder so far (the holder calls it)."""
        while self.left:
            await self.left.pop(0)()

    async def _later(self) -> None:
        if self.left:
            async with self:
                pass
