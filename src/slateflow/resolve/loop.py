"""A session's loop as the layers built on it see it: what flows and the call may ask of it.

``session.loop`` runs callbacks on the session's event loop from any thread, starts tasks in
its task group, reports failures of user code the way the session does, and tells whether the
session is open. It is the runtime protocol of a :class:`~slateflow.Session`, as
``state.engine`` is the State's: flows (``slateflow.flow``) and the conversation
(``slateflow.conversation.Call``) use it instead of the session's private members.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from .session import Session

__all__ = ["SessionLoop", "spawn_detached"]

_HOSTS: set[Any] = set()


class SessionLoop:
    """The runtime of one session (see the module docstring)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def open(self) -> bool:
        """Whether the session is open and not closing."""
        session = self._session
        return session._open and not session._closing

    def check(self) -> None:
        """Raise :class:`~slateflow.errors.SessionError` unless the session is open, on its
        own thread."""
        self._session._check_usable()

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the session's loop: now on its thread, else soon."""
        self._session._soon(fn, *args)

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` as a task of the session (nothing once it has closed)."""
        self._session._spawn(fn, *args)

    def report(self, receiver: object, exc: Exception) -> None:
        """Log a failure of user code (a receiver, a callback) and send it on
        ``state.receiver_failed``."""
        self._session._report(receiver, exc)

    def claim(self, name: str) -> bool:
        """Take on re-dispatching resolver ``name`` after a restart (False: someone already
        has, or it is running)."""
        return self._session._claim(name)


def spawn_detached(fn: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
    """Run ``fn`` in a task of its own that no task group of the caller owns (it must never
    raise): an asyncio task, or a trio system task."""
    import asyncio

    context = contextvars.copy_context()
    loop = anyio.lowlevel.current_token().native_token
    if not isinstance(loop, asyncio.AbstractEventLoop):  # trio, the other backend
        import trio

        trio.lowlevel.spawn_system_task(fn, name=name, context=context)
        return
    task: asyncio.Task[None] = loop.create_task(fn(), name=name, context=context)
    _HOSTS.add(task)  # asyncio keeps only weak references to tasks
    task.add_done_callback(_HOSTS.discard)
