"""The Session: runs resolvers in dispatch, background and call modes, in a task group of its own.

A Session is made of parts that each hold their own fields: a :class:`~.runtime.Runtime` (the
task group, event loop and thread: what reactions, watchers, flows and conversations use to
reach the loop, ``session.runtime``), a :class:`~.scheduler.Scheduler` (the runs: slots,
queues, supersession, the concurrency limit, what is in flight, the delivery of background
outcomes) and a :class:`~.recovery.Recovery` (runs a previous process left in flight). It knows
nothing of conversations or flows: what must close with it registers through :meth:`on_close`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

import anyio

from ..errors import SessionError
from ..state import Change, Key, State
from ..state.keys import key_name
from ..state.waits import keep_time
from ..state.when import Transition
from .background import (
    AckFormatter,
    Deliver,
    ResultFormatter,
    Scheduling,
    default_ack,
    default_result,
)
from .clock import SYSTEM_CLOCK, Clock, ClockTime, jumping
from .http import HTTPPool, hosting, unhost
from .recovery import Recovery
from .resolver import OnConflict, Resolver
from .run import Run
from .runtime import Runtime, spawn_detached
from .scheduler import Scheduler
from .watchers import Watcher, WatchQueue

__all__ = ["Session"]


class Session:
    """The runtime for dispatch and background modes: an anyio task group, a clock, the runs.

    Use it as ``async with Session(state) as session:``. Inside, ``session.dispatch(resolver)``
    starts a run and returns its handle at once; ``session.background(resolver, deliver)`` also
    hands the outcome to ``deliver`` (a conversation's ``deliver`` tells the model);
    ``session.call(resolver)`` runs one in the calling task; ``session.watch(...)`` runs async
    actions on changes.

    ``max_concurrency`` caps how many sources run at once (the rest wait, status ``running``).
    ``clock`` drives timeouts, retry backoff and debounce (a ``ManualClock`` in tests).
    ``on_exit="cancel"`` (default) cancels what is still running when the block ends;
    ``on_exit="wait"`` waits for it first (reactions and watchers stop either way). A resolver's
    exception never escapes the session: it becomes the run's error. A source that ignores
    cancellation is reported (logged) after ``cancel_grace`` seconds while the session waits for
    it, so no task outlives the block. ``ack_formatter`` and ``result_formatter`` shape what
    background mode tells the model. ``http`` is the session's pooled HTTP client (an
    :class:`~slateflow.resolve.HTTPPool`, ``session.http``), which its HTTP resolvers and
    OpenAI models share; it is closed with the session.

    Open it with ``async with``, or with ``await session.start()`` and ``await
    session.aclose()`` from different tasks (a framework's start and end callbacks). Call its
    methods from the thread running the event loop. Writes to the state may come from any
    thread: reactions and watchers are woken on the session's loop.
    """

    def __init__(
        self,
        state: State,
        *,
        max_concurrency: int | None = None,
        clock: Clock | None = None,
        on_exit: Literal["cancel", "wait"] = "cancel",
        cancel_grace: float = 5.0,
        ack_formatter: AckFormatter = default_ack,
        result_formatter: ResultFormatter = default_result,
        http: HTTPPool | None = None,
    ) -> None:
        if not isinstance(state, State):
            raise TypeError(f"Session needs a State, got {type(state).__name__}")
        if max_concurrency is not None and (
            type(max_concurrency) is not int or max_concurrency < 1
        ):
            raise ValueError(
                f"max_concurrency must be an int >= 1 or None, got {max_concurrency!r}"
            )
        if on_exit not in ("cancel", "wait"):
            raise ValueError(f"on_exit must be 'cancel' or 'wait', got {on_exit!r}")
        self.state = state
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.on_exit = on_exit
        self.ack_formatter = ack_formatter
        self.result_formatter = result_formatter
        if http is not None and not isinstance(http, HTTPPool):
            raise TypeError(f"http must be an HTTPPool, got {type(http).__name__}")
        self.runtime = Runtime(state, http)
        """The session's task group and event loop, for the layers built on it (see
        :class:`~slateflow.resolve.runtime.Runtime`)."""
        self._scheduler = Scheduler(
            state,
            self.clock,
            self.runtime,
            max_concurrency=max_concurrency,
            cancel_grace=cancel_grace,
            result_formatter=result_formatter,
        )
        self._recovery = Recovery(state, self._scheduler)
        self._watchers: set[Watcher] = set()
        self._queue: WatchQueue | None = None
        self._closers: dict[int, Callable[[], object]] = {}
        self._closer_ids = itertools.count()
        self._host: tuple[anyio.Event, anyio.Event, list[BaseException]] | None = None
        self._forget_clock: Callable[[], None] = _nothing

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        if self.runtime.used:
            raise SessionError("a Session can be entered once; make a new one")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self.runtime.begin(tg)
        if self.clock is not SYSTEM_CLOCK:
            # The State's own waits follow this clock while the session is open.
            self._forget_clock = keep_time(self.state, ClockTime(self.clock))
        self._scheduler.begin()
        self._recovery.opened_seq = self.state.journal.cursor
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self.runtime.tg
        assert tg is not None
        self.runtime.closing()
        self._forget_clock()
        try:
            self._scheduler.stop_reacting()
            for watcher in list(self._watchers):
                watcher.close()
            for close in list(self._closers.values()):
                try:
                    close()
                except Exception as err:
                    self.runtime.report(close, err)
            try:
                if exc_type is None and self.on_exit == "wait":
                    await self.wait_idle()
            finally:
                # Also when the wait itself is cancelled: nothing may outlive the block.
                self._scheduler.cancel_all("session closed")
                if self._queue is not None:
                    self._queue.close(drain=exc_type is None and self.on_exit == "wait")
        finally:
            try:
                result = await tg.__aexit__(exc_type, exc, tb)
            except BaseExceptionGroup as group:
                # anyio wraps the block's own exception in a group; the session's tasks never
                # fail, so hand the caller back exactly what its block raised.
                if exc is not None and list(group.exceptions) == [exc]:
                    return False
                raise
            finally:
                self.runtime.ended()
                if self.runtime.http.started:
                    with anyio.CancelScope(shield=True):
                        await self.runtime.http.aclose()
        return result

    async def start(self) -> Session:
        """Open the session without an ``async with`` block, for hosts whose start and end run
        in different tasks (a pipecat processor's StartFrame and EndFrame, a LiveKit agent's
        entrypoint and shutdown callback). Its task group lives in a task of its own until
        :meth:`aclose`; the guarantees are those of ``async with`` (no task outlives the
        session; every run ends in exactly one terminal status). Returns the session."""
        if self.runtime.used or self._host is not None:
            raise SessionError("a Session can be started once; make a new one")
        opened, leave = anyio.Event(), anyio.Event()
        failure: list[BaseException] = []
        closed = anyio.Event()
        self._host = (leave, closed, failure)

        async def host() -> None:
            try:
                async with self:
                    opened.set()
                    await leave.wait()
            except BaseException as exc:  # handed to start() or aclose(), never lost
                failure.append(exc)
            finally:
                opened.set()
                closed.set()

        spawn_detached(host, name="slateflow:session")
        await opened.wait()
        if failure:
            raise failure[0]
        return self

    async def aclose(self) -> None:
        """Close a session opened with :meth:`start` (from any task of its event loop): like
        the end of an ``async with`` block, what is still running is cancelled (or awaited,
        with ``on_exit="wait"``). Safe to call twice."""
        if self._host is None:
            raise SessionError(
                "aclose() closes a session opened with 'await session.start()'; a session "
                "opened with 'async with' closes when its block ends"
            )
        leave, closed, failure = self._host
        leave.set()
        await closed.wait()
        if failure:
            exc = failure.pop()
            raise exc

    def on_close(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback()`` as the session closes, before its runs are cancelled (a flow
        runner registers its ``close`` so it stops with the session). A callback that raises is
        reported on ``state.receiver_failed``; the others still run. Returns a function that
        takes the callback back (a runner closed earlier does, so a long session holds only
        what is still open)."""
        if not callable(callback):
            raise TypeError(f"on_close takes a callable, got {callback!r}")
        key = next(self._closer_ids)
        self._closers[key] = callback

        def forget() -> None:
            self._closers.pop(key, None)

        return forget

    # -- the three modes -------------------------------------------------------------------

    def dispatch(self, resolver: Resolver, *, on_conflict: OnConflict | None = None) -> Run:
        """Start ``resolver`` in the background and return its handle (fire-and-forget).

        ``<name>:status`` is ``"running"`` when this returns. ``on_conflict`` overrides the
        resolver's own policy for this dispatch. With ``"reject"`` and a run in flight, raises
        :class:`~slateflow.errors.DispatchRejectedError`. A reactive resolver also starts
        reacting: it re-runs when a ``reads`` key changes, until ``cancel(name)`` or the end of
        the session.
        """
        return self._scheduler.submit(resolver, "dispatch", on_conflict, None, None)

    def background(
        self,
        resolver: Resolver,
        deliver: Deliver | None = None,
        scheduling: Scheduling | str = Scheduling.WHEN_IDLE,
        *,
        on_conflict: OnConflict | None = None,
    ) -> dict[str, Any]:
        """Start ``resolver`` and return the acknowledgement for the model at once.

        When the run ends, ``deliver`` (sync or async) receives a :class:`BackgroundResult`
        with the ``scheduling`` hint and its ``response`` made by the result formatter: give a
        conversation's ``deliver`` to tell the model, or a callback of your own. Its exceptions
        are logged and reported on ``state.receiver_failed``; they never reach the session.
        With no ``deliver``, the outcome is only in the State.
        """
        if deliver is not None and not callable(deliver):
            raise TypeError(
                f"background({resolver.name!r}, deliver): deliver must be a callable taking a "
                f"BackgroundResult, got {type(deliver).__name__}"
            )
        try:
            hint = Scheduling(scheduling)
        except ValueError:
            raise ValueError(
                f"scheduling must be one of {[s.value for s in Scheduling]}, got {scheduling!r}"
            ) from None
        self._scheduler.submit(resolver, "background", on_conflict, deliver, hint)
        return self.ack_formatter(resolver.name)

    async def call(self, resolver: Resolver) -> Any:
        """Run ``resolver`` in the calling task (call mode) on the session's clock: its value,
        or :class:`~slateflow.errors.ResolverError`. Under a ``ManualClock`` it waits as the
        kit's waits do: time jumps while every task is blocked, and a run that nothing could
        ever end raises :class:`~slateflow.errors.WaitTimeoutError` instead of hanging."""
        self.runtime.check()
        token = hosting(self.runtime.http)
        try:
            async with jumping(self.clock, f"the call of resolver {resolver.name!r}"):
                return await Run(resolver, "call", self.state, self.clock).call()
        finally:
            unhost(token)

    # -- control ---------------------------------------------------------------------------

    def cancel(self, name: str) -> int:
        """Cancel every run of resolver ``name`` (and stop it reacting); returns how many."""
        self.runtime.check_thread()
        return self._scheduler.cancel(name)

    def cancel_all(self, *, reason: str = "cancelled") -> int:
        """Cancel every run of the session; returns how many were cancelled."""
        self.runtime.check_thread()
        return self._scheduler.cancel_all(reason)

    def is_running(self, name: str) -> bool:
        """Whether a run of resolver ``name`` is in flight or queued.

        A superseded run still winding down does not count (it will write nothing).
        """
        return self._scheduler.is_running(name)

    @property
    def http(self) -> HTTPPool:
        """The session's pooled HTTP client (see :class:`~slateflow.resolve.HTTPPool`)."""
        return self.runtime.http

    @property
    def active_count(self) -> int:
        """How many runs are in flight or queued."""
        return self._scheduler.count

    def runs(self, name: str | None = None) -> list[Run]:
        """The handles of the runs in flight or queued (of ``name``, or all).

        Superseded runs that have not ended yet are included (``run.superseded`` is True).
        """
        return self._scheduler.runs(name)

    async def wait_idle(self) -> None:
        """Wait until no run is in flight or queued and no watcher action is pending.

        Reactions may start more runs later (after their debounce). Under a ``ManualClock``
        time jumps to the next timer while every task is blocked, and if nothing can ever end
        the runs (every task blocked, no timer left) this raises
        :class:`~slateflow.errors.WaitTimeoutError` naming them instead of hanging.
        """
        await self._scheduler.wait_idle()

    # -- after a restart -------------------------------------------------------------------

    def in_flight(self) -> list[str]:
        """The resolvers a previous process left running, which no run here has taken over.

        On a durable state each run records how it was started; a ``<name>:status`` still
        ``"running"`` from before this session opened means that process stopped mid-run. Flows
        re-dispatch their own ``on_enter`` resolvers as they resume; :meth:`resume` the rest.
        """
        return self._recovery.in_flight()

    def resume(
        self, *resolvers: Resolver, abandon: bool = False, deliver: Deliver | None = None
    ) -> list[Run]:
        """Re-dispatch the resolvers that were in flight when the process stopped.

        Give every resolver that may have been in flight (a resolver is code: the state holds
        only its name). Each one :meth:`in_flight` names runs again in the mode it was started
        in (background outcomes go to ``deliver``, a conversation's ``deliver`` to tell the
        model; a call-mode run, whose caller is gone, is dispatched). Resolvers that finished
        are never re-run: completed work is exactly-once, in-flight work at-least-once. An
        in-flight name with no resolver given raises :class:`~slateflow.errors.RecoveryError`
        before anything starts, unless ``abandon=True``, which marks those ``cancelled``
        instead. Returns the new runs.
        """
        self.runtime.check()
        return self._recovery.resume(resolvers, abandon, deliver)

    def adopt(self, name: str) -> bool:
        """Take over re-dispatching resolver ``name`` after a restart (a resuming flow does, for
        its own ``on_enter`` resolvers): False when someone already has, or it is running."""
        return self._recovery.adopt(name)

    # -- watchers --------------------------------------------------------------------------

    def watch(
        self,
        key: str | Key[Any],
        when: Transition | Callable[[Any, Any], bool],
        action: Callable[[Change], Any],
        *,
        blocking: bool = False,
    ) -> Watcher:
        """Run ``action(change)`` (sync or async) in the session when ``when(old, new)`` holds.

        Non-blocking actions run concurrently, each in its own task. Blocking ones run one
        after another, in commit order, across all blocking watchers of the session. Changes
        from any thread are handled on the session's loop. An action's exception is logged and
        reported on ``state.receiver_failed``. ``watcher.close()`` stops it.
        """
        self.runtime.check()
        name = key_name(key)
        if not callable(when) or not callable(action):
            raise TypeError(
                f"watch({name!r}, when, action) needs two callables: a predicate over "
                "(old, new) such as when.changed_to('done'), and an action taking the Change"
            )
        queue = None
        if blocking:
            if self._queue is None:
                self._queue = WatchQueue()
                # spawn: a sync fixture may set up watchers while the loop is paused.
                self.runtime.spawn(self._queue.consume)
            queue = self._queue
        watcher = Watcher(self._scheduler, queue, name, when, action, self._watchers.discard)
        self._watchers.add(watcher)
        return watcher

    def __repr__(self) -> str:
        state = "open" if self.runtime.open else "closed"
        return f"<Session {state}, {self._scheduler.count} runs>"


def _nothing() -> None:
    return None
