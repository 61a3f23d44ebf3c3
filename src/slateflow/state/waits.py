"""Async waits on the state (anyio: asyncio and trio), woken from whichever thread writes."""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.lowlevel

from ..errors import UsageError, WaitTimeoutError
from .keys import Key, key_name
from .values import MISSING

if TYPE_CHECKING:
    from .state import State

__all__ = ["Timekeeper", "keep_time", "wait_for", "wait_until"]

_MISSING = MISSING


class Timekeeper(Protocol):
    """The clock a State's waits follow while a session with a clock of its own runs over it
    (a ``ManualClock`` in tests): ``wait`` returns ``"set"``, ``"timeout"`` or ``"stuck"``
    (nothing could ever set the event: every task blocked, no timer left)."""

    def monotonic(self) -> float: ...

    async def wait(
        self, event: anyio.Event, timeout: float | None
    ) -> Literal["set", "timeout", "stuck"]: ...


_keepers: weakref.WeakKeyDictionary[State, Timekeeper] = weakref.WeakKeyDictionary()


def keep_time(state: State, keeper: Timekeeper) -> Callable[[], None]:
    """Make ``state``'s waits (``wait_for``, ``wait_until``) follow ``keeper`` until the
    returned function is called (a Session over a manual clock does, while it is open)."""
    _keepers[state] = keeper

    def forget() -> None:
        if _keepers.get(state) is keeper:
            del _keepers[state]

    return forget


async def _wait(
    keeper: Timekeeper | None, event: anyio.Event, deadline: float | None
) -> Literal["set", "timeout", "stuck"]:
    """Wait for ``event`` until ``deadline`` (on the keeper's clock, or the loop's)."""
    if keeper is None:
        if deadline is None:
            await event.wait()
            return "set"
        with anyio.move_on_at(deadline):
            await event.wait()
        return "set" if event.is_set() else "timeout"
    left = None if deadline is None else max(deadline - keeper.monotonic(), 0.0)
    return await keeper.wait(event, left)


def _deadline(keeper: Timekeeper | None, timeout: float | None) -> float | None:
    if timeout is None:
        return None
    return (keeper.monotonic() if keeper is not None else anyio.current_time()) + timeout


_STUCK = "; every task is blocked and no timer is due, so nothing could ever end the wait"


class _Waiter:
    """Wakes one async task waiting on the state, from whichever thread delivers the change."""

    __slots__ = ("error", "event", "result", "thread", "token")

    def __init__(self) -> None:
        self.token = anyio.lowlevel.current_token()
        self.thread = threading.get_ident()
        self.event = anyio.Event()
        self.result: Any = _MISSING
        self.error: BaseException | None = None

    def arm(self) -> anyio.Event:
        self.event = anyio.Event()
        return self.event

    def wake(self, changes: object = None) -> None:
        event = self.event
        if threading.get_ident() == self.thread:
            event.set()
            return
        # If the waiting loop has ended there is nobody left to wake.
        with contextlib.suppress(anyio.RunFinishedError):
            self.token.backend_class.run_sync_soon(event.set, (), self.token.native_token)


def check_timeout(timeout: object, what: str) -> float | None:
    """``timeout`` as seconds, or None; anything but a finite number >= 0 (or None) raises
    :class:`UsageError` (``True`` is not one second, NaN is not a number of seconds)."""
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise UsageError(
            f"{what}: timeout must be a finite number of seconds >= 0 or None, got {timeout!r}"
        )
    return float(timeout)


async def wait_for(state: State, key: str | Key[Any], timeout: float | None) -> Any:
    """See :meth:`State.wait_for`."""
    name = key_name(key)
    timeout = check_timeout(timeout, f"wait_for({name!r})")
    waiter = _Waiter()
    keeper = _keepers.get(state)
    deadline = _deadline(keeper, timeout)
    sub = state.subscribe(waiter.wake, keys=[name])
    try:
        while True:
            event = waiter.arm()
            value = state.get(key, _MISSING)
            if value is not _MISSING:
                return value
            outcome = await _wait(keeper, event, deadline)
            if outcome != "set":
                how = f"timed out after {timeout}s" if outcome == "timeout" else "gave up"
                why = _STUCK if outcome == "stuck" else ""
                raise WaitTimeoutError(f"{how} waiting for {name!r} to be set{why}")
    finally:
        sub.close()


async def wait_until(
    state: State,
    predicate: Callable[[State], Any],
    keys: Iterable[str | Key[Any]] | None,
    pattern: str | Iterable[str] | None,
    timeout: float | None,
) -> Any:
    """See :meth:`State.wait_until`."""
    timeout = check_timeout(timeout, "wait_until")
    waiter = _Waiter()

    def check(changes: object = None) -> None:
        if waiter.result is not _MISSING or waiter.error is not None:
            return
        try:
            result = predicate(state)
        except Exception as exc:
            waiter.error = exc
            waiter.wake()
            return
        if result:
            waiter.result = result
            waiter.wake()

    keeper = _keepers.get(state)
    deadline = _deadline(keeper, timeout)
    outcome = "set"
    sub = state.subscribe(check, keys=keys, pattern=pattern)
    try:
        while True:
            event = waiter.arm()
            check()
            if waiter.error is not None or waiter.result is not _MISSING:
                break
            outcome = await _wait(keeper, event, deadline)
            if outcome != "set":
                break
    finally:
        sub.close()
    # Raised outside the wait, so a predicate's own TimeoutError stays its own.
    if waiter.error is not None:
        raise waiter.error
    if waiter.result is not _MISSING:
        return waiter.result
    what = getattr(predicate, "__qualname__", repr(predicate))
    if outcome == "stuck":
        raise WaitTimeoutError(f"gave up waiting until {what} held{_STUCK}")
    raise WaitTimeoutError(f"timed out after {timeout}s waiting until {what} held")
