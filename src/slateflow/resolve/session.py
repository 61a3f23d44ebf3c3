"""The Session: owns the tasks of dispatched and background resolvers, watchers and reactions."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from ..errors import (
    SessionError,
    WaitTimeoutError,
)
from ..state import SECRET_MASK, Change, Key, State
from ..state.keys import key_name
from ..state.redaction import redact as redact_transcript
from ..state.when import Transition
from .background import (
    AckFormatter,
    BackgroundResult,
    Deliver,
    ResultFormatter,
    Scheduling,
    default_ack,
    default_result,
)
from .clock import SYSTEM_CLOCK, Clock, wait_on
from .conversing import Conversing
from .inbox import DEFAULT_INBOX_LIMIT
from .loop import SessionLoop, spawn_detached
from .reactions import Reaction
from .resolver import OnConflict, Resolver
from .restart import Restart
from .run import Mode, Run
from .slots import RunSlots, Slot
from .turns import (
    DEFAULT_MAX_TRANSCRIPT,
    Closable,
    Conversation,
    Governor,
    HandoverMode,
    R_co,
    Runnable,
    check_options,
)
from .watchers import Watcher, WatchQueue

__all__ = ["Runnable", "Session"]

log = logging.getLogger("slateflow.resolve")


class Session(RunSlots, Restart, Conversing):
    """The runtime for dispatch and background modes: an anyio task group, a clock, the runs.

    Use it as ``async with Session(state) as session:``. Inside, ``session.dispatch(resolver)``
    starts a run and returns its handle at once; ``session.background(resolver, deliver)`` also
    hands the outcome to ``deliver``; ``session.watch(...)`` runs async actions on changes;
    ``session.run_flow(flow)`` runs a flow whose ``on_enter`` actions run here.

    ``max_concurrency`` caps how many sources run at once (the rest wait, status ``running``).
    ``clock`` drives timeouts, retry backoff and debounce (a ``ManualClock`` in tests).
    ``on_exit="cancel"`` (default) cancels what is still running when the block ends;
    ``on_exit="wait"`` waits for it first (reactions and watchers stop either way). A resolver's
    exception never escapes the session: it becomes the run's error. A source that ignores
    cancellation is reported (logged) after ``cancel_grace`` seconds while the session waits for
    it, so no task outlives the block. ``ack_formatter`` and ``result_formatter`` shape what
    background mode tells the model.

    The conversation over it (turns, contexts, tools, the inbox, interruptions, voice timing) is
    a :class:`slateflow.conversation.Call`: ``Call(session, ...)``, or ``session.conversation``,
    made when first asked for with the options given here (``redact``, ``tools``,
    ``on_delivery``, ``on_waiting``, ``handover``, ``max_transcript``, ``max_waiting``: see
    ``Call``).

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
        redact: Callable[[str], str] | None = redact_transcript,
        tools: Iterable[str] = (),
        on_delivery: Deliver | None = None,
        on_waiting: Deliver | None = None,
        handover: HandoverMode = "auto",
        max_transcript: int = DEFAULT_MAX_TRANSCRIPT,
        max_waiting: int = DEFAULT_INBOX_LIMIT,
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
        self.cancel_grace = cancel_grace
        self.ack_formatter = ack_formatter
        self.result_formatter = result_formatter
        self._max_concurrency = max_concurrency
        self._limiter: anyio.CapacityLimiter | None = None
        self._tg: TaskGroup | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._thread = 0
        self._open = False
        self._closing = False
        self._slots: dict[str, Slot] = {}
        self._count = 0
        self._idle: anyio.Event | None = None
        self._actions = 0  # watcher actions queued or running
        # Cancelled runs not yet ended, by when they will be reported as ignoring it.
        self._stubborn: list[tuple[float, int, Run]] = []
        self._order = itertools.count()
        self._reaping = False
        # Bound once: every run holds one of these, and a bound method per run is an object more
        # for the garbage collector to track.
        self._on_cancel_started: Callable[[Run], None] = self._watch_cancelled
        self._on_cancel_queued: Callable[[Run], None] = self._cancel_queued
        self._reactions: dict[str, Reaction] = {}
        self._watchers: set[Watcher] = set()
        self._queue: WatchQueue | None = None
        self._runners: list[Closable] = []
        check_options(redact, on_delivery, on_waiting, handover, max_transcript, max_waiting)
        self.loop = SessionLoop(self)
        """The session's runtime, for the layers built on it (see :class:`SessionLoop`)."""
        # The conversation (a slateflow.conversation.Call) attached, or made with these options
        # when first asked for.
        self._conversation: Conversation | None = None
        self._made_conversation = False
        self._conversation_options: dict[str, Any] = {
            "redact": redact,
            "tools": tools,
            "on_delivery": on_delivery,
            "on_waiting": on_waiting,
            "handover": handover,
            "max_transcript": max_transcript,
            "max_waiting": max_waiting,
        }
        self._host: tuple[anyio.Event, anyio.Event, list[BaseException]] | None = None
        self._opened_seq = 0
        # Resolvers a resuming flow has taken on re-dispatching: resume() leaves them alone.
        self._claimed: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        if self._open or self._closing:
            raise SessionError("a Session can be entered once; make a new one")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._token = anyio.lowlevel.current_token()
        self._thread = threading.get_ident()
        if self._max_concurrency is not None:
            self._limiter = anyio.CapacityLimiter(self._max_concurrency)
        self._opened_seq = self.state.cursor
        self._open = True
        if self._conversation is not None:
            self._conversation.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        self._closing = True
        try:
            for reaction in list(self._reactions.values()):
                reaction.stop()
            self._reactions.clear()
            for watcher in list(self._watchers):
                watcher.close()
            for runner in self._runners:
                runner.close()
            try:
                if exc_type is None and self.on_exit == "wait":
                    await self.wait_idle()
            finally:
                # Also when the wait itself is cancelled: nothing may outlive the block.
                self.cancel_all(reason="session closed")
                if self._queue is not None:
                    self._queue.close(drain=exc_type is None and self.on_exit == "wait")
        finally:
            try:
                result = await self._tg.__aexit__(exc_type, exc, tb)
            except BaseExceptionGroup as group:
                # anyio wraps the block's own exception in a group; the session's tasks never
                # fail, so hand the caller back exactly what its block raised.
                if exc is not None and list(group.exceptions) == [exc]:
                    return False
                raise
            finally:
                self._open = False
        return result

    async def start(self) -> Session:
        """Open the session without an ``async with`` block, for hosts whose start and end run
        in different tasks (a pipecat processor's StartFrame and EndFrame, a LiveKit agent's
        entrypoint and shutdown callback). Its task group lives in a task of its own until
        :meth:`aclose`; the guarantees are those of ``async with`` (no task outlives the
        session; every run ends in exactly one terminal status). Returns the session."""
        if self._open or self._closing or self._host is not None:
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

    def _check_usable(self) -> TaskGroup:
        if not self._open or self._closing or self._tg is None:
            raise SessionError(
                "the Session is not open; use it inside 'async with Session(state) as session:'"
            )
        self._check_thread()
        return self._tg

    def _check_thread(self) -> None:
        if self._thread and threading.get_ident() != self._thread:
            raise SessionError(
                "Session methods must be called from the thread running its event loop; from "
                "another thread use anyio.from_thread.run_sync(session.dispatch, resolver)"
            )

    # -- dispatch and background -----------------------------------------------------------

    def dispatch(self, resolver: Resolver, *, on_conflict: OnConflict | None = None) -> Run:
        """Start ``resolver`` in the background and return its handle (fire-and-forget).

        ``<name>:status`` is ``"running"`` when this returns. ``on_conflict`` overrides the
        resolver's own policy for this dispatch. With ``"reject"`` and a run in flight, raises
        :class:`~slateflow.errors.DispatchRejectedError`. A reactive resolver also starts
        reacting: it re-runs when a ``reads`` key changes, until ``cancel(name)`` or the end of
        the session.
        """
        return self._submit(resolver, "dispatch", on_conflict, None, None)

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
        with the ``scheduling`` hint. Its exceptions are logged and reported on
        ``state.receiver_failed``; they never reach the session. Without ``deliver`` the result
        goes to the session: to ``on_delivery`` at once for ``interrupt`` scheduling, else into
        the next :class:`TurnContext` (a ``silent`` one is handed over with no line for the
        model).
        """
        if deliver is None:
            deliver = self.inbox_delivery(None)
        if not callable(deliver):
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
        self._submit(resolver, "background", on_conflict, deliver, hint)
        return self.ack_formatter(resolver.name)

    async def call(self, resolver: Resolver) -> Any:
        """Run ``resolver`` in the calling task (call mode) on the session's clock."""
        self._check_usable()
        return await Run(resolver, "call", self.state, self.clock).call()

    def dress(self, result: BackgroundResult, *, to_model: bool = True) -> BackgroundResult:
        """``result`` with its ``response`` (what the model is told) made by the result
        formatter. A result of a secret key (``policy(..., secret=True)``) is never shown: its
        response says a secret result is available (``"result": "***"``), and one going to the
        model has its ``value`` masked too (a ``deliver`` callback of yours gets the value)."""
        secret = result.status == "completed" and self.state.is_secret(f"{result.name}:result")
        if not secret:
            return result.model_copy(update={"response": self.result_formatter(result)})
        masked = result.model_copy(update={"value": SECRET_MASK, "secret": True})
        response = self.result_formatter(masked)
        kept = masked if to_model else result.model_copy(update={"secret": True})
        return kept.model_copy(update={"response": response})

    def _report(self, receiver: object, exc: Exception) -> None:
        log.error("slateflow session: %r failed: %r", receiver, exc, exc_info=exc)
        if self.state.receiver_failed.receivers:
            try:
                self.state.receiver_failed.send(
                    self.state, receiver=receiver, error=exc, changes=()
                )
            except Exception:
                log.exception("a receiver_failed handler failed too")

    # -- control ---------------------------------------------------------------------------

    def cancel(self, name: str) -> int:
        """Cancel every run of resolver ``name`` (and stop it reacting); returns how many."""
        self._check_thread()
        reaction = self._reactions.pop(name, None)
        if reaction is not None:
            reaction.stop()
        slot = self._slots.get(name)
        if slot is None:
            return 0
        cancelled = 0
        while slot.waiting:
            self._end_queued(slot.waiting.popleft())
            cancelled += 1
        for run in list(slot.active):
            cancelled += run.cancel()
        return cancelled

    def cancel_all(self, *, reason: str = "cancelled") -> int:
        """Cancel every run of the session; returns how many were cancelled."""
        self._check_thread()
        total = 0
        for name, slot in list(self._slots.items()):
            for run in [*slot.active, *(slot.waiting or ())]:
                if run.cancel_reason is None:
                    run.cancel_reason = reason
            total += self.cancel(name)
        return total

    def is_running(self, name: str) -> bool:
        """Whether a run of resolver ``name`` is in flight or queued.

        A superseded run still winding down does not count (it will write nothing).
        """
        slot = self._slots.get(name)
        return slot is not None and slot.busy()

    @property
    def active_count(self) -> int:
        """How many runs are in flight or queued."""
        return self._count

    def runs(self, name: str | None = None) -> list[Run]:
        """The handles of the runs in flight or queued (of ``name``, or all).

        Superseded runs that have not ended yet are included (``run.superseded`` is True).
        """
        slots = [self._slots.get(name)] if name is not None else list(self._slots.values())
        return [
            run
            for slot in slots
            if slot is not None
            for run in (*slot.active, *(slot.waiting or ()))
        ]

    async def wait_idle(self) -> None:
        """Wait until no run is in flight or queued and no watcher action is pending.

        Reactions may start more runs later (after their debounce). Under a ``ManualClock``
        time jumps to the next timer while every task is blocked, and if nothing can ever end
        the runs (every task blocked, no timer left) this raises
        :class:`~slateflow.errors.WaitTimeoutError` naming them instead of hanging.
        """
        while self._count or self._actions:
            if self._idle is None:
                self._idle = anyio.Event()
            if await wait_on(self.clock, self._idle, None) == "stuck":
                running = ", ".join(sorted({r.name for r in self.runs()})) or "watcher actions"
                raise WaitTimeoutError(
                    f"wait_idle: {running} can never end: every task is blocked and no timer "
                    "is due on the manual clock (complete the fake, or advance the clock)"
                )

    def _check_idle(self) -> None:
        if not self._count and not self._actions and self._idle is not None:
            self._idle.set()
            self._idle = None

    # -- reactions -------------------------------------------------------------------------

    def _react(
        self,
        resolver: Resolver,
        mode: Mode,
        deliver: Deliver | None,
        scheduling: Scheduling | None,
    ) -> Reaction:
        reaction = self._reactions.get(resolver.name)
        if reaction is None:
            reaction = Reaction(self, resolver, mode, deliver, scheduling)
            self._reactions[resolver.name] = reaction
        else:
            reaction.retarget(resolver, mode, deliver, scheduling)
        return reaction

    def _rerun(self, reaction: Reaction) -> None:
        """A reaction's debounce elapsed: run again unless the latest run saw these inputs."""
        if self._closing or self._reactions.get(reaction.resolver.name) is not reaction:
            return
        resolver = reaction.resolver
        slot = self._slots.get(resolver.name)
        last = slot.last if slot is not None else reaction.last
        if last is not None and last.status != "cancelled":
            if last.inputs is None and not last.done:
                return  # not started yet: it will read the current values
            current = {k: self.state.version(k) for k in resolver.reads}
            if last.inputs == current:
                return
        try:
            self._submit(resolver, reaction.mode, "latest", reaction.deliver, reaction.scheduling)
        except Exception as exc:
            self._report(resolver, exc)

    # -- flows -----------------------------------------------------------------------------

    def run_flow(self, flow: Runnable[R_co], *, enforcement: Any = "enforce") -> R_co:
        """Start running ``flow`` over this session's state and return its ``FlowRunner``.

        The flow is compiled first (``FlowDefinitionError`` lists its problems). Steps advance
        the moment their guards hold, whoever writes the keys; ``on_enter`` actions run in this
        session. ``enforcement`` is ``"enforce"`` (refuse tools the flow does not admit) or
        ``"observe"`` (admit them and record violations). The runner closes with the session.
        """
        self._check_usable()
        runner = flow._run_in(self, enforcement=enforcement)
        self._runners.append(runner)
        # Checked once: a Protocol isinstance is slow. A conversation attached later takes up
        # the flows already running.
        if self._conversation is not None and isinstance(runner, Governor):
            self._conversation.govern(runner)
        return runner

    async def launch(
        self,
        resolver: Resolver,
        mode: Mode,
        *,
        scheduling: Scheduling | str = Scheduling.WHEN_IDLE,
        deliver: Deliver | None = None,
    ) -> None:
        """Start ``resolver`` in ``mode``: ``"call"`` waits for it, ``"dispatch"`` and
        ``"background"`` return at once (background results go to ``deliver`` or the model)."""
        if mode == "call":
            with contextlib.suppress(Exception):
                # Its outcome is in the state (<name>:result or <name>:error) either way.
                await self.call(resolver)
        elif mode == "dispatch":
            self.dispatch(resolver)
        else:
            self.background(resolver, deliver, scheduling)

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
        tg = self._check_usable()
        name = key_name(key)
        if not callable(when) or not callable(action):
            raise TypeError(
                f"watch({name!r}, when, action) needs two callables: a predicate over "
                "(old, new) such as when.changed_to('done'), and an action taking the Change"
            )
        if blocking and self._queue is None:
            self._queue = WatchQueue(self)
            tg.start_soon(self._queue.consume, name="slateflow:watchers")
        watcher = Watcher(self, name, when, action, blocking)
        self._watchers.add(watcher)
        return watcher

    def _soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the session's loop: now if this is its thread, else soon."""
        if threading.get_ident() == self._thread:
            fn(*args)
            return
        token = self._token
        if token is None:
            return
        with contextlib.suppress(anyio.RunFinishedError):
            token.backend_class.run_sync_soon(fn, args, token.native_token)

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._tg is not None and self._open:
            self._tg.start_soon(fn, *args)

    def __repr__(self) -> str:
        state = "open" if self._open and not self._closing else "closed"
        return f"<Session {state}, {self._count} runs>"
