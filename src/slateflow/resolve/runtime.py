"""A session's runtime: its task group, event loop, thread, open flag and HTTP pool.

:class:`Runtime` is what the parts of a :class:`~slateflow.Session` and the layers built on it
use to reach the session's event loop: run a callback on it from any thread (:meth:`soon`),
start a task in its task group (:meth:`spawn`), report a failure of user code the way the
session does (:meth:`report`), and check that the session is open on its own thread
(:meth:`check`). ``session.runtime`` is it, as ``state.engine`` is the State's commit path.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from ..errors import SessionError
from .http import HTTPPool

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Runtime", "spawn_detached"]

log = logging.getLogger("slateflow.resolve")

_HOSTS: set[Any] = set()


class Runtime:
    """The task group, event loop token, thread and open flag of one session.

    ``tg`` is set while the session is open; ``open`` is true from then until the session
    starts closing.
    """

    __slots__ = ("_closing", "_open", "_state", "_token", "accepting", "http", "tg", "thread")

    def __init__(self, state: State, http: HTTPPool | None = None) -> None:
        self._state = state
        self.http = http if http is not None else HTTPPool()
        """The session's pooled HTTP client (HTTP resolvers and OpenAI models run by the
        session share it); closed with the session."""
        self.tg: TaskGroup | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self.thread = 0
        """The id of the thread running the session's event loop (0 before it opens)."""
        self._open = False
        self._closing = False
        self.accepting = False
        """Whether the session is open and not closing (what :meth:`check` checks), as a plain
        attribute for the hot paths that check it inline."""

    # -- lifecycle (the session's) -----------------------------------------------------------

    def begin(self, tg: TaskGroup) -> None:
        """The session opened with ``tg`` on the running event loop, in this thread."""
        if self._open or self._closing:
            raise SessionError("a Session can be entered once; make a new one")
        self.tg = tg
        self._token = anyio.lowlevel.current_token()
        self.thread = threading.get_ident()
        self._open = True
        self.accepting = True

    def closing(self) -> None:
        """The session started closing: nothing new may start."""
        self._closing = True
        self.accepting = False

    def ended(self) -> None:
        """The session's task group has exited."""
        self._open = False
        self.accepting = False

    @property
    def open(self) -> bool:
        """Whether the session is open and not closing."""
        return self.accepting

    @property
    def running(self) -> bool:
        """Whether the session's task group is alive (open, or closing and not yet ended)."""
        return self._open

    @property
    def used(self) -> bool:
        """Whether the session was ever opened (it may have closed since)."""
        return self._open or self._closing

    # -- what the parts use ------------------------------------------------------------------

    def check(self) -> TaskGroup:
        """The task group; raises :class:`~slateflow.errors.SessionError` unless the session
        is open, on its own thread."""
        if not self._open or self._closing or self.tg is None:
            raise SessionError(
                "the Session is not open; use it inside 'async with Session(state) as session:'"
            )
        self.check_thread()
        return self.tg

    def in_loop(self) -> bool:
        """Whether the caller runs inside the session's event loop, not merely on its thread
        (a sync pytest fixture runs on the loop's thread while the loop is paused)."""
        token = self._token
        if token is None or threading.get_ident() != self.thread:
            return False
        native = token.native_token
        if isinstance(native, asyncio.AbstractEventLoop):
            return asyncio._get_running_loop() is native
        import trio

        return trio.lowlevel.in_trio_run()

    def check_in_loop(self, what: str) -> None:
        """Raise :class:`~slateflow.errors.SessionError` naming ``what`` unless the caller
        runs inside the session's event loop (see :meth:`in_loop`)."""
        if not self.in_loop():
            raise SessionError(
                f"{what} must run inside the session's event loop, which is not running here "
                "(called from a sync pytest fixture? make the fixture 'async def')"
            )

    def check_thread(self) -> None:
        """Raise :class:`~slateflow.errors.SessionError` if called from another thread than
        the one running the session's event loop."""
        if self.thread and threading.get_ident() != self.thread:
            raise SessionError(
                "Session methods must be called from the thread running its event loop; from "
                "another thread use anyio.from_thread.run_sync(session.dispatch, resolver)"
            )

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the session's loop: now when called inside it, else soon
        (from another thread, or from its own while it is paused; nothing once the loop has
        finished)."""
        if threading.get_ident() == self.thread and self.in_loop():
            fn(*args)
            return
        self.soon_later(fn, *args)

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` as a task of the session (nothing once it has closed). Called
        on the loop's thread while the loop is paused (a sync pytest fixture), the task starts
        when the loop runs again."""
        tg = self.tg
        if tg is None or not self._open:
            return
        if self.in_loop():
            tg.start_soon(fn, *args)
        else:
            self.soon_later(self.spawn, fn, *args)

    def soon_later(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the session's loop the next time it runs, even from its own
        thread (where :meth:`soon` would call it now)."""
        token = self._token
        if token is not None:
            with contextlib.suppress(anyio.RunFinishedError):
                token.backend_class.run_sync_soon(fn, args, token.native_token)

    def report(self, receiver: object, exc: Exception) -> None:
        """Log a failure of user code (a receiver, a callback, a hook) and send it on
        ``state.receiver_failed``; it never reaches the session."""
        log.error("slateflow session: %r failed: %r", receiver, exc, exc_info=exc)
        signal = self._state.receiver_failed
        if signal.receivers:
            try:
                signal.send(self._state, receiver=receiver, error=exc, changes=())
            except Exception:
                log.exception("a receiver_failed handler failed too")


def spawn_detached(fn: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
    """Run ``fn`` in a task of its own that no task group of the caller owns (it must never
    raise): an asyncio task, or a trio system task."""
    context = contextvars.copy_context()
    loop = anyio.lowlevel.current_token().native_token
    if not isinstance(loop, asyncio.AbstractEventLoop):  # trio, the other backend
        import trio

        trio.lowlevel.spawn_system_task(fn, name=name, context=context)
        return
    task: asyncio.Task[None] = loop.create_task(fn(), name=name, context=context)
    _HOSTS.add(task)  # asyncio keeps only weak references to tasks
    task.add_done_callback(_HOSTS.discard)
