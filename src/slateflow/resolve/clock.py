"""Clocks: the Session's source of time, sleeps and deadlines (the real one, and a manual one).

Everything in the resolve layer that waits (timeouts, retry backoff, debounce) goes through a
:class:`Clock`, so a test can swap in :class:`ManualClock` and move time by hand.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Literal, Protocol, runtime_checkable

import anyio
import anyio.lowlevel

from ..errors import WaitTimeoutError

__all__ = [
    "Clock",
    "ClockTime",
    "ManualClock",
    "SystemClock",
    "WaitOutcome",
    "jumping",
    "real_work",
    "wait_on",
]


@runtime_checkable
class Clock(Protocol):
    """What a Session needs from a clock.

    ``time()`` is wall-clock seconds since the Unix epoch (for timestamps and TTLs), ``monotonic()``
    measures durations, ``sleep()`` waits, and ``deadline(seconds)`` is a cancel scope that is
    cancelled once ``seconds`` of this clock have passed. A clock is also callable (``clock()`` is
    ``clock.time()``), so the same object can be passed to ``State(clock=...)``.
    """

    def __call__(self) -> float: ...

    def time(self) -> float:
        """Wall-clock time in seconds (for timestamps)."""

    def monotonic(self) -> float:
        """A monotonic time in seconds (for durations and deadlines)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""

    def deadline(self, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope that ends its block after ``seconds`` on this clock."""


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and anyio's sleeps and deadlines."""

    __slots__ = ()

    def __call__(self) -> float:
        return time.time()

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds on a monotonic clock (for durations)."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (a checkpoint when zero or less)."""
        await anyio.sleep(max(seconds, 0.0))

    def deadline(self, seconds: float) -> anyio.CancelScope:
        """A cancel scope cancelled ``seconds`` from now (on the running event loop's clock)."""
        return anyio.CancelScope(deadline=anyio.current_time() + seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()

# Real seconds a manual-clock wait with no timer left lets pass, polling, before it gives up.
_STUCK_AFTER = 1.0
_STUCK_POLL = 0.01

# 2026-01-01T00:00:00Z: a fixed start keeps timestamps in tests reproducible.
_DEFAULT_START = 1_767_225_600.0


# Blocks under real_work() now running, in every thread (a list: one mutable cell).
_real_work = [0]


@contextmanager
def real_work() -> Iterator[None]:
    """Mark a block that waits on real work outside the event loop (a worker thread, a socket
    on a real server): while one runs, a :class:`ManualClock` waiting with autojump jumps time
    only after a moment of real time (1 s) with every task blocked, so a tool's or a fetch's
    timeout does not fire while the work is simply still running. Tools run in worker threads
    and HTTP and model calls use it; a fake of yours that waits on a thread can too."""
    _real_work[0] += 1
    try:
        yield
    finally:
        _real_work[0] -= 1


class _Timer:
    __slots__ = ("alive", "due", "event", "scope")

    def __init__(self, due: float, event: anyio.Event | None, scope: anyio.CancelScope | None):
        self.due = due
        self.event = event
        self.scope = scope
        self.alive = True

    def fire(self) -> None:
        if not self.alive:
            return
        self.alive = False
        if self.event is not None:
            self.event.set()
        if self.scope is not None:
            self.scope.cancel()


class _Jump:
    __slots__ = ("stuck",)

    def __init__(self) -> None:
        self.stuck = False


class ManualClock:
    """A clock that moves only when told to: ``await clock.advance(seconds)``.

    Sleeps, timeouts, retry backoff and debounce under a Session using this clock wait for
    ``advance``; ``advance`` fires every timer that falls due in order, and after each one lets
    the woken tasks run until they block again, so a test sees the same sequence of events on
    every run, on asyncio and trio. ``time()`` starts at ``start`` (default 2026-01-01 UTC).
    Use it from one event loop.

    A wait of the kit never hangs: while a flow's ``wait_for_step`` / ``wait_complete``, a
    session's ``wait_idle`` or ``wait_for_delivery`` waits on this clock and every task is
    blocked, time jumps to the next timer (as trio's ``MockClock(autojump_threshold=0)``
    does), so a timeout fires instead of hanging; with no timer at all, the wait fails with a
    message naming what it waited for. ``autojump=False`` turns the jumps off (the waits then
    wait for ``advance``, as before).
    """

    def __init__(self, start: float = _DEFAULT_START, *, autojump: bool = True) -> None:
        if not math.isfinite(start):
            raise ValueError(f"ManualClock start must be a finite number, got {start!r}")
        self._start = float(start)
        self._elapsed = 0.0
        self._heap: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()
        self.autojump = bool(autojump)
        self._advancing = 0  # advance() calls running: a wait does not jump meanwhile
        self._quiet: anyio.Event | None = None  # set when the last advance() returns

    def __call__(self) -> float:
        return self._start + self._elapsed

    def time(self) -> float:
        """Wall-clock seconds: ``start`` plus everything advanced so far."""
        return self._start + self._elapsed

    def monotonic(self) -> float:
        """Seconds advanced since the clock was made."""
        return self._elapsed

    @property
    def pending(self) -> int:
        """How many sleeps and deadlines are waiting for time to move."""
        return sum(1 for _, _, timer in self._heap if timer.alive)

    def next_due(self) -> float | None:
        """Seconds until the next timer falls due (None when nothing waits)."""
        while self._heap and not self._heap[0][2].alive:
            heapq.heappop(self._heap)
        return None if not self._heap else max(self._heap[0][0] - self._elapsed, 0.0)

    def _add(self, seconds: float, timer: _Timer) -> None:
        heapq.heappush(self._heap, (timer.due, next(self._order), timer))

    @staticmethod
    def _check(seconds: float, what: str) -> None:
        # A NaN timer is never due and never leaves the heap: advance() would spin forever.
        if math.isnan(seconds):
            raise ValueError(f"ManualClock.{what}() needs a number of seconds, got nan")

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds`` (a checkpoint when <= 0)."""
        self._check(seconds, "sleep")
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        timer = _Timer(self._elapsed + seconds, anyio.Event(), None)
        self._add(seconds, timer)
        try:
            assert timer.event is not None
            await timer.event.wait()
        finally:
            timer.alive = False

    def deadline(self, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope cancelled once the clock has been advanced by ``seconds``."""
        self._check(seconds, "deadline")
        return self._deadline(seconds)

    @contextmanager
    def _deadline(self, seconds: float) -> Iterator[anyio.CancelScope]:
        scope = anyio.CancelScope()
        timer = _Timer(self._elapsed + seconds, None, scope)
        if seconds <= 0:
            scope.cancel()
            timer.alive = False
        else:
            self._add(seconds, timer)
        try:
            with scope:
                yield scope
        finally:
            timer.alive = False

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing due timers in order and letting tasks react.

        Also settles first: tasks that are ready run (and register their timers) before time
        moves. ``advance(0)`` only settles.
        """
        if not seconds >= 0 or not math.isfinite(seconds):
            raise ValueError(f"advance() takes a finite number of seconds >= 0, got {seconds!r}")
        target = self._elapsed + seconds
        self._advancing += 1
        try:
            await settle()
            while True:
                due = self.next_due()
                if due is None or self._elapsed + due > target:
                    break
                now = self._heap[0][0]
                self._elapsed = max(self._elapsed, now)
                while self._heap and self._heap[0][0] <= now:
                    heapq.heappop(self._heap)[2].fire()
                await settle()
            self._elapsed = target
            await settle()
        finally:
            self._advancing -= 1
            if not self._advancing and self._quiet is not None:
                self._quiet.set()
                self._quiet = None

    async def settle(self) -> None:
        """Let every other task run until all of them are blocked; time does not move."""
        await settle()

    async def _wait_jumping(self, event: anyio.Event, timeout: float | None) -> WaitOutcome:
        """Wait for ``event``; whenever every task is blocked, jump to the next timer."""
        jump = _Jump()
        with self.deadline(timeout) if timeout is not None else anyio.CancelScope():
            async with self._jumping(jump):
                await event.wait()
        if event.is_set():
            return "set"
        return "stuck" if jump.stuck else "timeout"

    @asynccontextmanager
    async def _jumping(self, jump: _Jump) -> AsyncIterator[None]:
        # The body runs in the caller's task; a task beside it jumps time while every task is
        # blocked, and cancels the body (jump.stuck) when nothing could ever wake it.
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._jump, jump, tg.cancel_scope, name="slateflow:autojump")
            try:
                yield
            except Exception as exc:
                failure = exc  # raised as it is, not wrapped in the task group's group
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _jump(self, jump: _Jump, body: anyio.CancelScope) -> None:
        idle_since: float | None = None
        working_since: float | None = None
        while True:
            if self._advancing:
                # The test is moving time itself: wait for it to finish.
                quiet = self._quiet = self._quiet or anyio.Event()
                await quiet.wait()
                await anyio.lowlevel.checkpoint()
                continue
            await settle()
            if self._advancing:
                continue
            if _real_work[0]:
                # A worker thread or a socket is working: the tasks wait on it, not on time.
                # Time jumps only after a moment of real time with nothing happening.
                now = time.monotonic()
                if working_since is None:
                    working_since = now
                if now - working_since < _STUCK_AFTER:
                    idle_since = None
                    await anyio.sleep(_STUCK_POLL)
                    continue
            working_since = None
            due = self.next_due()
            if due is not None:
                idle_since = None
                await self.advance(due)
                continue
            # No timer left. A worker thread may still be about to write: only after a
            # moment of real time with nothing happening is it hopeless.
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            elif now - idle_since >= _STUCK_AFTER:
                jump.stuck = True  # nothing can ever happen: give up instead of hanging
                body.cancel()
                return
            await anyio.sleep(_STUCK_POLL)

    def __repr__(self) -> str:
        return f"ManualClock(time={self.time():.6f}, pending={self.pending})"


WaitOutcome = Literal["set", "timeout", "stuck"]


async def wait_on(clock: Clock, event: anyio.Event, timeout: float | None) -> WaitOutcome:
    """Wait until ``event`` is set, for at most ``timeout`` seconds of ``clock``.

    ``"set"``, or ``"timeout"``; under a :class:`ManualClock` with ``autojump`` time jumps to
    the next timer whenever every task is blocked, and ``"stuck"`` means no timer was left at
    all (nothing could ever set the event), so a test fails instead of hanging.
    """
    if isinstance(clock, ManualClock) and clock.autojump:
        return await clock._wait_jumping(event, timeout)
    if timeout is None:
        await event.wait()
        return "set"
    with clock.deadline(timeout):
        await event.wait()
    return "set" if event.is_set() else "timeout"


@asynccontextmanager
async def jumping(clock: Clock, what: str) -> AsyncIterator[None]:
    """Run the block on ``clock`` as the kit's waits wait: under a :class:`ManualClock` with
    ``autojump``, time jumps to the next timer whenever every task is blocked, and a block
    that nothing could ever end raises :class:`~slateflow.errors.WaitTimeoutError` naming
    ``what`` instead of hanging (a fake that sleeps on the manual clock inside a tool call or
    a resolver called in the test's own task). Other clocks: the block runs as it is."""
    if not isinstance(clock, ManualClock) or not clock.autojump:
        yield
        return
    jump = _Jump()
    async with clock._jumping(jump):
        yield
    if jump.stuck:
        raise WaitTimeoutError(
            f"waited for {what}, which cannot end: every task is blocked and no timer is due "
            "(does it wait for something this task was to do, or for time nobody moves?)"
        ) from None


class ClockTime:
    """A :class:`~slateflow.state.waits.Timekeeper` over ``clock``: a Session hands one to its
    State, so ``state.wait_for`` / ``wait_until`` follow the session's clock."""

    __slots__ = ("clock",)

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def monotonic(self) -> float:
        return self.clock.monotonic()

    async def wait(self, event: anyio.Event, timeout: float | None) -> WaitOutcome:
        return await wait_on(self.clock, event, timeout)


async def settle(max_rounds: int = 10_000) -> None:
    """Let every other task run until all of them are blocked (or ``max_rounds`` passes).

    On trio this is ``trio.testing.wait_all_tasks_blocked``. anyio's asyncio version polls with
    100 ms real sleeps, which would make a manual clock slow, so on asyncio it yields until the
    loop has nothing else ready to run: O(1) a round on CPython's loop, whose ready queue it
    reads; on another loop (uvloop), the tasks are inspected after each yield instead (O(tasks)).
    """
    import asyncio

    loop = anyio.lowlevel.current_token().native_token
    if not isinstance(loop, asyncio.AbstractEventLoop):
        await anyio.wait_all_tasks_blocked()
        return
    ready = getattr(loop, "_ready", None)
    if isinstance(ready, collections.deque):
        # Resumed from the ready queue, this task runs while the callbacks queued behind it
        # (and any scheduled since) wait there: none left means every other task is blocked.
        for _ in range(max_rounds):
            await anyio.lowlevel.checkpoint()
            if not ready:
                return
        return
    this = asyncio.current_task()
    for _ in range(max_rounds):
        await anyio.lowlevel.checkpoint()
        for task in asyncio.all_tasks():
            if task is this:
                continue
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is None or waiter.done():
                break
        else:
            return
