"""Waiting for a running flow to get somewhere, from any task, on the session's clock."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from ..errors import FlowError, WaitTimeoutError
from ..resolve.clock import Clock, wait_on

__all__ = ["Waiter", "Waits"]


class Waiter:
    """One task waiting for ``check`` to hold; woken from any thread."""

    __slots__ = ("check", "event", "thread", "token")

    def __init__(self, check: Callable[[], bool]) -> None:
        self.check = check
        self.event = anyio.Event()
        self.token = anyio.lowlevel.current_token()
        self.thread = threading.get_ident()

    def wake(self) -> None:
        if threading.get_ident() == self.thread:
            self.event.set()
            return
        with contextlib.suppress(anyio.RunFinishedError, RuntimeError):
            self.token.backend_class.run_sync_soon(self.event.set, (), self.token.native_token)


class Waits:
    """The tasks waiting on one runner; :meth:`wake` after every transition it publishes."""

    __slots__ = ("closed", "explain", "lock", "name", "waiters")

    def __init__(
        self,
        name: str,
        lock: threading.RLock,
        closed: Callable[[], bool],
        explain: Callable[[], Any],
    ) -> None:
        self.name = name
        self.lock = lock
        self.closed = closed
        self.explain = explain
        self.waiters: list[Waiter] = []

    def wake(self) -> None:
        """Wake the waiters whose condition holds now."""
        with self.lock:
            ready = [w for w in self.waiters if w.check()]
            if not ready:
                return
            self.waiters = [w for w in self.waiters if w not in ready]
        for w in ready:
            w.wake()

    def close(self) -> None:
        """Wake every waiter (the runner closed: they raise unless their condition holds)."""
        with self.lock:
            waiters, self.waiters = self.waiters, []
        for w in waiters:
            w.wake()

    async def until(
        self, check: Callable[[], bool], timeout: float | None, what: str, clock: Clock
    ) -> None:
        """Return once ``check()`` holds; raise :class:`WaitTimeoutError` after ``timeout``
        seconds on ``clock`` (or at once when nothing can ever make it hold under a manual
        clock), :class:`FlowError` if the runner closes first."""
        if timeout is not None and (
            type(timeout) not in (int, float) or not math.isfinite(timeout)
        ):
            raise FlowError(
                f"flow {self.name!r}: the timeout waiting for {what} must be a finite number of "
                f"seconds or None, got {timeout!r}"
            )
        deadline = None if timeout is None else clock.monotonic() + timeout
        while True:
            with self.lock:
                if check():
                    return
                if self.closed():
                    raise FlowError(
                        f"flow {self.name!r}: the runner is closed; start the flow again"
                    )
                waiter = Waiter(check)
                self.waiters.append(waiter)
            try:
                left = None if deadline is None else max(deadline - clock.monotonic(), 0.0)
                # Under a manual clock, time jumps while every task is blocked: never a hang.
                outcome = await wait_on(clock, waiter.event, left)
                if outcome == "stuck" and not check():
                    raise WaitTimeoutError(
                        f"flow {self.name!r}: waiting for {what}, but nothing can ever get it "
                        f"there: every task is blocked and no timer is due on the manual "
                        f"clock\n{self.explain()}"
                    )
                if outcome == "timeout" and not waiter.event.is_set():
                    raise WaitTimeoutError(
                        f"flow {self.name!r}: waited {timeout}s for {what}\n{self.explain()}"
                    )
            finally:
                with self.lock, contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            if self.closed() and not check():
                raise FlowError(
                    f"flow {self.name!r} was closed while waiting for {what}\n{self.explain()}"
                )
            # Woken: reached (checked at the top), or reached and left again before this task
            # ran (a gate flicker, a reset); then wait on.
